"""The fork barrier: the ranks torch's launchers fork start together, once all are forked.

While start_processes forks (the fork window), each child waits, before it runs anything, until
the parent has forked them all. No child can connect to anything of the parent's while the
parent still forks, so no thread of the parent resolves a peer's name then (the hazard of
`fork_hazard`). A pipe carries it: the parent counts the forks of the window and writes one byte
per child when the window closes (on an error or interrupt too); a child whose parent died
reads the pipe's end instead. Only the window's children wait: their own forks later
(DataLoader workers) do not. Each child of a window then starts the hang watchdog
(`hang_report`).
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from devlab.engine.simulated.torch_distributed.fork_safety.fork_hazard import wait_for_parent
from devlab.engine.simulated.torch_distributed.fork_safety.hang_report import (
    SLOT,
    hang_timeout,
    start_watchdog,
    watched_spawn,
)


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


@contextlib.contextmanager
def fork_window(count: int) -> Iterator[None]:
    """Children forked inside wait until it ends, then watch for hangs (`count`: how many)."""
    global _window
    timeout = hang_timeout()  # a bad DEVLAB_HANG_TIMEOUT fails here, before anything starts
    with _window_lock:
        read_fd, write_fd = os.pipe()  # close-on-exec: an exec'd child does not keep it
        try:
            slots = mmap.mmap(-1, SLOT.size * max(count, 1))  # shared: the children's one
        except BaseException:
            os.close(read_fd)
            os.close(write_fd)
            raise
        now = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
        for i in range(max(count, 1)):
            SLOT.pack_into(slots, i * SLOT.size, now)
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
        wait_for_parent(window.read_fd)
        os.close(window.read_fd)
        if window.timeout is not None:
            start_watchdog(window.slots, window.forked, window.count, window.timeout)
    except Exception as e:  # noqa: BLE001 - a fork hook cannot raise; the child runs unwatched
        os.write(2, f"devlab: the fork barrier failed in this child: {e!r}\n".encode())


def barriered(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch.multiprocessing.start_processes, whose forked children start together."""

    @functools.wraps(original)
    def start_processes(fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int = 1,
                        join: bool = True, daemon: bool = False,
                        start_method: str = "spawn") -> Any:
        if start_method in ("spawn", "forkserver"):
            return watched_spawn(original, fn, args, nprocs, join, daemon, start_method)
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


os.register_at_fork(after_in_parent=_after_in_parent, after_in_child=_after_in_child)
