"""Routing in every thread: torch's function modes are per-thread, so the simulation puts its
mode on each thread that can place work on a simulated GPU.

The thread that calls start() gets it then; every thread started while the simulation runs
gets it when it starts (DataLoader's pin-memory thread, DataParallel's replicas, a learner's
`threading.Thread`, a ThreadPoolExecutor's workers), as a real GPU is usable from any thread.
A thread started before the simulation, and still running, is not routed: its attempt to make
a GPU tensor fails with one line saying so (`_cuda._lazy_init`), or it enters
`thread_routing()`. The simulation's own worker threads are never routed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode, _pop_mode, _push_mode

from . import _session
from ._patcher import Patcher
from ._routing import SimulationMode
from ._workers import UNROUTED


def push_routing() -> SimulationMode:
    """Route this thread: put the simulation's mode on its stack (undo with pop_routing)."""
    mode = SimulationMode()
    _push_mode(mode)
    _session.tls.routed = mode.session
    return mode


def remove_mode(mode: TorchFunctionMode) -> bool:
    """Take `mode` off this thread's function mode stack, keeping the modes above it."""
    above = []
    found = False
    while torch._C._len_torch_function_stack():
        m = _pop_mode()
        if m is mode:
            found = True
            break
        above.append(m)
    for m in reversed(above):
        _push_mode(m)
    return found


def _restore(stack: list) -> None:
    """Make this thread's function mode stack `stack` again (bottom first), keeping any mode
    pushed on top meanwhile above it."""
    extra = []
    while torch._C._len_torch_function_stack():
        m = _pop_mode()
        if not any(m is s for s in stack):
            extra.append(m)
    for m in stack:
        _push_mode(m)
    for m in reversed(extra):
        _push_mode(m)


def pop_routing(mode: SimulationMode) -> None:
    """Undo push_routing."""
    remove_mode(mode)
    _session.tls.__dict__.pop("routed", None)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Take this thread's simulation modes off its stack for the block, and put them back in
    their places after (host work timed as plain PyTorch runs it)."""
    functions = torch.overrides._get_current_function_mode_stack()
    for m in functions:
        if isinstance(m, SimulationMode):
            remove_mode(m)
    try:
        yield
    finally:
        _restore(functions)


@contextlib.contextmanager
def routing() -> Iterator[None]:
    """Route this thread's work while inside: nothing to do if the running simulation's mode is
    on its stack; else its mode for the block. Also inside the simulation's own handling of a
    call, where torch has taken the mode off the stack (torch's code that runs there, a tensor
    subclass's dispatch making DTensor's RNG tracker, moves tensors to simulated GPUs), and
    where a dispatch mode running an op has switched torch functions off (`_dispatched.run`)."""
    if torch._C._is_torch_function_all_disabled():
        with torch._C._EnableTorchFunction(), routing():
            yield
        return
    if any(isinstance(m, SimulationMode) and not m.inert
           for m in torch.overrides._get_current_function_mode_stack()):
        yield
        return
    before = _session.tls.__dict__.get("routed")
    mode = push_routing()
    try:
        yield
    finally:
        remove_mode(mode)
        if before is None:
            _session.tls.__dict__.pop("routed", None)
        else:
            _session.tls.routed = before


_orig_bootstrap_inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _bootstrap_inner(self: threading.Thread) -> None:
    """Thread._bootstrap_inner: a thread started while simulating runs routed."""
    mode = None
    if _session.session is not None and not getattr(self, UNROUTED, False):
        try:
            mode = push_routing()
        except Exception:  # never keep the thread from starting (its starter waits for it)
            mode = None
    try:
        _orig_bootstrap_inner(self)
    finally:
        if mode is not None:
            pop_routing(mode)


def install(p: Patcher) -> None:
    p.set(threading.Thread, "_bootstrap_inner", _bootstrap_inner)
