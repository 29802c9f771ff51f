"""Memory of every kind of device, and the background `Sampler` that watches it.

- `devlab.core.memory_watch.readers`: a *reader* per backend answers "how much memory does this device
  hold right now?" as a `MemoryReading` (simulated accounting, torch's allocator, NVML, the
  process RSS); `reader_for(device)` picks one.
- `devlab.core.memory_watch.sampler`: `Sampler` reads its readers from one background thread at a
  fixed rate into a time series.
- `devlab.core.memory_watch.summary`: start/peak/end per device (`MemorySummary`), shown with
  `devlab._helpers.sizes.format_bytes` (also importable from here).
- `devlab.core.memory_watch.memory_chart`: `MemoryChart`, the matplotlib chart `Sampler.plot` and the
  `MemoryMonitor` widget draw.
- `devlab.core.memory_watch.allocation_timeline`: `timeline(snapshot)`, an `AllocationTimeline` of every allocation
  and free a trace in `torch.cuda.memory._snapshot()`'s format recorded, with the user's line
  behind each (self-contained SVG, plot, top lines at the peak, export for PyTorch's viewer).
- `devlab.core.memory_watch.fresh_process`: `run_fresh(fn, growth=False, model="T4")` runs a function in a new
  process under memory settings this one can no longer change, and returns its readings.

Every public name is importable from `devlab.memory` itself.
"""

from __future__ import annotations

from devlab._helpers.figures import ensure_figure_formatter, figure_png
from devlab.core.memory_watch.allocation_timeline import (
    Allocation,
    AllocationTimeline,
    LineUsage,
    Peak,
    is_user_file,
    timeline,
)
from devlab.core.memory_watch.fresh_process import FreshRun, run_fresh
from devlab.core.memory_watch.memory_chart import MemoryChart
from devlab.core.memory_watch.readers import (
    MemoryReader,
    MemoryReading,
    NvmlReader,
    PeakWindow,
    ProcessReader,
    SimulatedReader,
    TorchCudaReader,
    default_devices,
    reader_for,
)
from devlab.core.memory_watch.sampler import MAX_INTERVAL, MIN_INTERVAL, Sampler, check_interval
from devlab.core.memory_watch.summary import DeviceSummary, MemorySummary, format_bytes

__all__ = [
    "MemoryReading",
    "MemoryReader",
    "ProcessReader",
    "TorchCudaReader",
    "SimulatedReader",
    "NvmlReader",
    "reader_for",
    "default_devices",
    "PeakWindow",
    "Sampler",
    "check_interval",
    "MIN_INTERVAL",
    "MAX_INTERVAL",
    "DeviceSummary",
    "MemorySummary",
    "format_bytes",
    "MemoryChart",
    "figure_png",
    "ensure_figure_formatter",
    "timeline",
    "AllocationTimeline",
    "Allocation",
    "LineUsage",
    "Peak",
    "is_user_file",
    "run_fresh",
    "FreshRun",
]
