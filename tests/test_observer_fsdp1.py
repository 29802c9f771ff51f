"""The conformance observer gathers FSDP1's sharded parameters whole on simulated GPUs: a flat
parameter's shards (one of a single number too), the original parameters `use_orig_params=True`
leaves to the optimizer, a flat parameter offloaded to the CPU, and one trained in mixed
precision; each rank's gathered parameters after a step equal one CPU process's."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import devlab

OBSERVER = Path(__file__).resolve().parent / "conformance" / "observer" / "sitecustomize.py"

pytestmark = pytest.mark.usefixtures("no_simulation")

LR = 0.1


def _observer() -> Any:
    spec = importlib.util.spec_from_file_location("observer_fsdp1", OBSERVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(kind: str) -> nn.Module:
    torch.manual_seed(0)  # every rank (and the CPU reference) builds the same weights
    if kind == "one":  # a flat parameter of one number, padded to one per rank
        return nn.Linear(1, 1, bias=False)
    return nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 1))  # 11 numbers: padded


def _inputs(kind: str, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(4, 1 if kind == "one" else 3, generator=g)


def fsdp1_ranks(config: str) -> dict[str, Any]:
    """On one rank: an FSDP1 model in `config`, the observer's reading of its optimizer's
    parameters before and after one SGD step."""
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffload, MixedPrecision
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    observer = _observer()
    kind = "one" if config == "one" else "mlp"
    options: dict[str, Any] = {"use_orig_params": config == "orig"}
    if config == "offload":
        options["cpu_offload"] = CPUOffload(offload_params=True)
    if config == "mixed":
        options["mixed_precision"] = MixedPrecision(param_dtype=torch.float16,
                                                    reduce_dtype=torch.float16)
    model = FSDP(_model(kind).to("cuda"), device_id=rank, **options)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    # read where the observer's pre-step hook reads: after the backward pass (FSDP sets a
    # flat parameter's padded size at its first forward)
    model(_inputs(kind, rank).to("cuda")).pow(2).sum().backward()
    params = [p for g in opt.param_groups for p in g["params"]]
    out: dict[str, Any] = {
        "sharded": [observer._sharded(p) or observer._view_of_flat(p) for p in params],
        "local": [p.numel() for p in params],
        "devices": sorted({str(p.device) for p in params}),
        "initial": observer._parameters(opt),
    }
    opt.step()
    out["final"] = observer._parameters(opt)
    dist.destroy_process_group()
    return out


def _reference(kind: str) -> tuple[list[float], list[float]]:
    """One CPU process: the same weights, one SGD step on the mean of the ranks' gradients
    (FSDP's reduce-scatter divides the sum by the world size)."""
    model = _model(kind)
    initial = torch.nn.utils.parameters_to_vector(model.parameters()).tolist()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sum(model(_inputs(kind, r)).pow(2).sum() for r in range(2)).div(2).backward()
    opt.step()
    return initial, torch.nn.utils.parameters_to_vector(model.parameters()).tolist()


@pytest.mark.parametrize(("config", "devices", "rtol"), [
    ("one", ["cuda:{rank}"], 1e-6),
    ("orig", ["cuda:{rank}"], 1e-6),
    ("offload", ["cpu"], 1e-6),
    ("mixed", ["cuda:{rank}"], 2e-3),  # float16 forward, backward and reduction
])
def test_observer_gathers_fsdp1_parameters_whole(two, config: str, devices: list[str],
                                                 rtol: float) -> None:
    kind = "one" if config == "one" else "mlp"
    initial, final = _reference(kind)
    got = devlab.launch(fsdp1_ranks, config, nprocs=2, timeout=180)
    for rank, ranked in enumerate(got):
        assert all(ranked["sharded"]), ranked
        assert ranked["devices"] == [d.format(rank=rank) for d in devices]
        # each rank holds part of the numbers (one of the one-number flat parameter's two)
        assert sum(ranked["local"]) < len(initial) or len(initial) == 1
        assert ranked["initial"] == pytest.approx(initial, rel=1e-6)
        assert ranked["final"] == pytest.approx(final, rel=rtol, abs=1e-6)
    assert got[0]["final"] == got[1]["final"]
    if config == "orig":  # the optimizer holds the original parameters, not a flat one
        assert len(got[0]["local"]) == 4


def test_a_shard_of_a_one_number_flat_parameter_is_sharded() -> None:
    # FSDP pads a one-number flat parameter to one number per rank: a shard holds as many
    # numbers as the unpadded whole, which the observer once took for an unsharded one.
    observer = _observer()
    from torch.distributed.fsdp._flat_param import FlatParameter

    flat = FlatParameter(torch.zeros(1), requires_grad=True)
    flat._unpadded_unsharded_size = torch.Size([1])
    flat._sharded_size = torch.Size([1])
    assert not observer._flat_shard(flat)  # no padded size yet: FSDP has not sharded it
    flat._padded_unsharded_size = torch.Size([2])
    assert observer._flat_shard(flat)
    flat._padded_unsharded_size = torch.Size([1])  # NO_SHARD, one rank: the whole
    assert not observer._flat_shard(flat)
