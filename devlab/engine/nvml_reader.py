"""The thin NVML backend (`nvidia-ml-py`, imported as `pynvml`).

Every function answers `None` (or an empty/False value) where there is no NVIDIA driver or
NVML refuses: callers show "not available", never an NVML traceback. The logic that uses
these readings lives elsewhere and is tested with simulated devices.
"""

from __future__ import annotations

import functools
from typing import Any

_NVML_ERROR: str | None = None


@functools.lru_cache(maxsize=1)
def _nvml() -> Any | None:
    global _NVML_ERROR
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver errors
        _NVML_ERROR = f"{type(exc).__name__}: {exc}".strip()
        return None
    return pynvml


def available() -> bool:
    """True when the NVIDIA driver answers through NVML."""
    return _nvml() is not None


def unavailable_reason() -> str | None:
    """Why NVML is not available (for messages), or None if it is."""
    return None if available() else (_NVML_ERROR or "NVML did not answer")


def _call(fn_name: str, *args: Any) -> Any | None:
    nv = _nvml()
    if nv is None:
        return None
    try:
        return getattr(nv, fn_name)(*args)
    except Exception:
        return None


def device_count() -> int:
    """GPUs the driver sees (0 without a driver)."""
    return _call("nvmlDeviceGetCount") or 0


def _handle(index: int) -> Any | None:
    return _call("nvmlDeviceGetHandleByIndex", index)


def memory_info(index: int) -> tuple[int, int] | None:
    """(used, total) bytes of GPU `index` as the driver sees it."""
    handle = _handle(index)
    info = _call("nvmlDeviceGetMemoryInfo", handle) if handle is not None else None
    return None if info is None else (int(info.used), int(info.total))


def process_memory(index: int, pid: int | None = None) -> int | None:
    """Bytes this process (or `pid`) holds on GPU `index`, where the driver reports it."""
    import os

    handle = _handle(index)
    if handle is None:
        return None
    procs = _call("nvmlDeviceGetComputeRunningProcesses", handle)
    if procs is None:
        return None
    pid = os.getpid() if pid is None else pid
    for proc in procs:
        if proc.pid == pid:
            used = getattr(proc, "usedGpuMemory", None)
            return None if used is None else int(used)
    return 0


def utilization(index: int) -> int | None:
    """GPU utilisation in percent over the driver's last sample period."""
    handle = _handle(index)
    rates = _call("nvmlDeviceGetUtilizationRates", handle) if handle is not None else None
    return None if rates is None else int(rates.gpu)


def device_details(index: int) -> dict[str, Any]:
    """Name, total memory, compute capability, PCI bus id and driver version, where known."""
    handle = _handle(index)
    if handle is None:
        return {}
    details: dict[str, Any] = {}
    name = _call("nvmlDeviceGetName", handle)
    if name is not None:
        details["device_name"] = name.decode() if isinstance(name, bytes) else name
    mem = memory_info(index)
    if mem is not None:
        details["total_memory"] = mem[1]
    cc = _call("nvmlDeviceGetCudaComputeCapability", handle)
    if cc is not None:
        details["compute_capability"] = tuple(cc)
    pci = _call("nvmlDeviceGetPciInfo", handle)
    if pci is not None:
        bus = getattr(pci, "busId", None)
        details["pci_bus_id"] = bus.decode() if isinstance(bus, bytes) else bus
    driver = _call("nvmlSystemGetDriverVersion")
    if driver is not None:
        details["driver_version"] = driver.decode() if isinstance(driver, bytes) else driver
    return details
