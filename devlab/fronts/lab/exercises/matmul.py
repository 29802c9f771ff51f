"""Exercise 1: a matrix product on the CPU and on a GPU across sizes, and where the GPU wins."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from devlab.core.timing import STEADY, TimingResult, check_options, time_on_device
from devlab.engine import gpu_model, simulated
from devlab.fronts.lab.exercises._common import (
    RETRIES,
    DeviceInfo,
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

DEFAULT_SIZES = (16, 32, 64, 128, 256, 512, 1024)


CPU, GPU = "cpu", "gpu"


class MatmulResult(ExerciseResult):
    """Time per product on each device, per size, which one was faster, and the crossover."""

    def _draw(self, fig: Any) -> None:
        ax = fig.add_subplot()
        sizes = self.data["sizes"]
        for i, (key, style) in enumerate(((CPU, "o-"), (GPU, "s-"))):
            times = self.data[key]
            if times is not None:
                # The devices' own labels, as in the table: "GPU:0 (modeled T4)".
                ax.plot(sizes, times, style, label=self.devices[i].label)
                steady = self.data[f"{key}_steady"]
                noisy = [(n, t) for n, t, ok in zip(sizes, times, steady, strict=True) if not ok]
                if noisy:
                    ax.plot(*zip(*noisy, strict=True), "x", color="red", markersize=9,
                            label=f"{self.devices[i].name}: noisy")
        crossover = self.data["crossover"]
        if crossover is not None:
            ax.axvline(crossover, color="gray", linestyle="--", label=f"crossover n={crossover}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_xlabel("matrix size n (n x n)")
        ax.set_ylabel("time per product (s, fastest block)")
        ax.set_title("matrix product: CPU vs GPU", fontsize=10)
        ax.legend(fontsize=8)


def _time_product(a: torch.Tensor, device: torch.device, timing: dict[str, Any]) -> TimingResult:
    """One measurement of `a @ a` on `device`, where `a` lives."""
    return time_on_device(lambda: a @ a, device, **timing)


@contextlib.contextmanager
def _num_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads for this thread, for the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def crossover_size(sizes: Sequence[int], cpu: Sequence[float], gpu: Sequence[float]) -> int | None:
    """The smallest size from which the GPU is faster at that size and every larger one."""
    crossover = None
    for n, c, g in zip(reversed(sizes), reversed(cpu), reversed(gpu), strict=True):
        if g < c:
            crossover = n
        else:
            break
    return crossover


def faster(cpu: Sequence[float], gpu: Sequence[float], cpu_steady: Sequence[bool],
           gpu_steady: Sequence[bool]) -> list[str | None]:
    """Per size (smallest first), the faster side ("cpu" or "gpu"), or None where it is too
    noisy to call.

    The times are each side's fastest block. Load only adds time, so a side is at least as
    fast as its fastest block; a steady measurement is the side's own speed; and a larger
    product never takes less time than a smaller one on the same device. So the faster
    side's lead is certain when it beats the slower side's steady time at that size or at any
    smaller one, and unknown otherwise.
    """
    def floor(times: Sequence[float], steady: Sequence[bool]) -> list[float]:
        # The least a side can take at each size: its largest steady time up to that size.
        out, least = [], 0.0
        for t, ok in zip(times, steady, strict=True):
            least = max(least, t) if ok else least
            out.append(least)
        return out

    out: list[str | None] = []
    for c, g, c_least, g_least in zip(cpu, gpu, floor(cpu, cpu_steady), floor(gpu, gpu_steady),
                                      strict=True):
        if g < c:
            out.append(GPU if g < c_least else None)
        else:
            out.append(CPU if c <= g_least else None)
    return out


def called_crossover(sizes: Sequence[int], winners: Sequence[str | None]
                     ) -> tuple[int | None, int | None]:
    """(crossover, blocking size): the crossover when every size that decides it was called
    (from the largest size down to the last one the CPU won), else None and the first size,
    from the top, too noisy to call."""
    crossover = None
    for n, w in zip(reversed(sizes), reversed(winners), strict=True):
        if w == GPU:
            crossover = n
        elif w is None:
            return None, n
        else:
            break
    return crossover, None


def unsteady(sizes: Sequence[int], results: Sequence[TimingResult]) -> list[int]:
    """Sizes whose measurement cannot be trusted: not steady (`TimingResult.steady`), or
    slower by more than `STEADY` times than a larger product (more work never takes less
    time, so the smaller one waited for the machine)."""
    bad = []
    for i, (n, r) in enumerate(zip(sizes, results, strict=True)):
        later = [x.min for x in results[i + 1:]]
        if not r.steady or (later and r.min > STEADY * min(later)):
            bad.append(n)
    return bad


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
    GPU, simulated ones included), with `devlab.timing` (warm-up, synchronize, repeats).

    Each time is the device's fastest block of calls: load on the machine only adds time, so
    the fastest block is the nearest to the device's own speed. A size whose measurement was
    not steady (its median block over `STEADY` times its fastest, or slower than a larger
    product) is measured again, at most `RETRIES` more times. Which device was faster is
    called only where steady measurements make it certain (`faster`), and the crossover (the
    smallest size from which the GPU wins at every larger size tried) only when every size
    deciding it was called; otherwise the result names the sizes too noisy to call. Without
    a GPU only the CPU is timed and the result says so.
    """
    sizes = check_sizes(sizes)
    check_options(min_time=min_time, repeats=repeats, warmup=warmup)
    cpu_info = device_info("cpu")
    gpu_info = device_info(device if device is not None else default_gpu())
    has_gpu = gpu_info.torch_device.type != "cpu"
    devices = [cpu_info, gpu_info] if has_gpu else [cpu_info]
    timing = {"min_time": min_time, "repeats": repeats, "warmup": warmup}
    inputs = {n: torch.randn(n, n) for n in sizes}
    on_gpu: dict[int, torch.Tensor] = {}

    # The CPU is timed with torch's threads and with one: a small product is quicker on one
    # thread than split, and on a busy machine a split product waits, every call, for a core
    # to come free for its second thread, which no choice of blocks can undo.
    cpu_threads = sorted({torch.get_num_threads(), 1}, reverse=True)
    threads = [cpu_threads[0]] * len(sizes)

    def measure(n: int, info: DeviceInfo) -> TimingResult:
        if info is cpu_info:
            tried = []
            for count in cpu_threads:
                with _num_threads(count):
                    tried.append((_time_product(inputs[n], cpu_info.torch_device, timing), count))
            best, threads[sizes.index(n)] = min(tried, key=lambda rc: rc[0].min)
            return best
        # The input is copied to the device once, outside the clock: this times the
        # product, not the transfer.
        if n not in on_gpu:
            on_gpu[n] = inputs[n].to(gpu_info.torch_device)
        return _time_product(on_gpu[n], gpu_info.torch_device, timing)

    results: dict[str, list[TimingResult]] = {d.name: [] for d in devices}
    attempts = {d.name: [1] * len(sizes) for d in devices}
    loads = [load_average()]
    with Progress(len(sizes) * len(devices), "matmul", progress) as bar:
        for n in sizes:
            for info in devices:
                results[info.name].append(measure(n, info))
                bar.step(f"n={n} done on {info.label}")
        for _ in range(RETRIES):
            again = [(info, i) for info in devices for i, n in enumerate(sizes)
                     if n in unsteady(sizes, results[info.name])]
            if not again:
                break
            bar.extend(len(again))
            for info, i in again:
                bar.step(f"n={sizes[i]} again on {info.label} (noisy)", n=0)
                retry = measure(sizes[i], info)
                attempts[info.name][i] += 1
                # Keep the less disturbed of the two: the one whose median block was faster.
                if retry.median < results[info.name][i].median:
                    results[info.name][i] = retry
                bar.step(f"n={sizes[i]} again on {info.label}")
    loads.append(load_average())
    bounds = ([simulated.explain(lambda ag=ag: ag @ ag).bound for ag in on_gpu.values()]
              if has_gpu and gpu_info.modeled else [])
    on_gpu.clear()
    cpu_r = results[cpu_info.name]
    gpu_r = results[gpu_info.name] if has_gpu else []
    cpu_times = [r.min for r in cpu_r]
    gpu_times = [r.min for r in gpu_r]
    cpu_noisy = unsteady(sizes, cpu_r)
    gpu_noisy = unsteady(sizes, gpu_r) if has_gpu else []
    cpu_steady = [n not in cpu_noisy for n in sizes]
    gpu_steady = [n not in gpu_noisy for n in sizes]
    winners = faster(cpu_times, gpu_times, cpu_steady, gpu_steady) if has_gpu else []
    crossover, blocking = called_crossover(sizes, winners) if has_gpu else (None, None)
    undecided = [n for n, w in zip(sizes, winners, strict=True) if w is None] if has_gpu else []
    again = "Run it again on a quieter machine, or with more time per size " \
            f"(min_time={max(0.5, 5 * min_time):g})."
    if not has_gpu:
        verdict = no_gpu_note() if device is None else (
            f"{gpu_info.name} was asked for: there is no GPU in this comparison.")
    elif blocking is not None:
        won = [n for n, w in zip(sizes, winners, strict=True) if n > blocking]
        lead = (f" {gpu_info.label} was faster from n={won[0]} on; below that the measurements "
                "cannot say where it starts to win." if won else "")
        verdict = (f"No crossover can be called: at n={blocking} the measurements were too noisy "
                   f"to say which device is faster.{lead} {again}")
    elif crossover is None:
        verdict = (f"No crossover in this range: {cpu_info.name} was faster at n={sizes[-1]}, "
                   "the largest size tried.")
    elif crossover == sizes[0]:
        verdict = (f"{gpu_info.label} was faster at every size tried (crossover at n={crossover} "
                   "or below).")
    else:
        verdict = f"{gpu_info.label} wins from n={crossover} on (crossover)."
    headers = ["n", f"{cpu_info.name} time", "GFLOP/s"]
    if len(cpu_threads) > 1:
        headers.append("threads")
    if has_gpu:
        headers += [f"{gpu_info.label} time", "GFLOP/s", "GPU speed-up", "faster"]
    if bounds:
        headers.append(f"{gpu_info.model} limited by")

    def shown(t: float, steady: bool) -> str:
        return format_seconds(t) + ("" if steady else " (noisy)")

    rows = []
    speedups: list[float] | None = [] if has_gpu else None
    names = {CPU: cpu_info.name, GPU: gpu_info.name, None: "too noisy to call"}
    for i, n in enumerate(sizes):
        flops = 2.0 * n**3  # multiply-adds of an n x n product
        row = [str(n), shown(cpu_times[i], cpu_steady[i]), f"{flops / cpu_times[i] / 1e9:.2f}"]
        if len(cpu_threads) > 1:
            row.append(str(threads[i]))
        if has_gpu and speedups is not None:
            speedup = cpu_times[i] / gpu_times[i]
            speedups.append(speedup)
            row += [shown(gpu_times[i], gpu_steady[i]), f"{flops / gpu_times[i] / 1e9:.2f}",
                    f"{speedup:.2f}x", names[winners[i]]]
        if bounds:
            row.append(bounds[i])
        rows.append(row)
    notes = [verdict]
    if bounds:
        cpu_won = [n for n, w in zip(sizes, winners, strict=True) if w == CPU]
        notes.append(_modeled_reason(sizes, bounds, gpu_info.model or "", cpu_won))
    measured = [d.name for d in devices if not d.modeled]
    notes.append(
        f"Timed with devlab.timing: {warmup} warm-up calls, each device synchronized before "
        f"every clock stops, at least {repeats} blocks of calls per size. Each time is the "
        f"fastest block: load on the machine only adds time, so the fastest block is the "
        f"nearest to the device's own speed. "
        + (f"{cpu_info.name} is timed with {cpu_threads[0]} threads and with 1, and the faster "
           "counts (\"threads\"): a small product is quicker on one thread, and on a busy "
           "machine a split product waits for a free core every call. "
           if len(cpu_threads) > 1 else "")
        + f"A size counts as steady on "
        f"{' and '.join(measured)} when its median block took at most {STEADY:g}x its "
        f"fastest and no larger product was quicker; one that was not was measured again "
        f"(up to {RETRIES} more times). Which device is faster is called only where steady "
        "measurements make it certain (a larger product never takes less time, so a steady "
        "time at a smaller size is a floor for the larger ones).")
    noisy = sorted(set(cpu_noisy) | set(gpu_noisy))
    busy = busy_note(max((x for x in loads if x is not None), default=None), steady=not noisy)
    if busy:
        notes.append(busy)
    if noisy:
        who = "; ".join(f"{name} at n={', '.join(str(n) for n in bad)}" for name, bad in
                        ((cpu_info.name, cpu_noisy), (gpu_info.name, gpu_noisy)) if bad)
        notes.append(f"Still noisy after {RETRIES} more tries: {who} (marked \"noisy\"). "
                     + ("" if blocking is not None else again))
    data = {
        "sizes": sizes,
        "cpu": cpu_times,
        "gpu": gpu_times if has_gpu else None,
        "cpu_median": [r.median for r in cpu_r],
        "gpu_median": [r.median for r in gpu_r] if has_gpu else None,
        "cpu_iqr": [r.iqr for r in cpu_r],
        "gpu_iqr": [r.iqr for r in gpu_r] if has_gpu else None,
        "cpu_steady": cpu_steady,
        "cpu_threads": threads,
        "gpu_steady": gpu_steady if has_gpu else None,
        "attempts": [attempts[d.name] for d in devices],
        "speedup": speedups,
        "faster": [None if w is None else names[w] for w in winners] if has_gpu else None,
        "too_noisy": undecided,
        "crossover": crossover,
        "load_average": loads,
        "verdict": verdict,
        "bound": bounds or None,
        "devices": [d.to_dict() for d in devices],
    }
    title = f"Matrix product, {cpu_info.name} vs {gpu_info.label}" if has_gpu else \
        f"Matrix product on {cpu_info.name}"
    return MatmulResult(title, devices, data, headers, rows, notes)
