"""devlab's timer against torch.utils.benchmark.Timer on the same work.

Both warm up, synchronize and report a median per call; they should agree within noise.
Prints the two medians and their ratio for a few workloads on the CPU and on a simulated
GPU (where devlab calls the simulation's `torch.cuda.synchronize`; Timer synchronizes
through `torch.accelerator`, which does not know simulated GPUs, so it is handed a timer
that calls `torch.cuda.synchronize`, as its default does on real CUDA).

Each row also prints devlab's median block over its fastest (`steady` when at most
`devlab.timing.STEADY`): how much load moved the measurement. Then exercise 1 runs on a
modeled T4 against this machine's CPU, as notebook 03 runs it: where the crossover falls on
this machine, and which sizes (if any) were too noisy to call. The tests assert the
crossover's range against a fixed CPU table (tests/test_gpu_model.py); this is the measured
version.

Run: .venv/bin/python benchmarks/timing.py
"""

from __future__ import annotations

import timeit

import torch
from torch.utils.benchmark import Timer

import devlab
from devlab.core.timing import format_seconds, time_on_device


def cuda_timer() -> float:
    torch.cuda.synchronize()
    return timeit.default_timer()


def row(name: str, device: str, stmt: str, setup: str) -> None:
    ns: dict = {"torch": torch}
    with devlab.device(device):
        exec(setup, ns)
    fn = eval(f"lambda: {stmt}", ns)
    # The work's tensors exist already: no device context around the timed calls, as in
    # Timer (a context costs about a microsecond per torch call).
    ours = time_on_device(fn, device, min_time=1.0, as_default=False)
    # Timer runs on one thread unless told otherwise; devlab times with torch's own setting.
    # Timer synchronizes through torch.accelerator, which knows real GPUs only: on a
    # simulated GPU it is given the torch.cuda.synchronize timer it would use on real CUDA.
    extra = {"timer": cuda_timer} if device.startswith("/GPU") else {}
    theirs = Timer(stmt, setup=setup, globals={"torch": torch},
                   num_threads=torch.get_num_threads(), **extra
                   ).blocked_autorange(min_run_time=1.0)
    print(f"{name:28s} {device:7s} devlab {format_seconds(ours.median):>9s} "
          f"(IQR {format_seconds(ours.iqr):>8s}, median/min {ours.median / ours.min:5.2f}"
          f"{'' if ours.steady else ' unsteady'})   torch Timer "
          f"{format_seconds(theirs.median):>9s}   ratio {ours.median / theirs.median:5.2f}")


WORK = [
    ("add, 1000 floats", "x + 1", "x = torch.rand(1000, device='DEVICE')"),
    ("matmul 256x256", "x @ x", "x = torch.rand(256, 256, device='DEVICE')"),
    ("matmul 1024x1024", "x @ x", "x = torch.rand(1024, 1024, device='DEVICE')"),
]


def crossover() -> None:
    """Exercise 1 on a modeled T4 against this machine's CPU, as notebook 03 runs it."""
    import time

    from devlab.fronts.lab import exercises

    devlab.config.simulate_gpus(1, model="T4")
    t0 = time.perf_counter()
    r = exercises.matmul_cpu_vs_gpu(sizes=(16, 32, 64, 128, 256, 512, 1024), min_time=0.05,
                                    progress=False)
    took = time.perf_counter() - t0
    devlab.config.stop_simulation()
    d = r.data
    print(f"exercise 1 on a modeled T4 ({took:.1f} s; 1-minute load average "
          f"{d['load_average'][-1]:.1f})")
    for i, n in enumerate(d["sizes"]):
        print(f"  n={n:5d}  CPU {format_seconds(d['cpu'][i]):>9s} ({d['cpu_threads'][i]} "
              f"thread{'s' if d['cpu_threads'][i] > 1 else ''}, median/fastest "
              f"{d['cpu_median'][i] / d['cpu'][i]:5.2f}, tries {d['attempts'][0][i]})  "
              f"T4 {format_seconds(d['gpu'][i]):>9s}  faster: {d['faster'][i] or 'too noisy'}")
    print(f"  crossover: {d['crossover']}; too noisy to call: {d['too_noisy'] or 'none'}\n")


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    # Simulated GPUs must be chosen before any work is placed, so they come first.
    crossover()
    devlab.config.simulate_gpus(1)
    for name, stmt, setup in WORK:
        row(name, "/GPU:0", stmt, setup.replace("DEVICE", "cuda:0"))
    devlab.config.stop_simulation()
    for name, stmt, setup in WORK:
        row(name, "/CPU:0", stmt, setup.replace("DEVICE", "cpu"))


if __name__ == "__main__":
    main()
