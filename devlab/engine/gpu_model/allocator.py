"""CUDA's caching allocator as a pure state machine: what a GPU's memory looks like to torch.

A port of the rules of `c10/cuda/CUDACachingAllocator.cpp` and `c10/core/AllocatorConfig.cpp`
(torch 2.13), fed with allocation and free events, running no op and touching no GPU, so it is
tested against those rules directly (tests/test_allocator.py). The simulation keeps one per
simulated GPU and `torch.cuda`'s memory API reads it; the numbers are what a real GPU's
allocator would report for the same sequence of requests.

What it keeps, as CUDA's does:

- two pools of cached free blocks, small (requests of at most 1 MiB) and large, each ordered by
  (stream, size, address): a request takes the smallest cached block of its stream that fits
  (blocks are kept per stream: one freed on another stream is not reused);
- sizes rounded to 512 bytes (or to `roundup_power2_divisions` of a power of two);
- a new segment (cudaMalloc) when nothing cached fits: 2 MiB for a small request, 20 MiB for
  one of 1-10 MiB, else the request rounded up to 2 MiB; a block larger than the request is
  split when the rest is worth keeping (any 512 bytes in the small pool; more than 1 MiB in
  the large pool, and never a block of `max_split_size` or more);
- on free, a block merges with free neighbours of its segment; `empty_cache()` releases every
  segment with nothing allocated in it (whole segments: a split one stays);
- out of memory: free cached oversize blocks, then every unsplit cached block, then retry; then
  CUDA's out-of-memory error with its numbers;
- statistics under the keys of `torch.cuda.memory_stats()`, a snapshot in the format of
  `torch.cuda.memory._snapshot()`, and the trace of `_record_memory_history`.

- private pools (`PrivatePool`, CUDA's of the same name): while a capture or `use_mem_pool` is
  under way (`begin_allocate_to_pool`, with the filter saying which requests it takes), a
  request goes to that pool's own small and large pools, in segments of its own; a block freed
  returns to the pool it came from, so only that pool reuses it; `release_pool` (a graph's
  reset, a MemPool's end) drops a use, and at none the pool is freeable: `empty_cache()` (or the
  out-of-memory retry) then releases its unsplit cached segments, and forgets the pool once it
  holds none (`release_cached_blocks`, `graph_pools_freeable`).

Not modeled: expandable segments (refused by `AllocatorConfig.parse`, naming the option), IPC
sharing, the cudaMallocAsync backend, a MemPool's own allocator (CUDAPluggableAllocator) and its
`use_on_oom` fallback, the private pools' checkpoints (`setCheckpointPoolState`, used by
torch.compile's cudagraph trees).
"""

from __future__ import annotations

import time
from bisect import bisect_left
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
# A cached block's sort key is size << 64 | address: addresses stay below 2**64 (they start
# near 2**47 and grow by the bytes ever reserved), so keys order as (size, address) tuples.
_KEY_SHIFT = 64

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


_NO_FRAMES: list[dict[str, Any]] = []  # shared, never written: blocks replace, not extend
_NO_EVENTS: list[float | None] = []  # likewise


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
    """A piece of a segment: allocated to a tensor, or cached free in its pool (`pool`: the
    one it returns to, a device's own or a private pool's, as CUDA's `Block::pool`)."""

    __slots__ = ("address", "allocated", "events", "frames", "gc_base", "next", "pool", "prev",
                 "requested", "segment_frames", "size", "stream", "stream_uses")

    def __init__(self, address: int, size: int, stream: int, pool: _Pool) -> None:
        self.address = address
        self.size = size
        self.stream = stream
        self.pool = pool
        self.requested = 0
        self.allocated = False
        self.prev: Block | None = None
        self.next: Block | None = None
        # The other streams it is recorded on (record_stream): a set once there is one; the
        # empty tuple until then, since making a set per block costs the hot path.
        self.stream_uses: set[int] | tuple[()] = ()
        # When each of stream_uses' work queued before the free is done (`insert_events`).
        self.events: list[float | None] = _NO_EVENTS
        self.frames: list[dict[str, Any]] = _NO_FRAMES
        self.segment_frames: list[dict[str, Any]] = _NO_FRAMES
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
    """Cached free blocks of one pool, ordered as CUDA's `BlockComparatorSize`
    (stream, size, address).

    Per stream, two parallel lists kept sorted: `keys`, each block's size and address as one
    int (`_key`), and the blocks themselves. One int compares in a few machine instructions
    where a tuple compares item by item, and bisecting is most of a request's search (See Note
    [The allocator's hot path]). `stats` holds the statistics a block of this pool changes
    (`CachingAllocator._stats_of`), `counts` the first of them.
    """

    __slots__ = ("counts", "free_calls", "owner", "small", "stats", "streams")

    def __init__(self, small: bool, owner: PrivatePool | None = None) -> None:
        self.small = small
        self.owner = owner  # owner_PrivatePool: None for the device's own pools
        # stream -> (keys, blocks): made with the stream's first segment in the pool (blocks
        # enter a pool only so), kept while the pool lives (a GPU has few streams)
        self.streams: dict[int, tuple[list[int], list[Block]]] = {}
        self.free_calls = 0  # get_free_blocks_call_count: the garbage collector's clock
        self.stats: tuple[_Counts, _Counts, _Counts] = ()  # type: ignore[assignment]
        self.counts: _Counts  # stats[0], its own pool type's

    @property
    def blocks(self) -> list[Block]:
        """The cached blocks, in the pool's order."""
        return [b for s in sorted(self.streams) for b in self.streams[s][1]]

    def insert(self, block: Block) -> None:
        block.gc_base = self.free_calls
        keys, blocks = self.streams[block.stream]
        k = block.size << _KEY_SHIFT | block.address
        i = bisect_left(keys, k)
        keys.insert(i, k)
        blocks.insert(i, block)

    def remove(self, block: Block) -> None:
        keys, blocks = self.streams[block.stream]
        i = bisect_left(keys, block.size << _KEY_SHIFT | block.address)
        del keys[i]
        del blocks[i]

    def first_fit(self, stream: int, size: int) -> Block | None:
        """The smallest cached block of `stream` of at least `size` bytes."""
        got = self.streams.get(stream)
        if got is None:
            return None
        keys, blocks = got
        i = bisect_left(keys, size << _KEY_SHIFT)
        return blocks[i] if i < len(keys) else None


PoolId = tuple[int, int]  # MempoolId_t
DEFAULT_POOL: PoolId = (0, 0)


class PrivatePool:
    """CUDA's `PrivatePool`: a CUDA graph's (or a `torch.cuda.MemPool`'s) memory, with block
    pools of its own. `use_count` counts the graphs, MemPools and `use_mem_pool` blocks using
    it; `segments` its live segments (cudaMalloc_count): a pool nobody uses is forgotten once
    it holds none."""

    __slots__ = ("id", "large", "no_split", "segments", "small", "use_count")

    def __init__(self, pool_id: PoolId) -> None:
        self.id = pool_id
        self.small = _Pool(small=True, owner=self)
        self.large = _Pool(small=False, owner=self)
        self.use_count = 1
        self.segments = 0
        self.no_split = False  # MemPool(no_split=True): its blocks are never split

    def __repr__(self) -> str:
        return f"PrivatePool({self.id}, use_count={self.use_count}, segments={self.segments})"


class PoolError(RuntimeError):
    """A private-pool call torch refuses (its TORCH_CHECK), in torch's words."""


class OutOfMemory(Exception):
    """A request the allocator could not satisfy, with the figures of CUDA's message."""

    def __init__(self, device: int, alloc_size: int, total: int, free: int, allocated: int,
                 reserved: int, allowed: int | None, process_bytes: int,
                 in_private_pools: int = 0) -> None:
        self.device = device
        self.in_private_pools = in_private_pools
        self.alloc_size = alloc_size
        self.total = total
        self.free = free
        self.allocated = allocated
        self.reserved = reserved
        self.allowed = allowed
        self.process_bytes = process_bytes
        super().__init__(self.message())

    def message(self, pid: int | None = None, others: tuple[tuple[int, int], ...] = ()) -> str:
        """CUDA's out-of-memory message (`DeviceCachingAllocator::malloc`). With `pid` (this
        process's, as NVML lists it), the processes' lines of `reportProcessMemoryInfo`: this
        process's own in its words, then "Process N has ..." for each (pid, bytes) of `others`,
        the other processes on the GPU."""
        proc = "" if pid is None else "".join(
            [f"Including non-PyTorch memory, this process has {format_size(self.process_bytes)} "
             "memory in use. "] + [f"Process {p} has {format_size(b)} memory in use. "
                                   for p, b in others if p != pid])
        allowed = "" if self.allowed is None else f"{format_size(self.allowed)} allowed; "
        # The cached blocks of private pools count as allocated, as CUDA's message counts them.
        private = self.in_private_pools
        pools = (f"with {format_size(private)} allocated in private pools (e.g., CUDA Graphs), "
                 if private > 0 else "")
        return (f"CUDA out of memory. Tried to allocate {format_size(self.alloc_size)}. GPU "
                f"{self.device} has a total capacity of {format_size(self.total)} of which "
                f"{format_size(self.free)} is free. {proc}{allowed}Of the allocated memory "
                f"{format_size(self.allocated + private)} is allocated by PyTorch, {pools}and "
                f"{format_size(self.reserved - self.allocated - private)} is reserved by "
                "PyTorch but "
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


def _stat() -> list[int]:
    return [0, 0, 0, 0]  # current, peak, allocated, freed


class _Counts:
    """The statistics of one pool type (small or large blocks) as attributes, one set per
    name of `ARRAY_STATS`: `X` (current), `X_peak`, `X_total` (CUDA's "allocated": every
    increase since the accumulated statistics were reset) and `X_base` (the current value at
    that reset).

    Cheaper to keep than CUDA's four numbers for "all" and each pool type (See Note [The
    allocator's hot path]), and as exact: a decrease changes only `X`, since CUDA's "freed" is
    always `X_base + X_total - X`; and "all" is the sum of the two pool types (every change of
    a statistic is of one pool type), except its peak, which `CachingAllocator.peaks` keeps
    (its `X_peak`) from the sum at each increase.
    """

    __slots__ = tuple(f"{name}{suffix}" for name in ARRAY_STATS
                      for suffix in ("", "_peak", "_total", "_base"))

    # A block becomes active exactly when it is allocated (`alloc_found_block` raises both),
    # so active's totals are allocation's and are not kept twice; its current value is kept
    # on its own (a freed block stays active while other streams use it).
    _SAME_TOTAL = {"active": "allocation", "active_bytes": "allocated_bytes"}

    def __init__(self) -> None:
        for slot in self.__slots__:
            setattr(self, slot, 0)

    def freed(self, name: str) -> int:
        """CUDA's "freed" of statistic `name`: every decrease since the last reset."""
        return getattr(self, name + "_base") + self.total(name) - getattr(self, name)

    def total(self, name: str) -> int:
        """CUDA's "allocated" of statistic `name`: every increase since the last reset."""
        return getattr(self, self._SAME_TOTAL.get(name, name) + "_total")


def _up(stats: tuple[_Counts, _Counts, _Counts], name: str, n: int) -> None:
    """Statistic `name` of pool type `stats[0]` rises by `n` (the other type: `stats[1]`;
    `stats[2]`: the peaks of "all"). The hot paths write this out inline."""
    c, o, t = stats
    v = getattr(c, name) + n
    setattr(c, name, v)
    setattr(c, name + "_total", getattr(c, name + "_total") + n)
    if v > getattr(c, name + "_peak"):
        setattr(c, name + "_peak", v)
    v += getattr(o, name)
    if v > getattr(t, name + "_peak"):
        setattr(t, name + "_peak", v)


def _down(stats: tuple[_Counts, _Counts, _Counts], name: str, n: int) -> None:
    """Statistic `name` of pool type `stats[0]` falls by `n`."""
    c = stats[0]
    setattr(c, name, getattr(c, name) - n)


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

    # Note [The allocator's hot path]
    # malloc and free run once per tensor, so they are written for speed (issue 27: at most
    # 2 us per allocation event; benchmarks/allocator.py), against the plain port they replaced
    # (tests/_allocator_reference.py, replayed beside it by tests/test_allocator_equivalence.py):
    # - each pool keeps its cached blocks per stream as two parallel sorted lists, int keys
    #   (size << 64 | address) and blocks: bisecting ints is cheaper than comparing tuples;
    # - the statistics are attributes of one `_Counts` per pool type; "all" is summed when
    #   read (only its peak is kept), and CUDA's "freed" is derived, so a free changes one
    #   number per statistic (See _Counts; active's current value is always kept, never
    #   derived from allocation's: blocks waiting for other streams stay active);
    # - alloc_found_block is written inline in `allocate`; segments' first blocks are kept by
    #   address (`heads`, what snapshots walk) rather than a set of active blocks;
    # - blocks share empty frames and stream lists until they get some of their own;
    # - the history's and the garbage collector's switches are kept as flags (`_tracing`,
    #   `_framing`, `_gc`), the configuration's max_split_size as `_max_split`.
    # Callgrind (benchmarks/allocator.py): 20.4k instructions per event before these, 12.9k.

    def __init__(self, device: int = 0, total: int | None = None, context: int = 0,
                 allowed: int | None = None, config: AllocatorConfig | None = None) -> None:
        if total is not None and context > total:
            raise ValueError(f"context ({context:,} bytes) exceeds the GPU's total ({total:,})")
        self.device = device
        self.total = total
        self.context = context
        self.config = config or AllocatorConfig()
        self._allowed = allowed
        self._gc = False
        self.allowed = allowed  # sets _gc
        self._plain_rounding = not any(self.config.roundup_power2_divisions)
        self._max_split = self.config.max_split_size
        self.small = _Pool(small=True)
        self.large = _Pool(small=False)
        self.reserved_total = 0  # total_allocated_memory: every live segment's bytes
        # Each live segment's first block, by the segment's address (what snapshots walk)
        self.heads: dict[int, Block] = {}
        self.deferred: list[Block] = []  # freed blocks other streams still use (record_stream)
        # Where the other streams are (None: every stream is always done, as with no clock).
        self.events: StreamEvents | None = None
        # The statistics of small and large blocks; `peaks`: the peaks of "all" (_Counts)
        self.small_counts, self.large_counts, self.peaks = _Counts(), _Counts(), _Counts()
        for pool in (self.small, self.large):
            pool.stats = self._stats_of(pool.small)
            pool.counts = pool.stats[0]
        self.oversize_allocations = _stat()
        self.oversize_segments = _stat()
        self.counters = {"num_alloc_retries": 0, "num_ooms": 0, "num_sync_all_streams": 0,
                         "num_device_alloc": 0, "num_device_free": 0}
        self.history = History()
        self._tracing = False  # history.enabled == "all"
        self._framing = False  # history.frames and history.context are set
        # Private pools (torch's note "Interaction with CUDA graph capture" in
        # CUDACachingAllocator.cpp): every live one, those no graph or MemPool uses any more
        # (graph_pools_freeable), and the captures and use_mem_pool blocks under way, each with
        # the filter that says whether a request on a stream goes to its pool, newest last.
        self.graph_pools: dict[PoolId, PrivatePool] = {}
        self.freeable: dict[PoolId, PrivatePool] = {}
        self.captures: list[tuple[PoolId, Callable[[int], bool]]] = []
        self._next_address = 0x7F0000000000 + (device << 36)

    def _stats_of(self, small: bool) -> tuple[_Counts, _Counts, _Counts]:
        """What a block of a small or large pool changes: its pool type's statistics, the
        other type's (to sum "all"), and the peaks of "all"."""
        if small:
            return (self.small_counts, self.large_counts, self.peaks)
        return (self.large_counts, self.small_counts, self.peaks)

    @property
    def allowed(self) -> int | None:
        """The per-process limit in bytes (None: none)."""
        return self._allowed

    @allowed.setter
    def allowed(self, value: int | None) -> None:
        self._allowed = value
        self._gc = value is not None and self.config.garbage_collection_threshold > 0

    # -- what torch.cuda reads ---------------------------------------------------------------

    @property
    def allocated(self) -> int:
        """Bytes allocated to tensors now (memory_allocated)."""
        return self.small_counts.allocated_bytes + self.large_counts.allocated_bytes

    @property
    def reserved(self) -> int:
        """Bytes of every segment (memory_reserved)."""
        return self.small_counts.reserved_bytes + self.large_counts.reserved_bytes

    @property
    def peak_allocated(self) -> int:
        return self.peaks.allocated_bytes_peak

    @property
    def peak_reserved(self) -> int:
        return self.peaks.reserved_bytes_peak

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
        small, large = self.small_counts, self.large_counts
        for name in ARRAY_STATS:
            per = [[getattr(c, name), getattr(c, name + "_peak"), c.total(name), c.freed(name)]
                   for c in (small, large)]
            every = [a + b for a, b in zip(*per, strict=True)]
            every[1] = getattr(self.peaks, name + "_peak")
            out[name] = {pool: _stat_dict(s)
                         for pool, s in zip(POOL_TYPES, (every, *per), strict=True)}
        out["oversize_allocations"] = _stat_dict(self.oversize_allocations)
        out["oversize_segments"] = _stat_dict(self.oversize_segments)
        return out

    def reset_peak(self) -> None:
        """`resetPeakStats`: every peak becomes the current value."""
        small, large = self.small_counts, self.large_counts
        for name in ARRAY_STATS:
            for c in (small, large):
                setattr(c, name + "_peak", getattr(c, name))
            setattr(self.peaks, name + "_peak", getattr(small, name) + getattr(large, name))
        for s in (self.oversize_allocations, self.oversize_segments):
            s[1] = s[0]

    def reset_accumulated(self) -> None:
        """`resetAccumulatedStats`: the allocated/freed totals and counters start again."""
        for c in (self.small_counts, self.large_counts):
            for name in ARRAY_STATS:
                setattr(c, name + "_total", 0)
                setattr(c, name + "_base", getattr(c, name))
        for s in (self.oversize_allocations, self.oversize_segments):
            s[2] = s[3] = 0
        for k in self.counters:
            self.counters[k] = 0

    # -- requests ----------------------------------------------------------------------------

    def malloc(self, size: int, stream: int = 0) -> Block:
        """Allocate `size` bytes on `stream`: a cached block, else a new segment; raises
        `OutOfMemory` where CUDA's allocator raises its out-of-memory error."""
        got = self.allocate(size, stream)
        if got.__class__ is OutOfMemory:
            raise got  # type: ignore[misc]
        return got  # type: ignore[return-value]

    def allocate(self, size: int, stream: int = 0) -> Block | OutOfMemory:
        """`malloc` that returns its out-of-memory instead of raising it (a caller that turns
        it into an error of its own keeps no traceback of the allocator's frames)."""
        if size < 0:
            raise ValueError(f"cannot allocate a negative size ({size})")
        if self.deferred and not self.captures:
            # `process_events`, as CUDA's malloc; skipped while a capture is under way (CUDA
            # may not query events then)
            self._process_deferred(only_done=True)
        frames = self._frames("state") if self._framing else _NO_FRAMES
        if self._plain_rounding:
            rounded = KMIN_BLOCK if size < KMIN_BLOCK else (size + KMIN_BLOCK - 1) & -KMIN_BLOCK
        else:
            rounded = round_size(size, self.config)
        if rounded <= SMALL_SIZE:
            pool = self.small
            alloc_size = SMALL_BUFFER
        else:
            pool = self.large
            alloc_size = (LARGE_BUFFER if rounded < MIN_LARGE_ALLOC
                          else (rounded + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE)
        if self.captures:  # get_pool: a capture's (or use_mem_pool's) private pool
            pool = self._capture_pool(pool, stream)
        # get_free_block, inline: the smallest cached block of the stream that fits
        if self._gc:
            pool.free_calls += 1
        block: Block | None = None
        if stream in pool.streams:
            keys, blocks = pool.streams[stream]
            i = bisect_left(keys, rounded << _KEY_SHIFT)
            if i < len(keys):
                found = blocks[i]
                max_split = self._max_split
                # an oversize block is not split for a smaller request, nor handed out whole
                # for a much smaller one
                if not ((rounded < max_split and found.size >= max_split)
                        or (rounded >= max_split and found.size
                            >= rounded + self.config.max_non_split_rounding)):
                    del keys[i]
                    del blocks[i]
                    block = found
        if block is None:
            if self._gc:
                self._garbage_collect()
            block = (self._new_segment(pool, alloc_size, stream, frames, retry=False)
                     or (self._release_available(pool, rounded, stream)
                         and self._new_segment(pool, alloc_size, stream, frames, retry=False))
                     or (not self.captures and self.empty_cache()
                         and self._new_segment(pool, alloc_size, stream, frames, retry=True)))
        if not block:
            self.counters["num_ooms"] += 1
            free = 0 if self.total is None else self.free_memory()
            self._trace("oom", 0, alloc_size, stream, frames, device_free=free)
            return self._oom(alloc_size, free)
        # alloc_found_block, inline (a call costs the hot path): split off what the request
        # does not need, mark the block allocated; from here `size` is the rounded size
        requested, size = size, rounded
        c, o, t = pool.stats
        already_split = block.prev is not None or block.next is not None
        remaining = block.size - size
        # should_split (never in a MemPool made with no_split)
        if (remaining >= KMIN_BLOCK if pool.small else (size < self._max_split
                                                        and remaining > SMALL_SIZE)) and (
                pool.owner is None or not pool.owner.no_split):
            rest = block
            block = Block(rest.address, size, stream, pool)
            prev = block.prev = rest.prev
            if prev is not None:
                prev.next = block
            else:
                self.heads[block.address] = block
            block.next = rest
            block.segment_frames = rest.segment_frames
            rest.segment_frames = _NO_FRAMES
            rest.prev = block
            rest.address += size
            rest.size = remaining
            rest.gc_base = pool.free_calls
            keys, blocks = pool.streams[stream]
            k = remaining << _KEY_SHIFT | rest.address
            i = bisect_left(keys, k)
            keys.insert(i, k)
            blocks.insert(i, rest)
            if already_split:
                # the block's bytes leave the inactive split bytes; the rest stays in them
                c.inactive_split_bytes -= size
            else:
                # the rest is a new inactive split block (its segment is split from now)
                v = c.inactive_split_bytes = c.inactive_split_bytes + remaining
                c.inactive_split_bytes_total += remaining
                if v > c.inactive_split_bytes_peak:
                    c.inactive_split_bytes_peak = v
                v += o.inactive_split_bytes
                if v > t.inactive_split_bytes_peak:
                    t.inactive_split_bytes_peak = v
                v = c.inactive_split = c.inactive_split + 1
                c.inactive_split_total += 1
                if v > c.inactive_split_peak:
                    c.inactive_split_peak = v
                v += o.inactive_split
                if v > t.inactive_split_peak:
                    t.inactive_split_peak = v
        else:
            size = block.size
            if already_split:
                c.inactive_split_bytes -= size
                c.inactive_split -= 1
        block.allocated = True
        block.requested = requested
        block.frames = frames
        if self._tracing:
            self._trace("alloc", block.address, requested, stream, frames)
        # allocation and active +1, allocated_bytes and active_bytes +size, requested_bytes
        # +requested, each with its peak and the peak of "all" (See _Counts): written out,
        # this is the hottest code of the model. active's totals are allocation's (_SAME_TOTAL)
        v = c.allocation = c.allocation + 1
        c.allocation_total += 1
        if v > c.allocation_peak:
            c.allocation_peak = v
        v += o.allocation
        if v > t.allocation_peak:
            t.allocation_peak = v
        v = c.active = c.active + 1
        if v > c.active_peak:
            c.active_peak = v
        v += o.active
        if v > t.active_peak:
            t.active_peak = v
        v = c.allocated_bytes = c.allocated_bytes + size
        c.allocated_bytes_total += size
        if v > c.allocated_bytes_peak:
            c.allocated_bytes_peak = v
        v += o.allocated_bytes
        if v > t.allocated_bytes_peak:
            t.allocated_bytes_peak = v
        v = c.active_bytes = c.active_bytes + size
        if v > c.active_bytes_peak:
            c.active_bytes_peak = v
        v += o.active_bytes
        if v > t.active_bytes_peak:
            t.active_bytes_peak = v
        v = c.requested_bytes = c.requested_bytes + requested
        c.requested_bytes_total += requested
        if v > c.requested_bytes_peak:
            c.requested_bytes_peak = v
        v += o.requested_bytes
        if v > t.requested_bytes_peak:
            t.requested_bytes_peak = v
        if size >= self._max_split:
            _inc1(self.oversize_allocations, 1)
        return block

    def refusal(self, size: int, stream: int = 0) -> OutOfMemory | None:
        """The out-of-memory `malloc(size)` would raise, or None where it would succeed,
        changing nothing: a caller asks before it makes what it would allocate."""
        rounded = round_size(size, self.config)
        pool = self.small if rounded <= SMALL_SIZE else self.large
        if self.captures:
            pool = self._capture_pool(pool, stream)
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
        releasable = sum(b.size for p in (self.small, self.large) for b in p.blocks
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
        private = sum(b.size for pp in self.graph_pools.values()
                      for p in (pp.large, pp.small) for b in p.blocks)
        return OutOfMemory(self.device, alloc_size, self.total if self.total is not None else 0,
                           free, self.allocated, self.reserved, self.allowed,
                           self.context + self.reserved_total, private)

    def free(self, block: Block) -> None:
        """The tensor's memory is given back: the block returns to its pool (after the other
        streams it was recorded on, `record_stream`, are done with it)."""
        if not block.allocated:
            raise ValueError(f"{block!r} is not allocated")
        block.allocated = False
        size = block.size
        pool = block.pool
        c = pool.counts
        c.allocation -= 1
        c.allocated_bytes -= size
        if size >= self._max_split:
            _dec1(self.oversize_allocations, 1)
        if self._tracing:
            self._trace("free_requested", block.address, block.requested, block.stream,
                        self._frames("all") or block.frames)
        if block.stream_uses:
            events = self.events
            block.events = ([events.record(s) for s in sorted(block.stream_uses)]
                            if events is not None else [])
            self.deferred.append(block)
        else:
            self._free_block(block, pool)

    def record_stream(self, block: Block, stream: int) -> None:
        """`recordStream`: `block` is in use on `stream` too, so it is not reused until that
        stream's work is done."""
        if stream != block.stream:
            if block.stream_uses:
                block.stream_uses.add(stream)  # type: ignore[union-attr]
            else:
                block.stream_uses = {stream}

    def synchronize(self) -> None:
        """Every stream is done: blocks held back for other streams are free."""
        self._process_deferred()

    def empty_cache(self, pool_id: PoolId = DEFAULT_POOL) -> bool:
        """`release_cached_blocks`: release every cached block that is a whole segment, of the
        device's own pools (unless a capture is under way) and of the private pools no graph or
        MemPool uses any more (`pool_id`: of that one only, and not the device's own). A freeable
        pool left with no segment is forgotten."""
        if pool_id == DEFAULT_POOL and not self.captures:
            self._process_deferred()
            self.counters["num_sync_all_streams"] += 1
            for pool in (self.large, self.small):
                self._release_blocks(pool)
        for pid, pp in list(self.freeable.items()):
            if pool_id not in (DEFAULT_POOL, pid):
                continue
            if pool_id != DEFAULT_POOL:
                # synchronize_and_free_events(context, pool): that pool's held-back blocks
                self._process_deferred(owner=pp)
            self._release_blocks(pp.small)
            self._release_blocks(pp.large)
            if pp.segments == 0:
                del self.graph_pools[pid]
                del self.freeable[pid]
        return True

    def _release_blocks(self, pool: _Pool) -> None:
        """`release_blocks`: release the pool's cached blocks that are whole segments."""
        for b in pool.blocks:
            if not b.is_split:
                self._release(pool, b)

    # -- private pools (CUDA graphs, torch.cuda.MemPool) -------------------------------------

    def _capture_pool(self, pool: _Pool, stream: int) -> _Pool:
        """`get_pool`: the private pool of the newest capture whose filter takes `stream`
        (its small or large pool, as `pool` is), else `pool`."""
        for pool_id, takes in reversed(self.captures):
            if takes(stream):
                pp = self.graph_pools[pool_id]
                return pp.small if pool.small else pp.large
        return pool

    def create_or_incref_pool(self, pool_id: PoolId) -> PrivatePool:
        """`create_or_incref_pool`: a new private pool (use count 1), or one more use of a
        live one."""
        pp = self.graph_pools.get(pool_id)
        if pp is None:
            pp = self.graph_pools[pool_id] = PrivatePool(pool_id)
            # its blocks count in the device's statistics, by pool size (get_stat_types_for_pool)
            for p in (pp.small, pp.large):
                p.stats = self._stats_of(p.small)
                p.counts = p.stats[0]
        elif pp.use_count == 0:
            # CUDA asserts here (TORCH_INTERNAL_ASSERT(use_count > 0)): the pool was released
            raise PoolError(f"memory pool {pool_id} was released (no graph or MemPool uses "
                            "it any more) and cannot be shared; capture into a new pool")
        else:
            pp.use_count += 1
        return pp

    def begin_allocate_to_pool(self, pool_id: PoolId, takes: Callable[[int], bool]) -> None:
        """`beginAllocateToPool`: requests on the streams `takes` accepts go to the pool (made,
        or one more use of it)."""
        if any(pid == pool_id for pid, _ in self.captures):
            raise PoolError("beginAllocateToPool: already recording to mempool_id")
        self.create_or_incref_pool(pool_id)
        self.captures.append((pool_id, takes))

    def end_allocate_to_pool(self, pool_id: PoolId) -> None:
        """`endAllocateToPool`: requests no longer go to the pool (its use stays)."""
        for i, (pid, _) in enumerate(self.captures):
            if pid == pool_id:
                del self.captures[i]
                return
        raise PoolError("endAllocatePool: not currently recording to mempool_id")

    def release_pool(self, pool_id: PoolId) -> None:
        """`releasePool`: one use fewer; at none the pool is freeable (its cached segments go
        at the next `empty_cache()`, its blocks still allocated when they are freed)."""
        pp = self.graph_pools.get(pool_id)
        if pp is None or pp.use_count <= 0:
            raise PoolError(f"releasePool: no memory pool {pool_id} in use on device "
                            f"{self.device}")
        pp.use_count -= 1
        if pp.use_count == 0:
            self.freeable[pool_id] = pp

    def pool_use_count(self, pool_id: PoolId) -> int:
        """`getPoolUseCount`."""
        pp = self.graph_pools.get(pool_id)
        if pp is None:
            raise PoolError(f"no memory pool {pool_id} on device {self.device}")
        return pp.use_count

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
        self._tracing = enabled == "all"
        self._framing = frames is not None and self.history.context is not None

    def snapshot(self, pool_id: PoolId = DEFAULT_POOL) -> list[dict[str, Any]]:
        """Every segment with its blocks, as `torch.cuda.memory._snapshot()["segments"]`, each
        with the private pool it belongs to (`segment_pool_id`, (0, 0): the device's own);
        `pool_id`: that private pool's segments only (none if there is no such pool)."""
        heads = [self.heads[a] for a in sorted(self.heads)]
        if pool_id != DEFAULT_POOL:
            heads = [b for b in heads if b.pool.owner is not None and b.pool.owner.id == pool_id]
        segments = []
        for head in heads:
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
                             "segment_type": "small" if head.pool.small else "large",
                             "segment_pool_id": (DEFAULT_POOL if head.pool.owner is None
                                                 else head.pool.owner.id),
                             "is_expandable": False,
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

    def _new_segment(self, pool: _Pool, size: int, stream: int,
                     frames: list[dict[str, Any]], retry: bool) -> Block | None:
        """`alloc_block`: cudaMalloc a segment, or None where it would not fit."""
        if retry:
            self.counters["num_alloc_retries"] += 1
        room = self._room()
        if room is not None and size > room:
            return None
        self.reserved_total += size
        b = Block(self._next_address, size, stream, pool)
        if pool.owner is not None:
            pool.owner.segments += 1
        self._next_address += (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE
        b.segment_frames = frames
        self.heads[b.address] = b
        if stream not in pool.streams:
            pool.streams[stream] = ([], [])
        _up(pool.stats, "segment", 1)
        _up(pool.stats, "reserved_bytes", size)
        if size >= self._max_split:
            _inc1(self.oversize_segments, 1)
        self.counters["num_device_alloc"] += 1
        if self._tracing:
            self._trace("segment_alloc", b.address, size, stream, frames)
        return b

    def _free_block(self, block: Block, pool: _Pool) -> None:
        """`free_block`: merge with free neighbours (`try_merge_blocks`, inline) and go back
        to the pool."""
        if self._tracing:
            self._trace("free_completed", block.address, block.requested, block.stream,
                        block.frames)
        size, requested = block.size, block.requested
        # a segment's blocks are all of its stream, so its neighbours are in these lists
        keys, blocks = pool.streams[block.stream]
        split_blocks = split_bytes = 0
        # A block waiting for other streams keeps its stream_uses, so it is never merged.
        src = block.prev
        if src is not None and not src.allocated and not src.stream_uses:
            i = bisect_left(keys, src.size << _KEY_SHIFT | src.address)
            del keys[i]
            del blocks[i]
            block.address = src.address
            prev = block.prev = src.prev
            if prev is not None:
                prev.next = block
            else:
                self.heads[block.address] = block  # it is now its segment's first block
            block.segment_frames = src.segment_frames
            block.size += src.size
            split_blocks -= 1
            split_bytes -= src.size
        src = block.next
        if src is not None and not src.allocated and not src.stream_uses:
            i = bisect_left(keys, src.size << _KEY_SHIFT | src.address)
            del keys[i]
            del blocks[i]
            nxt = block.next = src.next
            if nxt is not None:
                nxt.prev = block
            block.size += src.size
            split_blocks -= 1
            split_bytes -= src.size
        block.frames = _NO_FRAMES
        block.requested = 0
        block.gc_base = pool.free_calls
        k = block.size << _KEY_SHIFT | block.address
        i = bisect_left(keys, k)
        keys.insert(i, k)
        blocks.insert(i, block)
        if block.prev is not None or block.next is not None:
            split_blocks += 1
            split_bytes += block.size
        # inactive_split and its bytes move by what the merges and the block's own split made
        c, o, t = pool.stats
        if split_blocks > 0:
            v = c.inactive_split = c.inactive_split + split_blocks
            c.inactive_split_total += split_blocks
            if v > c.inactive_split_peak:
                c.inactive_split_peak = v
            v += o.inactive_split
            if v > t.inactive_split_peak:
                t.inactive_split_peak = v
        elif split_blocks < 0:
            c.inactive_split += split_blocks
        if split_bytes > 0:
            v = c.inactive_split_bytes = c.inactive_split_bytes + split_bytes
            c.inactive_split_bytes_total += split_bytes
            if v > c.inactive_split_bytes_peak:
                c.inactive_split_bytes_peak = v
            v += o.inactive_split_bytes
            if v > t.inactive_split_bytes_peak:
                t.inactive_split_bytes_peak = v
        elif split_bytes < 0:
            c.inactive_split_bytes += split_bytes
        # active -1, active_bytes -size, requested_bytes -requested
        c.active -= 1
        c.active_bytes -= size
        c.requested_bytes -= requested

    def _process_deferred(self, only_done: bool = False,
                          owner: PrivatePool | None = None) -> None:
        """Free the blocks held back for other streams: all (a synchronize; `owner`: those of
        that private pool), or `only_done` those whose streams have done the work queued
        before their free, as `process_events` queries their events."""
        events = self.events
        if owner is not None:
            done = [b for b in self.deferred if b.pool.owner is owner]
            self.deferred = [b for b in self.deferred if b.pool.owner is not owner]
        elif only_done and events is not None:
            done = [b for b in self.deferred if all(events.done(t) for t in b.events)]
            if not done:
                return
            self.deferred = [b for b in self.deferred if b not in done]
        else:
            done, self.deferred = self.deferred, []
        for b in done:
            b.stream_uses = ()
            b.events = _NO_EVENTS
            self._free_block(b, b.pool)

    def _release(self, pool: _Pool, block: Block) -> None:
        """`release_block`: cudaFree a whole cached segment."""
        pool.remove(block)
        del self.heads[block.address]
        if pool.owner is not None:
            pool.owner.segments -= 1
        self.reserved_total -= block.size
        _down(pool.stats, "segment", 1)
        _down(pool.stats, "reserved_bytes", block.size)
        if block.size >= self._max_split:
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
        cached = pool.streams.get(stream)
        candidates = ([] if cached is None else
                      [b for b in reversed(cached[1]) if b.size >= max_split])
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
        freeable = [b for b in pool.blocks if not b.is_split]
        if not freeable:
            return
        total_age = sum(pool.free_calls - b.gc_base for b in freeable)
        count = len(freeable)
        reclaimed = 0
        freed_one = True
        while reclaimed < target and freed_one and count > 0:
            threshold_age = total_age / count
            freed_one = False
            for b in pool.blocks:
                age = pool.free_calls - b.gc_base
                if not b.is_split and age >= threshold_age:
                    freed_one = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release(pool, b)


# The oversize statistics are one [current, peak, allocated, freed] each (no pool types).

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
