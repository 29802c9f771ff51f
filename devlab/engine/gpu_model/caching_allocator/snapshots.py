"""The caching allocator's history and snapshots, in the forms torch reads
(`c10/core/CachingDeviceAllocator.h`'s `TraceEntry`, `SegmentInfo`, `BlockInfo`,
`RecordContext`): the trace `_record_memory_history` keeps, where each allocation came from,
and the segments of `torch.cuda.memory._snapshot()`. Snapshots are plain dicts, as torch's."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from devlab.engine.gpu_model.caching_allocator.block_pools import (
    DEFAULT_POOL,
    NO_FRAMES,
    Block,
    PoolId,
)

# RecordContext, least to most: which events keep the frames of their caller.
_CONTEXTS = ("state", "alloc", "all")


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

    def frames_at(self, level: str) -> list[dict[str, Any]]:
        """The caller's frames for an event of `level` ("state": an allocation kept in the
        snapshot, "alloc", "all": a free), if the recorded context reaches it."""
        if self.frames is None or self.context is None:
            return NO_FRAMES
        if _CONTEXTS.index(self.context) < _CONTEXTS.index(level):
            return []
        return self.frames()

    def record(self, action: str, addr: int, size: int, stream: int,
               frames: list[dict[str, Any]], **extra: Any) -> None:
        """One `TraceEntry`, if the whole trace is recorded and `action` is not skipped."""
        if self.enabled != "all" or action in self.skip:
            return
        entry = {"action": action, "addr": addr, "size": size, "stream": stream,
                 "time_us": int(time.time() * 1e6), "frames": frames, **extra}
        if len(self.trace) >= self.max_entries:
            del self.trace[0]
        self.trace.append(entry)


def segments(device: int, heads: dict[int, Block], deferred: list[Block],
             pool_id: PoolId = DEFAULT_POOL) -> list[dict[str, Any]]:
    """Every segment with its blocks, as `torch.cuda.memory._snapshot()["segments"]`, from
    each segment's first block by address (`heads`), `deferred` the freed blocks other streams
    still use; each with the private pool it belongs to (`segment_pool_id`, (0, 0): the
    device's own); `pool_id`: that private pool's segments only."""
    firsts = [heads[a] for a in sorted(heads)]
    if pool_id != DEFAULT_POOL:
        firsts = [b for b in firsts if b.pool.owner is not None and b.pool.owner.id == pool_id]
    out = []
    for head in firsts:
        blocks = []
        total = allocated = active = requested = 0
        b: Block | None = head
        while b is not None:
            awaiting = not b.allocated and b in deferred
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
        out.append({"device": device, "address": head.address,
                    "total_size": total, "allocated_size": allocated,
                    "active_size": active, "requested_size": requested,
                    "stream": head.stream,
                    "segment_type": "small" if head.pool.small else "large",
                    "segment_pool_id": (DEFAULT_POOL if head.pool.owner is None
                                        else head.pool.owner.id),
                    "is_expandable": False,
                    "frames": list(head.segment_frames), "blocks": blocks})
    return out
