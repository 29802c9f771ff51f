"""What watching memory costs: the sampler's achieved rate, and how much it slows a cell.

Prints, for this machine:
- the rate the sampler thread achieves at its default 20 Hz (target: at least 20 Hz), on the
  CPU (process RSS) and on simulated GPUs;
- the slowdown of two compute-bound loops (torch matmuls, which release the GIL, and pure
  Python arithmetic, which holds it) with a sampler running, and with a MemoryMonitor
  drawing its chart too (target: under 2%);
- the CPU time the sampler thread itself uses, as a share of one core: the cost it adds to
  the cell at most, and a figure that other load on the machine does not blur;
- what one chart frame costs to draw.

Trials of the three settings are interleaved and the best of each taken, so drift of the
machine (turbo, other processes) hits all three alike.

Run: .venv/bin/python benchmarks/memory_sampler.py
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time

import torch

import devlab
from devlab.core.memory_watch import MemoryChart, Sampler
from devlab.fronts.lab.widgets import MemoryMonitor


def achieved_rate(devices, seconds: float = 3.0) -> float:
    with Sampler(devices) as s:
        time.sleep(seconds)
    return s.rate()


def matmul_loop(n: int = 400) -> None:
    a = torch.rand(512, 512)
    for _ in range(n):
        a = (a @ a).clamp_(-1, 1)


def python_loop(n: int = 6_000_000) -> None:
    total = 0
    for i in range(n):
        total += i * i % 7


@contextlib.contextmanager
def nothing():
    yield None


@contextlib.contextmanager
def sampler():
    with Sampler(["cpu"]) as s:
        yield s


@contextlib.contextmanager
def monitor():
    # Outside a notebook the widget's frames go nowhere, but each is drawn and encoded as
    # in a notebook: that is the cost that matters to the cell.
    mon = MemoryMonitor(["cpu"])
    mon.start()
    try:
        yield mon.sampler
    finally:
        mon.stop()


def slowdowns(work, trials: int = 11) -> dict[str, float]:
    """Best wall time of `work` bare, with a sampler, with a drawing MemoryMonitor; and the
    CPU share the sampler thread itself used (immune to other load on the machine).

    The best of interleaved trials, not the median: other processes only ever add time, so
    the least disturbed trial of each setting is the fairest comparison."""
    settings = {"bare": nothing, "sampler": sampler, "monitor": monitor}
    times: dict[str, list[float]] = {k: [] for k in settings}
    cpu: dict[str, list[float]] = {k: [] for k in settings}
    work()  # warm-up
    for _ in range(trials):
        for name, ctx in settings.items():
            with ctx() as s:
                t0 = time.perf_counter()
                work()
                wall = time.perf_counter() - t0
            times[name].append(wall)
            if s is not None:
                cpu[name].append(s.thread_cpu_seconds / (s.stopped_at - s.started_at))
    med = {k: min(v) for k, v in times.items()}
    return {"bare_s": med["bare"],
            "sampler_pct": 100 * (med["sampler"] / med["bare"] - 1),
            "monitor_pct": 100 * (med["monitor"] / med["bare"] - 1),
            "sampler_cpu_pct": 100 * statistics.median(cpu["sampler"]),
            "monitor_cpu_pct": 100 * statistics.median(cpu["monitor"])}


def frame_cost_ms(frames: int = 50) -> float:
    with Sampler(["cpu"], interval=0.01) as s:
        time.sleep(0.5)
    chart = MemoryChart(live=True)
    chart.update(s.series(), s.started_at)
    chart.png()  # the first frame lays out the axes
    t0 = time.perf_counter()
    for _ in range(frames):
        chart.update(s.series(), s.started_at)
        chart.png()
    return (time.perf_counter() - t0) / frames * 1000


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"sampler rate, CPU (RSS), default 20 Hz:      {achieved_rate(['cpu']):6.2f} Hz")
    devlab.config.simulate_gpus(2)
    print(f"sampler rate, 2 simulated GPUs + CPU:        "
          f"{achieved_rate(['/GPU:0', '/GPU:1', 'cpu']):6.2f} Hz")
    devlab.config.stop_simulation()
    print(f"one live chart frame (update + PNG):         {frame_cost_ms():6.2f} ms")
    print(f"load average before the loops: {os.getloadavg()[0]:.2f} "
          "(other processes make the wall-clock figures noisy; the CPU shares are not)")
    for name, work in (("torch matmul loop", matmul_loop), ("pure Python loop", python_loop)):
        r = slowdowns(work)
        print(f"{name} ({r['bare_s']:.2f} s), best of 11 interleaved trials:")
        print(f"  wall-clock slowdown: sampler {r['sampler_pct']:+.2f}%, "
              f"sampler + MemoryMonitor drawing {r['monitor_pct']:+.2f}%")
        print(f"  sampler thread's CPU use: sampler {r['sampler_cpu_pct']:.2f}% of one core, "
              f"with MemoryMonitor drawing {r['monitor_cpu_pct']:.2f}%")


if __name__ == "__main__":
    main()
