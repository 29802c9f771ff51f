"""The caching allocator's blocks and pools (`CUDACachingAllocator.cpp`'s `Block`,
`BlockPool`, `PrivatePool`): pieces of segments, the cached free ones ordered for the search
of a request, and the private pools of CUDA graphs and `torch.cuda.MemPool`s."""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Protocol

from devlab.engine.gpu_model.caching_allocator.stats import PoolStats, PoolTypeStats

# A cached block's sort key is size << 64 | address: addresses stay below 2**64 (they start
# near 2**47 and grow by the bytes ever reserved), so keys order as (size, address) tuples.
KEY_SHIFT = 64

NO_FRAMES: list[dict[str, Any]] = []  # shared, never written: blocks replace, not extend
NO_EVENTS: list[float | None] = []  # likewise


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

    def __init__(self, address: int, size: int, stream: int, pool: BlockPool) -> None:
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
        self.events: list[float | None] = NO_EVENTS
        self.frames: list[dict[str, Any]] = NO_FRAMES
        self.segment_frames: list[dict[str, Any]] = NO_FRAMES
        self.gc_base = 0

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def key(self) -> tuple[int, int, int]:
        return (self.stream, self.size, self.address)

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "free"
        return f"Block({self.size:,} B at {self.address:#x}, stream {self.stream}, {state})"


class BlockPool:
    """Cached free blocks of one pool, ordered as CUDA's `BlockComparatorSize`
    (stream, size, address).

    Per stream, two parallel lists kept sorted: `keys`, each block's size and address as one
    int (`KEY_SHIFT`), and the blocks themselves. One int compares in a few machine instructions
    where a tuple compares item by item, and bisecting is most of a request's search (See Note
    [The allocator's hot path] in state_machine.py). `stats` holds the statistics a block of
    this pool changes (`DeviceStats.of_pool`), `counts` the first of them.
    """

    __slots__ = ("counts", "free_calls", "owner", "small", "stats", "streams")

    def __init__(self, small: bool, owner: PrivatePool | None = None) -> None:
        self.small = small
        self.owner = owner  # owner_PrivatePool: None for the device's own pools
        # stream -> (keys, blocks): made with the stream's first segment in the pool (blocks
        # enter a pool only so), kept while the pool lives (a GPU has few streams)
        self.streams: dict[int, tuple[list[int], list[Block]]] = {}
        self.free_calls = 0  # get_free_blocks_call_count: the garbage collector's clock
        self.stats: PoolTypeStats = ()  # type: ignore[assignment]
        self.counts: PoolStats  # stats[0], its own pool type's

    @property
    def blocks(self) -> list[Block]:
        """The cached blocks, in the pool's order."""
        return [b for s in sorted(self.streams) for b in self.streams[s][1]]

    def insert(self, block: Block) -> None:
        block.gc_base = self.free_calls
        keys, blocks = self.streams[block.stream]
        k = block.size << KEY_SHIFT | block.address
        i = bisect_left(keys, k)
        keys.insert(i, k)
        blocks.insert(i, block)

    def remove(self, block: Block) -> None:
        keys, blocks = self.streams[block.stream]
        i = bisect_left(keys, block.size << KEY_SHIFT | block.address)
        del keys[i]
        del blocks[i]

    def first_fit(self, stream: int, size: int) -> Block | None:
        """The smallest cached block of `stream` of at least `size` bytes."""
        got = self.streams.get(stream)
        if got is None:
            return None
        keys, blocks = got
        i = bisect_left(keys, size << KEY_SHIFT)
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
        self.small = BlockPool(small=True, owner=self)
        self.large = BlockPool(small=False, owner=self)
        self.use_count = 1
        self.segments = 0
        self.no_split = False  # MemPool(no_split=True): its blocks are never split

    def __repr__(self) -> str:
        return f"PrivatePool({self.id}, use_count={self.use_count}, segments={self.segments})"


class PoolError(RuntimeError):
    """A private-pool call torch refuses (its TORCH_CHECK), in torch's words."""
