"""CUDA's caching allocator as a pure state machine (`DeviceCachingAllocator` of
`c10/cuda/CUDACachingAllocator.cpp`, torch 2.13): `CachingAllocator`, fed with allocation and
free events, running no op and touching no GPU. The package's docstring says what it keeps;
begin at `CachingAllocator.allocate` (CUDA's `malloc`) and `free`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from devlab.engine.gpu_model.caching_allocator.alloc_conf import (
    KMIN_BLOCK,
    LARGE_BUFFER,
    MIN_LARGE_ALLOC,
    ROUND_LARGE,
    SIZE_MAX,
    SMALL_BUFFER,
    SMALL_SIZE,
    AllocatorConfig,
)
from devlab.engine.gpu_model.caching_allocator.block_pools import (
    DEFAULT_POOL,
    KEY_SHIFT,
    NO_EVENTS,
    NO_FRAMES,
    Block,
    BlockPool,
    PoolError,
    PoolId,
    PrivatePool,
    StreamEvents,
)
from devlab.engine.gpu_model.caching_allocator.oom import OutOfMemory
from devlab.engine.gpu_model.caching_allocator.size_rules import round_size, segment_size, serves
from devlab.engine.gpu_model.caching_allocator.snapshots import History, segments
from devlab.engine.gpu_model.caching_allocator.stats import (
    DeviceStats,
    decrease,
    increase,
    stat_decrease,
    stat_increase,
)

_new_block = object.__new__


class CachingAllocator:
    """One GPU's caching allocator (CUDA's `DeviceCachingAllocator`).

    `total` is the capacity torch reports for the GPU (None: unlimited, a GPU on the host's
    memory); `context` what the CUDA context and other processes already hold of it, so
    cudaMalloc can give `total - context`; `allowed` the per-process limit of
    `set_per_process_memory_fraction` (None: none). Addresses are made up, unique per GPU.

    Its steps carry CUDA's names: `allocate` is `malloc`'s chain (process_events, round_size,
    get_pool, get_allocation_size, get_free_block, garbage_collect_cached_blocks, alloc_block,
    release_available_cached_blocks, release_cached_blocks, alloc_found_block), `free` is
    `free` (free_block once the block's other streams are done), `empty_cache` is
    `release_cached_blocks`.
    """

    # Note [The allocator's hot path]
    # malloc and free run once per tensor, so they are written for speed (issue 27: at most
    # 2 us per allocation event; benchmarks/allocator.py), against the plain port they replaced
    # (tests/_allocator_reference.py, replayed beside it by tests/test_allocator_equivalence.py):
    # - each pool keeps its cached blocks per stream as two parallel sorted lists, int keys
    #   (size << 64 | address) and blocks: bisecting ints is cheaper than comparing tuples;
    # - the statistics are attributes of one `PoolStats` per pool type; "all" is summed when
    #   read (only its peak is kept), and CUDA's "freed" is derived, so a free changes one
    #   number per statistic (See PoolStats; active's current value is always kept, never
    #   derived from allocation's: blocks waiting for other streams stay active);
    # - round_size, get_allocation_size, get_free_block and alloc_found_block are written
    #   inline in `allocate` (a call costs more than most of these steps), each labelled with
    #   its name, following the rules of size_rules.py; segments' first blocks are kept by
    #   address (`heads`, what snapshots walk) rather than a set of active blocks;
    # - blocks share empty frames and stream lists until they get some of their own;
    # - the history's and the garbage collector's switches are kept as flags (`_tracing`,
    #   `_framing`, `_gc`), the configuration's max_split_size and max_non_split_rounding as
    #   `_max_split` and `_max_non_split`.
    # Callgrind (benchmarks/allocator.py): 20.4k instructions per event before these, 12.9k.
    # Issue 36's split kept it: get_free_block asks size_rules.serves (the fit decision, which
    # refusal asks too) in a call, paid for by alloc_found_block's split reusing get_free_block's
    # lists; the loop without torch's import under callgrind (PYTHONHASHSEED=0): 12.90k
    # instructions per event before the split, 12.89k after.
    # Issue 39: get_free_block asks serves() only of a large pool; for a small one its answer
    # is decided once (`_small_served`, from serves' own rule: every small pool's block and
    # request is under max_split_size, which torch's parser keeps at 20 MiB or more), the
    # stream's cached lists are read with one lookup, and a split's block is made without the
    # class's call (object.__new__ and its fields): an allocate and free of 4,000 bytes by a
    # small segment went from 28,282 to 26,413 instructions (the loop without torch's import).

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
        self._max_non_split = self.config.max_non_split_rounding
        # Whether serves() says yes to every block of a small pool for every small request:
        # it does when a small pool's blocks (at most one SMALL_BUFFER segment) and requests
        # (at most SMALL_SIZE) are all under max_split_size (at least 20 MiB as torch parses
        # it), so get_free_block's fit is decided once here for them
        self._small_served = SMALL_SIZE < self._max_split and SMALL_BUFFER < self._max_split
        self.small = BlockPool(small=True)
        self.large = BlockPool(small=False)
        self.reserved_total = 0  # total_allocated_memory: every live segment's bytes
        # Each live segment's first block, by the segment's address (what snapshots walk)
        self.heads: dict[int, Block] = {}
        self.deferred: list[Block] = []  # freed blocks other streams still use (record_stream)
        # Where the other streams are (None: every stream is always done, as with no clock).
        self.events: StreamEvents | None = None
        self.stats = DeviceStats()
        for pool in (self.small, self.large):
            pool.stats = self.stats.of_pool(pool.small)
            pool.counts = pool.stats[0]
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
        stats = self.stats
        return stats.small.allocated_bytes + stats.large.allocated_bytes

    @property
    def reserved(self) -> int:
        """Bytes of every segment (memory_reserved)."""
        stats = self.stats
        return stats.small.reserved_bytes + stats.large.reserved_bytes

    @property
    def peak_allocated(self) -> int:
        return self.stats.peaks.allocated_bytes_peak

    @property
    def peak_reserved(self) -> int:
        return self.stats.peaks.reserved_bytes_peak

    def free_memory(self) -> int:
        """What cudaMemGetInfo calls free: the capacity less the context and the segments."""
        if self.total is None:
            raise ValueError("an unlimited GPU has no free figure")
        return max(0, self.total - self.context - self.reserved_total)

    def memory_stats(self) -> dict[str, Any]:
        """`torch._C._cuda_memoryStats`: the nested dict torch.cuda.memory_stats flattens."""
        return self.stats.as_dict(self.config.max_split_size)

    def reset_peak(self) -> None:
        """`resetPeakStats`: every peak becomes the current value."""
        self.stats.reset_peak()

    def reset_accumulated(self) -> None:
        """`resetAccumulatedStats`: the allocated/freed totals and counters start again."""
        self.stats.reset_accumulated()

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
            # process_events, as CUDA's malloc; skipped while a capture is under way (CUDA
            # may not query events then)
            self._process_events()
        frames = self.history.frames_at("state") if self._framing else NO_FRAMES
        # round_size, inline for the plain settings (size_rules.round_size)
        if self._plain_rounding:
            rounded = KMIN_BLOCK if size < KMIN_BLOCK else (size + KMIN_BLOCK - 1) & -KMIN_BLOCK
        else:
            rounded = round_size(size, self.config)
        # get_pool, and get_allocation_size inline (size_rules.segment_size)
        if rounded <= SMALL_SIZE:
            pool = self.small
            alloc_size = SMALL_BUFFER
            served = self._small_served
        else:
            pool = self.large
            alloc_size = (LARGE_BUFFER if rounded < MIN_LARGE_ALLOC
                          else (rounded + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE)
            served = False
        if self.captures:  # a capture's (or use_mem_pool's) private pool
            pool = self._get_pool(pool, stream)
        # get_free_block, inline: the smallest cached block of the stream that fits, if it
        # may serve the request (`served`: serves() says yes to every small pool's block)
        if self._gc:
            pool.free_calls += 1
        block: Block | None = None
        cached = pool.streams.get(stream)
        if cached is not None:
            keys, blocks = cached
            i = bisect_left(keys, rounded << KEY_SHIFT)
            if i < len(keys) and (served or serves(blocks[i].size, rounded, self._max_split,
                                                   self._max_non_split)):
                block = blocks[i]
                del keys[i]
                del blocks[i]
        if block is None:
            if self._gc:
                self._garbage_collect_cached_blocks()
            block = (self._alloc_block(pool, alloc_size, stream, frames, retry=False)
                     or (self._release_available_cached_blocks(pool, rounded, stream)
                         and self._alloc_block(pool, alloc_size, stream, frames, retry=False))
                     or (not self.captures and self.release_cached_blocks()
                         and self._alloc_block(pool, alloc_size, stream, frames, retry=True)))
            if not block:
                self.stats.counters["num_ooms"] += 1
                free = 0 if self.total is None else self.free_memory()
                self.history.record("oom", 0, alloc_size, stream, frames, device_free=free)
                return self._oom(alloc_size, free)
            keys, blocks = pool.streams[stream]  # alloc_block made them if there were none
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
            # Block(rest.address, size, stream, pool), inline: a class's call costs more
            # than its fields (the split runs for most small requests); prev, next and the
            # frames are set below, allocated and requested after the split
            block = _new_block(Block)
            block.address = rest.address
            block.size = size
            block.stream = stream
            block.pool = pool
            block.stream_uses = ()
            block.events = NO_EVENTS
            block.gc_base = 0
            prev = block.prev = rest.prev
            if prev is not None:
                prev.next = block
            else:
                self.heads[block.address] = block
            block.next = rest
            block.segment_frames = rest.segment_frames
            rest.segment_frames = NO_FRAMES
            rest.prev = block
            rest.address += size
            rest.size = remaining
            rest.gc_base = pool.free_calls
            k = remaining << KEY_SHIFT | rest.address
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
            self.history.record("alloc", block.address, requested, stream, frames)
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
            stat_increase(self.stats.oversize_allocations, 1)
        return block

    def refusal(self, size: int, stream: int = 0) -> OutOfMemory | None:
        """The out-of-memory `malloc(size)` would raise, or None where it would succeed,
        changing nothing: a caller asks before it makes what it would allocate. It asks what
        `allocate` asks, in its order."""
        rounded = round_size(size, self.config)
        pool = self.small if rounded <= SMALL_SIZE else self.large
        if self.captures:
            pool = self._get_pool(pool, stream)
        b = pool.first_fit(stream, rounded)
        if b is not None and serves(b.size, rounded, self._max_split, self._max_non_split):
            return None  # get_free_block would take it
        alloc_size = segment_size(rounded)
        room = self._room()
        if room is None or alloc_size <= room:
            return None  # alloc_block would make it
        # release_cached_blocks would free the cached whole segments of the device's pools
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
            stat_decrease(self.stats.oversize_allocations, 1)
        if self._tracing:
            self.history.record("free_requested", block.address, block.requested,
                                block.stream, self.history.frames_at("all") or block.frames)
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
        self._synchronize_and_free_events()

    def release_cached_blocks(self, pool_id: PoolId = DEFAULT_POOL) -> bool:
        """`release_cached_blocks` (`empty_cache`): release every cached block that is a whole
        segment, of the device's own pools (unless a capture is under way) and of the private
        pools no graph or MemPool uses any more (`pool_id`: of that one only, and not the
        device's own). A freeable pool left with no segment is forgotten."""
        if pool_id == DEFAULT_POOL and not self.captures:
            self._synchronize_and_free_events()
            self.stats.counters["num_sync_all_streams"] += 1
            for pool in (self.large, self.small):
                self._release_blocks(pool)
        for pid, pp in list(self.freeable.items()):
            if pool_id not in (DEFAULT_POOL, pid):
                continue
            if pool_id != DEFAULT_POOL:
                # synchronize_and_free_events(context, pool): that pool's held-back blocks
                self._synchronize_and_free_events(owner=pp)
            self._release_blocks(pp.small)
            self._release_blocks(pp.large)
            if pp.segments == 0:
                del self.graph_pools[pid]
                del self.freeable[pid]
        return True

    empty_cache = release_cached_blocks  # emptyCache: what torch.cuda.empty_cache calls

    def _release_blocks(self, pool: BlockPool) -> None:
        """`release_blocks`: release the pool's cached blocks that are whole segments."""
        for b in pool.blocks:
            if not b.is_split:
                self._release_block(pool, b)

    # -- private pools (CUDA graphs, torch.cuda.MemPool) -------------------------------------

    def _get_pool(self, pool: BlockPool, stream: int) -> BlockPool:
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
                p.stats = self.stats.of_pool(p.small)
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
        return segments(self.device, self.heads, self.deferred, pool_id)

    def trace(self) -> list[dict[str, Any]]:
        """The recorded events, oldest first (`device_traces[device]`)."""
        return list(self.history.trace)

    # -- the allocator's own steps -----------------------------------------------------------

    def _alloc_block(self, pool: BlockPool, size: int, stream: int,
                     frames: list[dict[str, Any]], retry: bool) -> Block | None:
        """`alloc_block`: cudaMalloc a segment, or None where it would not fit."""
        if retry:
            self.stats.counters["num_alloc_retries"] += 1
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
        increase(pool.stats, "segment", 1)
        increase(pool.stats, "reserved_bytes", size)
        if size >= self._max_split:
            stat_increase(self.stats.oversize_segments, 1)
        self.stats.counters["num_device_alloc"] += 1
        if self._tracing:
            self.history.record("segment_alloc", b.address, size, stream, frames)
        return b

    def _free_block(self, block: Block, pool: BlockPool) -> None:
        """`free_block`: merge with free neighbours (`try_merge_blocks`, inline) and go back
        to the pool."""
        if self._tracing:
            self.history.record("free_completed", block.address, block.requested,
                                block.stream, block.frames)
        size, requested = block.size, block.requested
        # a segment's blocks are all of its stream, so its neighbours are in these lists
        keys, blocks = pool.streams[block.stream]
        split_blocks = split_bytes = 0
        # A block waiting for other streams keeps its stream_uses, so it is never merged.
        src = block.prev
        if src is not None and not src.allocated and not src.stream_uses:
            i = bisect_left(keys, src.size << KEY_SHIFT | src.address)
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
            i = bisect_left(keys, src.size << KEY_SHIFT | src.address)
            del keys[i]
            del blocks[i]
            nxt = block.next = src.next
            if nxt is not None:
                nxt.prev = block
            block.size += src.size
            split_blocks -= 1
            split_bytes -= src.size
        block.frames = NO_FRAMES
        block.requested = 0
        block.gc_base = pool.free_calls
        k = block.size << KEY_SHIFT | block.address
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

    def _process_events(self) -> None:
        """`process_events`: free the blocks held back for other streams whose streams have
        done the work queued before their free (all of them where no clock tells)."""
        events = self.events
        if events is None:
            self._synchronize_and_free_events()
            return
        done = [b for b in self.deferred if all(events.done(t) for t in b.events)]
        if not done:
            return
        self.deferred = [b for b in self.deferred if b not in done]
        self._free_deferred(done)

    def _synchronize_and_free_events(self, owner: PrivatePool | None = None) -> None:
        """`synchronize_and_free_events`: every stream is done, so the blocks held back for
        other streams are free (`owner`: those of that private pool)."""
        if owner is not None:
            done = [b for b in self.deferred if b.pool.owner is owner]
            self.deferred = [b for b in self.deferred if b.pool.owner is not owner]
        else:
            done, self.deferred = self.deferred, []
        self._free_deferred(done)

    def _free_deferred(self, done: list[Block]) -> None:
        """The blocks of `done` are no longer used on other streams: `free_block` each."""
        for b in done:
            b.stream_uses = ()
            b.events = NO_EVENTS
            self._free_block(b, b.pool)

    def _release_block(self, pool: BlockPool, block: Block) -> None:
        """`release_block`: cudaFree a whole cached segment."""
        pool.remove(block)
        del self.heads[block.address]
        if pool.owner is not None:
            pool.owner.segments -= 1
        self.reserved_total -= block.size
        decrease(pool.stats, "segment", 1)
        decrease(pool.stats, "reserved_bytes", block.size)
        if block.size >= self._max_split:
            stat_decrease(self.stats.oversize_segments, 1)
        self.stats.counters["num_device_free"] += 1
        self.history.record("segment_free", block.address, block.size, block.stream,
                            self.history.frames_at("all") or block.segment_frames)

    def _release_available_cached_blocks(self, pool: BlockPool, size: int, stream: int) -> bool:
        """`release_available_cached_blocks`: free cached oversize blocks, just enough."""
        max_split = self._max_split
        if max_split == SIZE_MAX:
            return False
        want = max(size, max_split)
        b = pool.first_fit(stream, want)
        if b is not None:
            self._release_block(pool, b)
            return True
        cached = pool.streams.get(stream)
        candidates = ([] if cached is None else
                      [b for b in reversed(cached[1]) if b.size >= max_split])
        released = 0
        for b in candidates:
            if released >= want:
                break
            released += b.size
            self._release_block(pool, b)
        return released >= want

    def _garbage_collect_cached_blocks(self) -> None:
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
                    self._release_block(pool, b)
