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
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, _pop_mode, _push_mode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack as _dispatch_stack
from torch.utils._python_dispatch import _pop_mode as _pop_dispatch_mode
from torch.utils._python_dispatch import _push_mode as _push_dispatch_mode

from . import _session
from ._patcher import Patcher
from ._routing import SimulationMode
from ._workers import UNROUTED


class Routing:
    """What routes one thread: the simulation's function mode, and with a performance model,
    the clock's dispatch mode."""

    def __init__(self) -> None:
        self.mode = SimulationMode()
        sess = _session.session
        clock = sess.clock if sess is not None else None
        self.clock_mode = None if clock is None else _clock_mode(clock)


def _clock_mode(clock: object) -> TorchDispatchMode:
    from ._clock import ClockMode  # only a modeled simulation loads the model

    return ClockMode(clock)  # type: ignore[arg-type]


def push_routing() -> Routing:
    """Route this thread: put the simulation's modes on its stacks (undo with pop_routing)."""
    routing = Routing()
    _push_mode(routing.mode)
    if routing.clock_mode is not None:
        _push_dispatch_mode(routing.clock_mode)
    _session.tls.routed = routing.mode.session
    return routing


class _Stack:
    """One of this thread's two mode stacks, through torch's own push, pop and length."""

    def __init__(self, push: Any, pop: Any, length: Any) -> None:
        self.push, self.pop, self.length = push, pop, length

    def remove(self, mode: object) -> bool:
        """Take `mode` off the stack, keeping the modes above it in order."""
        above = []
        found = False
        while self.length():
            m = self.pop()
            if m is mode:
                found = True
                break
            above.append(m)
        for m in reversed(above):
            self.push(m)
        return found

    def restore(self, stack: list) -> None:
        """Make the stack `stack` again (bottom first), keeping any mode pushed on top
        meanwhile above it."""
        extra = []
        while self.length():
            m = self.pop()
            if not any(m is s for s in stack):
                extra.append(m)
        for m in stack:
            self.push(m)
        for m in reversed(extra):
            self.push(m)


FUNCTION_MODES = _Stack(_push_mode, _pop_mode, torch._C._len_torch_function_stack)
DISPATCH_MODES = _Stack(_push_dispatch_mode, _pop_dispatch_mode,
                        torch._C._len_torch_dispatch_stack)


def remove_mode(mode: TorchFunctionMode) -> bool:
    """Take `mode` off this thread's function mode stack, keeping the modes above it."""
    return FUNCTION_MODES.remove(mode)


def remove_dispatch_mode(mode: TorchDispatchMode) -> bool:
    """Take `mode` off this thread's dispatch mode stack, keeping the modes above it."""
    return DISPATCH_MODES.remove(mode)


def pop_routing(routing: Routing) -> None:
    """Undo push_routing."""
    remove_mode(routing.mode)
    if routing.clock_mode is not None:
        remove_dispatch_mode(routing.clock_mode)
    _session.tls.__dict__.pop("routed", None)


def remove_stale_clock_modes() -> None:
    """Take clock modes of earlier simulations off this thread's stack (a stop() from another
    thread could only disarm them)."""
    from ._clock import ClockMode

    sess = _session.session
    for m in _dispatch_stack():
        if isinstance(m, ClockMode) and (sess is None or m.clock is not sess.clock):
            remove_dispatch_mode(m)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Take this thread's simulation modes off its stacks for the block, and put them back
    in their places after (host work timed as plain PyTorch runs it)."""
    from ._clock import ClockMode

    functions = torch.overrides._get_current_function_mode_stack()
    dispatches = _dispatch_stack()
    ours = [m for m in functions if isinstance(m, SimulationMode)]
    clocks = [m for m in dispatches if isinstance(m, ClockMode)]
    for m in ours:
        remove_mode(m)
    for m in clocks:
        remove_dispatch_mode(m)
    try:
        yield
    finally:
        FUNCTION_MODES.restore(functions)
        DISPATCH_MODES.restore(dispatches)


@contextlib.contextmanager
def routing() -> Iterator[None]:
    """Route this thread's work while inside (nothing to do if it is routed already)."""
    if _session.is_routed():
        yield
        return
    routing = push_routing()
    try:
        yield
    finally:
        pop_routing(routing)


_orig_bootstrap_inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _bootstrap_inner(self: threading.Thread) -> None:
    """Thread._bootstrap_inner: a thread started while simulating runs routed."""
    routing = None
    if _session.session is not None and not getattr(self, UNROUTED, False):
        try:
            routing = push_routing()
        except Exception:  # never keep the thread from starting (its starter waits for it)
            routing = None
    try:
        _orig_bootstrap_inner(self)
    finally:
        if routing is not None:
            pop_routing(routing)


def install(p: Patcher) -> None:
    p.set(threading.Thread, "_bootstrap_inner", _bootstrap_inner)
