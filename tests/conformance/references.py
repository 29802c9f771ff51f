"""CPU replays: the CPU run of a corpus program that cannot run on a CPU as it is.

A DDP program hard-codes `init_process_group("nccl")` and one GPU per rank, so it has no CPU
run. Its replay computes on the CPU, in one process, what DDP defines its ranks to compute:
every rank starts from the same parameters (DDP broadcasts rank 0's), takes its own batches
(DistributedSampler with that rank's number), and every step applies the mean of the ranks'
gradients. It starts from the initial parameters the program's ranks draw: from the same seed
where the program seeds its ranks, else from those the observer recorded in the simulated
run's rank 0 (each new process's random generator starts from a different seed, so no other
process can draw the same ones). It uses the program's own classes and functions (its file is
run with a name other than `__main__`, so its launching code does not run), prints the lines
the program prints, and returns the initial and final parameters. Everything runs on the CPU;
devlab is not imported.
"""

from __future__ import annotations

import ast
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler


def _initial(records: list[dict[str, Any]]) -> tuple[list[float], int]:
    """Rank 0's initial parameters and the world size, from the observer's records."""
    (rank0,) = [r for r in records if r.get("rank") == 0]
    return rank0["initial"], int(rank0["world_size"])


def _llms_ddp(folder: Path, entry: str, records: list[dict[str, Any]],
              seed: int | None) -> dict[str, Any]:
    """LLMs-from-scratch's DDP scripts (appendix A): 3 epochs of SGD (lr 0.5) on their toy
    data, batch size 2 per rank with drop_last, then each rank's training and test accuracy.
    With `seed`, the initial parameters are drawn on the CPU as each rank draws them (the
    script seeds every rank with it before building the model); else rank 0's recorded ones."""
    program = runpy.run_path(str(folder / entry), run_name="conformance_replay")
    recorded, world = _initial(records)
    num_epochs = 3  # as the program's __main__ block sets it
    if seed is not None:
        torch.manual_seed(seed)
    # prepare_dataset() builds a DistributedSampler, which needs a process group: a
    # one-process group gives it one; only its datasets are used.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        train_loader, test_loader = program["prepare_dataset"]()
    finally:
        dist.destroy_process_group()
    train_ds = train_loader.dataset
    loaders = [DataLoader(train_ds, batch_size=2, shuffle=False, drop_last=True,
                          sampler=DistributedSampler(train_ds, num_replicas=world, rank=r))
               for r in range(world)]
    model = program["NeuralNetwork"](num_inputs=2, num_outputs=2)
    if seed is None:
        torch.nn.utils.vector_to_parameters(torch.tensor(recorded), model.parameters())
    initial = torch.nn.utils.parameters_to_vector(model.parameters()).tolist()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    lines: list[list[str]] = [[] for _ in range(world)]
    for epoch in range(num_epochs):
        for loader in loaders:
            loader.sampler.set_epoch(epoch)
        model.train()
        for batches in zip(*loaders, strict=True):
            optimizer.zero_grad()
            for rank, (features, labels) in enumerate(batches):
                loss = F.cross_entropy(model(features), labels)
                (loss / world).backward()  # DDP: the mean of the ranks' gradients
                lines[rank].append(f"[GPU{rank}] Epoch: {epoch+1:03d}/{num_epochs:03d}"
                                   f" | Batchsize {labels.shape[0]:03d}"
                                   f" | Train/Val Loss: {loss:.2f}")
            optimizer.step()
    model.eval()
    for rank in range(world):
        train_acc = program["compute_accuracy"](model, loaders[rank], device="cpu")
        lines[rank].append(f"[GPU{rank}] Training accuracy {train_acc}")
        test_acc = program["compute_accuracy"](model, test_loader, device="cpu")
        lines[rank].append(f"[GPU{rank}] Test accuracy {test_acc}")
    for rank_lines in lines:
        print("\n".join(rank_lines), flush=True)
    return {"initial": initial,
            "final": torch.nn.utils.parameters_to_vector(model.parameters()).tolist()}


def llms_from_scratch_ddp(folder: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """DDP-script.py: its ranks, started by mp.spawn, draw their initial weights unseeded (the
    script seeds only the parent), so the replay starts from rank 0's recorded ones."""
    return _llms_ddp(folder, "DDP-script.py", records, seed=None)


def llms_from_scratch_ddp_torchrun(folder: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """DDP-script-torchrun.py: every rank calls torch.manual_seed(123) before building the
    model, so the replay draws the same initial weights on the CPU: nothing is taken from the
    simulated run but the world size."""
    return _llms_ddp(folder, "DDP-script-torchrun.py", records, seed=123)


def examples_tensor_parallel(folder: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """pytorch/examples tensor_parallel_example.py: its ToyModel (the class taken from the
    program's text, whose module body runs the training) from rank 0's initial parameters, 10
    iterations of AdamW (lr 0.25, foreach) on `torch.manual_seed(i); torch.rand(20, 10)` with
    the sum of the output as the loss and no zero_grad, as the module body does; tensor
    parallelism computes the same on every rank."""
    path = folder / "tensor_parallel_example.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    (toy,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ToyModel"]
    namespace: dict[str, Any] = {"torch": torch, "nn": torch.nn}
    exec(compile(ast.Module(body=[toy], type_ignores=[]), str(path), "exec"), namespace)
    recorded, _ = _initial(records)
    model = namespace["ToyModel"]()
    torch.nn.utils.vector_to_parameters(torch.tensor(recorded), model.parameters())
    initial = torch.nn.utils.parameters_to_vector(model.parameters()).tolist()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.25, foreach=True)
    for i in range(10):  # num_iters, as the module body sets it
        torch.manual_seed(i)
        inp = torch.rand(20, 10)
        model(inp).sum().backward()
        optimizer.step()
    return {"initial": initial,
            "final": torch.nn.utils.parameters_to_vector(model.parameters()).tolist()}


def examples_fsdp2(folder: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """pytorch/examples FSDP2 example.py: its Transformer (the program's model.py, with the
    arguments example.py gives it) from rank 0's initial parameters (the observer gathers each
    DTensor parameter whole), 10 steps of Adam (lr 1e-2) on `model(x).sum()` with
    `clip_grad_norm_(max_norm=1.0)`, as the program trains. Every rank draws the same `x` (the
    ranks' generators stay in one state through DTensor's random ops) and FSDP2 averages
    the ranks' gradients: one process on the same batches computes the same.

    The batches: the program seeds 0, initializes its sharded parameters with DTensor random ops,
    then draws each `x` with `torch.randint` on its GPU. On simulated GPUs each DTensor random
    op draws one number below 2**63 - 1 from the generator and leaves it just after that draw
    (devlab/engine/simulated/torch_distributed/dtensor_rng.py, as CUDA's tracker leaves every rank's generator in one
    state), so after seeding 0 the replay draws one such number per random op that
    `reset_parameters` makes (counted on the CPU model), then the batches."""
    namespace = runpy.run_path(str(folder / "model.py"), run_name="conformance_replay")
    args = namespace["ModelArgs"](n_layers=10, n_heads=4, vocab_size=1024, max_seq_len=64,
                                  dropout_p=0)
    vocab_size, batch_size, seq_len = 1024, 32, 64
    model = namespace["Transformer"](args)
    random_ops = _random_ops(model.reset_parameters)
    recorded, _ = _initial(records)
    torch.nn.utils.vector_to_parameters(torch.tensor(recorded), model.parameters())
    initial = torch.nn.utils.parameters_to_vector(model.parameters()).tolist()
    torch.manual_seed(0)
    for _ in range(random_ops):
        torch.randint((1 << 63) - 1, (1,))
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(10):
        x = torch.randint(0, vocab_size, (batch_size, seq_len))
        model(x).sum().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optim.step()
        optim.zero_grad()
    return {"initial": initial,
            "final": torch.nn.utils.parameters_to_vector(model.parameters()).tolist()}


def _tutorial_flags() -> Any:
    """The FSDP1 tutorial's own flags the replay needs, with its defaults, from the command line
    the runner gives the program (`sys.argv`, set before a replay too)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1.0)
    return parser.parse_known_args(sys.argv[1:])[0]


def fsdp1_tutorial(folder: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The FSDP1 tutorial (its first seven python blocks, which the runner wrote to
    FSDP1_tutorial.py): one epoch of its `fsdp_main` on the CPU, both ranks in one process.

    Each rank is a process `mp.spawn` starts, whose generator starts from a seed of its own
    (the parent's `manual_seed` does not reach it; the observer records it): each rank builds
    its own Net, and FSDP1 shards it without a broadcast, so the model trained is made of rank
    r's Net's flat parameter's r-th shard (its padded length split evenly). Each rank draws
    from its own generator, in this order: the Net's initial weights, one number as its training DataLoader's iterator starts, the two
    dropout masks of each forward (a simulated GPU draws them from the CPU's generator); so
    the replay keeps one generator state per rank and swaps it in around that rank's draws.
    FSDP averages the ranks' gradients (reduce-scatter, divided by the world size): each
    rank's loss, divided by the world size, is backpropagated into one model before each
    Adadelta step. Each rank's batches are those of its DistributedSampler (shuffled with
    seed 0 and the epoch). The lines the program prints on rank 0 are printed from the losses
    the ranks sum (in float32, as `dist.all_reduce` of their float32 tensors)."""
    namespace = runpy.run_path(str(folder / "FSDP1_tutorial.py"), run_name="conformance_replay")
    _, world = _initial(records)
    datasets, transforms = namespace["datasets"], namespace["transforms"]
    transform = transforms.Compose([transforms.ToTensor(),
                                    transforms.Normalize((0.1307,), (0.3081,))])
    train_set = datasets.MNIST("../data", train=True, download=True, transform=transform)
    test_set = datasets.MNIST("../data", train=False, transform=transform)
    flags = _tutorial_flags()
    batch_size, test_batch_size, lr, epoch = (flags.batch_size, flags.test_batch_size,
                                              flags.lr, 1)
    if flags.epochs != 1:
        raise ValueError(f"the replay takes one epoch, not --epochs {flags.epochs}")
    seeds = {r["rank"]: r["seed"] for r in records if r.get("rank") is not None}
    states, shards = [], []
    for rank in range(world):
        torch.manual_seed(seeds[rank])
        flat = torch.nn.utils.parameters_to_vector(namespace["Net"]().parameters())
        states.append(torch.get_rng_state())
        size = -(-flat.numel() // world)
        shards.append(flat[rank * size:(rank + 1) * size])
    model = namespace["Net"]()
    torch.nn.utils.vector_to_parameters(torch.cat(shards), model.parameters())
    initial = torch.nn.utils.parameters_to_vector(model.parameters()).tolist()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=lr)

    def draw(rank: int, fn: Callable[[], Any]) -> Any:
        torch.set_rng_state(states[rank])
        out = fn()
        states[rank] = torch.get_rng_state()
        return out

    samplers = [DistributedSampler(train_set, rank=r, num_replicas=world, shuffle=True)
                for r in range(world)]
    for sampler in samplers:
        sampler.set_epoch(epoch)
    loaders = [DataLoader(train_set, batch_size=batch_size, sampler=s) for s in samplers]
    model.train()
    iterators = [draw(r, lambda r=r: iter(loaders[r])) for r in range(world)]
    sums = [torch.zeros(2) for _ in range(world)]
    for batches in zip(*iterators, strict=True):
        optimizer.zero_grad()
        for rank, (data, target) in enumerate(batches):
            output = draw(rank, lambda data=data: model(data))
            loss = F.nll_loss(output, target, reduction="sum")
            (loss / world).backward()
            sums[rank][0] += loss.item()
            sums[rank][1] += len(data)
        optimizer.step()
    total = sum(sums[1:], sums[0])
    print(f"Train Epoch: {epoch} \tLoss: {total[0] / total[1]:.6f}", flush=True)
    model.eval()
    tests = [torch.zeros(3) for _ in range(world)]
    with torch.no_grad():
        for rank in range(world):
            sampler = DistributedSampler(test_set, rank=rank, num_replicas=world)
            for data, target in DataLoader(test_set, batch_size=test_batch_size,
                                           sampler=sampler):
                output = model(data)
                tests[rank][0] += F.nll_loss(output, target, reduction="sum").item()
                pred = output.argmax(dim=1, keepdim=True)
                tests[rank][1] += pred.eq(target.view_as(pred)).sum().item()
                tests[rank][2] += len(data)
    total = sum(tests[1:], tests[0])
    loss, correct, count = total[0] / total[2], int(total[1]), int(total[2])
    print(f"Test set: Average loss: {loss:.4f}, Accuracy: {correct}/{count} "
          f"({100. * total[1] / total[2]:.2f}%)\n", flush=True)
    return {"initial": initial,
            "final": torch.nn.utils.parameters_to_vector(model.parameters()).tolist()}


def dcp_recipe(folder: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """PyTorch's DCP recipe (its save program, its first python block, which the runner wrote
    to distributed_checkpoint_recipe.py): one Adam step of its FSDP1 ToyModel on the CPU, both
    ranks in one process.

    As in the FSDP1 tutorial, each rank `mp.spawn` starts draws from its own generator (the
    observer records its seed): its ToyModel, then its batch (`torch.rand(8, 16)`, drawn from
    the CPU's generator on a simulated GPU); FSDP1 shards without a broadcast, so the model is
    made of rank r's flat parameter's r-th shard. FSDP averages the ranks' gradients of
    `model(x).sum()` before the step."""
    namespace = runpy.run_path(str(folder / "distributed_checkpoint_recipe.py"),
                               run_name="conformance_replay")
    _, world = _initial(records)
    seeds = {r["rank"]: r["seed"] for r in records if r.get("rank") is not None}
    shards, batches = [], []
    for rank in range(world):
        torch.manual_seed(seeds[rank])
        flat = torch.nn.utils.parameters_to_vector(namespace["ToyModel"]().parameters())
        batches.append(torch.rand(8, 16))
        size = -(-flat.numel() // world)
        shards.append(flat[rank * size:(rank + 1) * size])
    model = namespace["ToyModel"]()
    torch.nn.utils.vector_to_parameters(torch.cat(shards), model.parameters())
    initial = torch.nn.utils.parameters_to_vector(model.parameters()).tolist()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    optimizer.zero_grad()
    for x in batches:
        (model(x).sum() / world).backward()
    optimizer.step()
    return {"initial": initial,
            "final": torch.nn.utils.parameters_to_vector(model.parameters()).tolist()}


def _random_ops(fn: Callable[[], Any]) -> int:
    """How many random ATen ops `fn()` runs (ops tagged nondeterministic_seeded)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            if torch.Tag.nondeterministic_seeded in func.tags:
                Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


REPLAYS: dict[str, Callable[[Path, list[dict[str, Any]]], dict[str, Any]]] = {
    "llms_from_scratch_ddp": llms_from_scratch_ddp,
    "llms_from_scratch_ddp_torchrun": llms_from_scratch_ddp_torchrun,
    "examples_tensor_parallel": examples_tensor_parallel,
    "examples_fsdp2": examples_fsdp2,
    "fsdp1_tutorial": fsdp1_tutorial,
    "dcp_recipe": dcp_recipe,
}
