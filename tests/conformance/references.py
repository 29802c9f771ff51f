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
the program prints, and returns the initial and final parameters (lists, or flat tensors for a
large model). Everything runs on the CPU; devlab is not imported.
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


def _initial(records: list[dict[str, Any]]) -> tuple[torch.Tensor, int]:
    """Rank 0's initial parameters (flat) and the world size, from the observer's records (a
    list of values, or for a large model the file rank 0 saved them in)."""
    (rank0,) = [r for r in records if r.get("rank") == 0]
    initial = rank0["initial"]
    if isinstance(initial, dict):
        values = torch.load(initial["file"], weights_only=True)
    else:
        values = torch.tensor(initial)
    return values, int(rank0["world_size"])


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
        torch.nn.utils.vector_to_parameters(recorded, model.parameters())
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
    torch.nn.utils.vector_to_parameters(recorded, model.parameters())
    initial = torch.nn.utils.parameters_to_vector(model.parameters()).tolist()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.25, foreach=True)
    for i in range(10):  # num_iters, as the module body sets it
        torch.manual_seed(i)
        inp = torch.rand(20, 10)
        model(inp).sum().backward()
        optimizer.step()
    return {"initial": initial,
            "final": torch.nn.utils.parameters_to_vector(model.parameters()).tolist()}


def examples_fsdp_tp(folder: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """pytorch/examples fsdp_tp_example.py: FSDP2 over the "dp" dimension of a (dp, tp) mesh,
    tensor and sequence parallelism over "tp" (tp_size = 2, as the program sets it). Its Llama
    (`llama2_model.py`, imported as the program imports it, with the program's ModelArgs) from
    rank 0's initial parameters, gathered whole by the observer (`fully_shard` broadcasts
    nothing: each dp rank's shards come from its own unseeded draw, and their union is what
    every rank trains), then its 10 iterations of AdamW (lr 3e-3, foreach) without zero_grad
    (gradients accumulate, as in the program): dp rank d draws `torch.manual_seed(i + d);
    torch.randint(32000, (8, 256))`, the loss is the sum of the output, FSDP2's reduce-scatter
    averages the dp ranks' gradients, and tensor parallelism computes one device's gradient."""
    llama = runpy.run_path(str(folder / "llama2_model.py"), run_name="conformance_replay")
    recorded, world = _initial(records)
    dp = world // 2
    model = llama["Transformer"].from_model_args(
        llama["ModelArgs"](dim=256, n_layers=2, n_heads=16, vocab_size=32000))
    torch.nn.utils.vector_to_parameters(recorded, model.parameters())
    initial = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    for i in range(10):  # num_iterations, as the program sets it
        for d in range(dp):
            torch.manual_seed(i + d)
            inp = torch.randint(32000, (8, 256))
            (model(inp).sum() / dp).backward()
        optimizer.step()
    return {"initial": initial,
            "final": torch.nn.utils.parameters_to_vector(model.parameters()).detach(),
            "sizes": [p.numel() for p in model.parameters()]}


REPLAYS: dict[str, Callable[[Path, list[dict[str, Any]]], dict[str, Any]]] = {
    "llms_from_scratch_ddp": llms_from_scratch_ddp,
    "llms_from_scratch_ddp_torchrun": llms_from_scratch_ddp_torchrun,
    "examples_tensor_parallel": examples_tensor_parallel,
    "examples_fsdp_tp": examples_fsdp_tp,
}
