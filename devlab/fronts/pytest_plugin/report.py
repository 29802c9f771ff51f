"""What the session header and summary say: the simulated GPUs, what they cannot check, and
how many tests ran on them."""

from __future__ import annotations

from devlab._helpers.sizes import format_bytes
from devlab.fronts.pytest_plugin.options import Settings

# What passing here does not prove (docs/pytest-plugin.md lists the same, with the reasons).
CANNOT_CHECK = (
    "custom CUDA kernels and Triton kernels (not run: a CPU build has no CUDA compiler)",
    "the numerics of real GPU kernels (TF32, reduction order, cuBLAS/cuDNN algorithm choice: "
    "values are the CPU's)",
    "real timing and throughput (a --gpu-model clock is modeled, not measured)",
    "driver, hardware and NCCL transport faults (ECC errors, Xid, hangs of a real fabric)",
    "races a GPU's scheduling makes nondeterministic, beyond the stream rules devlab checks",
)


def describe(settings: Settings) -> str:
    """'2 simulated GPUs, model A100-80GB, 1.0 GiB each'."""
    n = settings.count
    text = f"{n} simulated GPU{'s' if n != 1 else ''}"
    text += f", model {settings.model}" if settings.model else " (no GPU model)"
    if settings.memory_mb is not None:
        text += f", {format_bytes(settings.memory_mb * 1024 * 1024)} each"
    elif settings.model:
        from devlab.engine import simulated
        from devlab.engine.gpu_model import capacity

        text += (f", {format_bytes(capacity.total_memory(simulated.gpu_spec(settings.model)))}"
                 " each (the model's, as torch reports it)")
    else:
        text += ", memory: the host's (--gpu-memory sets a limit)"
    if settings.topology:
        text += f", collectives timed on {settings.topology}"
    return text


def header(settings: Settings, visible: int | None = None) -> list[str]:
    """The session header; `visible`: the GPUs CUDA_VISIBLE_DEVICES leaves this process."""
    import os

    if visible is None or visible == settings.count:
        where = ("torch.cuda.is_available() is True here, in xdist workers and in the processes "
                 "tests start (values computed on the CPU)")
    else:
        where = (f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} shows "
                 f"{visible} of them to this process (torch.cuda.device_count() is {visible}), "
                 "and hides GPUs in xdist workers and the processes tests start as it would on "
                 "a real machine (values computed on the CPU)")
    return [
        f"devlab: {describe(settings)}; {where}",
        "devlab checks device placement, CUDA's errors, memory limits (OOM), stream and "
        "non_blocking-copy synchronization, NCCL collectives across processes",
        "devlab cannot check: " + "; ".join(CANNOT_CHECK),
    ]


def summary(ran: int, total: int, leaks: list[tuple[str, list[int]]], leak_mode: str
            ) -> list[str]:
    lines = [f"{ran} of {total} tests ran on simulated GPUs (made a tensor on one)"]
    if leaks and leak_mode != "off":
        lines.append(f"{len(leaks)} passing test{'s' if len(leaks) != 1 else ''} left memory "
                     "allocated on simulated GPUs" +
                     ("" if leak_mode == "fail" else " (--gpu-leaks=fail makes it an error)")
                     + ":")
        for nodeid, per_gpu in leaks:
            where = ", ".join(f"{format_bytes(b)} on cuda:{i}" for i, b in enumerate(per_gpu) if b)
            lines.append(f"  {nodeid}: {where}")
    return lines
