"""The hang watchdog and its report, for every rank of a launch (forked or spawned).

Each child of a fork window (`barrier`, `quiet_window`) starts a thread that watches the
processor time its process uses. A process blocked for good (a lock, a peer that never comes)
uses none; one that computes or talks to its peers does. The children share one slot each (an
anonymous shared mapping made before the forks) with the last time they made progress; once
none of them has for `hang_timeout()` seconds, each writes where its threads wait to its
stderr, which a notebook shows under the cell, and exits with status 124 (HANG_EXIT), so the
launcher in the cell raises rather than waiting for ever. faulthandler's own timer backs the
thread up, should a hang keep the thread from Python (the GIL held while blocked).

Spawned ranks (`start_method="spawn"` or `"forkserver"`: mp.spawn, torch elastic) inherit
nothing: start_processes wraps their function (`watched_spawn`) so that each child maps a small
file of slots and starts the same watchdog before the rank's code runs.
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import math
import mmap
import os
import struct
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from devlab.engine.simulated.base import machine as _machine

HANG_ENV = "DEVLAB_HANG_TIMEOUT"
DEFAULT_HANG_TIMEOUT = 180.0
# A rank the hang report stops exits with this (timeout(1)'s code), so launchers name it.
HANG_EXIT = 124
# Below this share of a period's wall time in processor time, a process counts as waiting:
# the watchdog's own check costs microseconds; a polling loop sleeping 10 ms uses ~0.2%.
IDLE_SHARE = 0.02
# A pool's parent counts as computing for its waiting children above this share of the last
# hang timeout's wall time: the kernel samples its time in clock ticks (10 ms), so a waiting
# parent whose own threads (a store's, the register's, a library's) use a few per cent shows
# ticks now and then, and one period's worth says nothing; a computing parent uses a core's.
PARENT_SHARE = 0.1
# devlab's own background threads: their processor time says nothing of a rank's progress.
OWN_THREADS = frozenset({"devlab-gpu-register", "devlab-hang-watchdog"})
SLOT = struct.Struct("d")  # one process's slot: when it last made progress (CLOCK_MONOTONIC)
_UNSET = object()
_PROCESS_PY = os.path.join("multiprocessing", "process.py")

_hang_timeout: Any = _UNSET  # set_hang_timeout's value; _UNSET: the environment's, or default


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


def start_watchdog(slots: mmap.mmap, index: int, count: int, timeout: float,
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


def _rank_cpu() -> float:
    """Processor time of this process's threads but devlab's own background ones
    (OWN_THREADS)."""
    total = time.process_time()
    for t in threading.enumerate():
        if t.name in OWN_THREADS and t.ident is not None:
            with contextlib.suppress(OSError, AttributeError, ValueError, OverflowError):
                total -= time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    return total


def _in_dataloader_worker() -> bool:
    worker = sys.modules.get("torch.utils.data._utils.worker")
    return worker is not None and getattr(worker, "_worker_info", None) is not None


def _watch(slots: mmap.mmap, index: int, count: int, timeout: float, period: float,
           parent: int | None = None) -> None:
    cpu = _rank_cpu()
    tick = os.sysconf("SC_CLK_TCK") if parent is not None else 100
    # the parent's processor time (ticks) over the last `timeout` seconds
    parent_cpu: collections.deque[tuple[float, float]] = collections.deque()
    if parent is not None and (first := _cpu_of(parent)) is not None:
        parent_cpu.append((time.monotonic(), first))
    while True:
        time.sleep(period)
        now = time.monotonic()
        used = _rank_cpu()
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
            if theirs is None:
                parent_cpu.clear()
            else:
                parent_cpu.append((now, theirs))
                while now - parent_cpu[0][0] > timeout:
                    parent_cpu.popleft()
                since, before = parent_cpu[0]
                used_s = (theirs - before) / tick
                busy = busy or used_s >= max(PARENT_SHARE * (now - since), 3 / tick)
        if busy and index < count:
            SLOT.pack_into(slots, index * SLOT.size, now)
        last = max(SLOT.unpack_from(slots, i * SLOT.size)[0] for i in range(count))
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


# -- spawned ranks ----------------------------------------------------------------------------


class _Watched:
    """A spawned launch's function, run under the hang watchdog: the children share a small
    file of slots (a spawned child inherits no mapping), which the parent removes."""

    def __init__(self, fn: Callable[..., Any], path: str, count: int, timeout: float) -> None:
        self.fn, self.path, self.count, self.timeout = fn, path, count, timeout

    def __call__(self, index: int, *args: Any) -> Any:
        try:
            with open(self.path, "r+b") as f:
                slots = mmap.mmap(f.fileno(), self.count * SLOT.size)
            SLOT.pack_into(slots, index * SLOT.size, time.monotonic())
            start_watchdog(slots, index, self.count, self.timeout)
        except Exception as e:  # noqa: BLE001 - the rank runs on, unwatched, and says so
            _say(f"devlab: no hang report for this rank: {e!r}\n")
        return self.fn(index, *args)


# Note [The slots file of a launch whose parent was killed]
# The launch's parent unlinks its slots file when the launch ends (`_unlink`, a finalizer for
# elastic's context), which a SIGKILL of the parent skips. The file's name holds the parent's
# pid, and each new launch sweeps the files of parents no longer alive, as the machine's
# register sweeps its entries (base/machine.py), so none outlives the next launch on this host.
_SLOTS_PREFIX = "devlab-hang-"


def _sweep_slots_files() -> None:
    folder = tempfile.gettempdir()
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if not name.startswith(_SLOTS_PREFIX):
            continue
        pid_text = name[len(_SLOTS_PREFIX):].split("-", 1)[0]
        if pid_text.isdigit() and not _machine.alive(int(pid_text)):
            _unlink(os.path.join(folder, name))


def _slots_file(count: int) -> str:
    _sweep_slots_files()  # See Note [The slots file of a launch whose parent was killed]
    fd, path = tempfile.mkstemp(prefix=f"{_SLOTS_PREFIX}{os.getpid()}-")
    try:
        now = time.monotonic()
        os.write(fd, b"".join(SLOT.pack(now) for _ in range(count)))
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return path


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def watched_spawn(original: Callable[..., Any], fn: Callable[..., Any], args: tuple[Any, ...],
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
