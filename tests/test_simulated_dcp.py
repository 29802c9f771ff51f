"""torch.distributed.checkpoint (DCP) on simulated GPUs: FSDP1's and FSDP2's sharded state
dicts saved from two ranks (`dcp.save`, `dcp.async_save`) and loaded into models that started
elsewhere, as on CUDA; and the NCCL group's devices as the backend string names them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

# FSDP, and with it ShardedTensor's ops, imported before any simulation starts, as a program
# that imports FSDP before simulating has them (the ranks are forked from this process)
import torch.distributed.fsdp  # noqa: F401
from torch import nn

import devlab

pytestmark = pytest.mark.usefixtures("no_simulation")


def _build(fsdp: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).cuda()
    if fsdp == 2:
        from torch.distributed.fsdp import fully_shard

        fully_shard(model)
        return model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP(model, sync_module_states=True)  # rank 0's weights on both ranks


def _whole(model: nn.Module) -> dict[str, list]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True)
    return {k: v.cpu().tolist() for k, v in get_model_state_dict(model, options=options).items()}


def save_and_load(folder: str, fsdp: int, backend: str, asynchronous: bool) -> dict:
    """On one rank: train an FSDP model one step, save its sharded state dicts with DCP, build
    another from other weights, load the checkpoint into it; both models' whole weights."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group(backend)
    out: dict = {"devices": [str(d) for d in dist.group.WORLD._device_types]}
    model = _build(fsdp, 0)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.full((2, 4), float(rank + 1), device="cuda")).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    out["kinds"] = sorted({type(v).__name__ for v in msd.values()})
    state = {"model": msd, "optim": osd}
    if asynchronous:
        dcp.async_save(state, checkpoint_id=folder).result()
    else:
        dcp.save(state, checkpoint_id=folder)
    out["saved"] = _whole(model)
    other = _build(fsdp, 1)
    other_opt = torch.optim.Adam(other.parameters(), lr=0.1)
    out["before"] = _whole(other)
    msd, osd = get_state_dict(other, other_opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(other, other_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    out["loaded"] = _whole(other)
    out["files"] = sorted(p.name for p in Path(folder).iterdir())
    dist.destroy_process_group()
    return out


@pytest.mark.parametrize(("fsdp", "backend", "asynchronous", "kind"), [
    (1, "nccl", False, "ShardedTensor"),
    # DCP's async_save needs a CPU backend; torch 2.13 cannot stage FSDP1's ShardedTensors for
    # it (data_ptr is not supported for ShardedTensor, on any device), so FSDP2's DTensors
    (2, "cpu:gloo,cuda:nccl", True, "DTensor"),
])
def test_dcp_saves_and_loads_fsdp_shards(two, tmp_path: Path, fsdp: int, backend: str,
                                         asynchronous: bool, kind: str) -> None:
    folder = str(tmp_path / "checkpoint")
    got = devlab.launch(save_and_load, folder, fsdp, backend, asynchronous, nprocs=2,
                        timeout=240)
    for ranked in got:
        assert ranked["kinds"] == [kind]
        assert ranked["before"] != ranked["saved"]  # the second model started elsewhere
        assert ranked["loaded"] == ranked["saved"]
        assert ranked["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert got[0]["saved"] == got[1]["saved"]
    assert got[0]["devices"] == (["cuda"] if backend == "nccl" else ["cpu", "cuda"])


def refuse_async(folder: str) -> str:
    import torch.distributed.checkpoint as dcp

    torch.cuda.set_device(int(os.environ["RANK"]))
    dist.init_process_group("nccl")
    try:
        dcp.async_save({"x": torch.ones(2, device="cuda")}, checkpoint_id=folder)
    except AssertionError as e:
        return str(e)
    finally:
        dist.destroy_process_group()
    return "saved"


def test_async_save_refuses_an_nccl_only_group_as_on_cuda(two, tmp_path: Path) -> None:
    # An "nccl" group has CUDA's backend alone: DCP asks for a CPU one, as it does on a GPU.
    got = devlab.launch(refuse_async, str(tmp_path / "c"), nprocs=2, timeout=120)
    assert all(g.startswith("A CPU backend must be enabled for async save") for g in got), got


def test_a_sharded_tensor_says_its_device_whenever_its_module_was_imported() -> None:
    # ShardedTensor keys its `device` by torch.Tensor.device as it was at its import, which
    # the simulation patches: imported before the simulation or during it, it answers while
    # the simulation runs and after it stops, and its table is left as torch's import left it.
    import devlab.simulated as sim
    from torch.distributed._shard.sharded_tensor import api
    from torch.distributed._shard.sharded_tensor._ops import tensor_ops  # noqa: F401

    ops = api._SHARDED_OPS
    before = dict(ops)
    original = torch._C.TensorBase.device.__get__
    sim.start(2)
    try:
        patched = torch.Tensor.device.__get__
        assert patched != original
        assert ops[patched] is ops[original]
    finally:
        sim.stop()
    assert ops == before
