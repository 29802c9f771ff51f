"""CUDA's caching allocator model (devlab.engine.gpu_model.caching_allocator) against the rules of torch's
c10/cuda/CUDACachingAllocator.cpp: sequences of requests, frees and empty_cache() and the
statistics torch.cuda.memory_stats() would report for them. Nothing runs on a GPU."""

from __future__ import annotations

import pytest

from devlab.engine.gpu_model.caching_allocator import (
    LARGE_BUFFER,
    SMALL_BUFFER,
    AllocatorConfig,
    AllocatorConfigError,
    CachingAllocator,
    OutOfMemory,
    round_size,
    segment_size,
)

MiB = 1 << 20
DEFAULT = AllocatorConfig()


def stat(a: CachingAllocator, name: str, pool: str = "all", field: str = "current") -> int:
    return a.memory_stats()[name][pool][field]


@pytest.mark.parametrize(("size", "expected"), [
    (0, 512), (1, 512), (512, 512), (513, 1024), (4000, 4096), (MiB + 1, MiB + 512)])
def test_sizes_are_rounded_to_512_bytes(size: int, expected: int) -> None:
    assert round_size(size, DEFAULT) == expected


@pytest.mark.parametrize(("size", "expected"), [
    (512, SMALL_BUFFER), (MiB, SMALL_BUFFER), (MiB + 512, LARGE_BUFFER),
    (10 * MiB - 512, LARGE_BUFFER), (10 * MiB, 10 * MiB), (10 * MiB + 1, 12 * MiB),
    (100 * MiB + 1, 102 * MiB)])
def test_segment_sizes(size: int, expected: int) -> None:
    assert segment_size(size) == expected


def test_small_requests_share_one_2mib_segment() -> None:
    a = CachingAllocator()
    blocks = [a.malloc(1000) for _ in range(4)]
    assert a.reserved == SMALL_BUFFER
    assert a.allocated == 4 * 1024
    assert stat(a, "segment", "small_pool") == 1
    assert stat(a, "requested_bytes") == 4000
    # Blocks are handed out from the front of the segment, one after another.
    assert [b.address - blocks[0].address for b in blocks] == [0, 1024, 2048, 3072]


def test_del_keeps_the_segment_reserved_until_empty_cache() -> None:
    a = CachingAllocator()
    b = a.malloc(100 * MiB)
    assert (a.allocated, a.reserved) == (100 * MiB, 100 * MiB)
    a.free(b)
    assert (a.allocated, a.reserved) == (0, 100 * MiB)
    again = a.malloc(100 * MiB)  # the cached block is reused: no new cudaMalloc
    assert again.address == b.address
    assert stat(a, "segment", field="allocated") == 1
    assert a.memory_stats()["num_device_alloc"] == 1
    a.free(again)
    a.empty_cache()
    assert (a.allocated, a.reserved) == (0, 0)
    assert a.memory_stats()["num_device_free"] == 1
    assert a.peak_reserved == 100 * MiB


def test_a_1_to_10_mib_request_splits_a_20mib_segment() -> None:
    a = CachingAllocator()
    x = a.malloc(3 * MiB)
    assert a.reserved == LARGE_BUFFER
    assert stat(a, "inactive_split") == 1
    assert stat(a, "inactive_split_bytes") == 17 * MiB
    y = a.malloc(5 * MiB)  # fits in the rest of the same segment
    assert y.address == x.address + 3 * MiB
    assert a.reserved == LARGE_BUFFER
    assert stat(a, "inactive_split_bytes") == 12 * MiB


def test_a_split_segment_is_not_released_by_empty_cache() -> None:
    a = CachingAllocator()
    x = a.malloc(3 * MiB)
    y = a.malloc(3 * MiB)
    a.free(x)
    a.empty_cache()  # y still lives in the segment: it stays whole
    assert a.reserved == LARGE_BUFFER
    a.free(y)  # y merges with both free neighbours: one whole free segment again
    assert stat(a, "inactive_split") == 0
    assert stat(a, "inactive_split_bytes") == 0
    a.empty_cache()
    assert a.reserved == 0


def test_large_blocks_split_only_when_more_than_1mib_remains() -> None:
    a = CachingAllocator()
    b = a.malloc(12 * MiB)
    a.free(b)
    c = a.malloc(11 * MiB + 512)  # 12 MiB block, 0.5 MiB over: handed out whole
    assert c.size == 12 * MiB
    assert stat(a, "allocated_bytes") == 12 * MiB
    assert stat(a, "requested_bytes") == 11 * MiB + 512
    a.free(c)
    d = a.malloc(10 * MiB)  # 2 MiB over: split
    assert d.size == 10 * MiB
    assert stat(a, "inactive_split_bytes") == 2 * MiB


def test_blocks_are_cached_per_stream() -> None:
    a = CachingAllocator()
    b = a.malloc(100 * MiB, stream=0)
    a.free(b)
    c = a.malloc(100 * MiB, stream=7)
    assert c.address != b.address
    assert a.reserved == 200 * MiB


def test_record_stream_holds_the_block_until_the_streams_are_done() -> None:
    a = CachingAllocator()
    b = a.malloc(100 * MiB)
    a.record_stream(b, 3)
    a.free(b)
    assert stat(a, "active_bytes") == 100 * MiB  # awaiting the other stream
    assert [blk["state"] for seg in a.snapshot() for blk in seg["blocks"]] == [
        "active_awaiting_free"]
    a.synchronize()
    assert stat(a, "active_bytes") == 0
    assert a.malloc(100 * MiB).address == b.address


def test_out_of_memory_frees_the_cache_first_then_raises_cudas_error() -> None:
    total = 1024 * MiB
    a = CachingAllocator(total=total, context=300 * MiB)
    x = a.malloc(400 * MiB)
    a.free(x)  # cached
    y = a.malloc(500 * MiB)  # does not fit next to the cache: the cache is released
    assert a.reserved == 500 * MiB
    assert a.memory_stats()["num_alloc_retries"] == 1
    with pytest.raises(OutOfMemory) as info:
        a.malloc(300 * MiB)
    e = info.value
    assert a.memory_stats()["num_ooms"] == 1
    assert (e.alloc_size, e.total, e.free) == (300 * MiB, total, 224 * MiB)
    assert str(e).startswith(
        "CUDA out of memory. Tried to allocate 300.00 MiB. GPU 0 has a total capacity of "
        "1024.00 MiB of which 224.00 MiB is free. Of the allocated memory 500.00 MiB is allocated "
        "by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.")
    # reportProcessMemoryInfo: this process in its own words, the others (NVML's) by pid.
    assert ("is free. Including non-PyTorch memory, this process has 800.00 MiB memory in use. "
            "Of the allocated memory ") in e.message(pid=42)
    assert "Process 42" not in e.message(pid=42)
    assert ("this process has 800.00 MiB memory in use. Process 7 has 1.50 GiB memory in use. "
            "Process 9 has 512 bytes memory in use. Of the allocated") in e.message(
                pid=42, others=((7, 3 * 512 * MiB), (42, 800 * MiB), (9, 512)))
    a.free(y)


def test_fragmentation_causes_out_of_memory_with_enough_free_bytes() -> None:
    # 3 MiB requests fill 20 MiB segments six at a time; freeing every other one leaves over
    # half the memory free, in holes of 3 and 2 MiB that no 20 MiB request fits in, and
    # empty_cache cannot release a segment that still holds a tensor.
    a = CachingAllocator(total=200 * MiB)
    held = [a.malloc(3 * MiB) for _ in range(60)]
    assert a.reserved == 200 * MiB
    for b in held[::2]:
        a.free(b)
    assert a.reserved - a.allocated == 110 * MiB
    with pytest.raises(OutOfMemory) as info:
        a.malloc(20 * MiB)
    assert "110.00 MiB is reserved by PyTorch but unallocated" in str(info.value)
    assert a.memory_stats()["num_alloc_retries"] == 1


def test_max_split_size_keeps_oversize_blocks_whole() -> None:
    a = CachingAllocator(config=AllocatorConfig.parse("max_split_size_mb:64"))
    big = a.malloc(100 * MiB)
    assert a.memory_stats()["oversize_allocations"]["current"] == 1
    a.free(big)
    small = a.malloc(30 * MiB)  # an oversize cached block is not split for it
    assert small.address != big.address
    a.free(small)
    near = a.malloc(90 * MiB)  # within 20 MiB of the oversize block: reused whole
    assert near.address == big.address and near.size == 100 * MiB
    assert a.memory_stats()["max_split_size"] == 64 * MiB


def test_max_split_size_releases_oversize_blocks_before_giving_up() -> None:
    a = CachingAllocator(total=300 * MiB, config=AllocatorConfig.parse("max_split_size_mb:64"))
    b = a.malloc(200 * MiB)
    a.free(b)
    c = a.malloc(150 * MiB)  # 200 >= 150 + 20: not reused; released to make room
    assert a.reserved == 150 * MiB
    assert a.memory_stats()["num_alloc_retries"] == 0
    a.free(c)


def test_roundup_power2_divisions() -> None:
    four = AllocatorConfig.parse("roundup_power2_divisions:4")
    assert round_size(1200 * 1024, four) == 1280 * 1024  # the source's own example, in KiB
    assert round_size(2 * MiB, four) == 2 * MiB
    listed = AllocatorConfig.parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    assert listed.divisions(3 * MiB) == 1  # below the first interval: the first value
    assert listed.divisions(300 * MiB) == 1
    assert listed.divisions(600 * MiB) == 2
    # ">" fills from the last interval named, that one included, as torch's parser does.
    assert listed.divisions(1500 * MiB) == 8
    assert listed.divisions(4096 * MiB) == 8
    assert round_size(600 * MiB + 1, listed) == 768 * MiB


def test_garbage_collection_releases_cached_segments_past_the_threshold() -> None:
    def run(conf: str) -> CachingAllocator:
        a = CachingAllocator(allowed=100 * MiB, config=AllocatorConfig.parse(conf))
        x, y = a.malloc(40 * MiB), a.malloc(30 * MiB)
        a.free(x)
        a.free(y)
        a.malloc(44 * MiB)  # fits no cached block; 70 MiB reserved is past 0.5 x 100 MiB
        return a

    collected = run("garbage_collection_threshold:0.5")
    assert collected.reserved == 44 * MiB
    assert collected.memory_stats()["num_device_free"] == 2
    assert collected.memory_stats()["num_alloc_retries"] == 0
    # Without the threshold, the cache goes only when the limit is reached, by a retry.
    plain = run("")
    assert plain.reserved == 44 * MiB
    assert plain.memory_stats()["num_alloc_retries"] == 1


def test_per_process_limit() -> None:
    a = CachingAllocator(total=16 * 1024 * MiB, allowed=64 * MiB)
    a.malloc(40 * MiB)
    with pytest.raises(OutOfMemory) as info:
        a.malloc(40 * MiB)
    assert "64.00 MiB allowed; " in str(info.value)


def test_peak_and_accumulated_resets() -> None:
    a = CachingAllocator()
    b = a.malloc(100 * MiB)
    a.free(b)
    assert a.peak_allocated == 100 * MiB
    a.reset_peak()
    assert a.peak_allocated == 0 and a.peak_reserved == 100 * MiB
    a.reset_accumulated()
    assert stat(a, "allocated_bytes", field="allocated") == 0
    assert a.memory_stats()["num_device_alloc"] == 0


def test_memory_stats_has_cudas_keys() -> None:
    stats = CachingAllocator().memory_stats()
    assert set(stats) == {
        "num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
        "num_device_free", "max_split_size", "allocation", "segment", "active",
        "inactive_split", "allocated_bytes", "reserved_bytes", "active_bytes",
        "inactive_split_bytes", "requested_bytes", "oversize_allocations",
        "oversize_segments"}
    assert set(stats["allocated_bytes"]) == {"all", "small_pool", "large_pool"}
    assert set(stats["allocated_bytes"]["all"]) == {"current", "peak", "allocated", "freed"}


def test_snapshot_and_trace() -> None:
    a = CachingAllocator()
    a.record_history("all", frames=lambda: [{"filename": "cell.py", "line": 3, "name": "f"}])
    x = a.malloc(3 * MiB)
    y = a.malloc(1000)
    a.free(x)
    segs = a.snapshot()
    assert [(s["segment_type"], s["total_size"], s["allocated_size"]) for s in segs] == [
        ("large", LARGE_BUFFER, 0), ("small", SMALL_BUFFER, 1024)]
    assert segs[0]["address"] < segs[1]["address"]
    assert [b["state"] for b in segs[1]["blocks"]] == ["active_allocated", "inactive"]
    assert segs[1]["blocks"][0]["frames"][0]["line"] == 3
    actions = [e["action"] for e in a.trace()]
    assert actions == ["segment_alloc", "alloc", "segment_alloc", "alloc", "free_requested",
                       "free_completed"]
    a.free(y)
    a.record_history(None)
    assert a.trace() == []


@pytest.mark.parametrize(("conf", "words"), [
    ("max_split_size_mb:10", "max_split_size_mb too small, must be >= 20"),
    ("garbage_collection_threshold:1.5", "set it in (0.0, 1.0)"),
    ("roundup_power2_divisions:3", "has to be power of 2"),
    ("expandable_segments:True", "expandable_segments:True is not simulated"),
    ("backend:cudaMallocAsync", "backend:cudaMallocAsync is not simulated"),
    ("max_split_size:64", "Unrecognized CachingAllocator option: max_split_size"),
    ("max_split_size_mb=64", "Unrecognized CachingAllocator option: max_split_size_mb=64"),
    ("expandable_segments:yes", "Expected a single True/False argument for expandable_segments"),
])
def test_bad_configs_are_refused_naming_the_option(conf: str, words: str) -> None:
    with pytest.raises(AllocatorConfigError) as info:
        AllocatorConfig.parse(conf)
    assert words in str(info.value)


def test_accepted_configs() -> None:
    conf = AllocatorConfig.parse(
        "max_split_size_mb:128, garbage_collection_threshold:0.6,expandable_segments:False")
    assert conf.max_split_size == 128 * MiB
    assert conf.garbage_collection_threshold == 0.6
    assert AllocatorConfig.parse("") == AllocatorConfig()


def test_every_modeled_gpu_has_a_published_capacity_below_its_datasheet() -> None:
    from devlab.engine.gpu_model import SPECS
    from devlab.engine.gpu_model.capacity import context_bytes, total_memory

    for spec in SPECS.values():
        total = total_memory(spec)
        # The datasheet's "16 GB" of memory is 16 GiB of chips; the driver keeps some of it.
        assert 0.9 * spec.memory_gb * 2**30 < total < spec.memory_gb * 2**30, spec.name
        assert 200 * MiB < context_bytes(spec) < 500 * MiB


def test_the_former_names_are_the_split_model() -> None:
    # devlab.gpu_model.allocator (and, after the layout, devlab.engine.gpu_model.allocator) was
    # the model's one module before issue 36 split it as torch splits it: both names import the
    # package, so notebooks and users' code that name them get the same classes.
    import importlib

    from devlab.engine.gpu_model import caching_allocator

    for former in ("devlab.gpu_model.allocator", "devlab.engine.gpu_model.allocator"):
        old = importlib.import_module(former)
        assert old is caching_allocator
        assert old.CachingAllocator is CachingAllocator and old.OutOfMemory is OutOfMemory
