"""The quiet window: forks no launcher announces (a program's own `multiprocessing` fork loop,
`os.fork`) while a c10d store server thread runs in the forking process.

While simulating, a fork from a process in which a c10d store server thread runs
(`pt_tcpstore*`, `fork_hazard.store_thread_running`) opens a *quiet window*: its children wait
until the parent has not forked for QUIET seconds (a timer thread in the parent closes the pipe
they wait on) or has died. They are watched too (`hang_report`), with the parent's processor
time counting as progress, except DataLoader workers. Forks from a process without a store
thread are untouched, as are forks under a launcher's own window (`barrier`) or `exempt()`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from devlab.engine.simulated.torch_distributed.fork_safety import barrier as _barrier
from devlab.engine.simulated.torch_distributed.fork_safety.fork_hazard import (
    store_thread_running,
    wait_for_parent,
)
from devlab.engine.simulated.torch_distributed.fork_safety.hang_report import (
    SLOT,
    hang_timeout,
    start_watchdog,
)

# A quiet window's children start once their parent has not forked for this long.
QUIET = 0.15
# A quiet window's watchdog slots (one page): children past these run unwatched.
QUIET_SLOTS = mmap.PAGESIZE // SLOT.size


@dataclass
class _Quiet:
    """Forks a process makes, without a launcher, while a store server thread runs in it."""

    read_fd: int
    write_fd: int
    slots: mmap.mmap
    timeout: float | None
    parent: int
    forked: int = 0
    last: float = 0.0
    timer: threading.Thread | None = None


_unannounced = False  # while simulating: forks no launcher announces open quiet windows
_exempt = 0  # forks a caller makes under exempt(): its own, watched its own way
_quiet: _Quiet | None = None
_quiet_lock = threading.Lock()
_forking: dict[int, tuple[_Quiet, int]] = {}  # a forking thread's window and its place in it


@contextlib.contextmanager
def exempt() -> Iterator[None]:
    """Forks inside are the caller's own (devlab's launcher): no quiet window for them."""
    global _exempt
    _exempt += 1
    try:
        yield
    finally:
        _exempt -= 1


def _quiet_before() -> None:
    global _quiet
    if not _unannounced or _barrier._window is not None or _exempt:
        return
    # Held across the fork: the timer cannot close the window's descriptors under it.
    _quiet_lock.acquire()
    try:
        window = _quiet
        if window is None:
            if not store_thread_running():
                _quiet_lock.release()
                return
            window = _open_quiet()
            _quiet = window
        _forking[threading.get_ident()] = (window, window.forked)
        window.forked += 1
        window.last = time.monotonic()
    except BaseException:
        _quiet_lock.release()
        raise


def _open_quiet() -> _Quiet:
    try:
        timeout = hang_timeout()
    except ValueError as e:  # a fork hook cannot raise: the children run unwatched
        os.write(2, f"devlab: no hang report for these forks: {e}\n".encode())
        timeout = None
    read_fd, write_fd = os.pipe()  # close-on-exec
    try:
        slots = mmap.mmap(-1, QUIET_SLOTS * SLOT.size)  # zeros: no child's progress yet
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    return _Quiet(read_fd, write_fd, slots, timeout, os.getpid())


def _quiet_after_in_parent() -> None:
    mine = _forking.pop(threading.get_ident(), None)
    if mine is None:
        return
    window = mine[0]
    try:
        window.last = time.monotonic()  # the quiet period counts from the fork's end
        if window.timer is None:
            window.timer = threading.Thread(target=_close_when_quiet, args=(window,),
                                            name="devlab-fork-quiet", daemon=True)
            window.timer.start()
    finally:
        _quiet_lock.release()


def _close_when_quiet(window: _Quiet) -> None:
    """The parent's timer: once it has not forked for QUIET seconds, the window's children
    read the end of its pipe and start."""
    global _quiet
    while True:
        with _quiet_lock:
            left = window.last + QUIET - time.monotonic()
            if left <= 0:
                if _quiet is window:
                    _quiet = None
                os.close(window.write_fd)
                os.close(window.read_fd)
                window.slots.close()  # the children keep their own mappings
                return
        time.sleep(left)


def _quiet_after_in_child() -> None:
    global _quiet, _quiet_lock, _forking
    mine = _forking.get(threading.get_ident())
    _quiet, _forking = None, {}
    # The forking thread held it; the timer thread is not in this process.
    _quiet_lock = threading.Lock()
    if mine is None:
        return
    window, index = mine
    try:
        os.close(window.write_fd)
        wait_for_parent(window.read_fd)  # the pipe's end: the window closed, or the parent died
        os.close(window.read_fd)
        if window.timeout is not None and index < QUIET_SLOTS:
            SLOT.pack_into(window.slots, index * SLOT.size, time.monotonic())
            start_watchdog(window.slots, index, QUIET_SLOTS, window.timeout, window.parent)
    except Exception as e:  # noqa: BLE001 - a fork hook cannot raise; the child runs unwatched
        os.write(2, f"devlab: the fork barrier failed in this child: {e!r}\n".encode())


os.register_at_fork(before=_quiet_before, after_in_parent=_quiet_after_in_parent,
                    after_in_child=_quiet_after_in_child)
