"""Wall time of work queued on a simulated GPU, with and without a sync (issue 37).

Run: .venv/bin/python benchmarks/async_wall.py [--rounds N] [--size N]
(DEVLAB_BENCH_TREE=/work/main runs another checkout's devlab, e.g. the code before a change.)

On a modeled T4 (one simulated GPU), with the asynchronous launch on and off (`start(...,
asynchronous=...)`), interleaved round by round, the median of the rounds:

- the issue's example: `timeit` (no sync) and a synchronized `torch.utils.benchmark.Timer`
  around an elementwise product and its sum of two N x N matrices, per call;
- a queue of 20 products of 1024 x 1024 matrices: when the calls returned, and when a
  synchronize() after them returned;
- a chain (a product, an in-place product, a sum): when it returned, and when `.item()` did;
- ten elementwise products and their sums, `for _ in range(10): (x * y).sum()`: when the loop
  returned, and when a synchronize() after it did (each product's output is let go of while
  still queued: the next one takes its memory, Note [A queued output takes a dropped one's
  memory]);
- a queue of 5 convolutions (64 channels, 3x3, a batch of 8 56 x 56 images): when the calls
  returned, and when a synchronize() after them did.

With the launch on, the timer without a sync sees the launches and the synchronized one the
work, as on a GPU; with it off, both see the work. A simulated GPU is this CPU: the work's
time is this CPU computing the values, not a GPU's; run `uptime` beside the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, os.environ.get("DEVLAB_BENCH_TREE", str(Path(__file__).resolve().parents[1])))

import torch  # noqa: E402
import torch.utils.benchmark as benchmark  # noqa: E402

import devlab  # noqa: E402


def one_round(asynchronous: bool, n: int) -> dict[str, float]:
    """Milliseconds for each figure, on a fresh modeled T4."""
    devlab.simulated.start(1, model="T4", asynchronous=asynchronous)
    try:
        x = torch.rand(n, n, device="cuda")
        y = torch.rand(n, n, device="cuda")
        a = torch.rand(1024, 1024, device="cuda")

        def work() -> torch.Tensor:
            return (x * y).sum()

        for _ in range(3):
            work()
            a @ a
        torch.cuda.synchronize()
        calls = 20
        got = {"timeit, no sync (per call)": timeit.timeit(work, number=calls) / calls * 1e3}
        torch.cuda.synchronize()
        timer = benchmark.Timer("(x * y).sum()", globals={"x": x, "y": y})
        got["benchmark.Timer, synced (per call)"] = timer.timeit(calls).mean * 1e3
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = [a @ a for _ in range(20)]
        got["20 products: returned"] = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        got["20 products: synchronized"] = (time.perf_counter() - t0) * 1e3
        del outs
        t0 = time.perf_counter()
        z = x * y
        z.mul_(2)
        s = z.sum()
        got["mul, mul_, sum: returned"] = (time.perf_counter() - t0) * 1e3
        s.item()
        got["mul, mul_, sum: .item()"] = (time.perf_counter() - t0) * 1e3
        del z, s
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            (x * y).sum()
        got["10 x (x * y).sum(): returned"] = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        got["10 x (x * y).sum(): synchronized"] = (time.perf_counter() - t0) * 1e3
        images = torch.rand(8, 64, 56, 56, device="cuda")
        weight = torch.rand(64, 64, 3, 3, device="cuda")
        torch.conv2d(images, weight, None, 1, 1)  # oneDNN's first call picks its kernel
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = [torch.conv2d(images, weight, None, 1, 1) for _ in range(5)]
        got["5 convolutions: returned"] = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        got["5 convolutions: synchronized"] = (time.perf_counter() - t0) * 1e3
        del outs
        return got
    finally:
        devlab.simulated.stop()
        devlab.runtime.reset()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=2048, help="N of the N x N elementwise case")
    args = p.parse_args()
    rounds: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for asynchronous in (True, False):
            rounds[asynchronous].append(one_round(asynchronous, args.size))
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"modeled T4 on this CPU ({torch.get_num_threads()} threads, load {load}); "
          f"milliseconds, median of {args.rounds} rounds; wall time, not a GPU's")
    print(f"{'':38s} {'launch on':>10s} {'launch off':>11s}")
    for key in rounds[True][0]:
        on = statistics.median(r[key] for r in rounds[True])
        off = statistics.median(r[key] for r in rounds[False])
        print(f"{key:38s} {on:10.2f} {off:11.2f}")


if __name__ == "__main__":
    main()
