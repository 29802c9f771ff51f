"""Memory on simulated GPUs as a user meets it through torch's own API: CUDA's caching
allocator (reserved memory, empty_cache, statistics, the summary table, snapshots and the
allocation history), a modeled GPU's capacity and CUDA context, and PYTORCH_CUDA_ALLOC_CONF.
The expected figures follow from the allocator's rules (tests/test_allocator.py)."""

from __future__ import annotations

import pickle

import pytest
import torch

import devlab
from devlab.core.memory_watch.allocation_trace import AllocationTrace
from devlab.engine import simulated
from devlab.engine.gpu_model import SPECS
from devlab.engine.gpu_model.capacity import CONTEXT_BYTES, TOTAL_MEMORY

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _stop():
    yield
    devlab.config.reset()


def test_a_modeled_t4_has_the_capacity_torch_reports_and_a_cuda_context() -> None:
    devlab.config.simulate_gpus(1, model="T4")
    total = TOTAL_MEMORY["T4"]
    assert torch.cuda.get_device_properties(0).total_memory == total  # not 16 GB
    # Asking, like the first tensor, makes the CUDA context, which is not free.
    assert torch.cuda.mem_get_info(0) == (total - CONTEXT_BYTES, total)
    x = torch.empty(100 * MIB // 4, device="cuda")
    assert (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()) == (100 * MIB, 100 * MIB)
    del x  # the segment stays reserved, and not free, until empty_cache()
    assert (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()) == (0, 100 * MIB)
    assert torch.cuda.mem_get_info(0)[0] == total - CONTEXT_BYTES - 100 * MIB
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == 0
    assert torch.cuda.max_memory_reserved() == 100 * MIB


def test_one_capacity_whichever_way_the_simulation_starts() -> None:
    devlab.config.simulate_gpus(1, model="L4")
    via_config = torch.cuda.get_device_properties(0).total_memory
    devlab.config.reset()
    simulated.start(1, model="L4")
    assert torch.cuda.get_device_properties(0).total_memory == via_config == TOTAL_MEMORY["L4"]
    simulated.stop()


def test_a_memory_limit_on_a_modeled_gpu_is_a_per_process_limit() -> None:
    devlab.config.simulate_gpus(1, memory_limit=256, model="T4")
    assert torch.cuda.get_device_properties(0).total_memory == TOTAL_MEMORY["T4"]
    keep = torch.empty(200 * MIB, dtype=torch.uint8, device="cuda")
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(100 * MIB, dtype=torch.uint8, device="cuda")
    message = str(info.value)
    assert "Tried to allocate 100.00 MiB. GPU 0 has a total capacity of 14.75 GiB" in message
    assert "256.00 MiB allowed; " in message
    assert "capacity and CUDA context are those of the real GPU it models" in message
    del keep


def test_memory_stats_summary_and_snapshot_read_as_on_a_gpu() -> None:
    devlab.config.simulate_gpus(1)
    a = torch.ones(1000, device="cuda")  # 4000 B -> one 4096 B block of a 2 MiB segment
    b = torch.ones(3 * MIB, device="cuda")  # 12 MiB: its own 12 MiB segment
    stats = torch.cuda.memory_stats()
    assert len(stats) == 122  # CUDA's keys: 9 statistics x 3 pools x 4, 2 x 4, 6 counters
    assert stats["requested_bytes.small_pool.current"] == 4000
    assert stats["allocated_bytes.small_pool.current"] == 4096
    assert stats["segment.all.current"] == 2
    assert stats["reserved_bytes.all.current"] == 14 * MIB
    assert stats["inactive_split_bytes.small_pool.current"] == 2 * MIB - 4096
    summary = torch.cuda.memory_summary()  # torch's own table, from these statistics
    assert "PyTorch CUDA memory summary, device ID 0" in summary
    assert "GPU reserved memory   |  14336 KiB" in summary
    segments = torch.cuda.memory_snapshot()
    assert sorted((s["segment_type"], s["total_size"]) for s in segments) == [
        ("large", 12 * MIB), ("small", 2 * MIB)]
    del a, b


def test_allocation_history_and_timeline(tmp_path) -> None:
    devlab.config.simulate_gpus(1)
    with AllocationTrace([0]) as trace:
        w = torch.ones(4, MIB, device="cuda")  # 16 MiB
        act = torch.ones(2, MIB, device="cuda")
        del act
    (tl,) = trace.timelines
    assert tl.peak.bytes == 24 * MIB
    lines = {u.line.rsplit(" ", 1)[0]: u.bytes for u in tl.top_lines()}
    assert list(lines.values()) == [16 * MIB, 8 * MIB]
    assert all("test_simulated_memory.py:" in line for line in lines)
    # Recording ended with the block: nothing more is traced.
    x = torch.ones(10, device="cuda")
    assert torch.cuda.memory._snapshot()["device_traces"] == [[]]
    # torch's own dump writes the same format PyTorch's viewer reads.
    torch.cuda.memory._record_memory_history()
    y = torch.ones(10, device="cuda")
    path = tmp_path / "snap.pickle"
    torch.cuda.memory._dump_snapshot(str(path))
    torch.cuda.memory._record_memory_history(None)
    snap = pickle.loads(path.read_bytes())
    assert [e["action"] for e in snap["device_traces"][0]] == ["alloc"]
    assert snap["device_traces"][0][0]["frames"][0]["filename"].endswith(".py")
    del w, x, y


def test_an_error_in_a_trace_stops_recording() -> None:
    devlab.config.simulate_gpus(1)
    with pytest.raises(ZeroDivisionError):
        with AllocationTrace([0]) as trace:
            z = torch.ones(10, device="cuda")
            raise ZeroDivisionError("the cell fails")
    assert trace.timelines[0].peak.bytes == 40
    torch.ones(10, device="cuda")
    assert torch.cuda.memory._snapshot()["device_traces"] == [[]]
    del z


def test_alloc_conf_is_read_and_a_mistake_named(monkeypatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    devlab.config.simulate_gpus(1)
    assert torch.cuda.memory_stats()["max_split_size"] == 64 * MIB
    devlab.config.reset()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    with pytest.raises(ValueError, match="expandable_segments:True is not simulated"):
        devlab.config.simulate_gpus(1)
    assert not simulated.is_active()


def test_every_modeled_gpu_can_be_simulated_with_its_capacity() -> None:
    for name in SPECS:
        simulated.start(1, model=name)
        assert torch.cuda.get_device_properties(0).total_memory == TOTAL_MEMORY[name]
        simulated.stop()


def test_a_backward_pass_counts_what_it_allocates_on_its_gpu() -> None:
    # The gradients of the activations exist only while the C++ engine runs the pass; on a GPU
    # they count in the peak. Two 2048x2048 layers on a batch of 1024: each activation's
    # gradient is 8 MiB, alive beside the weights' gradients being made.
    devlab.config.simulate_gpus(1)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 2048)).to("cuda")
    batch = torch.randn(1024, 2048, device="cuda")
    loss = model(batch).square().mean()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss.backward()
    after = torch.cuda.memory_allocated()
    weights_grads = sum(p.numel() * 4 for p in model.parameters())
    assert after >= before + weights_grads - 3 * 8 * MIB  # the saved activations went
    assert torch.cuda.max_memory_allocated() >= after + 8 * MIB
    del loss


@pytest.mark.parametrize(("model", "config", "expected"), [
    ("T4", None, 4096 * 2 * 1024 + 16 * 8 * 1024),  # ":4096:2:16:8", torch's default
    ("H100", None, 4096 * 8 * 1024),  # 32 MiB on Hopper
    ("B200", None, 4096 * 8 * 1024),  # and on Blackwell
    ("T4", ":1024:4", 4 * MIB),
    ("T4", ":0:0", 0),
])
def test_the_first_matrix_product_allocates_cublas_workspace(monkeypatch, model, config,
                                                              expected) -> None:
    # As torch's own test_cublas_workspace_explicit_allocation measures it on a GPU.
    if config is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    else:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", config)
    devlab.config.simulate_gpus(1, model=model)
    a = torch.randn(7, 7, device="cuda")

    def grown() -> int:
        torch._C._cuda_clearCublasWorkspaces()
        start = torch.cuda.memory_stats()["active_bytes.all.allocated"]
        with torch.no_grad():
            torch.matmul(a, a)
        return torch.cuda.memory_stats()["active_bytes.all.allocated"] - start

    assert grown() - 512 == expected  # the product's own 512-byte block, and the workspace
    assert grown() - 512 == expected  # cleared, it is allocated again
    torch.cuda.empty_cache()  # empty_cache keeps it: it is allocated, not cached
    assert torch.cuda.memory_allocated() >= expected


def test_a_training_step_holds_two_cublas_workspaces(monkeypatch) -> None:
    # Autograd's engine runs a GPU's backward on a device thread with a cuBLAS handle of its
    # own, and torch keeps a workspace per handle: forward products take the host thread's,
    # the backward's products their own, and both stay until they are cleared.
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    devlab.config.simulate_gpus(1, model="T4")
    workspace = 4096 * 2 * 1024 + 16 * 8 * 1024
    model = torch.nn.Linear(64, 64).cuda()
    x = torch.randn(8, 64, device="cuda")
    held = torch.cuda.memory_allocated()
    with torch.no_grad():
        model(x)  # inference: the host's handle alone
    assert torch.cuda.memory_allocated() == held + workspace
    model(x).sum().backward()
    grads = sum(-(-p.grad.nbytes // 512) * 512 for p in model.parameters())  # 512-byte blocks
    assert torch.cuda.memory_allocated() == held + 2 * workspace + grads
    model(x).sum().backward()  # a second step takes no more
    assert torch.cuda.memory_allocated() == held + 2 * workspace + grads
    torch._C._cuda_clearCublasWorkspaces()
    assert torch.cuda.memory_allocated() == held + grads
    # A backward with no product (an element-wise graph) runs no cuBLAS: no workspace.
    y = torch.randn(8, 64, device="cuda", requires_grad=True)
    (y * y).sum().backward()
    assert torch.cuda.memory_allocated() == held + grads + 2 * y.nbytes


def test_a_product_launched_on_the_worker_takes_cublas_workspace_once(monkeypatch) -> None:
    # Heavy products run on the GPU's worker thread (mode/async_launch.py), not through mode.device_rule's
    # run: they take cuBLAS's workspace all the same, once per GPU.
    from devlab.engine.simulated.mode import async_launch as _launch
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    devlab.config.simulate_gpus(2, model="T4")
    monkeypatch.setattr(_launch, "MIN_MACS", 1)
    assert _launch.enabled
    a = torch.randn(64, 64, device="cuda:1")
    before = torch.cuda.memory_allocated(1)
    with torch.no_grad():
        out = a.mm(a)
        out2 = a @ a
    torch.cuda.synchronize()
    workspace = 4096 * 2 * 1024 + 16 * 8 * 1024  # torch's default CUBLAS_WORKSPACE_CONFIG
    assert torch.cuda.memory_allocated(1) - before == 2 * 64 * 64 * 4 + workspace
    assert torch.cuda.memory_allocated(0) == 0  # the other GPU ran no product
    del out, out2


def test_a_model_parallel_backward_counts_each_gpus_part_on_that_gpu() -> None:
    # Two stages on two GPUs. On a real GPU each GPU's backward kernels allocate there as they
    # run (the gradient of the hidden activation, copied across, the weight gradients), so
    # each GPU's peak is that of its stage's backward run alone, and the pass's is their sum.
    from torch import nn
    devlab.config.simulate_gpus(2, model="T4")
    torch.manual_seed(0)
    batch, d, hidden = 256, 512, 2048
    l1 = nn.Linear(d, hidden).to("cuda:0")
    l2 = nn.Linear(hidden, d).to("cuda:1")
    x = torch.randn(batch, d, device="cuda:0")

    def peaks(backward) -> list[int]:
        torch.cuda.synchronize()
        base = [torch.cuda.memory_allocated(i) for i in (0, 1)]
        for i in (0, 1):
            torch.cuda.reset_peak_memory_stats(i)
        backward()
        torch.cuda.synchronize()
        return [torch.cuda.max_memory_allocated(i) - base[i] for i in (0, 1)]

    def clear() -> None:
        for p in (*l1.parameters(), *l2.parameters()):
            p.grad = None

    # A first pass takes each GPU's cuBLAS workspace for autograd's thread, kept from then on.
    l2(torch.relu(l1(x)).to("cuda:1")).sum().backward()
    clear()
    loss = l2(torch.relu(l1(x)).to("cuda:1")).sum()
    both = peaks(loss.backward)
    clear()
    del loss
    # GPU 1's stage alone: its input a leaf there.
    h1 = torch.relu(l1(x)).detach().to("cuda:1").requires_grad_()
    loss1 = l2(h1).sum()
    second = peaks(loss1.backward)
    clear()
    del loss1, h1
    # GPU 0's stage alone, fed the gradient GPU 1 would send (the clone leaves the stage's
    # activation to autograd alone, as in the two-GPU pass).
    root = torch.relu(l1(x)).clone()
    grad = torch.ones(batch, hidden, device="cuda:0")
    first = peaks(lambda: root.backward(grad))
    assert first[1] == 0 and second[0] == 0
    assert first[0] >= hidden * d * 4  # at least the weight's gradient
    assert both == [first[0], second[1]]
    assert sum(both) == first[0] + second[1]


def test_a_modeled_gpu_reports_its_compute_capability() -> None:
    devlab.config.simulate_gpus(1, model="H100")
    assert torch.cuda.get_device_capability() == (9, 0)
    props = torch.cuda.get_device_properties(0)
    assert (props.major, props.minor) == (9, 0)
    devlab.config.reset()
    devlab.config.simulate_gpus(1)  # no model: no capability to claim
    assert torch.cuda.get_device_capability() == (0, 0)


def test_caching_allocator_alloc_for_another_framework() -> None:
    devlab.config.simulate_gpus(1)
    ptr = torch.cuda.caching_allocator_alloc(3 * MIB)
    assert isinstance(ptr, int) and torch.cuda.memory_allocated() == 3 * MIB
    assert torch.cuda.memory_reserved() == 20 * MIB  # a 1-10 MiB request: a 20 MiB segment
    torch.cuda.caching_allocator_delete(ptr)
    assert torch.cuda.memory_allocated() == 0
    with pytest.raises(RuntimeError, match="invalid device pointer"):
        torch.cuda.caching_allocator_delete(ptr)


def test_mem_pool_routes_this_threads_allocations_to_its_own_segments() -> None:
    """torch.cuda.MemPool and use_mem_pool (torch/cuda/memory.py, c10's MemPool): inside the
    block this thread's tensors come from the pool's segments; the pool keeps them through
    empty_cache() while it lives; its end releases it and frees its unused segments."""
    MiB = 1 << 20
    simulated.start(1, model="T4")
    keep = torch.ones(1, device="cuda")  # a segment of the device's own that stays
    r0 = torch.cuda.memory_reserved()
    pool = torch.cuda.MemPool()
    assert pool.id[0] == 0 and pool.id[1] > 0 and pool.use_count() == 1
    with torch.cuda.use_mem_pool(pool):
        assert pool.use_count() == 2  # the block holds a use of its own
        a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    b = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    assert pool.use_count() == 1
    mine = pool.snapshot()
    assert [(s["segment_pool_id"], s["total_size"], s["allocated_size"]) for s in mine] == [
        (pool.id, 20 * MiB, 3 * MiB)]  # a 1-10 MiB request: a 20 MiB segment, of the pool's
    assert sum(s["segment_pool_id"] == (0, 0) and s["allocated_size"] == 3 * MiB
               for s in torch.cuda.memory_snapshot()) == 1  # b, in the device's own pool
    assert torch.cuda.memory_allocated() >= a.nbytes + b.nbytes
    del a, b
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() - r0 == 20 * MiB  # the live pool's segment stays
    del pool  # MemPool's end: releasePool, then emptyCache(id)
    assert torch.cuda.memory_reserved() == r0
    assert keep.device.type == "cuda"


def test_a_graph_captures_into_a_mem_pool_and_no_split_keeps_blocks_whole() -> None:
    MiB = 1 << 20
    simulated.start(1, model="T4")
    x = torch.ones(256, device="cuda")
    pool = torch.cuda.MemPool(no_split=True)
    torch.cuda.set_stream(torch.cuda.Stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool.id):
        y = x + 1  # 1 KiB, given the pool's whole 2 MiB segment (no_split)
    assert pool.use_count() == 2  # the MemPool and the graph
    assert [(s["total_size"], s["allocated_size"]) for s in pool.snapshot()] == [
        (2 * MiB, 2 * MiB)]
    assert y.untyped_storage().nbytes() == x.nbytes
    g.reset()
    assert pool.use_count() == 1


def test_what_mem_pool_cannot_model_is_devlabs_own_error() -> None:
    simulated.start(1)
    with pytest.raises(NotImplementedError, match="use_on_oom=True.*not simulated by devlab"):
        torch.cuda.MemPool(use_on_oom=True)
    with pytest.raises(NotImplementedError, match="allocator of its own"):
        torch.cuda.MemPool(allocator=object())
    with pytest.raises(TypeError, match="a pair of ints"):
        torch._C._cuda_releasePool(0, "pool")  # type: ignore[arg-type]
