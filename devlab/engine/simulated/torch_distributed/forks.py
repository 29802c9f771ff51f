"""Ranks forked or spawned while GPUs are simulated: a barrier at their start, a watchdog for hangs.

`torch.multiprocessing.start_processes(start_method="fork")` is how torch elastic's agent
(accelerate's `notebook_launcher`) and Lightning's `ddp_notebook` start their ranks. It forks one
child after another from a process that has threads, and each child starts at once: rank 0
connects to the agent's TCPStore while the parent forks rank 1. The store's server thread names
each peer with `getnameinfo` (c10d's `formatSockAddr`, which asks for a host name: only
`NI_NUMERICSERV`), and glibc's resolver takes one process-wide lock there (`resolv_conf.c`'s
`lock`, in `__resolv_conf_get_current`, from `__resolv_context_get`). glibc's `fork` resets its
malloc, stdio, NSS and loader locks in the child, not that one (posix/fork.c as of glibc 2.34;
this machine's is 2.36), so a child forked while the server thread held it never gets past its
own `getnameinfo`, the one its TCPStore client makes on connecting (the hang of issue 29).
c10d's socket.cpp makes that call on every connect and accept, with no switch to make it
numeric (it stops only after a lookup fails), so the children cannot be kept from it.

The barrier: while start_processes forks (the fork window), each child waits, before it runs
anything, until the parent has forked them all. No child can connect to anything of the
parent's while the parent still forks, so no thread of the parent resolves a peer's name then.
A pipe carries it: the parent counts the forks of the window and writes one byte per child when
the window closes (on an error or interrupt too); a child whose parent died reads the pipe's
end instead. Only the window's children wait: their own forks later (DataLoader workers) do not.

The watchdog: each child of a window starts a thread that watches the processor time its
process uses. A process blocked for good (a lock, a peer that never comes) uses none; one that
computes or talks to its peers does. The children share one slot each (an anonymous shared
mapping made before the forks) with the last time they made progress; once none of them has
for `hang_timeout()` seconds, each writes where its threads wait to its stderr, which a
notebook shows under the cell, and exits with status 124 (HANG_EXIT), so the launcher in the
cell raises rather than waiting for ever. faulthandler's own timer backs the thread up, should a
hang keep the thread from Python (the GIL held while blocked).

Forks no launcher announces (a program's own `multiprocessing` fork loop, `os.fork`): while
simulating, a fork from a process in which a c10d store server thread runs (`pt_tcpstore*`)
opens a *quiet window*: its children wait until the parent has not forked for QUIET seconds (a
timer thread in the parent closes the pipe they wait on) or has died. They are watched too, with
the parent's processor time counting as progress, except DataLoader workers. Forks from a
process without a store thread are untouched.

Spawned ranks (`start_method="spawn"` or `"forkserver"`: mp.spawn, torch elastic) inherit
nothing: start_processes wraps their function so that each child maps a small file of slots and
starts the same watchdog before the rank's code runs.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import math
import mmap
import os
import select
import struct
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from devlab.engine.simulated.base.import_patches import when_imported
from devlab.engine.simulated.base.patcher import Patcher

HANG_ENV = "DEVLAB_HANG_TIMEOUT"
DEFAULT_HANG_TIMEOUT = 180.0
# A rank the hang report stops exits with this (timeout(1)'s code), so launchers name it.
HANG_EXIT = 124
# A child goes on after this long without the parent's word (a parent stuck in its fork loop):
# the watchdog still reports it if it then hangs.
BARRIER_WAIT = 120.0
# Below this share of a period's wall time in processor time, a process counts as waiting:
# the watchdog's own check costs microseconds; a polling loop sleeping 10 ms uses ~0.2%.
IDLE_SHARE = 0.02
_SLOT = struct.Struct("d")
_UNSET = object()
_PROCESS_PY = os.path.join("multiprocessing", "process.py")

_hang_timeout: Any = _UNSET  # set_hang_timeout's value; _UNSET: the environment's, or default


@dataclass
class _Window:
    """One start_processes' forks, as parent and children see it."""

    read_fd: int
    write_fd: int
    slots: mmap.mmap
    count: int
    timeout: float | None
    forked: int = 0  # forks in the window so far; in a child, its place among them


_window: _Window | None = None
# Two threads' windows one after the other: each counts its own forks.
_window_lock = threading.Lock()


def _check_timeout(seconds: Any, what: str) -> float | None:
    if seconds is None:
        return None
    if (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
            or not 0 < seconds <= threading.TIMEOUT_MAX or math.isnan(seconds)):
        raise ValueError(f"{what} is a number of seconds greater than 0 and at most "
                         f"{threading.TIMEOUT_MAX:g} (or None to switch the hang report off), "
                         f"got {seconds!r}")
    return float(seconds)


def set_hang_timeout(seconds: float | None) -> None:
    """How long the ranks of a launch (forked or spawned) may all wait before each reports
    where it waits and stops (default 180 s, or the environment's DEVLAB_HANG_TIMEOUT);
    None: never."""
    global _hang_timeout
    _hang_timeout = _check_timeout(seconds, "the hang timeout")


def reset_hang_timeout() -> None:
    """Back to DEVLAB_HANG_TIMEOUT's value, or the default."""
    global _hang_timeout
    _hang_timeout = _UNSET


def hang_timeout() -> float | None:
    """The hang timeout the next launch gets: set_hang_timeout's, else DEVLAB_HANG_TIMEOUT's
    (seconds, or "off"), else 180 s."""
    if _hang_timeout is not _UNSET:
        return _hang_timeout  # type: ignore[no-any-return]
    raw = os.environ.get(HANG_ENV, "").strip()
    if not raw:
        return DEFAULT_HANG_TIMEOUT
    if raw.lower() in ("off", "none", "0"):
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= threading.TIMEOUT_MAX:
        raise ValueError(f"{HANG_ENV} is a number of seconds greater than 0, or 'off', "
                         f"got {raw!r}")
    return value


@contextlib.contextmanager
def fork_window(count: int) -> Iterator[None]:
    """Children forked inside wait until it ends, then watch for hangs (`count`: how many)."""
    global _window
    timeout = hang_timeout()  # a bad DEVLAB_HANG_TIMEOUT fails here, before anything starts
    with _window_lock:
        read_fd, write_fd = os.pipe()  # close-on-exec: an exec'd child does not keep it
        try:
            slots = mmap.mmap(-1, _SLOT.size * max(count, 1))  # shared: the children's one
        except BaseException:
            os.close(read_fd)
            os.close(write_fd)
            raise
        now = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
        for i in range(max(count, 1)):
            _SLOT.pack_into(slots, i * _SLOT.size, now)
        window = _Window(read_fd, write_fd, slots, max(count, 1), timeout)
        _window = window
        try:
            yield
        finally:
            _window = None
            try:
                _release(window)
            finally:
                os.close(write_fd)
                os.close(read_fd)
                slots.close()  # the children keep their own mappings


def _release(window: _Window) -> None:
    data = b"\0" * window.forked
    while data:
        try:
            data = data[os.write(window.write_fd, data):]
        except InterruptedError:
            continue


def _after_in_parent() -> None:
    if _window is not None:
        _window.forked += 1


def _after_in_child() -> None:
    global _window, _window_lock
    window, _window = _window, None
    # The forking thread held it; the child's own launches need a free one.
    _window_lock = threading.Lock()
    if window is None:
        return
    try:
        os.close(window.write_fd)
        _wait_for_parent(window.read_fd)
        os.close(window.read_fd)
        if window.timeout is not None:
            _start_watchdog(window.slots, window.forked, window.count, window.timeout)
    except Exception as e:  # noqa: BLE001 - a fork hook cannot raise; the child runs unwatched
        os.write(2, f"devlab: the fork barrier failed in this child: {e!r}\n".encode())


def _wait_for_parent(fd: int) -> None:
    deadline = time.monotonic() + BARRIER_WAIT
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                os.read(fd, 1)  # one byte per child, or b"" once the parent is gone
                return
        except InterruptedError:
            continue


def _start_watchdog(slots: mmap.mmap, index: int, count: int, timeout: float,
                    parent: int | None = None) -> None:
    """Watch this process for hangs, in slot `index` of `count`; with `parent` (a pid), also
    count that process's work as progress and stop watching in a DataLoader worker."""
    period = min(1.0, timeout / 10)
    # Should this thread never get the GIL back (a hang holding it), faulthandler's own thread
    # dumps the stacks and exits instead; the loop below keeps pushing that back.
    faulthandler.dump_traceback_later(timeout + 3 * period, exit=True, file=2)
    thread = threading.Thread(target=_watch, args=(slots, index, count, timeout, period, parent),
                              name="devlab-hang-watchdog", daemon=True)
    thread.start()


def _cpu_of(pid: int) -> float | None:
    """Processor time `pid` has used, in clock ticks (None: gone, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return float(int(fields[11]) + int(fields[12]))  # utime, stime (proc(5): 14, 15)
    except (OSError, IndexError, ValueError):
        return None


def _in_dataloader_worker() -> bool:
    worker = sys.modules.get("torch.utils.data._utils.worker")
    return worker is not None and getattr(worker, "_worker_info", None) is not None


def _watch(slots: mmap.mmap, index: int, count: int, timeout: float, period: float,
           parent: int | None = None) -> None:
    cpu = time.process_time()
    parent_cpu = _cpu_of(parent) if parent is not None else None
    tick = os.sysconf("SC_CLK_TCK") if parent is not None else 100
    while True:
        time.sleep(period)
        now = time.monotonic()
        used = time.process_time()
        busy = used - cpu >= IDLE_SHARE * period
        cpu = used
        if parent is not None:
            # A child forked without a launcher may be a pool's or a DataLoader's worker that
            # waits while its parent computes: that is no hang. A DataLoader worker is left
            # alone altogether (its loader has its own timeout).
            if _in_dataloader_worker():
                faulthandler.cancel_dump_traceback_later()
                return
            theirs = _cpu_of(parent) if os.getppid() == parent else None
            if theirs is not None and parent_cpu is not None:
                busy = busy or (theirs - parent_cpu) / tick >= IDLE_SHARE * period
            parent_cpu = theirs
        if busy and index < count:
            _SLOT.pack_into(slots, index * _SLOT.size, now)
        last = max(_SLOT.unpack_from(slots, i * _SLOT.size)[0] for i in range(count))
        if now - last >= timeout:
            _report_and_exit(index, timeout, period)
        faulthandler.dump_traceback_later(timeout + 3 * period, exit=True, file=2)


def _report_and_exit(index: int, timeout: float, period: float) -> None:
    faulthandler.cancel_dump_traceback_later()
    rank = os.environ.get("RANK")
    who = f"rank {rank}" if rank is not None else f"process {index} of the launch"
    lines = [f"\ndevlab: no process of this launch made progress for {timeout:g} s "
             f"({HANG_ENV}, devlab.simulated.set_hang_timeout): {who} (pid {os.getpid()}) "
             "stops; it waits here:\n"]
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    frames = sys._current_frames()
    # the main thread first: that is where the rank's own code waits
    for ident in sorted(frames, key=lambda i: i != threading.main_thread().ident):
        if ident == me:
            continue
        lines.append(f"Thread {names.get(ident, ident)!s}:\n")
        lines.extend(traceback.format_list(_own_part(traceback.extract_stack(frames[ident]))))
    del frames
    _say("".join(lines))
    # The others see the same slots within a period: once this one exits, its launcher stops
    # them, and their report would be lost.
    time.sleep(2 * period)
    os._exit(HANG_EXIT)


def _say(text: str) -> None:
    """Write to this process's stderr as Python sees it: in a kernel's child that is the
    kernel's stream, which shows under the cell (its file descriptor 2 goes to the kernel's
    terminal), elsewhere file descriptor 2."""
    stream = sys.stderr
    if stream is not None and stream is not sys.__stderr__:
        try:
            sys.stdout.flush()
            stream.write(text)
            stream.flush()
            return
        except Exception:  # noqa: BLE001, S110 - then straight to the descriptor
            pass
    os.write(2, text.encode("utf-8", "replace"))


def _own_part(stack: traceback.StackSummary) -> list[traceback.FrameSummary]:
    """The frames from the child's start on: a forked child's stack also holds the parent's
    frames that called fork, which say nothing about where the child waits."""
    starts = [i for i, f in enumerate(stack)
              if f.name == "_bootstrap" and f.filename.endswith(_PROCESS_PY)]
    return list(stack[starts[-1] + 1:] if starts else stack)


# -- forks no launcher announces (multiprocessing, os.fork) ---------------------------------

# A process holds a c10d store server while one of these threads runs (torch names them:
# `pt_tcpstore_uv`, libuv's server, the default; `pt_tcpstore`, the older one; torch 2.13).
STORE_THREAD = b"pt_tcpstore"
# A quiet window's children start once their parent has not forked for this long.
QUIET = 0.15
# A quiet window's watchdog slots (one page): children past these run unwatched.
QUIET_SLOTS = mmap.PAGESIZE // _SLOT.size


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


def store_thread_running() -> bool:
    """Whether a c10d store server thread runs in this process (Linux's /proc names them)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return False
    if len(tids) < 2:
        return False  # only the forking thread
    for tid in tids:
        try:
            fd = os.open(f"/proc/self/task/{tid}/comm", os.O_RDONLY)
        except OSError:
            continue  # a thread that just ended
        try:
            if os.read(fd, 32).startswith(STORE_THREAD):
                return True
        except OSError:
            pass
        finally:
            os.close(fd)
    return False


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
    if not _unannounced or _window is not None or _exempt:
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
        slots = mmap.mmap(-1, QUIET_SLOTS * _SLOT.size)  # zeros: no child's progress yet
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
        _wait_for_parent(window.read_fd)  # the pipe's end: the window closed, or the parent died
        os.close(window.read_fd)
        if window.timeout is not None and index < QUIET_SLOTS:
            _SLOT.pack_into(window.slots, index * _SLOT.size, time.monotonic())
            _start_watchdog(window.slots, index, QUIET_SLOTS, window.timeout, window.parent)
    except Exception as e:  # noqa: BLE001 - a fork hook cannot raise; the child runs unwatched
        os.write(2, f"devlab: the fork barrier failed in this child: {e!r}\n".encode())


# -- spawned ranks ----------------------------------------------------------------------------


class _Watched:
    """A spawned launch's function, run under the hang watchdog: the children share a small
    file of slots (a spawned child inherits no mapping), which the parent removes."""

    def __init__(self, fn: Callable[..., Any], path: str, count: int, timeout: float) -> None:
        self.fn, self.path, self.count, self.timeout = fn, path, count, timeout

    def __call__(self, index: int, *args: Any) -> Any:
        try:
            with open(self.path, "r+b") as f:
                slots = mmap.mmap(f.fileno(), self.count * _SLOT.size)
            _SLOT.pack_into(slots, index * _SLOT.size, time.monotonic())
            _start_watchdog(slots, index, self.count, self.timeout)
        except Exception as e:  # noqa: BLE001 - the rank runs on, unwatched, and says so
            _say(f"devlab: no hang report for this rank: {e!r}\n")
        return self.fn(index, *args)


def _slots_file(count: int) -> str:
    fd, path = tempfile.mkstemp(prefix="devlab-hang-")
    try:
        now = time.monotonic()
        os.write(fd, b"".join(_SLOT.pack(now) for _ in range(count)))
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return path


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _watched_spawn(original: Callable[..., Any], fn: Callable[..., Any], args: tuple[Any, ...],
                   nprocs: int, join: bool, daemon: bool, start_method: str) -> Any:
    timeout = hang_timeout()  # a bad DEVLAB_HANG_TIMEOUT fails here, before anything starts
    if timeout is None or nprocs < 1:
        return original(fn, args, nprocs, join, daemon, start_method)
    path = _slots_file(nprocs)
    try:
        context = original(_Watched(fn, path, nprocs, timeout), args, nprocs, False, daemon,
                           start_method)
    except BaseException:
        _unlink(path)
        raise
    if not join:
        # torch elastic keeps the context while its ranks run
        weakref.finalize(context, _unlink, path)
        return context
    try:
        while not context.join():  # as torch's own start_processes joins
            pass
    finally:
        _unlink(path)
    return None


def _barriered(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch.multiprocessing.start_processes, whose forked children start together."""

    @functools.wraps(original)
    def start_processes(fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int = 1,
                        join: bool = True, daemon: bool = False,
                        start_method: str = "spawn") -> Any:
        if start_method in ("spawn", "forkserver"):
            return _watched_spawn(original, fn, args, nprocs, join, daemon, start_method)
        if start_method != "fork":
            return original(fn, args, nprocs, join, daemon, start_method)
        with fork_window(nprocs):
            context = original(fn, args, nprocs, False, daemon, start_method)
        if not join:
            return context
        while not context.join():  # as torch's own start_processes joins
            pass
        return None

    return start_processes


def install(p: Patcher) -> None:
    global _unannounced
    _unannounced = True

    def unannounced_off() -> None:
        global _unannounced
        _unannounced = False

    p.on_restore(unannounced_off)

    def patch(module: ModuleType) -> None:
        spawn = sys.modules["torch.multiprocessing.spawn"]
        ours = _barriered(spawn.start_processes)
        # torch.multiprocessing's name (elastic, Lightning, accelerate) and spawn.py's own
        # (mp.spawn calls it there)
        p.set(spawn, "start_processes", ours)
        p.set(module, "start_processes", ours)

    when_imported(p, "torch.multiprocessing", patch)


os.register_at_fork(after_in_parent=_after_in_parent, after_in_child=_after_in_child)
os.register_at_fork(before=_quiet_before, after_in_parent=_quiet_after_in_parent,
                    after_in_child=_quiet_after_in_child)
