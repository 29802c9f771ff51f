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

import threading

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
