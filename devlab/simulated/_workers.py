"""One worker thread per simulated GPU: the GPU's queue, as a CUDA stream is.

A real GPU runs kernels asynchronously: `x.mm(x)` returns at once and the host only waits at a
sync point (`.item()`, printing, `.cpu()`, `torch.cuda.synchronize()`). `_launch` queues heavy
ops here; each worker runs its GPU's queue in order with its own share of the CPU cores, so
work on two simulated GPUs overlaps. An error in queued work surfaces at the next sync, as a
CUDA error does. At interpreter exit the queues drain and the threads end (a thread left
inside torch at exit aborts the process); a forked child starts with no workers.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
from collections.abc import Callable

import torch

from devlab.host import cpu_cores

from . import _session

# Launched-but-unfinished ops over all workers, and whether a worker holds an error: wait()
# reads just these two on every op.
_pending_total = 0
_has_error = False
_lock = threading.Lock()
_workers: dict[int, _Worker] = {}

# Threads the simulation starts for itself, which must not route work (see _threads).
UNROUTED = "_devlab_unrouted"


class _Worker:
    def __init__(self, index: int, threads: int) -> None:
        self.index = index
        self.threads = threads
        self.queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.pending = 0
        self.done = threading.Condition(_lock)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"devlab-simulated-gpu{index}",
                                       daemon=True)
        setattr(self.thread, UNROUTED, True)
        self.thread.start()

    def _run(self) -> None:
        global _pending_total, _has_error
        # Per-thread: the main thread keeps all cores for its own (synchronous) work.
        torch.set_num_threads(self.threads)
        _session.tls.index = self.index
        while True:
            fn = self.queue.get()
            if fn is None:
                return
            try:
                fn()
            except BaseException as e:  # surfaces at the next sync, as CUDA errors do
                with _lock:
                    if self.error is None:
                        self.error = e
                    _has_error = True
            finally:
                # Drop the op (and the tensors its closure holds) before waiting for the next
                # one, so freed tensors leave the device's memory at once.
                fn = None
                with _lock:
                    self.pending -= 1
                    _pending_total -= 1
                    if self.pending == 0:
                        self.done.notify_all()

    def submit(self, fn: Callable[[], None]) -> None:
        global _pending_total
        with _lock:
            self.pending += 1
            _pending_total += 1
        self.queue.put(fn)

    def wait(self) -> None:
        global _has_error
        with _lock:
            while self.pending:
                self.done.wait()
            err, self.error = self.error, None
            _has_error = any(w.error is not None for w in _workers.values())
        if err is not None:
            raise err


def submit(index: int, fn: Callable[[], None]) -> None:
    """Queue fn on simulated GPU `index`'s worker (started on first use)."""
    w = _workers.get(index)
    if w is None:
        sess = _session.session
        count = sess.count if sess is not None else 1
        w = _workers[index] = _Worker(index, max(1, cpu_cores() // count))
    w.submit(fn)


def wait(index: int) -> None:
    """Block until simulated GPU `index` has finished its queued work (a host sync)."""
    if _pending_total or _has_error:
        w = _workers.get(index)
        if w is not None:
            w.wait()


def idle(index: int) -> bool:
    """True when simulated GPU `index` has no queued work."""
    w = _workers.get(index)
    return w is None or w.pending == 0


def at_queue_end(index: int, fn: Callable[[], None]) -> None:
    """Run fn when the device has done all work queued so far (now, if it has none)."""
    w = _workers.get(index)
    if w is None or w.pending == 0:
        fn()
    else:
        w.submit(fn)


def wait_all() -> None:
    for w in list(_workers.values()):
        w.wait()


def host_sync(index: int | None = None) -> None:
    """The host waits for simulated GPU `index` (every GPU's if None), as `synchronize()`
    does: for its queued work, and on a modeled GPU for the modeled clock's queue too."""
    if index is None:
        wait_all()
    else:
        wait(index)
    sess = _session.session
    if sess is not None and sess.clock is not None:
        sess.clock.sync(index)


def shutdown() -> None:
    """Finish all queued work and end the worker threads (stop(), and interpreter exit)."""
    errors = []
    for w in list(_workers.values()):
        try:
            w.wait()
        except BaseException as e:  # stop() must still tear down; report after
            errors.append(e)
        w.queue.put(None)
        w.thread.join()
    _workers.clear()
    if errors:
        raise errors[0]


def _at_exit() -> None:
    # An error queued work left behind has nobody to report to any more.
    try:
        shutdown()
    except BaseException:  # noqa: S110 - exit must stay clean
        pass


def _forget_in_child() -> None:
    """A forked child has none of the parent's threads: start over with no workers."""
    global _pending_total, _has_error, _lock
    _lock = threading.Lock()
    _workers.clear()
    _pending_total = 0
    _has_error = False


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_forget_in_child)
