"""CUDA's caching allocator as a pure state machine: what a GPU's memory looks like to torch.

A port of the rules of `c10/cuda/CUDACachingAllocator.cpp` and `c10/core/AllocatorConfig.cpp`
(torch 2.13), fed with allocation and free events, running no op and touching no GPU, so it is
tested against those rules directly (tests/test_allocator.py). The simulation keeps one per
simulated GPU and `torch.cuda`'s memory API reads it; the numbers are what a real GPU's
allocator would report for the same sequence of requests.

Split as torch splits it; begin at `state_machine.CachingAllocator.allocate`:

- `alloc_conf`: PYTORCH_CUDA_ALLOC_CONF and the size constants (`AllocatorConfig.h`);
- `size_rules`: rounding, a new segment's size, whether a cached block may serve a request;
- `block_pools`: blocks, the pools of cached blocks, private pools (`Block`, `BlockPool`,
  `PrivatePool`);
- `stats`, `snapshots`: the statistics, the history and the snapshot (`CachingDeviceAllocator.h`);
- `oom`: the out-of-memory error in CUDA's words;
- `state_machine`: the allocator itself, its steps under CUDA's names.

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

from devlab.engine.gpu_model.caching_allocator.alloc_conf import (
    KMIN_BLOCK,
    LARGE_BUFFER,
    MIN_LARGE_ALLOC,
    ROUND_LARGE,
    SIZE_MAX,
    SMALL_BUFFER,
    SMALL_SIZE,
    AllocatorConfig,
    AllocatorConfigError,
)
from devlab.engine.gpu_model.caching_allocator.block_pools import (
    DEFAULT_POOL,
    Block,
    BlockPool,
    PoolError,
    PoolId,
    PrivatePool,
    StreamEvents,
)
from devlab.engine.gpu_model.caching_allocator.oom import OutOfMemory, format_size
from devlab.engine.gpu_model.caching_allocator.size_rules import round_size, segment_size, serves
from devlab.engine.gpu_model.caching_allocator.snapshots import History
from devlab.engine.gpu_model.caching_allocator.state_machine import CachingAllocator
from devlab.engine.gpu_model.caching_allocator.stats import (
    ARRAY_STATS,
    POOL_TYPES,
    DeviceStats,
    PoolStats,
)

__all__ = ["ARRAY_STATS", "DEFAULT_POOL", "KMIN_BLOCK", "LARGE_BUFFER", "MIN_LARGE_ALLOC",
           "POOL_TYPES", "ROUND_LARGE", "SIZE_MAX", "SMALL_BUFFER", "SMALL_SIZE",
           "AllocatorConfig", "AllocatorConfigError", "Block", "BlockPool", "CachingAllocator",
           "DeviceStats", "History", "OutOfMemory", "PoolError", "PoolId", "PoolStats",
           "PrivatePool", "StreamEvents", "format_size", "round_size", "segment_size", "serves"]
