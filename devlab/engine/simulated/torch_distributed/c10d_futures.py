"""Futures of torch.distributed's collectives on simulated GPUs, and what a process waits for
before a group's teardown and at exit.

Futures of collectives (`work.get_future().then(callback)`, as DDP's hooks chain them): a
callback runs on the thread that completes the future, often gloo's own C++ thread, which
the simulation does not route; tensors made there would land on the host (PowerSGD keeps its
error feedback so). `Future.then` and `add_done_callback` run their callbacks routed, as the
calling thread's work is. That thread lets go of a callback only after completing the future
it chained; a callback may hold a group's last reference (PowerSGD's holds its group), and a
gloo thread that tears down its own group aborts the process. `settle()`, which the NCCL
group's shutdown calls, waits until torch has let go of every callback that ran.

At exit, Python finalizes only after gloo's threads are done with Python (`quiet_at_exit`;
See Note [Why a rank waits at exit]).
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
import time
from typing import Any

from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.mode.routing import routing

# One entry per future's callback that has run and that torch still holds (see settle()); a
# list, as append and pop are atomic under the GIL on whichever thread. A forked child has none
# of the threads that would let go of its parent's.
_unreleased: list[None] = []
os.register_at_fork(after_in_child=_unreleased.clear)


class _Released:
    """Kept by one routed callback alone: counted in `_unreleased` from the callback's first run
    until torch lets go of the callback (and so of this)."""

    __slots__ = ("ran",)

    def __init__(self) -> None:
        self.ran = False

    def run(self) -> None:
        if not self.ran:
            self.ran = True
            _unreleased.append(None)

    def __del__(self) -> None:
        if self.ran:
            _unreleased.pop()


def settle(within: float = 5.0) -> None:
    """Wait, with the GIL released, until torch has let go of every future's callback that has
    run (the thread that ran one lets go of it after completing the future it chained, so the
    caller may go on meanwhile). Bounded: a callback kept alive elsewhere only delays this."""
    deadline = time.monotonic() + within
    while _unreleased and time.monotonic() < deadline:
        time.sleep(0.001)


def _running_threads() -> int:
    """How many other threads of this process are running or runnable (Linux: their state in
    /proc; elsewhere 0, nothing to read)."""
    me = str(threading.get_native_id())
    running = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tasks:
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        if stat[stat.rfind(b")") + 2:][:1] == b"R":
            running += 1
    return running


# Note [Why a rank waits at exit]
# A thread that takes the GIL once Python has begun to finalize is made to exit on the spot
# (Python 3.11's runtime); the C++ frames it unwinds end in std::terminate, and the process
# aborts ("terminate called without an active exception") though the program had finished.
# A collective's future completes on a gloo thread, which then runs its callbacks and frees
# what the collective held, some of it Python objects: plain gloo on the CPU aborts so too.
# NCCL completes a future as its work is queued and runs callbacks on the caller's thread, so
# a CUDA program never meets this. So a rank waits at exit, before Python finalizes, until
# gloo's threads are done with Python (`quiet_at_exit`); the simulated GPUs' workers drain
# and end at exit for the same reason (`base/gpu_workers.py`).


def quiet_at_exit(within: float = 1.0) -> None:
    """At interpreter exit, before Python finalizes: let gloo's threads finish with Python
    (See Note [Why a rank waits at exit]).

    Wait, with the GIL released, for every callback that ran to be let go (`settle`), then
    until no other thread has been running for a few checks in a row (gloo's idle threads
    sleep). Bounded: a thread busy elsewhere only delays the exit."""
    settle(within)
    deadline = time.monotonic() + within
    calm = 0
    while calm < 3 and time.monotonic() < deadline:
        time.sleep(0.002)
        calm = calm + 1 if _running_threads() == 0 else 0


_quiet_registered = threading.Event()


def register_quiet_at_exit() -> None:
    """Call `quiet_at_exit` at interpreter exit (once per process; a forked child registers
    its own when it makes a group)."""
    if not _quiet_registered.is_set():
        _quiet_registered.set()
        atexit.register(quiet_at_exit)


def routed_callbacks(original: Any) -> Any:
    """`Future.then`/`add_done_callback` whose callback runs routed on whatever thread."""

    @functools.wraps(original)
    def chained(self: Any, callback: Any) -> Any:
        released = _Released()

        @functools.wraps(callback)
        def routed(fut: Any) -> Any:
            released.run()
            if _session.session is None or _session.is_routed():
                return callback(fut)
            with routing():
                return callback(fut)

        return original(self, routed)

    return chained
