"""One worker thread per simulated GPU: the GPU's queue, as a CUDA stream is.

A real GPU runs kernels asynchronously: `x.mm(x)` returns at once and the host only waits at a
sync point (`.item()`, printing, `.cpu()`, `torch.cuda.synchronize()`). `_launch` queues heavy
ops here; each worker runs its GPU's queue in order with its own share of the CPU cores, so
work on two simulated GPUs overlaps. An error in queued work surfaces at the next sync, as a
CUDA error does. At interpreter exit the queues drain and the threads end (a thread left
inside torch at exit aborts the process: See Note [Why a rank waits at exit] in
torch_distributed/c10d_futures.py); a fork finds every queue drained, and the child
starts with no workers (`_fork`).
"""

from __future__ import annotations

import atexit
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from devlab._helpers.host import cpu_cores
from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import session as _session

# Launched-but-unfinished ops over all workers, and whether wait() must look further: a worker
# holds an error, or this process may not use the simulated GPUs (`_session.bad_fork`).
# wait() reads just these two on every op.
_pending_total = 0
_alert = False
_lock = threading.Lock()
_workers: dict[int, _Worker] = {}

# A host sync wakes at least this often (seconds): an interrupt (SIGINT) that reached the
# process while the main thread waits is raised then, even if the signal woke another thread.
_WAKE = 0.1

# Set in a forked child: its workers take one thread each (see fork._after_in_child).
_forked = False

# Threads the simulation starts for itself, which must not route work (see mode.thread_starts).
UNROUTED = "_devlab_unrouted"


class _Worker:
    def __init__(self, index: int, threads: int) -> None:
        self.index = index
        self.threads = threads
        # (the op, the device state whose `queued` lists the marks its tensors are on)
        self.queue: queue.SimpleQueue[tuple[Callable[[], None], Any] | None] = (
            queue.SimpleQueue())
        self.pending = 0
        self.done = threading.Condition(_lock)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"devlab-simulated-gpu{index}",
                                       daemon=True)
        setattr(self.thread, UNROUTED, True)
        self.thread.start()

    def _run(self) -> None:
        global _pending_total, _alert
        # Per-thread: the main thread keeps all cores for its own (synchronous) work.
        torch.set_num_threads(self.threads)
        _session.tls.index = self.index
        while True:
            item = self.queue.get()
            if item is None:
                return
            fn, dev = item
            item = None
            try:
                fn()
            except BaseException as e:  # surfaces at the next sync, as CUDA errors do
                with _lock:
                    if self.error is None:
                        self.error = e
                    _alert = True
            finally:
                if dev is not None:
                    # Out of the queued ops before the op's tensors go, and both in one hold of
                    # the lock: a `settle` between them (a host allocation) would find a
                    # storage the user let go of neither queued work's nor freed, and take
                    # memory the synchronous run reuses. See Note [Why queued work's storages
                    # are uncounted] in base/session.py.
                    with _session.lock:
                        dev.queued.pop(id(fn), None)
                        fn = None
                # Drop the op (and the tensors its closure holds) before waiting for the next
                # one, so freed tensors leave the device's memory at once.
                fn = dev = None
                with _lock:
                    self.pending -= 1
                    _pending_total -= 1
                    if self.pending == 0:
                        self.done.notify_all()

    def submit(self, fn: Callable[[], None], dev: Any, holds: list | None) -> None:
        global _pending_total
        key = id(fn)
        with _lock:
            # No call between the counts, the op's holds and the put, where an interrupt could
            # land and leave a count without its op (every wait would hang), an op without
            # its count, or holds without their op.
            self.pending += 1
            _pending_total += 1
            if holds:
                dev.queued[key] = holds
            self.queue.put((fn, dev if holds else None))

    def drain(self) -> None:
        """Block until the queued work is done; an error it raised stays for the next sync."""
        with _lock:
            while self.pending:
                self.done.wait(_WAKE)

    def wait(self) -> None:
        global _alert
        with _lock:
            while self.pending:
                self.done.wait(_WAKE)
            err, self.error = self.error, None
            _alert = _session.bad_fork or any(w.error is not None for w in _workers.values())
        if err is not None:
            raise err


def submit(index: int, fn: Callable[[], None], holds: list | None = None) -> None:
    """Queue fn on simulated GPU `index`'s worker (started on first use). `holds`: the marks of
    the storages fn holds its own tensors on, one per tensor (See Note [Why queued work's
    storages are uncounted] in base/session.py)."""
    w = _workers.get(index)
    sess = _session.session
    if w is None:
        count = sess.count if sess is not None else 1
        # In a forked child one thread each, as its main thread (see fork._after_in_child).
        threads = 1 if _forked else max(1, cpu_cores() // count)
        w = _workers[index] = _Worker(index, threads)
    w.submit(fn, sess.devices[index] if holds and sess is not None else None, holds)


def wait(index: int) -> None:
    """Block until simulated GPU `index` has finished its queued work (a host sync). Every use
    of a GPU's tensors passes here first, so a child forked after its parent initialized the
    simulated GPUs gets CUDA's error here."""
    if _pending_total or _alert:
        if _session.bad_fork:
            raise _errors.forked_after_init()
        w = _workers.get(index)
        if w is not None:
            w.wait()


def drain(index: int | None = None) -> None:
    """Block until simulated GPU `index` (every GPU if None) has done its queued work, without
    raising an error it left for the next sync: what an allocation that does not fit waits
    for, and a fork."""
    for i, w in list(_workers.items()):
        if index is None or i == index:
            w.drain()


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
        w.submit(fn, None, None)


def wait_all() -> None:
    if _session.bad_fork:
        raise _errors.forked_after_init()
    for w in list(_workers.values()):
        w.wait()


def host_sync(index: int | None = None) -> None:
    """The host waits for simulated GPU `index` (every GPU's if None), as `synchronize()`
    does: for its queued work, and on a modeled GPU for the modeled clock's queue too. During
    a CUDA graph's capture it is CUDA's capture error instead (`session.capture`)."""
    capture = _session.capture
    if capture is not None:
        capture.refuse("synchronize()")
    if index is None:
        wait_all()
    else:
        wait(index)
    sess = _session.session
    if sess is not None:
        sess.charges.sync(index)


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


def forget_in_child() -> None:
    """A forked child has none of the parent's threads: start over with no workers (`_fork`)."""
    global _pending_total, _alert, _lock, _forked
    _forked = True
    _lock = threading.Lock()
    _workers.clear()
    _pending_total = 0
    _alert = _session.bad_fork


def set_alert() -> None:
    """Make wait() look again (`_session.bad_fork` changed)."""
    global _alert
    with _lock:
        _alert = _session.bad_fork or any(w.error is not None for w in _workers.values())


atexit.register(_at_exit)
