"""Routing in every thread: torch's function modes are per-thread, so the simulation puts its
mode on each thread that can place work on a simulated GPU.

The thread that calls start() gets it then; every thread started while the simulation runs
gets it when it starts (DataLoader's pin-memory thread, DataParallel's replicas, a learner's
`threading.Thread`, a ThreadPoolExecutor's workers), as a real GPU is usable from any thread.
A thread started before the simulation, and still running, is not routed: its attempt to make
a GPU tensor fails with one line saying so (`_cuda._lazy_init`), or it enters
`thread_routing()`, unless the simulation routes the threads running already
(`route_running_threads`: a simulation started from DEVLAB_SIMULATE_GPUS, where torch may have
been imported first in any thread). The simulation's own worker threads are never routed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from torch.overrides import _pop_mode, _push_mode

from devlab._helpers.thread_calls import call_in_threads
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.gpu_workers import UNROUTED
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.mode.routing import pop_routing, push_routing

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


def route_running_threads() -> list[threading.Thread]:
    """Route every other running thread of this process at its next Python call (the threads
    it arranged that for). Daemon threads are left out: they are libraries' helpers (Jupyter's
    heartbeat, IOPub and control threads) that may never run Python again, and from Python 3.12
    a thread whose one-shot profile function has not run yet slows every thread's calls."""
    sess = _session.session
    if sess is None:
        return []
    threads = {t.ident: t for t in threading.enumerate()
               if not t.daemon and t.ident is not None and not getattr(t, UNROUTED, False)}

    def route_there(ident: int) -> Callable[[], None]:
        return lambda: _route_here(sess)

    return [threads[i] for i in call_in_threads(threads, route_there)]


def _route_here(sess: _session.Session) -> None:
    """In a thread that was running before `sess` started: put its mode at the bottom of the
    thread's stack, below any function mode the thread has entered (whose exit pops the top)."""
    if _session.session is not sess or _session.is_routed():
        return
    above = []
    while torch._C._len_torch_function_stack():
        above.append(_pop_mode())
    try:
        push_routing()
    finally:
        for m in reversed(above):
            _push_mode(m)
