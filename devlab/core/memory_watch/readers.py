"""Memory readers: one small class per backend, each answering "how much memory does this
device hold right now?" as a `MemoryReading`.

- `SimulatedReader`: a simulated GPU's own accounting (`devlab.simulated.memory_stats`);
- `TorchCudaReader`: torch's caching allocator on a real GPU (allocated vs reserved);
- `NvmlReader`: what the driver sees (NVML), for the whole device or this process;
- `ProcessReader`: the resident memory (RSS) of this Python process, for the CPU.

`reader_for(device)` picks the right one. Readers never initialize CUDA: reading the
allocator before CUDA started returns zeros, so watching memory does not fix device settings
(see `devlab.runtime`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from devlab.core.placement_scope import device_label, resolve_device
from devlab.engine import nvml_reader as nvml
from devlab.engine import simulated

__all__ = [
    "MemoryReading",
    "MemoryReader",
    "PeakWindow",
    "ProcessReader",
    "TorchCudaReader",
    "SimulatedReader",
    "NvmlReader",
    "reader_for",
    "default_devices",
]


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """One look at one device's memory.

    `used` is what is allocated to tensors (or, for NVML and the CPU, what is in use);
    `reserved` is what torch's caching allocator holds from the driver (None where the
    backend has no such notion); `limit` is the most the device can hold: a configured
    memory limit, or the device's total memory (None when unknown or not meaningful).
    `peak` is the backend's own high-water mark, where it keeps one: it catches spikes
    that fall between two samples. `driver_used` is what the driver (NVML, as nvidia-smi)
    counts in use on the whole device, where a real GPU's reader can ask it: every process's
    memory, CUDA contexts and libraries' own buffers included (None elsewhere).
    `timestamp` is on the `time.perf_counter()` clock.
    """

    timestamp: float
    used: int
    reserved: int | None
    limit: int | None
    label: str
    peak: int | None = None
    driver_used: int | None = None


class MemoryReader(Protocol):
    """Anything with a `label` and a `read()` returning a `MemoryReading`.

    A reader whose backend can tell the exact peak over a span of time also has
    `open_peak()`, returning a `PeakWindow` (see `SimulatedReader`).
    """

    label: str

    def read(self) -> MemoryReading: ...


class PeakWindow(Protocol):
    """The exact highest `used` since the window opened (`peak`, bytes), until `close()`."""

    peak: int

    def close(self) -> None: ...


# --------------------------------------------------------------------------------------------
# Devices


def _simulated():
    """The `devlab.simulated` module when a simulation is running, else None."""
    return simulated if simulated.is_active() else None


def _nvml():
    return nvml if nvml.available() else None


def default_devices() -> list[torch.device]:
    """Every GPU there is (real or simulated), or the CPU when there is none."""
    sim = _simulated()
    if sim is not None:
        count = sim.device_count()
    elif torch.cuda.is_available():
        count = torch.cuda.device_count()
    else:
        count = 0
    return [torch.device("cuda", i) for i in range(count)] or [torch.device("cpu")]


# --------------------------------------------------------------------------------------------
# Readers


class ProcessReader:
    """The CPU: resident memory (RSS) of this Python process, via psutil.

    There is no meaningful limit line: the machine's total memory would flatten the chart.
    """

    def __init__(self, label: str = "CPU:0 (process RSS)") -> None:
        import psutil

        self.label = label
        self._process = psutil.Process()

    def __repr__(self) -> str:
        return f"ProcessReader(label={self.label!r})"

    def read(self) -> MemoryReading:
        rss = self._process.memory_info().rss
        return MemoryReading(time.perf_counter(), rss, None, None, self.label)


class TorchCudaReader:
    """A real GPU through torch's caching allocator: allocated, reserved and peak bytes.

    Allocated is what tensors use; reserved is what the allocator keeps from the driver
    (freed tensors go back to the cache, not the driver), so the two differ. Where NVML
    answers, the reading also carries the device's used memory as NVML counts it
    (`driver_used`), which holds what the allocator does not see.
    """

    def __init__(self, index: int, label: str | None = None) -> None:
        self.index = index
        self.label = label or f"GPU:{index}"
        self._total: int | None = None

    def __repr__(self) -> str:
        return f"TorchCudaReader({self.index}, label={self.label!r})"

    def read(self) -> MemoryReading:
        i = self.index
        # These return zeros before CUDA is initialized and never initialize it themselves.
        used = torch.cuda.memory_allocated(i)
        reserved = torch.cuda.memory_reserved(i)
        peak = torch.cuda.max_memory_allocated(i)
        backend = _nvml()
        info = backend.memory_info(i) if backend is not None else None
        return MemoryReading(time.perf_counter(), used, reserved, self._limit(), self.label, peak,
                             int(info[0]) if info is not None else None)

    def _limit(self) -> int | None:
        if not torch.cuda.is_initialized():
            return None  # get_device_properties would initialize CUDA: only ask once it runs
        if self._total is None:
            self._total = torch.cuda.get_device_properties(self.index).total_memory
        # A limit set with set_per_process_memory_fraction (as devlab.config does for
        # LogicalDeviceConfiguration(memory_limit=...)) is the line to draw.
        fraction = _configured_fraction(self.index)
        return int(self._total * fraction) if fraction is not None else self._total


def _configured_fraction(index: int) -> float | None:
    """The allocator's per-process memory fraction, where torch exposes it."""
    get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if get is None:
        return None
    try:
        fraction = float(get(index))
    except Exception:  # noqa: BLE001 - older builds or an uninitialized device: no limit known
        return None
    return fraction if 0 < fraction < 1 else None


class SimulatedReader:
    """A simulated GPU: the bytes of the tensors that live on it, its peak and its limit.

    `open_peak()` watches its exact peak from now on (`simulated.watch_peak`), apart from the
    peak `torch.cuda.max_memory_allocated` reads, which stays the user's to reset.
    """

    def __init__(self, index: int, label: str | None = None) -> None:
        self.index = index
        self.label = label or f"GPU:{index} (simulated)"

    def __repr__(self) -> str:
        return f"SimulatedReader({self.index}, label={self.label!r})"

    def open_peak(self) -> PeakWindow:
        return simulated.watch_peak(self.index)

    def read(self) -> MemoryReading:
        stats = simulated.memory_stats(self.index)
        limit = stats.get("limit")
        # "reserved" is optional in the contract: memory growth off shows as reserved memory.
        reserved = stats.get("reserved")
        return MemoryReading(
            time.perf_counter(),
            int(stats["allocated"]),
            int(reserved) if reserved is not None else None,
            int(limit) if limit else None,
            self.label,
            int(stats["peak"]),
        )


class NvmlReader:
    """A real GPU as the driver sees it (NVML), like `nvidia-smi`.

    `scope="device"` reads the whole device's used memory (every process, plus the CUDA
    context); `scope="process"` reads this process's share, where NVML reports it (it does
    not on some platforms and inside some containers: then the device figure is used).
    """

    def __init__(self, index: int, scope: str = "device", label: str | None = None) -> None:
        if scope not in ("device", "process"):
            raise ValueError(f"scope must be 'device' or 'process', not {scope!r}")
        self.index = index
        self.scope = scope
        self.label = label or f"GPU:{index} (NVML{', this process' if scope == 'process' else ''})"

    def __repr__(self) -> str:
        return f"NvmlReader({self.index}, scope={self.scope!r}, label={self.label!r})"

    def read(self) -> MemoryReading:
        info = nvml.memory_info(self.index)
        used, total = info if info is not None else (0, None)
        if self.scope == "process":
            mine = nvml.process_memory(self.index)
            if mine is not None:
                used = mine
        return MemoryReading(time.perf_counter(), int(used), None, total, self.label)


def reader_for(device: torch.device | str, source: str | None = None) -> MemoryReader:
    """The reader for a device (a `torch.device`, a torch name or a devlab name).

    By default: a simulated GPU's accounting while a simulation runs, torch's allocator for
    a real GPU, the process RSS for the CPU. `source` forces one: "simulated", "torch",
    "nvml" (whole device) or "nvml-process", "process".
    """
    dev = resolve_device(device)
    index = 0 if dev.index is None else dev.index
    if source is None:
        if dev.type == "cpu":
            source = "process"
        elif dev.type == "cuda":
            sim = _simulated()
            if sim is not None:
                if index >= sim.device_count():
                    raise ValueError(
                        f"{dev} does not exist: {sim.device_count()} simulated GPU(s)")
                source = "simulated"
            else:
                source = "torch"
        else:
            raise ValueError(f"no memory reader for device type {dev.type!r}")
    if source == "process":
        return ProcessReader()
    if source == "simulated":
        return SimulatedReader(index, device_label(dev))
    if source == "torch":
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ValueError(f"{dev} is not an available CUDA device")
        return TorchCudaReader(index, device_label(dev))
    if source in ("nvml", "nvml-process"):
        if _nvml() is None:
            raise ValueError("NVML is not available (no NVIDIA driver)")
        return NvmlReader(index, "process" if source == "nvml-process" else "device")
    raise ValueError(f"unknown memory source {source!r}")
