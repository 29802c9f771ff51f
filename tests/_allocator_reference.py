"""A frozen copy of devlab.engine.gpu_model.allocator as it stood on main at commit c5048f1, with
streams' events (`StreamEvents`, `Block.events`, `_process_deferred(only_done=True)`), before its
hot path was tuned: the plain port of CUDACachingAllocator.cpp that
tests/test_allocator_equivalence.py replays random request sequences through beside the tuned
one. Do not edit it to follow the tuned allocator: it is the reference the tuned one must agree
with."""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

KMIN_BLOCK = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
SMALL_SIZE = 1 << 20  # kSmallSize: the largest "small" allocation is 1 MiB
SMALL_BUFFER = 2 << 20  # kSmallBuffer: small allocations are packed in 2 MiB segments
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: requests of 1-10 MiB get a 20 MiB segment
LARGE_BUFFER = 20 << 20  # kLargeBuffer
ROUND_LARGE = 2 << 20  # kRoundLarge: larger segments are rounded up to 2 MiB
SIZE_MAX = (1 << 64) - 1  # max_split_size's default: no block is "oversize"
_MB = 1 << 20
_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB ... 64 GiB

# The statistics CUDA keeps per pool type ("all", "small_pool", "large_pool"), in the order of
# torch._C._cuda_memoryStats.
ARRAY_STATS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
               "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
POOL_TYPES = ("all", "small_pool", "large_pool")


class AllocatorConfigError(ValueError):
    """A PYTORCH_CUDA_ALLOC_CONF that torch would refuse, or that devlab does not model."""


@dataclass(frozen=True)
class AllocatorConfig:
    """The caching allocator's settings (PYTORCH_CUDA_ALLOC_CONF), with torch's defaults."""

    max_split_size: int = SIZE_MAX
    max_non_split_rounding: int = LARGE_BUFFER
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple[int, ...] = (0,) * _INTERVALS
    expandable_segments: bool = False

    @classmethod
    def parse(cls, conf: str | None) -> AllocatorConfig:
        """The settings of a PYTORCH_CUDA_ALLOC_CONF string, read as torch reads it
        (`AllocatorConfig::parseArgs`); a mistake is an `AllocatorConfigError` in torch's words."""
        if not conf:
            return cls()
        tokens = _lex(conf)
        values: dict[str, Any] = {}
        divisions = [0] * _INTERVALS
        i = 0
        while i < len(tokens):
            key = tokens[i]
            if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
                i = _expect(tokens, i + 1, ":")
                mb = _int(tokens, i + 1, key)
                i += 1
                if mb < LARGE_BUFFER // _MB:
                    raise AllocatorConfigError(
                        f"CachingAllocator option {key} too small, must be >= "
                        f"{LARGE_BUFFER // _MB}")
                values["max_split_size" if key == "max_split_size_mb"
                       else "max_non_split_rounding"] = min(mb, SIZE_MAX // _MB) * _MB
            elif key == "garbage_collection_threshold":
                i = _expect(tokens, i + 1, ":")
                try:
                    threshold = float(tokens[i + 1])
                except (IndexError, ValueError):
                    raise AllocatorConfigError(
                        "Error, expecting garbage_collection_threshold value") from None
                i += 1
                if not 0.0 < threshold < 1.0:
                    raise AllocatorConfigError(
                        "garbage_collect_threshold is invalid, set it in (0.0, 1.0)")
                values["garbage_collection_threshold"] = threshold
            elif key == "roundup_power2_divisions":
                i = _expect(tokens, i + 1, ":")
                i = _parse_divisions(tokens, i + 1, divisions)
                values["roundup_power2_divisions"] = tuple(divisions)
            elif key == "expandable_segments":
                i = _expect(tokens, i + 1, ":")
                flag = _flag(tokens, i + 1, key)
                i += 1
                if flag:
                    raise AllocatorConfigError(
                        "PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True is not simulated "
                        "(devlab models CUDA's segments as cudaMalloc makes them); remove it, "
                        "or set expandable_segments:False")
            elif key == "backend":
                i = _expect(tokens, i + 1, ":")
                name = tokens[i + 1] if i + 1 < len(tokens) else ""
                i += 1
                if name == "cudaMallocAsync":
                    raise AllocatorConfigError(
                        "PYTORCH_CUDA_ALLOC_CONF: backend:cudaMallocAsync is not simulated "
                        "(devlab models the native caching allocator); use backend:native")
                if name != "native":
                    raise AllocatorConfigError(
                        "Unknown allocator backend, options are native and cudaMallocAsync")
            elif key in ("release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
                         "pinned_use_background_threads"):
                # Host-side and locking choices: nothing a GPU's memory shows.
                i = _expect(tokens, i + 1, ":")
                _flag(tokens, i + 1, key)
                i += 1
            elif key == "pinned_num_register_threads":
                i = _expect(tokens, i + 1, ":")
                _int(tokens, i + 1, key)
                i += 1
            else:
                raise AllocatorConfigError(f"Unrecognized CachingAllocator option: {key}")
            if i + 1 < len(tokens):
                i = _expect(tokens, i + 1, ",")
            i += 1
        return cls(**values)

    def divisions(self, size: int) -> int:
        """How many parts the power-of-two interval holding `size` is rounded to (0: none)."""
        index = size.bit_length() - 1 - 20  # intervals start at 1 MiB
        return self.roundup_power2_divisions[min(max(index, 0), _INTERVALS - 1)]


def _lex(conf: str) -> list[str]:
    """`AllocatorConfig::lexArgs`: `,` `:` `[` `]` are tokens of their own, spaces vanish."""
    tokens: list[str] = []
    buf = ""
    for ch in conf:
        if ch in ",:[]":
            if buf:
                tokens.append(buf)
                buf = ""
            tokens.append(ch)
        elif ch != " ":
            buf += ch
    if buf:
        tokens.append(buf)
    return tokens


def _expect(tokens: list[str], i: int, ch: str) -> int:
    if i >= len(tokens) or tokens[i] != ch:
        raise AllocatorConfigError(
            f"Error parsing CachingAllocator::AllocatorConfig settings, expected {ch}")
    return i


def _int(tokens: list[str], i: int, key: str) -> int:
    try:
        return int(tokens[i])
    except (IndexError, ValueError):
        raise AllocatorConfigError(f"Error, expecting {key} value") from None


def _flag(tokens: list[str], i: int, key: str) -> bool:
    if i >= len(tokens) or tokens[i] not in ("True", "False"):
        raise AllocatorConfigError(f"Expected a single True/False argument for {key}")
    return tokens[i] == "True"


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _parse_divisions(tokens: list[str], i: int, divisions: list[int]) -> int:
    """`parseRoundUpPower2Divisions`: one number for every interval, or `[MB:N, ..., >:N]`."""
    if i >= len(tokens):
        raise AllocatorConfigError("Error, expecting roundup_power2_divisions value")
    if tokens[i] != "[":
        n = _int(tokens, i, "roundup_power2_divisions")
        if not _power_of_two(n):
            raise AllocatorConfigError("For roundups, the divisons has to be power of 2 ")
        divisions[:] = [n] * _INTERVALS
        return i
    first, last = True, 0
    i += 1
    while i < len(tokens) and tokens[i] != "]":
        interval = tokens[i]
        i = _expect(tokens, i + 1, ":")
        n = _int(tokens, i + 1, "roundup_power2_divisions")
        i += 1
        if n != 0 and not _power_of_two(n):
            raise AllocatorConfigError(
                "For roundups, the divisons has to be power of 2 or 0 to disable roundup ")
        if interval == ">":
            divisions[last:] = [n] * (_INTERVALS - last)
        else:
            try:
                mb = int(interval)
            except ValueError:
                raise AllocatorConfigError("Error parsing roundup_power2_divisions value") from None
            if not _power_of_two(mb):
                raise AllocatorConfigError("For roundups, the intervals have to be power of 2 ")
            index = min(mb.bit_length() - 1, _INTERVALS - 1)
            if first:
                divisions[:index] = [n] * index
                first = False
            divisions[index] = n
            last = index
        if i + 1 < len(tokens) and tokens[i + 1] != "]":
            i = _expect(tokens, i + 1, ",")
        i += 1
    if i >= len(tokens):
        raise AllocatorConfigError(
            "Error parsing CachingAllocator::AllocatorConfig settings, expected ]")
    return i


def round_size(size: int, config: AllocatorConfig) -> int:
    """A request's size as the allocator hands it out (`round_size`)."""
    if size < KMIN_BLOCK:
        return KMIN_BLOCK
    divisions = config.divisions(size)
    if divisions > 1 and size > KMIN_BLOCK * divisions:
        return _roundup_power2_next_division(size, divisions)
    return (size + KMIN_BLOCK - 1) // KMIN_BLOCK * KMIN_BLOCK


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    if _power_of_two(size):
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def segment_size(size: int) -> int:
    """The cudaMalloc a rounded request needs when no cached block fits
    (`get_allocation_size`)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class StreamEvents(Protocol):
    """Where a GPU's streams are, for `record_stream`: CUDA records an event on each stream a
    freed block was used on, and its malloc frees the block once all have completed."""

    def record(self, stream: int) -> float | None:
        """An event recorded now on `stream`: when the stream's queued work ends."""
        ...

    def done(self, at: float | None) -> bool:
        """Whether an event recorded with time `at` has completed by now."""
        ...


class Block:
    """A piece of a segment: allocated to a tensor, or cached free in its pool."""

    __slots__ = ("address", "allocated", "events", "frames", "gc_base", "next", "prev",
                 "requested", "segment_frames", "size", "small", "stream", "stream_uses")

    def __init__(self, address: int, size: int, stream: int, small: bool) -> None:
        self.address = address
        self.size = size
        self.stream = stream
        self.small = small
        self.requested = 0
        self.allocated = False
        self.prev: Block | None = None
        self.next: Block | None = None
        self.stream_uses: set[int] = set()
        # When each of stream_uses' work queued before the free is done (`insert_events`).
        self.events: list[float | None] = []
        self.frames: list[dict[str, Any]] = []
        self.segment_frames: list[dict[str, Any]] = []
        self.gc_base = 0

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def key(self) -> tuple[int, int, int]:
        return (self.stream, self.size, self.address)

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "free"
        return f"Block({self.size:,} B at {self.address:#x}, stream {self.stream}, {state})"


class _Pool:
    """Cached free blocks of one pool, ordered as CUDA's `BlockComparatorSize`."""

    __slots__ = ("blocks", "free_calls", "keys", "small")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int, int]] = []
        self.blocks: dict[tuple[int, int, int], Block] = {}
        self.free_calls = 0  # get_free_blocks_call_count: the garbage collector's clock

    def insert(self, block: Block) -> None:
        block.gc_base = self.free_calls
        k = block.key()
        bisect.insort(self.keys, k)
        self.blocks[k] = block

    def remove(self, block: Block) -> None:
        k = block.key()
        del self.keys[bisect.bisect_left(self.keys, k)]
        del self.blocks[k]

    def first_fit(self, stream: int, size: int) -> Block | None:
        """The smallest cached block of `stream` of at least `size` bytes."""
        i = bisect.bisect_left(self.keys, (stream, size, 0))
        if i == len(self.keys) or self.keys[i][0] != stream:
            return None
        return self.blocks[self.keys[i]]


class OutOfMemory(Exception):
    """A request the allocator could not satisfy, with the figures of CUDA's message."""

    def __init__(self, device: int, alloc_size: int, total: int, free: int, allocated: int,
                 reserved: int, allowed: int | None, process_bytes: int) -> None:
        self.device = device
        self.alloc_size = alloc_size
        self.total = total
        self.free = free
        self.allocated = allocated
        self.reserved = reserved
        self.allowed = allowed
        self.process_bytes = process_bytes
        super().__init__(self.message())

    def message(self, pid: int | None = None) -> str:
        """CUDA's out-of-memory message (`DeviceCachingAllocator::malloc`)."""
        proc = ("" if pid is None else
                f"Process {pid} has {format_size(self.process_bytes)} memory in use. ")
        allowed = "" if self.allowed is None else f"{format_size(self.allowed)} allowed; "
        return (f"CUDA out of memory. Tried to allocate {format_size(self.alloc_size)}. GPU "
                f"{self.device} has a total capacity of {format_size(self.total)} of which "
                f"{format_size(self.free)} is free. {proc}{allowed}Of the allocated memory "
                f"{format_size(self.allocated)} is allocated by PyTorch, and "
                f"{format_size(self.reserved - self.allocated)} is reserved by PyTorch but "
                "unallocated. If reserved but unallocated memory is large try setting "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
                "documentation for Memory Management  "
                "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def format_size(size: int) -> str:
    """A byte count as CUDA's allocator writes it (`format_size`)."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


_NO_FRAMES: list[dict[str, Any]] = []  # shared, never written: blocks replace, not extend


def _stat() -> list[int]:
    return [0, 0, 0, 0]  # current, peak, allocated, freed


@dataclass
class History:
    """What `_record_memory_history` keeps: the trace (if `enabled == "all"`) and the frames
    callback that names where each allocation came from."""

    enabled: str | None = None  # None, "state" or "all"
    context: str | None = None  # None, "state", "alloc" or "all"
    max_entries: int = (1 << 63) - 1
    frames: Callable[[], list[dict[str, Any]]] | None = None
    trace: list[dict[str, Any]] = field(default_factory=list)
    skip: frozenset[str] = frozenset()


class CachingAllocator:
    """One GPU's caching allocator.

    `total` is the capacity torch reports for the GPU (None: unlimited, a GPU on the host's
    memory); `context` what the CUDA context and other processes already hold of it, so
    cudaMalloc can give `total - context`; `allowed` the per-process limit of
    `set_per_process_memory_fraction` (None: none). Addresses are made up, unique per GPU.
    """

    def __init__(self, device: int = 0, total: int | None = None, context: int = 0,
                 allowed: int | None = None, config: AllocatorConfig | None = None) -> None:
        if total is not None and context > total:
            raise ValueError(f"context ({context:,} bytes) exceeds the GPU's total ({total:,})")
        self.device = device
        self.total = total
        self.context = context
        self.allowed = allowed
        self.config = config or AllocatorConfig()
        self._plain_rounding = not any(self.config.roundup_power2_divisions)
        self.small = _Pool(small=True)
        self.large = _Pool(small=False)
        self.reserved_total = 0  # total_allocated_memory: every live segment's bytes
        self.active: set[Block] = set()
        self.deferred: list[Block] = []  # freed blocks other streams still use (record_stream)
        # Where the other streams are (None: every stream is always done, as with no clock).
        self.events: StreamEvents | None = None
        self.stats: dict[str, list[list[int]]] = {
            name: [_stat(), _stat(), _stat()] for name in ARRAY_STATS}
        # For each pool (small: True), each statistic's ("all", that pool) pair.
        self._pairs = {small: {name: (arr[0], arr[1 if small else 2])
                               for name, arr in self.stats.items()} for small in (True, False)}
        # The statistics one hand-out, free request and completed free change, per pool:
        # (counts..., bytes..., requested bytes...) for "all" and the pool alike.
        self._handed = {small: _group(p, ("allocation", "active"),
                                      ("allocated_bytes", "active_bytes"), "requested_bytes")
                        for small, p in self._pairs.items()}
        self._freed = {small: _group(p, ("allocation",), ("allocated_bytes",), None)
                       for small, p in self._pairs.items()}
        self._returned = {small: _group(p, ("active",), ("active_bytes",), "requested_bytes")
                          for small, p in self._pairs.items()}
        self.oversize_allocations = _stat()
        self.oversize_segments = _stat()
        self.counters = {"num_alloc_retries": 0, "num_ooms": 0, "num_sync_all_streams": 0,
                         "num_device_alloc": 0, "num_device_free": 0}
        self.history = History()
        self._next_address = 0x7F0000000000 + (device << 36)

    # -- what torch.cuda reads ---------------------------------------------------------------

    @property
    def allocated(self) -> int:
        """Bytes allocated to tensors now (memory_allocated)."""
        return self.stats["allocated_bytes"][0][0]

    @property
    def reserved(self) -> int:
        """Bytes of every segment (memory_reserved)."""
        return self.stats["reserved_bytes"][0][0]

    @property
    def peak_allocated(self) -> int:
        return self.stats["allocated_bytes"][0][1]

    @property
    def peak_reserved(self) -> int:
        return self.stats["reserved_bytes"][0][1]

    def free_memory(self) -> int:
        """What cudaMemGetInfo calls free: the capacity less the context and the segments."""
        if self.total is None:
            raise ValueError("an unlimited GPU has no free figure")
        return max(0, self.total - self.context - self.reserved_total)

    def memory_stats(self) -> dict[str, Any]:
        """`torch._C._cuda_memoryStats`: the nested dict torch.cuda.memory_stats flattens."""
        out: dict[str, Any] = dict(self.counters)
        out["max_split_size"] = (-1 if self.config.max_split_size == SIZE_MAX
                                 else self.config.max_split_size)
        for name, arr in self.stats.items():
            out[name] = {pool: _stat_dict(s) for pool, s in zip(POOL_TYPES, arr, strict=True)}
        out["oversize_allocations"] = _stat_dict(self.oversize_allocations)
        out["oversize_segments"] = _stat_dict(self.oversize_segments)
        return out

    def reset_peak(self) -> None:
        """`resetPeakStats`: every peak becomes the current value."""
        for arr in self.stats.values():
            for s in arr:
                s[1] = s[0]
        for s in (self.oversize_allocations, self.oversize_segments):
            s[1] = s[0]

    def reset_accumulated(self) -> None:
        """`resetAccumulatedStats`: the allocated/freed totals and counters start again."""
        for arr in self.stats.values():
            for s in arr:
                s[2] = s[3] = 0
        for s in (self.oversize_allocations, self.oversize_segments):
            s[2] = s[3] = 0
        for k in self.counters:
            self.counters[k] = 0

    # -- requests ----------------------------------------------------------------------------

    def malloc(self, size: int, stream: int = 0) -> Block:
        """Allocate `size` bytes on `stream`: a cached block, else a new segment; raises
        `OutOfMemory` where CUDA's allocator raises its out-of-memory error."""
        got = self.allocate(size, stream)
        if isinstance(got, OutOfMemory):
            raise got
        return got

    def allocate(self, size: int, stream: int = 0) -> Block | OutOfMemory:
        """`malloc` that returns its out-of-memory instead of raising it (a caller that turns
        it into an error of its own keeps no traceback of the allocator's frames)."""
        if size < 0:
            raise ValueError(f"cannot allocate a negative size ({size})")
        if self.deferred:
            self._process_deferred(only_done=True)  # `process_events`, as CUDA's malloc
        frames = self._frames("state")
        if self._plain_rounding:
            rounded = KMIN_BLOCK if size < KMIN_BLOCK else (size + KMIN_BLOCK - 1) & -KMIN_BLOCK
        else:
            rounded = round_size(size, self.config)
        small = rounded <= SMALL_SIZE
        pool = self.small if small else self.large
        alloc_size = segment_size(rounded)
        block = self._cached_block(pool, rounded, stream)
        if block is None:
            if self.allowed is not None and self.config.garbage_collection_threshold > 0:
                self._garbage_collect()
            block = (self._new_segment(pool, alloc_size, stream, frames, retry=False)
                     or (self._release_available(pool, rounded, stream)
                         and self._new_segment(pool, alloc_size, stream, frames, retry=False))
                     or (self.empty_cache()
                         and self._new_segment(pool, alloc_size, stream, frames, retry=True)))
        if not block:
            self.counters["num_ooms"] += 1
            free = 0 if self.total is None else self.free_memory()
            self._trace("oom", 0, alloc_size, stream, frames, device_free=free)
            return self._oom(alloc_size, free)
        return self._hand_out(block, pool, rounded, size, stream, frames)

    def refusal(self, size: int, stream: int = 0) -> OutOfMemory | None:
        """The out-of-memory `malloc(size)` would raise, or None where it would succeed,
        changing nothing: a caller asks before it makes what it would allocate."""
        rounded = round_size(size, self.config)
        pool = self.small if rounded <= SMALL_SIZE else self.large
        b = pool.first_fit(stream, rounded)
        max_split = self.config.max_split_size
        if b is not None and not (
                (rounded < max_split <= b.size)
                or (rounded >= max_split and b.size >= rounded + self.config.max_non_split_rounding)):
            return None
        alloc_size = segment_size(rounded)
        room = self._room()
        if room is None or alloc_size <= room:
            return None
        releasable = sum(b.size for p in (self.small, self.large) for b in p.blocks.values()
                         if not b.is_split)
        if alloc_size <= room + releasable:
            return None
        return self._oom(alloc_size, self.free_memory() if self.total is not None else 0)

    def _room(self) -> int | None:
        """The bytes a new segment may take now (None: no bound)."""
        bounds = []
        if self.allowed is not None:
            bounds.append(self.allowed - self.reserved_total)
        if self.total is not None:
            bounds.append(self.total - self.context - self.reserved_total)
        return min(bounds) if bounds else None

    def _oom(self, alloc_size: int, free: int) -> OutOfMemory:
        return OutOfMemory(self.device, alloc_size, self.total if self.total is not None else 0,
                           free, self.allocated, self.reserved, self.allowed,
                           self.context + self.reserved_total)

    def free(self, block: Block) -> None:
        """The tensor's memory is given back: the block returns to its pool (after the other
        streams it was recorded on, `record_stream`, are done with it)."""
        if not block.allocated:
            raise ValueError(f"{block!r} is not allocated")
        block.allocated = False
        _count_out(self._freed[block.small], block.size, None)
        if block.size >= self.config.max_split_size:
            _dec1(self.oversize_allocations, 1)
        if self.history.enabled == "all":
            self._trace("free_requested", block.address, block.requested, block.stream,
                        self._frames("all") or block.frames)
        if block.stream_uses:
            events = self.events
            block.events = ([events.record(s) for s in sorted(block.stream_uses)]
                            if events is not None else [])
            self.deferred.append(block)
        else:
            self._free_block(block)

    def record_stream(self, block: Block, stream: int) -> None:
        """`recordStream`: `block` is in use on `stream` too, so it is not reused until that
        stream's work is done."""
        if stream != block.stream:
            block.stream_uses.add(stream)

    def synchronize(self) -> None:
        """Every stream is done: blocks held back for other streams are free."""
        self._process_deferred()

    def empty_cache(self) -> bool:
        """`release_cached_blocks`: release every cached block that is a whole segment."""
        self._process_deferred()
        self.counters["num_sync_all_streams"] += 1
        for pool in (self.large, self.small):
            for k in list(pool.keys):
                b = pool.blocks[k]
                if not b.is_split:
                    self._release(pool, b)
        return True

    # -- history and snapshots ---------------------------------------------------------------

    def record_history(self, enabled: str | None, context: str | None = "all",
                       max_entries: int = (1 << 63) - 1,
                       frames: Callable[[], list[dict[str, Any]]] | None = None,
                       clear_history: bool = False, skip_actions: list[str] | None = None) -> None:
        """`_record_memory_history`: keep where each allocation came from (`frames()` gives
        the caller's stack) and, with `enabled="all"`, a trace of every event."""
        if enabled not in (None, "state", "all"):
            raise ValueError(f"enabled must be None, 'state' or 'all', not {enabled!r}")
        if context not in (None, "state", "alloc", "all"):
            raise ValueError(f"context must be None, 'state', 'alloc' or 'all', not {context!r}")
        trace = [] if (clear_history or enabled is None) else self.history.trace
        self.history = History(enabled, context if enabled else None, max_entries, frames,
                               trace, frozenset(skip_actions or ()))

    def snapshot(self) -> list[dict[str, Any]]:
        """Every segment with its blocks, as `torch.cuda.memory._snapshot()["segments"]`."""
        heads = {b for b in itertools.chain(self.active, self.deferred,
                                            self.small.blocks.values(),
                                            self.large.blocks.values()) if b.prev is None}
        segments = []
        for head in sorted(heads, key=lambda b: b.address):
            blocks = []
            total = allocated = active = requested = 0
            b: Block | None = head
            while b is not None:
                awaiting = not b.allocated and b in self.deferred
                state = ("active_allocated" if b.allocated
                         else "active_awaiting_free" if awaiting else "inactive")
                blocks.append({"address": b.address, "size": b.size,
                               "requested_size": b.requested, "state": state,
                               "frames": list(b.frames)})
                total += b.size
                if b.allocated:
                    allocated += b.size
                if state != "inactive":
                    active += b.size
                    requested += b.requested
                b = b.next
            segments.append({"device": self.device, "address": head.address,
                             "total_size": total, "allocated_size": allocated,
                             "active_size": active, "requested_size": requested,
                             "stream": head.stream,
                             "segment_type": "small" if head.small else "large",
                             "segment_pool_id": (0, 0), "is_expandable": False,
                             "frames": list(head.segment_frames), "blocks": blocks})
        return segments

    def trace(self) -> list[dict[str, Any]]:
        """The recorded events, oldest first (`device_traces[device]`)."""
        return list(self.history.trace)

    # -- the allocator's own steps -----------------------------------------------------------

    def _frames(self, level: str) -> list[dict[str, Any]]:
        h = self.history
        if h.frames is None or h.context is None:
            return _NO_FRAMES
        order = ("state", "alloc", "all")
        if order.index(h.context) < order.index(level):
            return []
        return h.frames()

    def _trace(self, action: str, addr: int, size: int, stream: int,
               frames: list[dict[str, Any]], **extra: Any) -> None:
        h = self.history
        if h.enabled != "all" or action in h.skip:
            return
        entry = {"action": action, "addr": addr, "size": size, "stream": stream,
                 "time_us": int(time.time() * 1e6), "frames": frames, **extra}
        if len(h.trace) >= h.max_entries:
            del h.trace[0]
        h.trace.append(entry)

    def _cached_block(self, pool: _Pool, size: int, stream: int) -> Block | None:
        """`get_free_block`: the best-fitting cached block, or None."""
        if self.allowed is not None and self.config.garbage_collection_threshold > 0:
            pool.free_calls += 1
        b = pool.first_fit(stream, size)
        if b is None:
            return None
        max_split = self.config.max_split_size
        if size < max_split and b.size >= max_split:
            return None  # an oversize block is not split for a smaller request
        if size >= max_split and b.size >= size + self.config.max_non_split_rounding:
            return None
        pool.remove(b)
        return b

    def _new_segment(self, pool: _Pool, size: int, stream: int,
                     frames: list[dict[str, Any]], retry: bool) -> Block | None:
        """`alloc_block`: cudaMalloc a segment, or None where it would not fit."""
        if retry:
            self.counters["num_alloc_retries"] += 1
        room = self._room()
        if room is not None and size > room:
            return None
        self.reserved_total += size
        b = Block(self._next_address, size, stream, pool.small)
        self._next_address += (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE
        b.segment_frames = frames
        pairs = self._pairs[pool.small]
        _inc(pairs["segment"], 1)
        _inc(pairs["reserved_bytes"], size)
        if size >= self.config.max_split_size:
            _inc1(self.oversize_segments, 1)
        self.counters["num_device_alloc"] += 1
        if self.history.enabled == "all":
            self._trace("segment_alloc", b.address, size, stream, frames)
        return b

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.small:
            return remaining >= KMIN_BLOCK
        return size < self.config.max_split_size and remaining > SMALL_SIZE

    def _hand_out(self, block: Block, pool: _Pool, size: int, requested: int, stream: int,
                  frames: list[dict[str, Any]]) -> Block:
        """`alloc_found_block`: split off what the request does not need, mark it allocated."""
        pairs = self._pairs[pool.small]
        already_split = block.is_split
        if self._should_split(block, size):
            rest = block
            block = Block(rest.address, size, stream, pool.small)
            block.prev = rest.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = rest
            block.segment_frames = rest.segment_frames
            rest.segment_frames = []
            rest.prev = block
            rest.address += size
            rest.size -= size
            pool.insert(rest)
            if already_split:
                _dec(pairs["inactive_split_bytes"], block.size)
            else:
                _inc(pairs["inactive_split_bytes"], rest.size)
                _inc(pairs["inactive_split"], 1)
        elif already_split:
            _dec(pairs["inactive_split_bytes"], block.size)
            _dec(pairs["inactive_split"], 1)
        block.allocated = True
        block.requested = requested
        block.frames = frames
        self.active.add(block)
        if self.history.enabled == "all":
            self._trace("alloc", block.address, requested, stream, frames)
        _count_in(self._handed[pool.small], block.size, requested)
        if block.size >= self.config.max_split_size:
            _inc1(self.oversize_allocations, 1)
        return block

    def _free_block(self, block: Block) -> None:
        """`free_block`: merge with free neighbours and go back to the pool."""
        if self.history.enabled == "all":
            self._trace("free_completed", block.address, block.requested, block.stream,
                        block.frames)
        pool = self.small if block.small else self.large
        size, requested = block.size, block.requested
        split_blocks = split_bytes = 0
        for other in (block.prev, block.next):
            merged = self._merge(block, other, pool)
            if merged:
                split_blocks -= 1
                split_bytes -= merged
        self.active.discard(block)
        block.frames = []
        block.requested = 0
        pool.insert(block)
        if block.is_split:
            split_blocks += 1
            split_bytes += block.size
        pairs = self._pairs[block.small]
        if split_blocks:
            _move(pairs["inactive_split"], split_blocks)
        if split_bytes:
            _move(pairs["inactive_split_bytes"], split_bytes)
        _count_out(self._returned[block.small], size, requested)

    def _merge(self, dst: Block, src: Block | None, pool: _Pool) -> int:
        """`try_merge_blocks`: fold a free neighbour into `dst`; the bytes it held, or 0."""
        if src is None or src.allocated or src.stream_uses or src in self.deferred:
            return 0
        pool.remove(src)
        if dst.prev is src:
            dst.address = src.address
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
            dst.segment_frames = src.segment_frames
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _process_deferred(self, only_done: bool = False) -> None:
        """Free the blocks held back for other streams: all (a synchronize), or `only_done`
        those whose streams have done the work queued before their free, as `process_events`
        queries their events."""
        events = self.events
        if only_done and events is not None:
            done = [b for b in self.deferred if all(events.done(t) for t in b.events)]
            self.deferred = [b for b in self.deferred if b not in done]
        else:
            done, self.deferred = self.deferred, []
        for b in done:
            b.stream_uses.clear()
            b.events = []
            self._free_block(b)

    def _release(self, pool: _Pool, block: Block) -> None:
        """`release_block`: cudaFree a whole cached segment."""
        pool.remove(block)
        self.reserved_total -= block.size
        pairs = self._pairs[block.small]
        _dec(pairs["segment"], 1)
        _dec(pairs["reserved_bytes"], block.size)
        if block.size >= self.config.max_split_size:
            _dec1(self.oversize_segments, 1)
        self.counters["num_device_free"] += 1
        self._trace("segment_free", block.address, block.size, block.stream,
                    self._frames("all") or block.segment_frames)

    def _release_available(self, pool: _Pool, size: int, stream: int) -> bool:
        """`release_available_cached_blocks`: free cached oversize blocks, just enough."""
        max_split = self.config.max_split_size
        if max_split == SIZE_MAX:
            return False
        want = max(size, max_split)
        b = pool.first_fit(stream, want)
        if b is not None:
            self._release(pool, b)
            return True
        candidates = [pool.blocks[k] for k in reversed(pool.keys)
                      if k[0] == stream and k[1] >= max_split]
        released = 0
        for b in candidates:
            if released >= want:
                break
            released += b.size
            self._release(pool, b)
        return released >= want

    def _garbage_collect(self) -> None:
        """`garbage_collect_cached_blocks`: past `garbage_collection_threshold` of the allowed
        memory, release the cached whole segments that have waited longest, oldest first."""
        assert self.allowed is not None
        threshold = int(self.config.garbage_collection_threshold * self.allowed)
        if self.reserved_total <= threshold:
            return
        target = self.reserved_total - threshold
        pool = self.large
        freeable = [b for b in pool.blocks.values() if not b.is_split]
        if not freeable:
            return
        total_age = sum(pool.free_calls - b.gc_base for b in freeable)
        count = len(freeable)
        reclaimed = 0
        freed_one = True
        while reclaimed < target and freed_one and count > 0:
            threshold_age = total_age / count
            freed_one = False
            for b in [pool.blocks[k] for k in list(pool.keys)]:
                age = pool.free_calls - b.gc_base
                if not b.is_split and age >= threshold_age:
                    freed_one = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release(pool, b)


# A statistic is [current, peak, allocated, freed], kept for "all" and for the block's pool:
# each change below touches both (one call for the pair: this is the allocator's hot path).

def _inc(pair: tuple[list[int], list[int]], n: int) -> None:
    a, p = pair
    a[0] += n
    a[2] += n
    if a[0] > a[1]:
        a[1] = a[0]
    p[0] += n
    p[2] += n
    if p[0] > p[1]:
        p[1] = p[0]


def _dec(pair: tuple[list[int], list[int]], n: int) -> None:
    a, p = pair
    a[0] -= n
    a[3] += n
    p[0] -= n
    p[3] += n


def _move(pair: tuple[list[int], list[int]], n: int) -> None:
    if n > 0:
        _inc(pair, n)
    elif n < 0:
        _dec(pair, -n)


_Group = tuple[tuple[list[int], ...], tuple[list[int], ...], tuple[list[int], ...]]


def _group(pairs: dict[str, tuple[list[int], list[int]]], counts: tuple[str, ...],
           sizes: tuple[str, ...], requested: str | None) -> _Group:
    def flat(names: tuple[str, ...]) -> tuple[list[int], ...]:
        return tuple(s for n in names for s in pairs[n])
    return flat(counts), flat(sizes), flat((requested,) if requested else ())


def _count_in(group: _Group, size: int, requested: int) -> None:
    """One block handed out: +1 in the counts, +size and +requested in the byte statistics."""
    counts, sizes, req = group
    for s in counts:
        s[0] += 1
        s[2] += 1
        if s[0] > s[1]:
            s[1] = s[0]
    for s in sizes:
        s[0] += size
        s[2] += size
        if s[0] > s[1]:
            s[1] = s[0]
    for s in req:
        s[0] += requested
        s[2] += requested
        if s[0] > s[1]:
            s[1] = s[0]


def _count_out(group: _Group, size: int, requested: int | None) -> None:
    """The reverse of `_count_in` (the freed totals grow)."""
    counts, sizes, req = group
    for s in counts:
        s[0] -= 1
        s[3] += 1
    for s in sizes:
        s[0] -= size
        s[3] += size
    if requested is not None:
        for s in req:
            s[0] -= requested
            s[3] += requested


def _inc1(s: list[int], n: int) -> None:
    s[0] += n
    s[2] += n
    if s[0] > s[1]:
        s[1] = s[0]


def _dec1(s: list[int], n: int) -> None:
    s[0] -= n
    s[3] += n


def _stat_dict(s: list[int]) -> dict[str, int]:
    return {"current": s[0], "peak": s[1], "allocated": s[2], "freed": s[3]}
