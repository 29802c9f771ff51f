"""What running on ranks costs: devlab.launch's overhead, and what a second rank buys.

Run: .venv/bin/python benchmarks/distributed.py [--quick]

Prints the wall time of `devlab.launch` for a function that returns at once on 2 ranks, with
fork and with spawn (median of several launches), then the time of one DDP training step of
a compute-bound MLP on 1 rank (the whole batch) and on 2 ranks (half the batch each), on two
simulated GPUs over gloo, and the speed-up beside its physical limit: each rank is a process
on this machine's cores, so 2 ranks can be at most min(2, cores) times faster. A simulated GPU
is the CPU: these numbers say nothing about real GPUs or NCCL.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import devlab  # noqa: E402
from devlab._helpers.host import cpu_cores  # noqa: E402

WIDTH, LAYERS, BATCH = 1024, 4, 512


def nothing() -> None:
    return None


def ddp_step_seconds(steps: int, threads: int | None = None) -> float:
    """Seconds per DDP step on this rank: forward, backward (gradients all-reduced), SGD step."""
    if threads is not None:
        torch.set_num_threads(threads)
    dist.init_process_group("gloo")  # (simulated GPUs' NCCL runs on gloo too)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    layers = [m for _ in range(LAYERS) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers).to(rank),
                                                device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH // world, WIDTH, device=rank)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    step()  # warm-up: buckets rebuilt, allocations made
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer launches and steps")
    args = parser.parse_args()
    launches = {"fork": 3 if args.quick else 7, "spawn": 2 if args.quick else 5}
    steps = 3 if args.quick else 10
    devlab.config.simulate_gpus(2)
    cores = cpu_cores()

    print("devlab.launch of a function that returns at once, 2 ranks:")
    for method, n in launches.items():
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            devlab.launch(nothing, nprocs=2, start_method=method)
            times.append(time.perf_counter() - t0)
        print(f"  {method:5s} {statistics.median(times):6.2f} s (median of {n}; "
              f"min {min(times):.2f} s, max {max(times):.2f} s)")

    print(f"\nDDP training step, MLP {LAYERS} x {WIDTH}, global batch {BATCH}, "
          f"on simulated GPUs over gloo ({cores} cores):")
    runs = {"one": [], "one_thread": [], "two": []}
    for _ in range(1 if args.quick else 3):  # interleaved, best of each: least disturbed
        runs["one"].append(devlab.launch(ddp_step_seconds, steps, nprocs=1)[0])
        runs["one_thread"].append(devlab.launch(ddp_step_seconds, steps, 1, nprocs=1)[0])
        runs["two"].append(max(devlab.launch(ddp_step_seconds, steps, nprocs=2)))
    one, one_thread, two = (min(runs[k]) for k in ("one", "one_thread", "two"))
    limit = float(min(2, cores))
    each = max(1, cores // 2)
    print(f"  1 rank : {one * 1e3:7.1f} ms per step (the whole batch, {cores} threads)")
    print(f"  1 rank : {one_thread * 1e3:7.1f} ms per step (the whole batch, 1 thread)")
    print(f"  2 ranks: {two * 1e3:7.1f} ms per step (half the batch each, {each} "
          f"thread{'s' if each > 1 else ''} each)")
    print(f"  speed-up of 2 ranks over 1 rank: {one / two:.2f}x; physical limit {limit:.1f}x "
          f"(2 ranks on {cores} core{'s' if cores > 1 else ''})")
    print(f"  (1 rank with {cores} threads is {one_thread / one:.2f}x its 1-thread speed: what the "
          "second core gives one process, against which the ranks are measured)")
    if os.environ.get("OMP_NUM_THREADS"):
        print(f"  (OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} fixes each rank's threads)")


if __name__ == "__main__":
    main()
