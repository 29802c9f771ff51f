"""CUDA graphs on simulated GPUs: what a replay costs this machine per op, beside the same ops
run eagerly through the simulation, and what it costs on the modeled GPU (one launch for the
graph instead of one per kernel; modeled from the GPU's specifications, not measured).

A replay reruns the recorded aten ops below the simulation's modes, so it should cost this
machine less per op than eager simulated ops (target: replay ≤ eager per op).

Run: .venv/bin/python benchmarks/cuda_graphs.py [--ops 200] [--repeats 7] [--model T4]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import devlab


def _wall_us_per_op(fn, ops: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / ops * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200, help="tiny kernels per step")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--model", default="T4", help="the GPU the modeled clock follows")
    args = parser.parse_args()
    torch.set_num_threads(1)
    devlab.simulated.start(1, model=args.model)
    x = torch.zeros(1024, device="cuda")

    def step() -> None:
        for _ in range(args.ops):
            x.add_(1)

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    eager_wall = _wall_us_per_op(step, args.ops, args.repeats)
    replay_wall = _wall_us_per_op(graph.replay, args.ops, args.repeats)
    eager = devlab.simulated.explain(step)
    replay = devlab.simulated.explain(graph.replay)
    print(f"{args.ops} tiny kernels (x.add_(1), 1,024 float32) per step")
    print(f"this machine, eager simulated   {eager_wall:7.2f} µs/op")
    print(f"this machine, graph replay      {replay_wall:7.2f} µs/op   "
          f"ratio replay/eager: {replay_wall / eager_wall:.2f} (target ≤ 1.0)")
    print(f"modeled {devlab.simulated.model().name}, eager       {eager.total * 1e6:9.1f} µs per step "
          "(one launch per kernel; modeled, not measured)")
    print(f"modeled {devlab.simulated.model().name}, one replay  {replay.total * 1e6:9.1f} µs per step "
          "(one launch for the graph; modeled, not measured)")
    devlab.simulated.stop()


if __name__ == "__main__":
    main()
