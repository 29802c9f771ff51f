"""Exercise 1: a matrix product on the CPU and on a GPU across sizes, and where the GPU wins."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from devlab import gpu_model, simulated
from devlab.exercises._common import (
    ExerciseResult,
    Progress,
    busy_note,
    check_sizes,
    default_gpu,
    device_info,
    format_seconds,
    load_average,
    no_gpu_note,
)
from devlab.timing import check_options, time_on_device

DEFAULT_SIZES = (16, 32, 64, 128, 256, 512, 1024)


class MatmulResult(ExerciseResult):
    """Median time per product on each device, per size, and the crossover size."""

    def _draw(self, fig: Any) -> None:
        ax = fig.add_subplot()
        sizes = self.data["sizes"]
        for key, style in (("cpu", "o-"), ("gpu", "s-")):
            times = self.data[key]
            if times is not None:
                label = self.data["devices"][0 if key == "cpu" else 1]["name"]
                if key == "gpu" and self.simulated:
                    label += " (simulated)"
                ax.plot(sizes, times, style, label=label)
        crossover = self.data["crossover"]
        if crossover is not None:
            ax.axvline(crossover, color="gray", linestyle="--", label=f"crossover n={crossover}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_xlabel("matrix size n (n x n)")
        ax.set_ylabel("median time per product (s)")
        ax.set_title("matrix product: CPU vs GPU", fontsize=10)
        ax.legend(fontsize=8)


def crossover_size(sizes: Sequence[int], cpu: Sequence[float], gpu: Sequence[float]) -> int | None:
    """The smallest size from which the GPU is faster at that size and every larger one."""
    crossover = None
    for n, c, g in zip(reversed(sizes), reversed(cpu), reversed(gpu), strict=True):
        if g < c:
            crossover = n
        else:
            break
    return crossover


def _modeled_reason(sizes: Sequence[int], bounds: Sequence[str], model: str,
                    cpu_won: Sequence[int]) -> str:
    """Why the modeled GPU loses on small products and wins on large ones."""
    spec = simulated.model()
    launch = f"{spec.launch_latency_us:g} µs" if spec is not None else "its launch latency"
    small = [n for n, b in zip(sizes, bounds, strict=True) if b == "launch-bound"]
    large = [n for n, b in zip(sizes, bounds, strict=True) if b == "compute-bound"]
    parts = []
    if small:
        beaten = (f"; the CPU's own product is quicker than that up to n={cpu_won[-1]}"
                  if cpu_won else "")
        parts.append(f"Up to n={small[-1]} a product on the {model} is launch-bound: it costs "
                     f"about {launch} whatever its size, the time to launch a kernel{beaten}.")
    if large:
        peak = (f"{gpu_model.CALIBRATION[spec.name].mm.fp32 * spec.fp32_tflops:.3g} TFLOPS "
                f"of the {spec.fp32_tflops:g} on its datasheet") if spec is not None else "its peak"
        parts.append(f"From n={large[0]} it is compute-bound, at the {model}'s achieved FP32 "
                     f"rate ({peak}), and its lead over the CPU grows with n.")
    return " ".join(parts)


def noisy_sizes(sizes: Sequence[int], medians: Sequence[float], iqrs: Sequence[float]
                ) -> list[int]:
    """Sizes whose measurements spread (IQR) over more than half their median."""
    return [n for n, m, q in zip(sizes, medians, iqrs, strict=True) if q > 0.5 * m]


def matmul_cpu_vs_gpu(
    sizes: Sequence[int] = DEFAULT_SIZES,
    device: str | torch.device | None = None,
    *,
    min_time: float = 0.1,
    repeats: int = 3,
    warmup: int = 2,
    progress: bool | None = None,
) -> MatmulResult:
    """Time `a @ a` for n x n float32 matrices on the CPU and on `device` (default: the first
    GPU, simulated ones included), with `devlab.timing` (warm-up, synchronize, median).

    The crossover is the smallest size from which the GPU wins at every larger size tried.
    Without a GPU only the CPU is timed and the result says so.
    """
    sizes = check_sizes(sizes)
    check_options(min_time=min_time, repeats=repeats, warmup=warmup)
    cpu_info = device_info("cpu")
    gpu_info = device_info(device if device is not None else default_gpu())
    has_gpu = gpu_info.torch_device.type != "cpu"
    devices = [cpu_info, gpu_info] if has_gpu else [cpu_info]
    cpu_times: list[float] = []
    gpu_times: list[float] = []
    cpu_iqr: list[float] = []
    gpu_iqr: list[float] = []
    bounds: list[str] = []  # with a modeled GPU: what limits one product at each size
    timing = {"min_time": min_time, "repeats": repeats, "warmup": warmup}
    loads = [load_average()]
    with Progress(len(sizes) * len(devices), "matmul", progress) as bar:
        for n in sizes:
            a = torch.randn(n, n)
            t = time_on_device(lambda a=a: a @ a, "cpu", **timing)
            cpu_times.append(t.median)
            cpu_iqr.append(t.iqr)
            bar.step(f"n={n} done on {cpu_info.name}")
            if has_gpu:
                # The input is copied to the device once, outside the clock: this times the
                # product, not the transfer.
                ag = a.to(gpu_info.torch_device)
                t = time_on_device(lambda ag=ag: ag @ ag, gpu_info.torch_device, **timing)
                gpu_times.append(t.median)
                gpu_iqr.append(t.iqr)
                if gpu_info.modeled:
                    bounds.append(simulated.explain(lambda ag=ag: ag @ ag).bound)
                del ag
                bar.step(f"n={n} done on {gpu_info.label}")
    loads.append(load_average())
    crossover = crossover_size(sizes, cpu_times, gpu_times) if has_gpu else None
    if not has_gpu:
        verdict = no_gpu_note() if device is None else (
            f"{gpu_info.name} was asked for: there is no GPU in this comparison.")
    elif crossover is None:
        verdict = (f"No crossover in this range: {cpu_info.name} was faster at n={sizes[-1]}, "
                   "the largest size tried.")
    elif crossover == sizes[0]:
        verdict = (f"{gpu_info.label} was faster at every size tried (crossover at n={crossover} "
                   "or below).")
    else:
        verdict = f"{gpu_info.label} wins from n={crossover} on (crossover)."
    headers = ["n", f"{cpu_info.name} median", "GFLOP/s"]
    if has_gpu:
        headers += [f"{gpu_info.label} median", "GFLOP/s", "GPU speed-up", "faster"]
    if bounds:
        headers.append(f"{gpu_info.model} limited by")
    rows = []
    speedups: list[float] | None = [] if has_gpu else None
    for i, n in enumerate(sizes):
        flops = 2.0 * n**3  # multiply-adds of an n x n product
        row = [str(n), format_seconds(cpu_times[i]), f"{flops / cpu_times[i] / 1e9:.2f}"]
        if has_gpu and speedups is not None:
            speedup = cpu_times[i] / gpu_times[i]
            speedups.append(speedup)
            row += [format_seconds(gpu_times[i]), f"{flops / gpu_times[i] / 1e9:.2f}",
                    f"{speedup:.2f}x", gpu_info.name if speedup > 1 else cpu_info.name]
        if bounds:
            row.append(bounds[i])
        rows.append(row)
    noisy = noisy_sizes(sizes, cpu_times, cpu_iqr) + (
        noisy_sizes(sizes, gpu_times, gpu_iqr) if has_gpu else [])
    notes = [verdict]
    if bounds:
        cpu_won = [n for n, c, g in zip(sizes, cpu_times, gpu_times, strict=True) if c <= g]
        notes.append(_modeled_reason(sizes, bounds, gpu_info.model or "", cpu_won))
    notes.append(f"Timed with devlab.timing: {warmup} warm-up calls, device synchronized "
                 f"before each clock stops, median of at least {repeats} blocks.")
    busy = busy_note(max((x for x in loads if x is not None), default=None))
    if busy:
        notes.append(busy)
    if noisy:
        notes.append("Noisy at n=" + ", ".join(str(n) for n in sorted(set(noisy))) + ": the middle "
                     "half of the measurements spread over more than half the median (a busy "
                     "machine?). Run again, or with a larger min_time, before trusting them.")
    data = {
        "sizes": sizes,
        "cpu": cpu_times,
        "gpu": gpu_times if has_gpu else None,
        "cpu_iqr": cpu_iqr,
        "gpu_iqr": gpu_iqr if has_gpu else None,
        "speedup": speedups,
        "crossover": crossover,
        "load_average": loads,
        "verdict": verdict,
        "bound": bounds or None,
        "devices": [d.to_dict() for d in devices],
    }
    title = f"Matrix product, {cpu_info.name} vs {gpu_info.label}" if has_gpu else \
        f"Matrix product on {cpu_info.name}"
    return MatmulResult(title, devices, data, headers, rows, notes)
