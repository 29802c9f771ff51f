"""The caching allocator's statistics, under the keys of `torch.cuda.memory_stats()`, as
torch keeps them in `c10/core/CachingDeviceAllocator.h` (`Stat`, `StatArray`, `DeviceStats`).

Kept more cheaply than CUDA's four numbers per statistic and pool type (`PoolStats`, See Note
[The allocator's hot path] in state_machine.py), and read out in CUDA's form by
`DeviceStats.as_dict`.
"""

from __future__ import annotations

from typing import Any

from devlab.engine.gpu_model.caching_allocator.alloc_conf import SIZE_MAX

# The statistics CUDA keeps per pool type ("all", "small_pool", "large_pool"), in the order of
# torch._C._cuda_memoryStats.
ARRAY_STATS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
               "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
POOL_TYPES = ("all", "small_pool", "large_pool")


class PoolStats:
    """The statistics of one pool type (small or large blocks) as attributes, one set per
    name of `ARRAY_STATS`: `X` (current), `X_peak`, `X_total` (CUDA's "allocated": every
    increase since the accumulated statistics were reset) and `X_base` (the current value at
    that reset).

    Cheaper to keep than CUDA's four numbers for "all" and each pool type (See Note [The
    allocator's hot path]), and as exact: a decrease changes only `X`, since CUDA's "freed" is
    always `X_base + X_total - X`; and "all" is the sum of the two pool types (every change of
    a statistic is of one pool type), except its peak, which `DeviceStats.peaks` keeps
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



# What a block of one pool type changes: its type's statistics, the other type's (to sum
# "all"), and the peaks of "all" (`DeviceStats.of_pool`).
PoolTypeStats = tuple[PoolStats, PoolStats, PoolStats]


def increase(stats: PoolTypeStats, name: str, n: int) -> None:
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


def decrease(stats: PoolTypeStats, name: str, n: int) -> None:
    """Statistic `name` of pool type `stats[0]` falls by `n`."""
    c = stats[0]
    setattr(c, name, getattr(c, name) - n)


# The oversize statistics are one CUDA `Stat` each, [current, peak, allocated, freed] (no pool
# types).

def _stat() -> list[int]:
    return [0, 0, 0, 0]  # current, peak, allocated, freed


def stat_increase(s: list[int], n: int) -> None:
    s[0] += n
    s[2] += n
    if s[0] > s[1]:
        s[1] = s[0]


def stat_decrease(s: list[int], n: int) -> None:
    s[0] -= n
    s[3] += n


def _stat_dict(s: list[int]) -> dict[str, int]:
    return {"current": s[0], "peak": s[1], "allocated": s[2], "freed": s[3]}


class DeviceStats:
    """CUDA's `DeviceStats` for one GPU: the statistics of small and large blocks
    (`small`, `large`), the peaks of "all" (`peaks`, a `PoolStats` of which only the `X_peak`
    are used), the oversize statistics and the counters."""

    __slots__ = ("counters", "large", "oversize_allocations", "oversize_segments", "peaks",
                 "small")

    def __init__(self) -> None:
        self.small, self.large, self.peaks = PoolStats(), PoolStats(), PoolStats()
        self.oversize_allocations = _stat()
        self.oversize_segments = _stat()
        self.counters = {"num_alloc_retries": 0, "num_ooms": 0, "num_sync_all_streams": 0,
                         "num_device_alloc": 0, "num_device_free": 0}

    def of_pool(self, small: bool) -> PoolTypeStats:
        """What a block of a small or large pool changes (`get_stat_types_for_pool`): its pool
        type's statistics, the other type's (to sum "all"), and the peaks of "all"."""
        if small:
            return (self.small, self.large, self.peaks)
        return (self.large, self.small, self.peaks)

    def as_dict(self, max_split_size: int) -> dict[str, Any]:
        """`torch._C._cuda_memoryStats`: the nested dict torch.cuda.memory_stats flattens
        (`max_split_size`: the configured one, SIZE_MAX for none)."""
        out: dict[str, Any] = dict(self.counters)
        out["max_split_size"] = -1 if max_split_size == SIZE_MAX else max_split_size
        small, large = self.small, self.large
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
        small, large = self.small, self.large
        for name in ARRAY_STATS:
            for c in (small, large):
                setattr(c, name + "_peak", getattr(c, name))
            setattr(self.peaks, name + "_peak", getattr(small, name) + getattr(large, name))
        for s in (self.oversize_allocations, self.oversize_segments):
            s[1] = s[0]

    def reset_accumulated(self) -> None:
        """`resetAccumulatedStats`: the allocated/freed totals and counters start again."""
        for c in (self.small, self.large):
            for name in ARRAY_STATS:
                setattr(c, name + "_total", 0)
                setattr(c, name + "_base", getattr(c, name))
        for s in (self.oversize_allocations, self.oversize_segments):
            s[2] = s[3] = 0
        for k in self.counters:
            self.counters[k] = 0
