"""What torch.profiler costs on a modeled GPU against what it costs on plain CPU.

Run: .venv/bin/python benchmarks/profiler.py [--steps N] [--repeats R]

One step is a small MLP's training step (forward, loss, backward, SGD update; 64x256 batch),
the kind of loop people profile. Prints microseconds per step, for plain CPU PyTorch and for a
simulated T4 (modeled clock), each without a profiler and inside
`torch.profiler.profile(...)` (CPU activity on CPU; CPU and CUDA activity on the simulated GPU,
with its modeled kernels), and the profile's post-processing (`key_averages().table()`). The
overhead is profiled minus unprofiled (and with the post-processing added); target: the
simulated GPU's within 2x the CPU's. Each
figure is the best of interleaved repeats; `--cpu-time` times them in this process's CPU time
(`time.process_time`), which a machine shared with other work disturbs less than the wall
clock does. A simulated GPU is the CPU: these numbers say
nothing about a real GPU's profiler.

Without a profile, a simulated op pays nothing for the profiler: the clock notes its spans
only while a profile (or `explain`, `timeline`) watches them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devlab import simulated  # noqa: E402


def _step(device: str) -> Callable[[], None]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256, device=device)
    y = torch.randint(0, 10, (64,), device=device)

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


_clock = time.perf_counter


def _run(step: Callable[[], None], steps: int, activities: list | None) -> tuple[float, float]:
    """(µs per step, µs of post-processing per step) for `steps` steps."""
    if activities is None:
        t0 = _clock()
        for _ in range(steps):
            step()
        return (_clock() - t0) / steps * 1e6, 0.0
    t0 = _clock()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
    t1 = _clock()
    prof.key_averages().table(sort_by="cpu_time_total", row_limit=10)
    t2 = _clock()
    return (t1 - t0) / steps * 1e6, (t2 - t1) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cpu-time", action="store_true",
                        help="time in this process's CPU time, not the wall clock")
    args = parser.parse_args()
    global _clock
    if args.cpu_time:
        _clock = time.process_time
    torch.set_num_threads(1)
    modes = {
        "CPU": ("cpu", None, [ProfilerActivity.CPU]),
        "simulated T4": ("cuda", "T4", [ProfilerActivity.CPU, ProfilerActivity.CUDA]),
    }
    best: dict[tuple[str, bool], tuple[float, float]] = {}
    for _ in range(args.repeats):
        for name, (device, model, activities) in modes.items():
            if model is not None:
                simulated.start(1, model=model)
            try:
                step = _step(device)
                for _ in range(5):
                    step()  # warm up
                for profiled in (False, True):
                    got = _run(step, args.steps, activities if profiled else None)
                    old = best.get((name, profiled))
                    best[name, profiled] = got if old is None or got[0] < old[0] else old
            finally:
                if model is not None:
                    simulated.stop()
    overhead, total = {}, {}
    for name in modes:
        (bare, _), (prof, post) = best[name, False], best[name, True]
        overhead[name], total[name] = prof - bare, prof - bare + post
        print(f"{name:13} {bare:9.1f} µs/step bare  {prof:9.1f} µs/step profiled  "
              f"overhead {prof - bare:8.1f} µs/step  post-processing {post:8.1f} µs/step")
    ratio = overhead["simulated T4"] / max(overhead["CPU"], 1e-9)
    print(f"profiler overhead while recording, simulated T4 / CPU: {ratio:.2f}x (target <= 2x)")
    ratio = total["simulated T4"] / max(total["CPU"], 1e-9)
    print(f"profiler overhead with post-processing, simulated T4 / CPU: {ratio:.2f}x "
          "(target <= 2x)")


if __name__ == "__main__":
    main()
