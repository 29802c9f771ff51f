"""The tuned caching-allocator model agrees with the plain port it replaced.

`devlab.engine.gpu_model.caching_allocator` was restructured for speed (issue 27: at most 2 us per
allocation). `tests/_allocator_reference.py` is the plain port as it stood before; both are fed
the same long random sequences of requests, frees, `record_stream`, synchronizations,
`empty_cache()`, resets and history recording, under several PYTORCH_CUDA_ALLOC_CONF settings
and capacities small enough to run out of memory, and must answer alike at every step: the
blocks handed out, every statistic of `memory_stats()`, the out-of-memory errors and their
messages, `refusal()`, and the snapshot and trace. The streams run on a fake clock
(`FakeStreams`, what the simulation's `StreamEvents` answers), so a block recorded on other
streams waits across later requests until the host's time passes their work, as on main.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from devlab.engine.gpu_model import caching_allocator as tuned
from tests import _allocator_reference as reference

MiB = 1 << 20

# (PYTORCH_CUDA_ALLOC_CONF, total, allowed): the settings each sequence runs under.
SETTINGS = [
    ("", None, None),
    ("", 600 * MiB, None),
    ("max_split_size_mb:40", 700 * MiB, None),
    ("roundup_power2_divisions:4", 900 * MiB, None),
    ("roundup_power2_divisions:[64:8,256:4,>:1],max_split_size_mb:64", 800 * MiB, None),
    ("garbage_collection_threshold:0.5", 2048 * MiB, 500 * MiB),
    ("garbage_collection_threshold:0.8,max_split_size_mb:30", None, 400 * MiB),
]


def _size(rng: random.Random) -> int:
    kind = rng.random()
    if kind < 0.05:
        return rng.choice((0, 1, 511, 512, 513, MiB, MiB + 1, 10 * MiB, 10 * MiB - 1))
    if kind < 0.45:
        return rng.randrange(1, 64 * 1024)
    if kind < 0.65:
        return rng.randrange(64 * 1024, 2 * MiB)
    if kind < 0.9:
        return rng.randrange(MiB, 12 * MiB)
    return rng.randrange(12 * MiB, 160 * MiB)


STREAMS = (0, 1, 3, 7)


class FakeStreams:
    """The streams of one GPU on a made-up clock, as the allocator's `StreamEvents` asks
    after them: each stream's queued work ends at some time, the host is at `now`; stream 3
    reports no time (None: a stream without a model, always done)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.ends = dict.fromkeys(STREAMS, 0.0)

    def record(self, stream: int) -> float | None:
        return None if stream == 3 else max(self.ends[stream], self.now)

    def done(self, at: float | None) -> bool:
        return at is None or at <= self.now


def _frames() -> list[dict[str, Any]]:
    return [{"filename": "cell.py", "line": 3, "name": "<module>"}]


def _trace(a: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "time_us"} for e in a.trace()]


def _step(a: Any, rng: random.Random, live: list[Any], mod: Any) -> Any:
    """One random step on allocator `a` (`rng` seeded alike for both); what it answered."""
    r = rng.random()
    if r < 0.5 or not live:
        size, stream = _size(rng), rng.choice((0, 0, 0, 1, 7))
        got = a.allocate(size, stream)
        if isinstance(got, mod.OutOfMemory):
            return ("oom", got.message(), got.process_bytes, got.alloc_size)
        live.append(got)
        return ("block", got.address, got.size, got.stream, got.requested)
    if r < 0.8:
        b = live.pop(rng.randrange(len(live)))
        if rng.random() < 0.25:
            for _ in range(rng.randrange(1, 3)):
                a.record_stream(b, rng.choice(STREAMS))
        a.free(b)
        return ("free",)
    if r < 0.82:
        b = live[rng.randrange(len(live))]
        a.record_stream(b, rng.choice(STREAMS))  # recorded while live, freed later
        return ("record",)
    if r < 0.85:
        # The streams' work and the host's time move (the same for both: same rng)
        clock = a.events
        if clock is not None:
            stream = rng.choice(STREAMS)
            clock.ends[stream] = max(clock.ends[stream], clock.now) + rng.random()
            clock.now += rng.random() * 0.5
        return ("time",)
    if r < 0.88:
        return ("refusal", str(a.refusal(_size(rng) * 4, rng.choice((0, 1)))))
    if r < 0.9:
        a.synchronize()
        return ("sync",)
    if r < 0.92:
        return ("empty", a.empty_cache())
    if r < 0.93:
        a.reset_peak()
        return ("reset_peak",)
    if r < 0.94:
        a.reset_accumulated()
        return ("reset_acc",)
    if r < 0.95:
        choice = rng.choice((None, "state", "all"))
        context = rng.choice(("state", "alloc", "all"))
        a.record_history(choice, context, frames=_frames, clear_history=rng.random() < 0.3)
        return ("history", choice, context)
    return ("snapshot", a.snapshot(), _trace(a))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("conf", "total", "allowed"), SETTINGS)
def test_tuned_allocator_answers_as_the_reference(conf: str, total: int | None,
                                                  allowed: int | None, seed: int) -> None:
    fast = tuned.CachingAllocator(3, total, 0 if total is None else 200 * MiB, allowed,
                                  tuned.AllocatorConfig.parse(conf))
    ref = reference.CachingAllocator(3, total, 0 if total is None else 200 * MiB, allowed,
                                     reference.AllocatorConfig.parse(conf))
    # Seed 0 runs without a clock (every stream always done, as without a model).
    if seed:
        fast.events, ref.events = FakeStreams(), FakeStreams()
    waited = 0
    rng_fast, rng_ref = random.Random(seed), random.Random(seed)
    live_fast: list[Any] = []
    live_ref: list[Any] = []
    ooms = 0
    for i in range(3000):
        got = _step(fast, rng_fast, live_fast, tuned)
        want = _step(ref, rng_ref, live_ref, reference)
        assert got == want, f"step {i}"
        assert fast.memory_stats() == ref.memory_stats(), f"step {i}: {got[0]}"
        assert (fast.allocated, fast.reserved, fast.peak_allocated, fast.peak_reserved) == (
            ref.allocated, ref.reserved, ref.peak_allocated, ref.peak_reserved)
        ooms += got[0] == "oom"
        waited += got[0] == "block" and bool(fast.deferred)
    assert fast.snapshot() == ref.snapshot()
    assert _trace(fast) == _trace(ref)
    if total is not None or allowed is not None:
        assert ooms, "the sequence never reached the capacity: the OOM paths went untested"
    if seed:
        assert waited, "no block waited for its streams across a request: untested"
