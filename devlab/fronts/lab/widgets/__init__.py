"""Live widgets: `MemoryMonitor` (memory over time) and `TimingChart` (device timings).

Built only from core ipywidgets controls (VBox, HTML, Output, IntProgress) and matplotlib
PNGs, so they work with ipywidgets 7.7 (Colab) and 8. They draw what the core computes
(`devlab.memory`, `devlab.timing`) and hold no logic of their own.
"""

from __future__ import annotations

from devlab.fronts.lab.widgets.memory_monitor import MemoryMonitor
from devlab.fronts.lab.widgets.timing_chart import TimingChart

__all__ = ["MemoryMonitor", "TimingChart"]
