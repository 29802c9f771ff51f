"""NCCL on simulated GPUs (devlab/engine/simulated/torch_distributed/nccl.py): a group made for "nccl" is NCCL to the
program — its name, the tensors its collectives accept, its errors, DDP's communication hooks —
with gloo moving the bytes; and the CUDA build's probes answer as a CUDA build does."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from torch import nn

# Imported here, not in the ranks: a forked rank that imports a module the parent never did can
# block on an import lock a thread of the parent held at the fork (seen ~1 run in 4 under load).
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

import devlab
from devlab.core import placement_log

pytestmark = pytest.mark.usefixtures("no_simulation")


def _rank() -> int:
    return int(os.environ["RANK"])


def _error(fn) -> str:
    try:
        fn()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


# --- what the group says about itself -----------------------------------------------------------

def bound_group() -> dict:
    rank = _rank()
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    dist.barrier()  # gloo's barrier would allocate a tensor on the bound CUDA device
    dist.barrier(device_ids=[rank])
    pg = dist.group.WORLD
    sub = dist.new_group([0, 1])
    t = torch.ones(1, device=rank)
    dist.all_reduce(t, group=sub)
    split = dist.split_group(split_ranks=[[0, 1]])  # NCCL's communicator split
    s = torch.full((1,), float(rank), device=rank)
    dist.all_reduce(s, group=split)
    mine, _ = dist.new_subgroups(group_size=1)  # one group per rank
    dist.all_reduce(t, group=mine)
    out = {"backend": dist.get_backend(), "name": pg.name(), "sub": dist.get_backend(sub),
           "split": (dist.get_backend(split), split.name(), s.tolist(), str(s.device)),
           "subgroups": (dist.get_backend(mine), mine.size()),
           "available": dist.is_nccl_available(), "bound": str(pg.bound_device_id),
           "config": dist.get_backend_config(), "sub_sum": t.tolist(), "device": str(t.device),
           "monitored": _error(lambda: dist.monitored_barrier())}
    dist.destroy_process_group()
    return out


def test_a_group_made_for_nccl_is_nccl(two) -> None:
    for rank, got in enumerate(devlab.launch(bound_group, nprocs=2, timeout=120)):
        # NCCL has no monitored barrier: torch says so for any group but gloo's (torch 2.15
        # words it anew)
        assert re.fullmatch(r"ValueError: monitored_barrier (is only implemented for GLOO "
                            r"backend|requires a group with a CPU-capable backend \(e\.g\. "
                            r"GLOO\))\.", got.pop("monitored"))
        assert got == {"backend": "nccl", "name": "nccl", "sub": "nccl", "available": True,
                       "bound": f"cuda:{rank}", "config": "cuda:nccl", "sub_sum": [2.0],
                       "split": ("nccl", "nccl", [1.0], f"cuda:{rank}"),
                       "subgroups": ("nccl", 1),
                       "device": f"cuda:{rank}"}


SPLITS = 16


def split_many_times() -> list[float]:
    rank = _rank()
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    sums = []
    for _ in range(SPLITS):
        split = dist.split_group(split_ranks=[[0, 1]])
        s = torch.full((1,), float(rank + 1), device=rank)
        dist.all_reduce(s, group=split)
        sums.append(s.item())
    dist.destroy_process_group()
    return sums


def test_splitting_a_group_again_and_again_never_hangs(two) -> None:
    # A split once met its peers twice under one store prefix (the gloo backend was registered
    # for two devices, and torch splits each): a rank could connect to the wrong child and wait
    # for ever. Before the fix, 16 splits in a row hung in most launches.
    for got in devlab.launch(split_many_times, nprocs=2, timeout=120):
        assert got == [3.0] * SPLITS


# --- collectives take what NCCL takes ---------------------------------------------------------

def _inputs(rank: int) -> torch.Tensor:
    """Rank r's four values, on its GPU: 10r, 10r+1, 10r+2, 10r+3."""
    return torch.arange(4.0, device=rank) + 10 * rank


# torch 2.13 shows a PREMUL_SUM op's factor to Python; earlier versions keep it in C++, and the
# simulated group then refuses the op in words (the compatibility job runs 2.11).
PREMUL_FACTOR = hasattr(dist._make_nccl_premul_sum(1.0), "factor")


def collectives() -> dict:
    rank = _rank()
    dist.init_process_group("nccl")
    torch.cuda.set_device(rank)
    x = _inputs(rank)
    out: dict = {}
    flat = torch.empty(8, device=rank)
    dist.all_gather_into_tensor(flat, x.view(2, 2))  # gloo: "invalid tensor size"
    stacked = torch.empty(2, 4, device=rank)
    dist.all_gather_into_tensor(stacked, x)
    out["all_gather_into_tensor"] = (flat.tolist(), stacked.flatten().tolist(), str(flat.device))
    part = torch.empty(2, device=rank)
    dist.reduce_scatter_tensor(part, x.view(2, 2))  # gloo: a failed check
    out["reduce_scatter_tensor"] = (part.tolist(), str(part.device))
    uneven = [torch.empty(1, device=rank), torch.empty(2, device=rank)]
    dist.all_gather(uneven, torch.full((rank + 1,), float(rank + 1), device=rank))
    out["all_gather_uneven"] = [u.tolist() for u in uneven]
    received = torch.empty(3 if rank == 0 else 5, device=rank)
    dist.all_to_all_single(received, x, [1, 2] if rank == 0 else [3, 2],
                           [1, 3] if rank == 0 else [2, 2])
    out["all_to_all_uneven"] = received.tolist()
    reductions = {}
    y = x.clone()
    dist.all_reduce(y, op=dist.ReduceOp.AVG)
    reductions["avg"] = y.tolist()
    if PREMUL_FACTOR:
        for name, op in (("premul", dist._make_nccl_premul_sum(0.5)),
                         ("premul_tensor", dist._make_nccl_premul_sum(torch.tensor(
                             0.25, device=rank)))):
            y = x.clone()
            dist.all_reduce(y, op=op)
            reductions[name] = y.tolist()
        scattered = torch.empty(2, device=rank)
        dist.reduce_scatter_tensor(scattered, x, op=dist._make_nccl_premul_sum(2.0))
        reductions["premul_scatter"] = scattered.tolist()
    else:
        reductions["premul"] = _error(lambda: dist.all_reduce(
            x.clone(), op=dist._make_nccl_premul_sum(0.5)))
    flags = torch.tensor([rank == 1, False], device=rank)
    dist.all_reduce(flags)  # NCCL reduces booleans with an or
    reductions["bool"] = flags.tolist()
    out["reductions"] = reductions
    dist.destroy_process_group()
    return out


def test_collectives_accept_what_nccl_accepts_and_stay_on_the_gpu(two) -> None:
    inputs = [torch.arange(4.0) + 10 * r for r in range(2)]  # what _inputs gives each rank
    total = inputs[0] + inputs[1]
    results = devlab.launch(collectives, nprocs=2, timeout=120)
    for rank, got in enumerate(results):
        gathered = torch.cat(inputs).tolist()
        assert got["all_gather_into_tensor"] == (gathered, gathered, f"cuda:{rank}")
        assert got["reduce_scatter_tensor"] == (total.chunk(2)[rank].tolist(), f"cuda:{rank}")
        assert got["all_gather_uneven"] == [[1.0], [2.0, 2.0]]
        sent = {0: inputs[0].split([1, 3]), 1: inputs[1].split([2, 2])}
        assert got["all_to_all_uneven"] == torch.cat([sent[0][rank], sent[1][rank]]).tolist()
        premul = ({"premul": (total * 0.5).tolist(), "premul_tensor": (total * 0.25).tolist(),
                   "premul_scatter": (total * 2).chunk(2)[rank].tolist()} if PREMUL_FACTOR
                  else {"premul": "NotImplementedError: ReduceOp.PREMUL_SUM on simulated GPUs "
                                  f"needs torch 2.13 or later: torch {torch.__version__} does "
                                  "not show the op's factor to Python. Use ReduceOp.AVG, or "
                                  "multiply the tensor by the factor before a SUM."})
        assert got["reductions"] == {"avg": (total / 2).tolist(), **premul,
                                     "bool": [True, False]}


def nccl_errors() -> dict:
    rank = _rank()
    dist.init_process_group("nccl")
    x = _inputs(rank)
    out = {
        "band": _error(lambda: dist.all_reduce(x.clone(), op=dist.ReduceOp.BAND)),
        "bool_avg": _error(lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool, device=rank),
                                                   op=dist.ReduceOp.AVG)),
        "premul_int": _error(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64,
                                                                device=rank),
                                                     op=dist._make_nccl_premul_sum(2.0))),
        "gather_size": _error(lambda: dist.all_gather_into_tensor(torch.empty(7, device=rank),
                                                                  x)),
        "gather_dtype": _error(lambda: dist.all_gather_into_tensor(
            torch.empty(8, dtype=torch.float64, device=rank), x)),
        "scatter_size": _error(lambda: dist.reduce_scatter_tensor(torch.empty(3, device=rank),
                                                                  x)),
        "strided": _error(lambda: dist.all_reduce(torch.ones(4, 4, device=rank).t())),
    }
    dist.barrier()  # the group still works after the refusals
    dist.destroy_process_group()
    return out


def test_what_nccl_refuses_is_refused_in_its_words(two) -> None:
    for got in devlab.launch(nccl_errors, nprocs=2, timeout=120):
        assert got == {
            "band": "ValueError: Cannot use ReduceOp.BAND with NCCL",
            "bool_avg": "TypeError: Cannot use ReduceOp.AVG with boolean inputs",
            "premul_int": "TypeError: PreMulSum Data type must be half, float, bfloat16 or "
                          "double",
            "gather_size": "ValueError: output tensor size must be equal to world_size times "
                           "input tensor size",
            "gather_dtype": "TypeError: output tensor must have the same type as input tensor",
            "scatter_size": "ValueError: input tensor must be the same size as output size "
                            "times world size",
            "strided": "ValueError: Tensors must be contiguous"}


# --- DDP's communication hooks ------------------------------------------------------------------

STEPS = 4


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 8, generator=g), torch.randn(8, 2, generator=g))
            for _ in range(STEPS)]


def train_with_hook(hook: str) -> tuple[list[float], list[str]]:
    rank = _rank()
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    torch.cuda.set_device(rank)
    model = nn.parallel.DistributedDataParallel(_net().to(rank), device_ids=[rank])
    if hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2, min_compression_rate=0.1)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif hook != "none":
        model.register_comm_hook(None, {"fp16": default_hooks.fp16_compress_hook,
                                        "bf16": default_hooks.bf16_compress_hook}[hook])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for X, y in _batches():
        opt.zero_grad()
        mine = slice(4 * rank, 4 * rank + 4)
        nn.functional.mse_loss(model(X[mine].to(rank)), y[mine].to(rank)).backward()
        opt.step()
    devices = sorted({str(p.device) for p in model.parameters()})
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu().tolist()
    dist.destroy_process_group()
    return weights, devices


@pytest.fixture(scope="module")
def one_process() -> torch.Tensor:
    """The same training on the whole batch in one process on the CPU: what DDP computes."""
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for X, y in _batches():
        opt.zero_grad()
        nn.functional.mse_loss(net(X), y).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in net.parameters()])


@pytest.mark.parametrize(("hook", "tolerance"), [
    ("none", 1e-6), ("fp16", 1e-3), ("bf16", 1e-2), ("powersgd", None)])
def test_ddp_communication_hooks_train_on_simulated_gpus(two, one_process, hook,
                                                         tolerance) -> None:
    results = devlab.launch(train_with_hook, hook, nprocs=2, timeout=120)
    for rank, (weights, devices) in enumerate(results):
        assert devices == [f"cuda:{rank}"]
        assert weights == results[0][0]  # every rank applied the same step
        if tolerance is not None:  # compression rounds the gradients it sends
            torch.testing.assert_close(torch.tensor(weights), one_process, rtol=tolerance,
                                       atol=tolerance)
    if hook == "powersgd":  # a rank-1 approximation: trained, but not the exact step
        moved = (torch.tensor(results[0][0]) - _initial()).abs().sum()
        assert moved > 0


def _initial() -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in _net().parameters()])


# --- the placement log ------------------------------------------------------------------------

def logged_gather() -> list[str]:
    rank = _rank()
    dist.init_process_group("nccl")
    x = _inputs(rank)
    out = torch.empty(8, device=rank)
    with placement_log.capture() as log:
        dist.all_gather_into_tensor(out, x.view(2, 2))
        dist.reduce_scatter_tensor(torch.empty(2, device=rank), x)
    dist.destroy_process_group()
    return [line for line in log.lines() if "c10d" in line]


def test_the_placement_log_shows_the_groups_collectives_with_their_bytes(two) -> None:
    gpu = "/job:localhost/replica:0/task:0/device:GPU:{}"
    for rank, lines in enumerate(devlab.launch(logged_gather, nprocs=2, timeout=120)):
        assert lines == [f"All-gather 16 B on {gpu.format(rank)} (c10d::_allgather_base_)",
                         f"Reduce-scatter 16 B on {gpu.format(rank)} "
                         "(c10d::_reduce_scatter_base_)"]


# --- the CUDA build's probes ------------------------------------------------------------------

def test_the_cuda_build_probes_answer_while_simulating_and_go_with_it(no_simulation) -> None:
    import torch.cuda.nccl
    import torch.distributed.distributed_c10d as c10d

    # torch 2.15 and later make "nccl" through a backend plugin, registered on first use
    plugins = getattr(c10d.Backend, "_plugins", {})
    register = getattr(c10d.Backend, "_ensure_backend_registered", None)
    if register is not None:
        for name in ("nccl", "nccl2", "nccl-lazy"):
            register(name)  # as a first init_process_group("nccl") before simulating does
    registered = dict(plugins)

    def state() -> tuple:
        return (dist.is_nccl_available(), torch.version.cuda, torch.cuda.nccl.version,
                hasattr(torch._C, "_cuda_isInBadFork"), hasattr(dist, "ProcessGroupNCCL"),
                c10d._new_process_group_helper, c10d.default_pg_nccl_timeout,
                torch._C.Future.then, torch._C._get_accelerator,
                getattr(c10d, "_get_split_source", None),
                getattr(c10d, "_FR_SELF_RECORDING_BACKENDS", None))

    before = state()
    devlab.simulated.start(2)
    if register is not None:  # every NCCL name makes the simulation's group
        assert {plugins[n].creator_fn for n in ("NCCL", "NCCL2", "NCCL-LAZY")} == {
            c10d._create_nccl_process_group}
    assert torch._C._get_accelerator() == torch.device("cuda")
    assert dist.is_nccl_available() and torch.cuda.nccl.version() >= (2, 10)
    assert torch.cuda.nccl.version()[-1] == "simulated"
    assert torch.version.cuda is not None and int(torch.version.cuda.split(".")[0]) >= 11
    assert torch._C._cuda_isInBadFork() is False
    assert dist.ProcessGroupNCCL.Options().is_high_priority_stream is False
    devlab.simulated.stop()
    assert state() == before
    assert plugins == registered


# --- a program that ends while gloo's thread still works for it --------------------------------

_ENDS_WITH_A_CALLBACK_RUNNING = """
import threading, time, torch, torch.distributed as dist
store = dist.HashStore()
groups = {}
def make(rank):  # two ranks in this one process, each its own group object
    groups[rank] = getattr(dist, GROUP)(store, rank, 2)
makers = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
for t in makers: t.start()
for t in makers: t.join()
def callback(f):
    time.sleep(0.3)
    where = "the main thread" if threading.current_thread() is threading.main_thread() else "gloo's thread"
    print(f"callback ran to its end on {where}", flush=True)
    return f.value()
work = groups[0].allreduce([torch.ones(4, device=DEVICE)])
work.get_future().then(callback)  # rank 1 has not joined: the future completes on gloo's thread
groups[1].allreduce([torch.ones(4, device=DEVICE)])
time.sleep(0.05)
print("program ends", flush=True)
"""


def _end(group: str, device: str, simulate: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DEVLAB_SIMULATE_GPUS"}
    if simulate:
        env["DEVLAB_SIMULATE_GPUS"] = "1"  # the start-up hook simulates, as under torchrun
    code = f"GROUP, DEVICE = {group!r}, {device!r}\n" + _ENDS_WITH_A_CALLBACK_RUNNING
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_program_that_ends_during_a_collectives_callback_exits_cleanly() -> None:
    # Plain gloo on the CPU: gloo's thread runs the callback, takes the GIL while Python
    # finalizes, and the process aborts, though the program ended. This is the abort the corpus
    # and the README's torchrun example met now and then at exit (when the thread freeing a
    # finished collective's Python objects was late); a callback still sleeping makes it certain.
    plain = _end("ProcessGroupGloo", "cpu", simulate=False)
    assert plain.stdout.splitlines() == ["program ends"]
    # Killed by a signal either way: std::terminate's abort (SIGABRT), or Python's own fatal
    # error when the thread lets go of a thread state it no longer holds (an abort too), or a
    # segfault when the thread races the finalizing runtime (SIGSEGV: then often before anything
    # reaches stderr, 1 run in 75 under load with torch 2.11).
    assert plain.returncode in (-signal.SIGABRT, -signal.SIGSEGV), plain
    if plain.returncode == -signal.SIGABRT:
        assert ("terminate called without an active exception" in plain.stderr
                or "Fatal Python error" in plain.stderr and "finalizing" in plain.stderr), plain
    # NCCL on simulated GPUs exits as a CUDA program does: the callback finishes first.
    simulated = _end("ProcessGroupNCCL", "cuda", simulate=True)
    assert simulated.returncode == 0, simulated.stderr
    assert simulated.stdout.splitlines() == ["program ends",
                                             "callback ran to its end on gloo's thread"]


def ddp_bucket_bytes() -> tuple[int, int]:
    rank = _rank()
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 10)).to(rank)
    before = torch.cuda.memory_allocated(rank)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    grown = torch.cuda.memory_allocated(rank) - before
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    del ddp
    dist.destroy_process_group()
    return grown, params


def test_ddp_allocates_its_gradient_buckets_on_the_gpu(two) -> None:
    # DistributedDataParallel's Reducer makes buckets the size of the model in C++ when it
    # wraps it: on a GPU, memory_allocated grows by the parameters' bytes (each bucket rounded
    # as CUDA's allocator rounds it). In ranks, not in this process: a process group made here
    # would leave gloo's threads to the ranks later tests fork from it.
    for grown, params in devlab.launch(ddp_bucket_bytes, nprocs=2, timeout=120):
        assert params <= grown < params + 4 * 512


_HOST_TENSOR = """
import os, socket, sys
import torch, torch.distributed as dist
import devlab
devlab.config.simulate_gpus(1)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group(sys.argv[1], rank=0, world_size=1)
try:
    host = torch.ones(2)
    dist.all_reduce(host)
    print("host", host.tolist())
except RuntimeError as e:
    print("host refused:", e)
gpu = torch.ones(2, device="cuda")
dist.all_reduce(gpu)
print("gpu", gpu.device)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl"])
def test_an_nccl_group_refuses_a_host_tensor_as_torch_does(backend):
    """A host tensor given to an NCCL-only group reaches no backend (torch's dispatcher's error);
    a group that names gloo for the CPU takes it there."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
         os.environ.get("PYTHONPATH", "")])}
    env = {k: v for k, v in env.items() if not k.startswith("DEVLAB_SIMULATE")}
    out = subprocess.run([sys.executable, "-c", _HOST_TENSOR, backend], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[-1] == "gpu cuda:0"
    assert lines[-2] == ("host refused: No backend type associated with device type cpu"
                         if backend == "nccl" else "host [1.0, 1.0]")
