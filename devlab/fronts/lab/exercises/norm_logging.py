"""Exercise 3 (d2l "GPUs"): log the Frobenius norm of 1000 matrix products one at a time
(`.item()` each step) or keep the norms on the device and move them to the host once.

Both versions are timed with `devlab.timing`, and each runs once more under the placement
log, which counts the host syncs and copies it really made.
"""

from __future__ import annotations

from typing import Any

import torch

from devlab._helpers.sizes import format_bytes
from devlab.core import placement_log
from devlab.core.timing import STEADY, check_options, time_on_device
from devlab.engine import simulated
from devlab.engine.gpu_model import HOST_COPY_LATENCY_US
from devlab.fronts.lab.exercises._common import (
    RETRIES,
    ExerciseResult,
    Progress,
    busy_note,
    check_positive,
    default_gpu,
    device_info,
    format_seconds,
    load_average,
)

PER_STEP = "per step: .item() each step"
ON_DEVICE = "on device: one transfer at the end"


class NormLoggingResult(ExerciseResult):
    """Time and host syncs of the two ways of logging the norms."""

    def _draw(self, fig: Any) -> None:
        versions = self.data["versions"]
        ax1, ax2 = fig.subplots(1, 2)
        times = [v["time"] * 1e3 for v in versions]
        ax1.bar([0, 1], times, color=["C3", "C2"])
        ax1.set_xticks([0, 1], ["per step", "on device"])
        ax1.set_ylabel(f"median time for {self.data['n']} steps (ms)")
        for x, v in enumerate(versions):
            ax1.text(x, times[x], f"{v['time'] * 1e3:.3g} ms", ha="center", va="bottom", fontsize=8)
        syncs = [v["syncs"] for v in versions]
        ax2.bar([0, 1], syncs, color=["C3", "C2"])
        ax2.set_xticks([0, 1], ["per step", "on device"])
        ax2.set_ylabel("host syncs (placement log)")
        for x, s in enumerate(syncs):
            ax2.text(x, s, str(s), ha="center", va="bottom", fontsize=8)
        fig.suptitle(f"{self.data['n']} products of {self.data['size']}x{self.data['size']} "
                     f"matrices on {self.devices[0].label}: logging the norm", fontsize=10)


def norm_logging(
    n: int = 1000,
    size: int = 100,
    device: str | torch.device | None = None,
    *,
    repeats: int = 3,
    warmup: int = 0,
    progress: bool | None = None,
) -> NormLoggingResult:
    """`n` products of `size` x `size` matrices on `device` (default: the first GPU, simulated
    ones included, else the CPU), logging each result's Frobenius norm either with `.item()`
    every step or into a device tensor moved to the host once. Returns times and host syncs.

    Each version first runs once under the placement log (which counts its syncs and copies,
    and warms it up), then `warmup` more times untimed, then `repeats` timed runs.
    """
    check_positive(n=n, size=size)
    check_options(repeats=repeats, warmup=warmup)
    info = device_info(device if device is not None else default_gpu())
    dev = info.torch_device
    gen = torch.Generator().manual_seed(0)
    # Made on the host and copied once, before anything is measured. Scaled so the product's
    # entries stay near 1: the norms are ordinary numbers.
    a = (torch.randn(size, size, generator=gen) / size**0.5).to(dev)
    b = torch.randn(size, size, generator=gen).to(dev)

    def per_step() -> list[float]:
        norms = []
        for _ in range(n):
            y = a @ b
            norms.append(torch.linalg.matrix_norm(y).item())  # the host waits, every step
        return norms

    def on_device() -> list[float]:
        norms = []
        for _ in range(n):
            y = a @ b
            norms.append(torch.linalg.matrix_norm(y))  # a device tensor: no wait
        return torch.stack(norms).cpu().tolist()  # one copy, one wait

    versions: list[dict[str, Any]] = []
    values: dict[str, list[float]] = {}
    loads = [load_average()]
    with Progress(4, "norm logging", progress) as bar:
        for name, fn in ((PER_STEP, per_step), (ON_DEVICE, on_device)):
            with placement_log.capture() as log:
                values[name] = fn()
            s = log.summary()
            bar.step(f"{name}: counted")
            t = time_on_device(fn, dev, warmup=warmup, repeats=repeats, min_time=0.0, number=1)
            for _ in range(RETRIES):
                if t.steady:
                    break
                bar.step(f"{name}: noisy, timing again", n=0)
                again = time_on_device(fn, dev, warmup=warmup, repeats=repeats, min_time=0.0,
                                       number=1)
                t = again if again.median < t.median else t
            bar.step(f"{name}: timed")
            versions.append({
                "version": name,
                "time": t.median,
                "time_iqr": t.iqr,
                "steady": t.steady,
                "time_per_step": t.median / n,
                "syncs": s.syncs,
                "copies": s.copies,
                "bytes": s.copied_bytes,
                "ops": sum(s.ops_per_device.values()),
            })
    loads.append(load_average())
    per, on = versions
    diff = max(abs(x - y) for x, y in zip(values[PER_STEP], values[ON_DEVICE], strict=True))
    headers = ["version", "median time", "per step", "host syncs", "copies", "bytes copied"]
    rows = [[v["version"], format_seconds(v["time"]), format_seconds(v["time_per_step"]),
             str(v["syncs"]), str(v["copies"]), format_bytes(v["bytes"])] for v in versions]
    how = ("modeled, the same every run" if info.modeled else
           f"medians of at least {repeats} runs, synchronized")
    notes = [f"Host syncs and copies were counted by the placement log over one full run of "
             f"each version, which also warmed it up; times are {how} (devlab.timing).",
             f"Both versions log the same norms (largest difference {diff:.2g})."]
    if dev.type == "cpu":
        notes.append("On the CPU there is no device to wait for, so neither version syncs. "
                     "With a GPU (or simulate_gpus(2)) the per-step version waits once per step.")
    else:
        ratio = per["time"] / on["time"]
        if per["steady"] and on["steady"]:
            speed = ("keeping the log on the device was "
                     + (f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower")
                     + " here")
        else:
            # A ratio of times that waited for the machine says nothing about the versions.
            noisy = " and ".join(v["version"].split(":")[0] for v in versions if not v["steady"])
            speed = (f"which version is faster is too noisy to call: the {noisy} runs spread "
                     f"over more than {STEADY:g}x their fastest even after {RETRIES} more tries "
                     "(a busy machine?). Run it again on a quieter machine, or with more repeats")
        notes.append(f"The per-step version made the host wait {per['syncs']} times, the on-device "
                     f"version {on['syncs']}; {speed}.")
        spec = simulated.model() if info.simulated else None
        if spec is not None:
            notes.append(
                f"Why, on the modeled {spec.name}: each step launches small kernels (about "
                f"{spec.launch_latency_us:g} µs each; they are launch-bound). Keeping the log on "
                "the device, the host only launches and the GPU works behind it. With .item() "
                "every step, the host launches a copy to itself (at least "
                f"{HOST_COPY_LATENCY_US:g} µs on the GPU, however small), waits until the GPU's "
                "queue is empty and pays the round trip of waking up "
                f"({spec.sync_latency_us:g} µs), while "
                "the GPU sits idle, then launches the next step.")
        elif info.simulated:
            notes.append("On a simulated GPU a host sync only waits for a CPU thread; on a real "
                         "GPU each sync also drains the queue of launched work and stalls the "
                         "next launch, which is what this exercise is about.")
    busy = busy_note(max((x for x in loads if x is not None), default=None),
                     steady=all(v["steady"] for v in versions))
    if busy:
        notes.append(busy)
    data = {"n": n, "size": size, "load_average": loads, "device": info.to_dict(), "devices": [info.to_dict()],
            "versions": versions, "max_difference": diff}
    return NormLoggingResult(f"Logging the norm of {n} products ({size}x{size}) on {info.label}",
                             [info], data, headers, rows, notes)
