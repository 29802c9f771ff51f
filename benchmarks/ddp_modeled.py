"""A modeled DDP step on 1 and 2 modeled GPUs, and what the communication model costs.

Run: .venv/bin/python benchmarks/ddp_modeled.py [--quick]

For a T4 (two PCIe cards through host memory, its default machine) and an A100 (SXM4 80 GB on
an NVSwitch board), prints the modeled time of one DDP training step of an MLP on 1 GPU and on
2 GPUs (the same batch per GPU, so the same compute), the difference (the communication the
backward pass does not hide) beside `gpu_model.data_parallel_step`'s prediction, and all the
communication. Then the wall-clock and CPU time of the same 2-rank step on modeled T4s with
the communication model and without it (its collectives left uncharged), interleaved runs with
their medians and spread: what agreeing on each collective's start across the ranks costs
(target: within 10 %). Modeled times are from the
GPUs' specifications and NCCL's tuning model, not measured.

Wall time on a shared machine is noisy (two ranks on two busy cores), so the cost is counted in
instructions too: `--steps with|without N` runs only the 2-rank step on modeled T4s, 3 warm-up
steps then N inside `operator.call` in each rank, one torch thread per rank, for callgrind
(valgrind follows the forked ranks; each writes its own file):

    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=_operator_call \
        --callgrind-out-file=/tmp/cg.with.%p .venv/bin/python benchmarks/ddp_modeled.py --steps with 10
    # instructions per step and rank = the ranks' "Collected" summed / 10 / 2

`--callgrind N` does both under valgrind and prints the two counts and their ratio. "Without"
leaves every collective uncharged (the benchmark replaces `ProcessGroupNCCL._charge`, the one
place collectives reach the clock, with a no-op: a switch for this benchmark only).
"""

from __future__ import annotations

import argparse
import glob
import operator
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import devlab  # noqa: E402
from devlab.engine import gpu_model, simulated  # noqa: E402
from devlab.engine.simulated.torch_distributed import nccl  # noqa: E402

WIDTH, LAYERS, BATCH = 1024, 8, 128  # 8 x (1024 x 1024 + 1024) parameters: 33.6 MB of gradients


def _warm_ddp(charge: bool) -> tuple[nn.parallel.DistributedDataParallel, torch.Tensor,
                                    Callable[[], None]]:
    """This rank's process group, DDP model, batch and training step, after three warm-up
    steps (the first rebuilds DDP's buckets), the ranks level; `charge=False` leaves the
    collectives uncharged."""
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    if not charge:
        nccl.ProcessGroupNCCL._charge = lambda self, *args, **kwargs: None
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

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    return model, x, step


def ddp_step(steps: int, charge: bool = True) -> dict:
    """One rank: the modeled time of a DDP step, of its backward pass alone, and the wall
    time of its fastest step (the least disturbed by other load on this machine's cores);
    `charge=False` leaves the collectives uncharged."""
    model, x, step = _warm_ddp(charge)
    t0 = simulated.modeled_time()
    step()
    torch.cuda.synchronize()
    modeled = simulated.modeled_time() - t0
    with model.no_sync():
        loss = model(x).square().mean()
        torch.cuda.synchronize()
        b0 = simulated.modeled_time()
        loss.backward()
        torch.cuda.synchronize()
        backward = simulated.modeled_time() - b0 - simulated.model().sync_latency_us * 1e-6
    walls, cpus = [], []
    dist.barrier()
    for _ in range(steps):
        w0, c0 = time.perf_counter(), time.process_time()
        step()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    # CPU time (all the rank's threads) leaves out waiting for the other rank, which wall time
    # on two busy cores is mostly made of.
    return {"modeled": modeled, "backward": backward, "wall": min(walls),
            "cpu": statistics.median(cpus)}


def counted_steps(steps: int, charge: bool) -> None:
    """One rank: 3 warm-up steps, then `steps` steps inside `operator.call` (what callgrind
    counts), with or without the communication model."""
    torch.set_num_threads(1)
    _, _, step = _warm_ddp(charge)

    def counted() -> None:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()

    operator.call(counted)
    dist.destroy_process_group()


def steps_only(mode: str, steps: int) -> None:
    """The 2-rank step on modeled T4s, `steps` times in each rank (for callgrind)."""
    devlab.config.simulate_gpus(2, model="T4")
    devlab.launch(counted_steps, steps, mode == "with", nprocs=2, timeout=3600)
    devlab.config.stop_simulation()


def callgrind(steps: int) -> None:
    """Both modes under callgrind: instructions per step and rank, with and without."""
    counts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("with", "without"):
            out = os.path.join(tmp, f"cg.{mode}.%p")
            subprocess.run(["valgrind", "--tool=callgrind", "--trace-children=yes",
                            "--collect-atstart=no",
                            "--toggle-collect=_operator_call", f"--callgrind-out-file={out}",
                            sys.executable, __file__, "--steps", mode, str(steps)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            total = 0
            for f in glob.glob(os.path.join(tmp, f"cg.{mode}.*")):
                with open(f) as fh:
                    found = re.search(r"^summary: (\d+)", fh.read(), re.M)
                total += int(found.group(1)) if found else 0
            counts[mode] = total / steps / 2
    print(f"Instructions per step and rank (callgrind, {steps} steps, 2 ranks on modeled T4s):")
    print(f"  with the communication model   : {counts['with'] / 1e6:9.2f} M")
    print(f"  without (collectives uncharged): {counts['without'] / 1e6:9.2f} M")
    print(f"  cost: {(counts['with'] / counts['without'] - 1) * 100:+.2f} % (target: within 10 %)")


def predicted(gpu: str, backward: float) -> gpu_model.StepTime:
    """data_parallel_step for this MLP: each layer's gradients written after an equal share
    of the backward pass, last layer first."""
    grads = []
    for j in range(LAYERS):
        ready = backward * (j + 1) / LAYERS
        grads += [(ready, WIDTH * 4), (ready, WIDTH * WIDTH * 4)]
    return gpu_model.data_parallel_step(grads, 2, gpu_model.default_topology(gpu),
                                        forward=0.0, backward=backward, gpu_name=gpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and runs")
    parser.add_argument("--steps", nargs=2, metavar=("MODE", "N"),
                        help="only run N steps of the 2-rank step, MODE with or without the "
                             "communication model (for callgrind)")
    parser.add_argument("--callgrind", type=int, metavar="N",
                        help="count instructions of N steps with and without, under callgrind")
    args = parser.parse_args()
    if args.steps:
        steps_only(args.steps[0], int(args.steps[1]))
        return
    if args.callgrind:
        callgrind(args.callgrind)
        return
    steps = 5 if args.quick else 15
    print(f"DDP step, MLP {LAYERS} x {WIDTH}, batch {BATCH} per GPU, "
          f"{LAYERS * (WIDTH * WIDTH + WIDTH) * 4 / 1e6:.1f} MB of gradients (modeled):")
    for gpu in ("T4", "A100"):
        devlab.config.simulate_gpus(2, model=gpu)
        (one,) = devlab.launch(ddp_step, 1, nprocs=1, timeout=600)
        two = devlab.launch(ddp_step, 1, nprocs=2, timeout=600)[0]
        p = predicted(gpu, one["backward"])
        topo = gpu_model.default_topology(gpu)
        print(f"  {simulated.model().full_name}, {topo.key}:")
        print(f"    1 GPU : {one['modeled'] * 1e3:8.3f} ms")
        print(f"    2 GPUs: {two['modeled'] * 1e3:8.3f} ms: +{(two['modeled'] - one['modeled']) * 1e3:.3f} "
              f"ms not hidden (data_parallel_step predicts +{p.exposed * 1e3:.3f} ms; all "
              f"the communication {p.communication * 1e3:.3f} ms in {len(p.buckets)} buckets)")
        devlab.config.stop_simulation()

    devlab.config.simulate_gpus(2, model="T4")
    runs: dict[str, list[dict]] = {"with": [], "without": []}
    for _ in range(2 if args.quick else 4):  # interleaved, best of each: least disturbed
        for mode in ("with", "without"):
            runs[mode].append(devlab.launch(ddp_step, steps, mode == "with", nprocs=2,
                                            timeout=600))
    wall = {m: min(max(r["wall"] for r in run) for run in runs[m]) for m in runs}
    cpu = {m: [sum(r["cpu"] for r in run) / 2 for run in runs[m]] for m in runs}
    print(f"\nThe 2-rank step on modeled T4s, {len(runs['with'])} runs of {steps} steps each, "
          "interleaved:")
    print(f"  wall clock (fastest step, best run): with {wall['with'] * 1e3:7.1f} ms, without "
          f"{wall['without'] * 1e3:7.1f} ms: {(wall['with'] / wall['without'] - 1) * 100:+.1f} %")
    ratios = sorted(a / b - 1 for a in cpu["with"] for b in cpu["without"])
    print(f"  CPU time per rank (median step): with {statistics.median(cpu['with']) * 1e3:7.1f} "
          f"ms, without {statistics.median(cpu['without']) * 1e3:7.1f} ms: "
          f"{(statistics.median(cpu['with']) / statistics.median(cpu['without']) - 1) * 100:+.1f}"
          f" % (pairs of runs: {ratios[0] * 100:+.1f} to {ratios[-1] * 100:+.1f} %; target: "
          "within 10 %)")
    devlab.config.stop_simulation()


if __name__ == "__main__":
    main()
