"""Cost of simulated GPUs against plain CPU PyTorch, and the two-GPU overlap.

Run: .venv/bin/python benchmarks/simulated.py [--quick]

Prints microseconds per op (bare CPU vs the same op on a simulated GPU), per training step of a
small MLP (CPU vs simulated GPU, target <= 2.5x; with a modeled T4 clock, target <= 3x), and
the d2l two-GPU exercise (matrix products
on two simulated GPUs, one after the other vs. launched together). Each figure is the best of
several interleaved repeats, so background load on a shared machine inflates it least.
A simulated GPU is the CPU: these numbers say nothing about a real GPU.

When the machine is too busy for wall-clock figures, count instructions instead:
`--steps MODE N` runs only the MLP step (MODE: cpu, simulated, or a GPU model such as T4), 30
warm-up steps then N, on one thread, the N inside `operator.call`, so that callgrind can count
those alone (start-up, torch's import among it, varies by tens of millions of instructions
between runs):

    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=_operator_call \
        .venv/bin/python benchmarks/simulated.py --steps T4 50
    # instructions per step = "Collected" / 50
"""

from __future__ import annotations

import argparse
import operator
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devlab._helpers.host import cpu_cores  # noqa: E402
from devlab.engine import simulated  # noqa: E402


def _best_us(fn: Callable[[], object], number: int, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best * 1e6


def _ops(device: str) -> dict[str, Callable[[], object]]:
    a = torch.randn(8, 8, device=device)
    b = torch.randn(8, 8, device=device)
    big = torch.randn(64, 64, device=device)
    host = torch.randn(8, 8)
    return {
        "a + b (8x8)": lambda: a + b,
        "a.mm(b) (64x64)": lambda: big.mm(big),
        "torch.relu(a)": lambda: torch.relu(a),
        "a.add_(1) in place": lambda: a.add_(1),
        "a.shape (attribute)": lambda: a.shape,
        "a.device": lambda: a.device,
        "torch.ones(8, device=d)": lambda: torch.ones(8, device=device),
        "host.to(d) (cpu: no-op)": lambda: host.to(device),
        "host.to(d, copy=True)": lambda: host.to(device, copy=True),
        "a.sum().item()": lambda: a.sum().item(),
    }


def per_op(number: int, repeats: int) -> list[tuple[str, float, float]]:
    rows: dict[str, list[float]] = {}
    for _ in range(5):  # interleave CPU and simulated runs
        cpu = {k: _best_us(f, number, repeats) for k, f in _ops("cpu").items()}
        simulated.start(1)
        try:
            sim = {k: _best_us(f, number, repeats) for k, f in _ops("cuda:0").items()}
        finally:
            simulated.stop()
        for k in cpu:
            c, s = rows.setdefault(k, [float("inf"), float("inf")])
            rows[k] = [min(c, cpu[k]), min(s, sim[k])]
    return [(k, c, s) for k, (c, s) in rows.items()]


def _mlp_step(device: str) -> Callable[[], object]:
    torch.manual_seed(0)
    X = torch.randn(64, 32).to(device)
    y = torch.randn(64, 1).to(device)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                        nn.Linear(64, 1)).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()

    def step() -> None:
        opt.zero_grad()
        loss = loss_fn(net(X), y)
        loss.backward()
        opt.step()

    return step


def training_step(number: int, repeats: int, rounds: int) -> dict[str, list[float]]:
    """Per round, the best µs per step on the CPU, on a simulated GPU, and on a simulated GPU
    with a modeled T4 clock (it charges each torch call, copy and backward pass), measured one
    right after the other: a ratio within a round is the least disturbed by the shared
    machine's load, which moves all three together."""
    out: dict[str, list[float]] = {"cpu": [], "simulated": [], "T4": []}
    for _ in range(rounds):
        out["cpu"].append(_best_us(_mlp_step("cpu"), number, repeats))
        for model in (None, "T4"):
            simulated.start(1, model=model)
            try:
                out["T4" if model else "simulated"].append(
                    _best_us(_mlp_step("cuda"), number, repeats))
            finally:
                simulated.stop()
    return out


def _ratios(times: dict[str, list[float]], key: str) -> str:
    r = sorted(t / c for t, c in zip(times[key], times["cpu"], strict=True))
    return (f"ratio {statistics.median(r):.2f}x (median of {len(r)} rounds; "
            f"{r[0]:.2f}-{r[-1]:.2f}x)")


def two_gpus(n: int, reps: int, trials: int) -> dict[str, float]:
    """d2l's scaling exercise: `run(x_gpu1); run(x_gpu2); torch.cuda.synchronize()`."""

    def run(x: torch.Tensor) -> list[torch.Tensor]:
        return [x.mm(x) for _ in range(reps)]

    times: dict[str, list[float]] = {"sequential": [], "together": [], "cpu": []}
    simulated.start(2)
    try:
        x0 = torch.randn(n, n, device="cuda:0")
        x1 = torch.randn(n, n, device="cuda:1")
        run(x0), run(x1), torch.cuda.synchronize()  # warm up both workers
        for _ in range(trials):
            t0 = time.perf_counter()
            run(x0)
            torch.cuda.synchronize(0)
            run(x1)
            torch.cuda.synchronize(1)
            times["sequential"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            run(x0)
            run(x1)
            torch.cuda.synchronize()
            times["together"].append(time.perf_counter() - t0)
    finally:
        simulated.stop()
    h0, h1 = torch.randn(n, n), torch.randn(n, n)
    run(h0)
    for _ in range(trials):
        t0 = time.perf_counter()
        run(h0)
        run(h1)
        times["cpu"].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def steps_only(mode: str, n: int) -> None:
    """30 warm-up steps, then `n` steps of the MLP in `mode` inside `operator.call`, on one
    thread (for callgrind's --toggle-collect=_operator_call)."""
    torch.set_num_threads(1)
    if mode != "cpu":
        simulated.start(1, model=None if mode == "simulated" else mode)
    try:
        step = _mlp_step("cpu" if mode == "cpu" else "cuda")
        for _ in range(30):
            step()

        def steps() -> None:
            for _ in range(n):
                step()

        # operator.call is Python 3.11's; on 3.10 the steps run as they are, uncounted alone.
        getattr(operator, "call", lambda f: f())(steps)
    finally:
        if mode != "cpu":
            simulated.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    parser.add_argument("--steps", nargs=2, metavar=("MODE", "N"),
                        help="only run N MLP steps in MODE (cpu, simulated, T4, ...)")
    opts = parser.parse_args()
    if opts.steps:
        steps_only(opts.steps[0], int(opts.steps[1]))
        return
    number, repeats = (200, 3) if opts.quick else (2000, 7)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{cpu_cores()} cores, load average {_load()}")
    print("\nmicroseconds per op (best of interleaved repeats)")
    print(f"{'op':28s} {'cpu':>9s} {'simulated':>10s} {'ratio':>7s}")
    for name, c, s in per_op(number, repeats):
        print(f"{name:28s} {c:9.2f} {s:10.2f} {s / c:7.2f}")

    steps, rounds = (100, 3) if opts.quick else (200, 15)
    t = training_step(steps, 3, rounds)
    print("\nMLP training step (64x32 batch, 3 Linear layers, SGD), microseconds (best round)")
    print(f"cpu {min(t['cpu']):.1f}   simulated GPU {min(t['simulated']):.1f}   "
          f"{_ratios(t, 'simulated')} (target <= 2.5x)")
    print(f"with a modeled T4 clock {min(t['T4']):.1f}   {_ratios(t, 'T4')} (target <= 3x)")

    n, reps = (256, 10) if opts.quick else (1024, 20)
    t = two_gpus(n, reps, 3 if opts.quick else 5)
    print(f"\ntwo simulated GPUs: {reps} x mm of {n}x{n} on each (median seconds)")
    print(f"one GPU after the other: {t['sequential']:.3f}   both launched together: "
          f"{t['together']:.3f}   speed-up {t['sequential'] / t['together']:.2f}x")
    print(f"same work on the plain CPU (all cores, no simulation): {t['cpu']:.3f}")
    print(f"load average now {_load()}: other processes on the cores lower every figure here,"
          " the overlap of two simulated GPUs most")


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
