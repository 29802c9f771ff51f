"""DTensor and what is built on it, on simulated GPUs, as on CUDA: local shards on each rank's
GPU, redistribution, tensor parallelism, FSDP2, a 2-D mesh, pipelining — each compared with the
same arithmetic in one process on the CPU."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

import devlab

pytestmark = pytest.mark.usefixtures("no_simulation")


def _rank() -> int:
    return int(os.environ["RANK"])


def _values(t: torch.Tensor) -> list:
    return t.detach().cpu().tolist()


# --- DTensor and DeviceMesh -------------------------------------------------------------------

def dtensor_basics() -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    rank = _rank()
    torch.cuda.set_device(rank)
    mesh = init_device_mesh("cuda", (2,))
    full = torch.arange(16.0, device="cuda").view(4, 4)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    replicated = sharded.redistribute(mesh, [Replicate()])
    summed = DTensor.from_local(torch.full((2,), float(rank + 1), device="cuda"), mesh,
                                [Partial()]).redistribute(mesh, [Replicate()])
    doubled = sharded * 2 + 1  # an op DTensor runs on the local shard, in C++
    out = {
        "mesh": str(mesh.device_type),
        "sharded": (str(sharded.device), str(sharded.to_local().device),
                    _values(sharded.to_local())),
        "replicated": (str(replicated.to_local().device), _values(replicated.to_local())),
        "partial_sum": (str(summed.to_local().device), _values(summed.to_local())),
        "op": (str(doubled.device), str(doubled.to_local().device),
               _values(doubled.full_tensor())),
    }
    dist.destroy_process_group()
    return out


def test_dtensor_shards_live_on_each_ranks_gpu(two) -> None:
    full = torch.arange(16.0).view(4, 4)
    for rank, got in enumerate(devlab.launch(dtensor_basics, nprocs=2, timeout=120)):
        gpu = f"cuda:{rank}"
        assert got == {
            "mesh": "cuda",
            "sharded": (gpu, gpu, full.chunk(2)[rank].tolist()),
            "replicated": (gpu, full.tolist()),
            "partial_sum": (gpu, [3.0, 3.0]),
            "op": (gpu, gpu, (full * 2 + 1).tolist())}


# --- DTensor's random numbers: what CUDA's RNG tracker promises ---------------------------------

def random_dtensors() -> dict:
    import torch.distributed.tensor as dt
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.cuda.set_device(_rank())
    torch.manual_seed(0)
    mesh = init_device_mesh("cuda", (2,))
    sharded = dt.randn(4, 4, device_mesh=mesh, placements=[Shard(0)])  # the tracker's region
    replicated = dt.randn(2, 2, device_mesh=mesh, placements=[Replicate()])
    ones = distribute_tensor(torch.ones(4, 6, device="cuda"), mesh, [Shard(1)])
    dropped = nn.functional.dropout(ones, 0.5)  # an op on a CUDA shard: run_dtensor_rng_op
    with torch.device("meta"):
        linear = nn.Linear(4, 4)
    fully_shard(linear)
    linear.to_empty(device="cuda")
    linear.reset_parameters()  # FSDP2's sharded initialization
    after = torch.rand(3, device="cuda")  # a plain draw once all that is done
    out = {"sharded": (str(sharded.to_local().device), _values(sharded.to_local())),
           "replicated": _values(replicated.to_local()), "dropped": _values(dropped.to_local()),
           "weight": _values(linear.weight.to_local()), "after": _values(after)}
    dist.destroy_process_group()
    return out


def test_random_dtensors_keep_the_promises_of_cudas_rng_tracker(two) -> None:
    """Replicas draw the same numbers, different shards different ones (each rank drawing its
    shard from its own generator, both seeded 0, gave both halves the same numbers), every rank's
    generator is in one state afterwards; the numbers are the ones devlab's rule gives."""
    from devlab.engine.simulated.torch_distributed.dtensor_rng import shard_seed

    got = devlab.launch(random_dtensors, nprocs=2, timeout=120)
    for key in ("replicated", "after"):
        assert got[0][key] == got[1][key]
    for key in ("sharded", "dropped", "weight"):
        assert got[0][key] != got[1][key]
    torch.manual_seed(0)
    number = int(torch.randint((1 << 63) - 1, (1,)))  # the op's one draw, the same on each rank
    for rank in (0, 1):
        assert got[rank]["sharded"][0] == f"cuda:{rank}"
        # rank r holds rows 2r, 2r+1: its shard's offset is r * 8 elements
        expected = torch.randn(2, 4, generator=torch.Generator().manual_seed(
            shard_seed(number, rank * 8)))
        assert got[rank]["sharded"][1] == expected.tolist()
        kept = torch.tensor(got[rank]["dropped"])
        assert set(kept.unique().tolist()) <= {0.0, 2.0} and 0 < int(kept.count_nonzero()) < 12


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.LayerNorm(8)
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))


def _inputs(step: int) -> torch.Tensor:
    return torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(step))


STEPS = 3


def tensor_parallel(sequence: bool) -> tuple[list, list[str]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    rank = _rank()
    torch.cuda.set_device(rank)
    mesh = init_device_mesh("cuda", (2,))
    plan: dict = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    if sequence:  # the norm on sequence shards, then all-gather into the column-wise layer
        plan = {"norm": SequenceParallel(),
                "up": ColwiseParallel(input_layouts=Shard(1)),
                "down": RowwiseParallel(output_layouts=Shard(1))}
    model = parallelize_module(MLP().to("cuda"), mesh, plan)
    # one step per parameter: the tensor plan leaves the norm's parameters plain tensors,
    # which a foreach step cannot take beside DTensors (on CUDA neither)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=False)
    for step in range(STEPS):
        opt.zero_grad()
        x = _inputs(step).to("cuda")
        if sequence:
            x = x.chunk(2, dim=1)[rank]  # each rank holds its half of the sequence
        model(x).pow(2).sum().backward()
        opt.step()
    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    def full(t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    devices = sorted({str(local(p).device) for p in model.parameters()}
                     | {str(local(p.grad).device) for p in model.parameters()})
    weights = [_values(full(p)) for p in model.parameters()]
    dist.destroy_process_group()
    return weights, devices


@pytest.mark.parametrize("sequence", [False, True], ids=["tensor", "sequence"])
def test_tensor_parallel_training_matches_one_cpu_process(two, sequence) -> None:
    ref = MLP()
    opt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    for step in range(STEPS):
        opt.zero_grad()
        ref(_inputs(step)).pow(2).sum().backward()
        opt.step()
    for rank, (weights, devices) in enumerate(devlab.launch(tensor_parallel, sequence,
                                                            nprocs=2, timeout=120)):
        assert devices == [f"cuda:{rank}"]
        for got, want in zip(weights, ref.parameters(), strict=True):
            torch.testing.assert_close(torch.tensor(got), want.detach(), rtol=1e-4, atol=1e-5)


def loss_parallel_step() -> tuple[float, list, list[str]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module

    rank = _rank()
    torch.cuda.set_device(rank)
    mesh = init_device_mesh("cuda", (2,))
    torch.manual_seed(0)
    head = parallelize_module(nn.Linear(8, 6).to("cuda"), mesh,
                              ColwiseParallel(use_local_output=False))  # logits sharded by class
    x, y = _inputs(0)[0].to("cuda"), torch.tensor([0, 5, 2, 3], device="cuda")
    with loss_parallel():  # cross-entropy on the class shards; its backward too
        loss = nn.functional.cross_entropy(head(x), y)
        loss.backward()
    devices = sorted({str(loss.to_local().device), str(head.weight.grad.to_local().device)})
    out = loss.full_tensor().item(), _values(head.weight.grad.full_tensor()), devices
    dist.destroy_process_group()
    return out


def test_loss_parallel_matches_one_cpu_process(two) -> None:
    """Loss parallelism keeps what its forward computes inside DTensor's dispatch (the total
    weight) for its backward, which moves it to the mesh's device: it must be on the GPU."""
    torch.manual_seed(0)
    head = nn.Linear(8, 6)
    loss = nn.functional.cross_entropy(head(_inputs(0)[0]), torch.tensor([0, 5, 2, 3]))
    loss.backward()
    for rank, (got, grad, devices) in enumerate(devlab.launch(loss_parallel_step, nprocs=2,
                                                               timeout=120)):
        assert devices == [f"cuda:{rank}"]
        assert got == pytest.approx(loss.item(), rel=1e-6)
        torch.testing.assert_close(torch.tensor(grad), head.weight.grad, rtol=1e-5, atol=1e-6)


# --- FSDP2 ------------------------------------------------------------------------------------

def fsdp2(reference: dict) -> dict:
    from torch.distributed.fsdp import fully_shard

    rank = _rank()
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", device_id=device)
    with torch.device("meta"):
        model = MLP()
    fully_shard(model.up)
    fully_shard(model)
    model.to_empty(device=device)
    with torch.no_grad():  # each rank's shard of the reference weights
        for name, p in model.named_parameters():
            p.to_local().copy_(reference[name].chunk(2)[rank])
    out: dict = {"sharded": sorted({f"{p.to_local().device} {tuple(p.to_local().shape)}"
                                    for p in model.up.parameters()})}
    model.unshard()
    out["unsharded"] = sorted({f"{p.device} {tuple(p.shape)}" for p in model.up.parameters()})
    model.reshard()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    norms = []
    for step in range(STEPS):
        opt.zero_grad()
        x = _inputs(step).chunk(2)[rank].to(device)  # each rank its half of the batch
        model(x).pow(2).mean().backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
    out["norms"] = norms
    out["grads"] = sorted({str(p.grad.to_local().device) for p in model.parameters()})
    out["weights"] = {n: _values(p.full_tensor()) for n, p in model.named_parameters()}
    dist.destroy_process_group()
    return out


def test_fsdp2_shards_unshards_and_trains_as_one_cpu_process(two) -> None:
    ref = MLP()
    start = {n: p.detach().clone() for n, p in ref.named_parameters()}
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    norms = []
    for step in range(STEPS):
        opt.zero_grad()
        # FSDP averages the ranks' gradients: the mean of the two halves' mean losses
        x = _inputs(step)
        sum(ref(half).pow(2).mean() for half in x.chunk(2)).div(2).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)))
        opt.step()
    for rank, got in enumerate(devlab.launch(fsdp2, start, nprocs=2, timeout=120)):
        gpu = f"cuda:{rank}"
        assert got["sharded"] == sorted([f"{gpu} (8,)", f"{gpu} (8, 8)"])  # half of up's
        assert got["unsharded"] == sorted([f"{gpu} (16,)", f"{gpu} (16, 8)"])
        assert got["grads"] == [gpu]
        assert got["norms"] == pytest.approx(norms, rel=1e-5)
        for name, p in ref.named_parameters():
            torch.testing.assert_close(torch.tensor(got["weights"][name]), p.detach(),
                                       rtol=1e-5, atol=1e-6)


# --- a 2-D mesh: FSDP2 across, tensor parallelism within ---------------------------------------

def two_dimensional() -> tuple[list[str], list]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    rank = _rank()
    torch.cuda.set_device(rank)
    mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(MLP().to("cuda"), mesh["tp"],
                               {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dp = mesh["dp"].get_local_rank()
    for step in range(STEPS):
        opt.zero_grad()
        x = _inputs(step).chunk(2)[dp].to("cuda")  # a data-parallel pair shares its half
        model(x).pow(2).mean().backward()
        opt.step()
    devices = sorted({str(p.to_local().device) for p in model.parameters()})
    weights = [_values(p.full_tensor()) for p in model.parameters()]
    dist.destroy_process_group()
    return devices, weights


def test_a_2d_mesh_of_fsdp2_and_tensor_parallelism(no_simulation) -> None:
    devlab.simulated.start(4)
    ref = MLP()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        sum(ref(half).pow(2).mean() for half in _inputs(step).chunk(2)).div(2).backward()
        opt.step()
    for rank, (devices, weights) in enumerate(devlab.launch(two_dimensional, nprocs=4, timeout=180)):
        assert devices == [f"cuda:{rank}"]
        for got, want in zip(weights, ref.parameters(), strict=True):
            torch.testing.assert_close(torch.tensor(got), want.detach(), rtol=1e-4, atol=1e-5)


# --- pipelining ---------------------------------------------------------------------------------

def pipelined() -> tuple[str, list[float], list]:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    rank = _rank()
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", device_id=device)
    model = MLP()
    stage_module = nn.Sequential(model.norm, model.up) if rank == 0 else \
        nn.Sequential(nn.ReLU(), model.down)
    stage = PipelineStage(stage_module.to(device), rank, 2, device)
    schedule = ScheduleGPipe(stage, n_microbatches=2,
                             loss_fn=lambda out, target: (out - target).pow(2).mean())
    x = _inputs(0).to(device)
    losses: list = []
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=torch.zeros(2, 4, 8, device=device), losses=losses)
    grads = [_values(p.grad) for p in stage_module.parameters()]
    where = sorted({str(p.grad.device) for p in stage_module.parameters()})
    dist.destroy_process_group()
    return " ".join(where), [float(v) for v in losses], grads


def test_pipelining_on_two_ranks_matches_one_cpu_process(two) -> None:
    ref = MLP()
    micro = _inputs(0).chunk(2)
    losses = [ref(m).pow(2).mean() for m in micro]
    (sum(losses) / 2).backward()  # the schedule scales gradients by the microbatch count
    results = devlab.launch(pipelined, nprocs=2, timeout=120)
    assert [r[0] for r in results] == ["cuda:0", "cuda:1"]
    assert results[1][1] == pytest.approx([v.item() for v in losses], rel=1e-5)
    owned = [[ref.norm.weight, ref.norm.bias, ref.up.weight, ref.up.bias],
             [ref.down.weight, ref.down.bias]]
    for (_, _, grads), params in zip(results, owned, strict=True):
        for got, want in zip(grads, params, strict=True):
            torch.testing.assert_close(torch.tensor(got), want.grad, rtol=1e-5, atol=1e-6)


def test_dtensor_imported_before_the_simulation_starts_is_patched_and_restored(
        no_simulation) -> None:
    """A program (or an earlier cell) that imported torch.distributed.tensor before starting the
    simulation gets the same DTensor (the patches ran before the session existed, and were
    skipped, when they checked it)."""
    import torch.distributed.tensor._dispatch as dispatch
    import torch.distributed.tensor._op_schema as op_schema
    import torch.distributed.tensor._random as random

    # run_dtensor_rng_op is torch 2.13's; earlier versions run random ops through the tracker
    rng_op = getattr(dispatch, "run_dtensor_rng_op", None)
    before = (random.OffsetBasedRNGTracker, rng_op, op_schema._rebuild_tensor_from_dtensor_meta)
    devlab.simulated.start(2)
    try:
        assert issubclass(random.OffsetBasedRNGTracker, before[0])
        assert random.OffsetBasedRNGTracker is not before[0]
        if rng_op is not None:
            assert dispatch.run_dtensor_rng_op.__wrapped__ is rng_op
        assert op_schema._rebuild_tensor_from_dtensor_meta.__wrapped__ is before[2]
    finally:
        devlab.simulated.stop()
    assert (random.OffsetBasedRNGTracker, getattr(dispatch, "run_dtensor_rng_op", None),
            op_schema._rebuild_tensor_from_dtensor_meta) == before
