"""Pending work the host or another stream must wait for, and the findings when it does not.

A simulated GPU computes every value in program order, so a program that forgets a sync gets
the right answer here where a real GPU gives it garbage now and then. The simulation knows
what a GPU would still have pending, though, and says so (Note [Pending work is a finding]):

- **read before sync**: a `non_blocking` copy from a GPU into pinned host memory
  (`x.to("cpu", non_blocking=True)`, `dst.copy_(x, non_blocking=True)`) is unfinished until
  the host waits for the stream that queued it (`torch.cuda.synchronize()`,
  `Stream.synchronize()`, `Event.synchronize()` or a True `query()` of an event recorded after
  it, a blocking copy or `.item()` on that stream); a host op on the copy's tensor before then
  reads memory the GPU may not have written yet.
- **freed while in use**: a GPU tensor allocated on one stream and used by work queued on
  another is freed (its last reference dropped) with neither `t.record_stream(other)` nor the
  allocating stream made to wait for the other (`wait_stream`, `wait_event`), nor the host
  having waited for it: CUDA's caching allocator hands the block to the allocating stream's
  next allocation while the other stream's kernel may still read it.
- **read of freed memory**: a `non_blocking` copy to the host queued on one stream reads a GPU
  tensor allocated on another (activation offloading, an asynchronous checkpoint's staging on a
  side stream), and the tensor is freed before the copy is waited for, with neither
  `t.record_stream(copy_stream)` nor the allocating stream made to wait: the allocator hands the
  block to the allocating stream's next tensor, whose values the copy may carry to the host.
  CPU-only CI never sees it (no streams, no caching allocator), and on a real GPU the host reads
  the wrong values only when the next kernel wins the race.

Each finding names the line that queued the work and the line that read (or freed) too early.
Where they go: to every listener `listen()` registered (the pytest plugin fails the test with
them); with none, a `GpuHazardWarning` (the lab: a warning, never an error).

The bookkeeping is a counter of work per (GPU, stream) and how far the host, and each stream,
has waited for each other stream; nothing is kept for a program that never copies
non-blocking to the host and never leaves the default stream, and every check is behind one
module flag (`armed`, `tracking`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

PENDING = "_devlab_pending"  # a host storage a non-blocking copy still writes: its _Pending

READ_BEFORE_SYNC = "read-before-sync"
FREED_WHILE_IN_USE = "freed-while-in-use"
READ_OF_FREED = "read-of-freed-memory"

_lock = threading.RLock()
# Work queued so far on each (GPU, stream), how far the host has waited for each, and how far
# each (GPU, waiting stream, waited-for stream) pair has waited.
_queued: dict[tuple[int, int], int] = {}
_host_waited: dict[tuple[int, int], int] = {}
_stream_waited: dict[tuple[int, int, int], int] = {}
# Host storages with a non-blocking copy pending (weakly: a storage let go has no reader).
_pending: weakref.WeakSet = weakref.WeakSet()
armed = False  # some host storage has a copy pending: the mode checks what a call reads
tracking = False  # some thread left the default stream: GPU ops note their streams
# id(block) -> the other streams a GPU tensor's block was used on: {stream: (count, where)}.
_uses: dict[int, dict[int, tuple[int, str]]] = {}
# id(block) -> the other streams whose non_blocking copies to the host read it: {stream:
# (count, where)}; a free before they are waited for is a read of freed memory.
_host_reads: dict[int, dict[int, tuple[int, str]]] = {}

_listeners: list[Callable[[Finding], None]] = []
_observers: list[Callable[[Finding], None]] = []


class GpuHazardWarning(UserWarning):
    """What a simulated GPU found a real one would get wrong now and then (a finding)."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """One hazard: what it is, the line that queued the work and the line that came too early."""

    kind: str  # READ_BEFORE_SYNC, FREED_WHILE_IN_USE or READ_OF_FREED
    message: str
    queued_at: str
    early_at: str

    def __str__(self) -> str:
        verb = "read" if self.kind == READ_BEFORE_SYNC else "freed"
        return f"{self.message}\n  queued at: {self.queued_at}\n  {verb} at:  {self.early_at}"


@dataclasses.dataclass
class _Pending:
    index: int
    stream: int
    count: int
    where: str


def listen(callback: Callable[[Finding], None]) -> Callable[[], None]:
    """Send every finding to `callback` (instead of a warning) until the returned function is
    called."""
    with _lock:
        _listeners.append(callback)

    def remove() -> None:
        with _lock:
            if callback in _listeners:
                _listeners.remove(callback)
    return remove


def observe(callback: Callable[[Finding], None]) -> Callable[[], None]:
    """Also tell `callback` of every finding (the placement log notes them), whoever else takes
    it, until the returned function is called."""
    with _lock:
        _observers.append(callback)

    def remove() -> None:
        with _lock:
            if callback in _observers:
                _observers.remove(callback)
    return remove


def reset() -> None:
    """Forget all pending work (a simulation starts or stops, a test starts afresh)."""
    global armed, tracking
    if not (armed or tracking or _queued or _pending or _uses or _host_reads):
        return  # nothing was ever noted since the last reset (most tests)
    with _lock:
        for s in list(_pending):
            try:
                delattr(s, PENDING)
            except AttributeError:
                pass
        _pending.clear()
        _queued.clear()
        _host_waited.clear()
        _stream_waited.clear()
        _uses.clear()
        _host_reads.clear()
        armed = False
        tracking = False


# --- where ----------------------------------------------------------------------------------

_DEVLAB_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_SKIP = (_DEVLAB_DIR + os.sep, _TORCH_DIR + os.sep)


def skip_frames_of(*dirs: str) -> None:
    """Name a finding's lines past these directories' files too (a test runner's own frames,
    which call the test: the pytest plugin passes pytest's and pluggy's)."""
    global _SKIP
    _SKIP = tuple(dict.fromkeys((*_SKIP, *(os.path.abspath(d) + os.sep for d in dirs))))


def _user_frame() -> Any:
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename.startswith(_SKIP)
                             or f.f_code.co_filename.startswith("<frozen")):
        f = f.f_back
    return f


def user_line() -> str:
    """`file:line in function` of the innermost frame that is neither devlab's nor torch's (the
    user's call), with the line's text."""
    f = _user_frame()
    if f is None:
        return "(unknown)"
    import linecache

    text = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
    where = f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"
    return f"{where}: {text}" if text else where


def _report(finding: Finding) -> None:
    with _lock:
        listeners = list(_listeners)
        observers = list(_observers)
    for cb in observers:
        cb(finding)
    if listeners:
        for cb in listeners:
            cb(finding)
        return
    f = _user_frame()  # the warning points at the user's line, as the finding does
    if f is None:
        warnings.warn(GpuHazardWarning(str(finding)), stacklevel=2)
    else:
        warnings.warn_explicit(GpuHazardWarning(str(finding)), GpuHazardWarning,
                               f.f_code.co_filename, f.f_lineno,
                               module=f.f_globals.get("__name__"),
                               registry=f.f_globals.setdefault("__warningregistry__", {}))


# --- the host and non-blocking copies --------------------------------------------------------


def _bump(index: int, stream: int) -> int:
    key = (index, stream)
    n = _queued.get(key, 0) + 1
    _queued[key] = n
    return n


def queued_to_host(storage: torch.UntypedStorage, index: int, stream: int,
                   source: Any = None) -> None:
    """A non-blocking copy from GPU `index`'s `stream` into pinned host `storage` was queued;
    `source` is the GPU tensor's allocator block (its `stream` the one it was allocated on)."""
    global armed
    with _lock:
        n = _bump(index, stream)
        where = user_line()
        setattr(storage, PENDING, _Pending(index, stream, n, where))
        _pending.add(storage)
        armed = True
        if source is not None and source.stream != stream:
            _host_reads.setdefault(id(source), {})[stream] = (n, where)


def mark(index: int, stream: int) -> int:
    """How much work GPU `index`'s `stream` has queued by now (an event's position)."""
    with _lock:
        return _queued.get((index, stream), 0)


def host_waited(index: int | None, stream: int | None = None, upto: int | None = None) -> None:
    """The host waited for GPU `index`'s `stream` (every stream if None; every GPU if `index` is
    None) up to `upto` (what `mark` gave; None: all its work queued so far)."""
    global armed
    if not (armed or tracking):
        return
    with _lock:
        keys = [k for k in _queued if (index is None or k[0] == index)
                and (stream is None or k[1] == stream)]
        for k in keys:
            n = _queued[k] if upto is None else min(upto, _queued[k])
            if n > _host_waited.get(k, 0):
                _host_waited[k] = n
        for s in list(_pending):
            p = getattr(s, PENDING, None)
            if p is None or _host_waited.get((p.index, p.stream), 0) >= p.count:
                if p is not None:
                    delattr(s, PENDING)
                _pending.discard(s)
        armed = bool(_pending)


def check_read(storages: list[Any]) -> None:
    """A host call is about to read these storages: a finding for each a copy still writes."""
    for s in storages:
        p = getattr(s, PENDING, None)
        if p is None:
            continue
        with _lock:
            if _host_waited.get((p.index, p.stream), 0) >= p.count:
                continue
            try:
                delattr(s, PENDING)  # one finding per copy
            except AttributeError:
                continue
            _pending.discard(s)
            global armed
            armed = bool(_pending)
        stream = "the default stream" if p.stream == 0 else f"stream {p.stream}"
        _report(Finding(
            READ_BEFORE_SYNC,
            f"a non_blocking copy from cuda:{p.index} to the host was read before the host "
            f"waited for it: on a real GPU the copy on {stream} may not have finished, and "
            "this read sees stale or partial values. Synchronize first "
            "(torch.cuda.synchronize(), the stream's synchronize(), or an Event recorded after "
            "the copy and synchronized).",
            p.where, user_line()))


# --- streams and the caching allocator -------------------------------------------------------


def left_default_stream() -> None:
    """A thread made a non-default stream current: from now on GPU ops note their streams."""
    global tracking
    tracking = True


def used_on(index: int, stream: int, blocks: list[Any]) -> None:
    """Work on GPU `index`'s `stream` was queued that uses these blocks (of its tensors)."""
    with _lock:
        n = _bump(index, stream)
        where = None
        for b in blocks:
            if b is None or b.stream == stream:
                continue
            if where is None:
                where = user_line()
            _uses.setdefault(id(b), {})[stream] = (n, where)


def stream_waited(index: int, waiting: int, other: int, upto: int | None = None) -> None:
    """GPU `index`'s `waiting` stream waits for `other` up to `upto` (None: all it queued)."""
    if not tracking:
        return
    with _lock:
        n = _queued.get((index, other), 0) if upto is None else upto
        key = (index, waiting, other)
        if n > _stream_waited.get(key, 0):
            _stream_waited[key] = n


def _late(index: int, block: Any, uses: dict[int, tuple[int, str]] | None
          ) -> list[tuple[int, str]]:
    """The other streams' uses of `block` nothing waited for before it is freed."""
    late = []
    for stream, (n, where) in (uses or {}).items():
        if block.stream_uses and stream in block.stream_uses:
            continue  # record_stream: the allocator holds the block for that stream
        if _host_waited.get((index, stream), 0) >= n:
            continue
        if _stream_waited.get((index, block.stream, stream), 0) >= n:
            continue
        late.append((stream, where))
    return late


def freed(index: int, block: Any) -> None:
    """A GPU tensor's block is being freed: a finding if another stream may still use it, or
    a non_blocking copy to the host on another stream may still read it."""
    with _lock:
        late = _late(index, block, _uses.pop(id(block), None))
        reads = _late(index, block, _host_reads.pop(id(block), None))
    for stream, where in reads:
        _report(Finding(
            READ_OF_FREED,
            f"a tensor of cuda:{index} allocated on stream {block.stream} was freed while a "
            f"non_blocking copy to the host queued on stream {stream} may still read it: CUDA's "
            f"caching allocator can hand its memory to the next allocation on stream "
            f"{block.stream} at once, and the host then reads that tensor's values. Call "
            f"t.record_stream(stream) for the copy's stream, or make stream {block.stream} "
            "wait for it (wait_stream / wait_event) before the tensor is freed.",
            where, user_line()))
    for stream, where in late:
        _report(Finding(
            FREED_WHILE_IN_USE,
            f"a tensor of cuda:{index} allocated on stream {block.stream} was freed while work "
            f"queued on stream {stream} may still use it: CUDA's caching allocator can hand its "
            f"memory to the next allocation on stream {block.stream} at once. Call "
            f"t.record_stream(stream) for the other stream, or make stream {block.stream} "
            "wait for it (wait_stream / wait_event) before the tensor is freed.",
            where, user_line()))
