"""`simulated.timeline`: one step's modeled timeline per GPU, its numbers against the clock's
rules and against `gpu_model`'s model of DDP."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

import devlab
from devlab.engine import gpu_model, simulated
from devlab.engine.gpu_model import modeled_clock as clk
from devlab.engine.gpu_model.modeled_clock import Clock, Span
from devlab.engine.simulated.clock.charges import Charges
from devlab.engine.simulated.clock.step_timeline import Timeline

pytestmark = pytest.mark.usefixtures("no_simulation")

MiB = 1024 * 1024
T4 = "NVIDIA T4 (16 GB, PCIe)"


def _span(device: int, kind: str, start: float, end: float) -> Span:
    stream = clk.COMM if kind in (clk.COLLECTIVE, clk.WAIT_RANKS) else clk.COMPUTE
    return Span(device, stream, kind, kind, start, end)


def test_the_parts_add_up_from_the_spans() -> None:
    spans = [  # GPU 0: kernels 0-4, an all-reduce 3-6 that the queue waits for, a kernel 6-7
        _span(0, clk.KERNEL, 0, 2), _span(0, clk.KERNEL, 2, 4),
        _span(0, clk.COLLECTIVE, 3, 6), _span(0, clk.WAIT_COMM, 4, 6),
        _span(0, clk.KERNEL, 6, 7),
        # GPU 1: a kernel 1-2, waits 2-3 for GPU 0's rank, the all-reduce 3-6, a kernel 6-7
        _span(1, clk.KERNEL, 1, 2), _span(1, clk.WAIT_RANKS, 2, 3),
        _span(1, clk.COLLECTIVE, 3, 6), _span(1, clk.WAIT_COMM, 2, 6),
        _span(1, clk.KERNEL, 6, 7)]
    tl = Timeline(T4, spans, 0.0)
    g0, g1 = tl.gpus()
    assert (g0.step, g0.compute, g0.communication, g0.overlap, g0.exposed, g0.idle) == (
        7, 5, 3, 1, 2, 0)
    assert (g0.waited_for_ranks, g0.waited_for_comm, g0.kernels, g0.collectives) == (0, 2, 3, 1)
    assert (g1.step, g1.compute, g1.communication, g1.overlap, g1.exposed, g1.idle) == (
        7, 2, 3, 0, 3, 2)  # idle: 0-1 (nothing launched yet) and 2-3 (the other rank)
    assert (g1.waited_for_ranks, g1.waited_for_comm) == (1, 4)
    assert tl.seconds == 7
    # The ranks' timelines merge; a GPU in two of them is refused.
    parts = [Timeline(T4, [s for s in spans if s.device == d], 0.0) for d in (0, 1)]
    assert Timeline.merge(parts).gpus() == [g0, g1]
    with pytest.raises(ValueError, match="both hold GPU:0"):
        Timeline.merge([parts[0], parts[0]])
    with pytest.raises(TypeError, match="list of Timelines"):
        Timeline.merge([spans])


def test_the_clock_records_when_each_stream_ran_what() -> None:
    c = Charges(Clock(gpu_model.gpu("T4"), 2))
    clock = c.clock
    clock.recording, clock.spans = [], []
    seconds = gpu_model.collective_time("all_reduce", 64 * MiB, 2, "pcie3-host").seconds
    # Another rank reaches the all-reduce 5 ms after this one could start it.
    local = clock.now() + clock._launch
    later = local + 5e-3
    end = c.collective("all_reduce", (64 * MiB,), 2, 0, lambda t: [later], None, join=True)
    assert end == pytest.approx(later + seconds)
    waited, ran, joined = clock.spans
    assert (waited.kind, waited.stream, waited.start, waited.end) == (
        clk.WAIT_RANKS, clk.COMM, pytest.approx(local), later)
    assert (ran.kind, ran.start, ran.end) == (clk.COLLECTIVE, later, end)
    assert ran.name.startswith("nccl:all_reduce (pcie3-host, 2 GPUs")
    assert (joined.kind, joined.stream, joined.end) == (clk.WAIT_COMM, clk.COMPUTE, end)
    assert ran.name == f"{clock.recording[0].op}: 64.0 MiB"


WIDTH, LAYERS, BATCH = 1024, 4, 256


def ddp_timelines() -> dict:
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    torch.manual_seed(0)
    layers = [m for _ in range(LAYERS) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers).to(rank),
                                                device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, WIDTH, device=rank)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        torch.cuda.synchronize()

    for _ in range(3):  # the first rebuilds DDP's buckets
        step()
    t0 = simulated.modeled_time()
    tl = simulated.timeline(step)
    modeled = simulated.modeled_time() - t0
    with model.no_sync():  # the backward pass alone, bracketed by syncs
        loss = model(x).square().mean()
        torch.cuda.synchronize()
        b0 = simulated.modeled_time()
        loss.backward()
        torch.cuda.synchronize()
        backward = simulated.modeled_time() - b0 - simulated.model().sync_latency_us * 1e-6
    # Rank 1 computes longer before a small all-reduce: rank 0 waits for it.
    a = torch.randn(1024, 1024, device=rank)
    torch.cuda.synchronize()

    def uneven() -> None:
        b = a
        for _ in range(8 if rank == 1 else 0):
            b = b @ a
        dist.all_reduce(torch.ones(1024, device=rank))
        torch.cuda.synchronize()

    waits = simulated.timeline(uneven)
    dist.destroy_process_group()
    return {"step": tl, "modeled": modeled, "backward": backward, "uneven": waits,
            "sync": simulated.model().sync_latency_us * 1e-6}


@pytest.mark.usefixtures("modeled_host")
def test_a_ddp_steps_timeline_agrees_with_the_clock_and_the_model(no_simulation) -> None:
    simulated.start(2, model="T4")
    (one,) = devlab.launch(ddp_timelines, nprocs=1, timeout=300)
    two = devlab.launch(ddp_timelines, nprocs=2, timeout=300)
    tl = Timeline.merge([r["step"] for r in two])
    g0, g1 = tl.gpus()
    (alone,) = one["step"].gpus()
    for g, got in ((g0, two[0]), (g1, two[1])):
        # The rules: the parts add up; the step is what the clock's own time says.
        assert g.overlap + g.exposed == pytest.approx(g.communication, abs=1e-12)
        assert g.compute + g.exposed + g.idle == pytest.approx(g.step, abs=1e-12)
        assert g.step + got["sync"] == pytest.approx(got["modeled"], rel=1e-9)
        # Each GPU computes what one GPU does alone; what is added is communication.
        assert g.compute == pytest.approx(alone.compute, rel=1e-9)
        assert g.step - alone.step == pytest.approx(g.exposed, abs=0.02 * g.communication)
    assert alone.communication == 0 and alone.exposed == 0  # one rank: nothing to send
    # The model: DDP's buckets (each layer's gradients ready after an equal share of the
    # backward pass, last layer first), each all-reduce as long as gpu_model says.
    backward = one["backward"]
    grads = []
    for j in range(LAYERS):
        ready = backward * (j + 1) / LAYERS
        grads += [(ready, WIDTH * 4), (ready, WIDTH * WIDTH * 4)]
    predicted = gpu_model.data_parallel_step(grads, 2, "pcie3-host", forward=0.0,
                                             backward=backward)
    assert g0.collectives == len(predicted.buckets) == 2
    assert g0.communication == pytest.approx(predicted.communication, rel=1e-9)
    assert g0.exposed == pytest.approx(predicted.exposed, abs=0.05 * predicted.communication)
    assert g0.waited_for_comm == pytest.approx(g0.exposed, rel=1e-9)  # the queue waited for it
    # A rank waits for the slowest: rank 0 for rank 1's products.
    w0, w1 = Timeline.merge([r["uneven"] for r in two]).gpus()
    assert w1.kernels - w0.kernels == 8  # (both fill the tensor they send)
    assert w0.waited_for_ranks == pytest.approx(w1.compute - w0.compute, rel=0.01)
    assert w1.waited_for_ranks == 0
    # What a notebook shows: the text and a self-contained SVG, both saying *modeled*.
    text, page = str(tl), tl._repr_html_()
    assert f"GPU:0: step {g0.step * 1e3:.3f} ms = compute {g0.compute * 1e3:.3f} ms" in text
    assert "not measured" in text and "pcie3-host" in text
    assert "<svg" in page and "<script" not in page and "(modeled)" in page
    assert page.count("GPU:1 NCCL") == 1
