"""Memory readers for every kind of device, and the background `Sampler` that watches them.

A *reader* answers one question, "how much memory does this device hold right now?", as a
`MemoryReading`. There is one small reader class per backend:

- `SimulatedReader`: a simulated GPU's own accounting (`devlab.simulated.memory_stats`);
- `TorchCudaReader`: torch's caching allocator on a real GPU (allocated vs reserved);
- `NvmlReader`: what the driver sees (NVML), for the whole device or this process;
- `ProcessReader`: the resident memory (RSS) of this Python process, for the CPU.

`reader_for(device)` picks the right one. A `Sampler` runs one background thread that reads
its readers at a fixed rate into a time series; widgets only draw that series.

Readers never initialize CUDA: reading the allocator before CUDA started returns zeros, so
watching memory does not fix device settings (see `devlab.runtime`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

__all__ = [
    "MemoryReading",
    "MemoryReader",
    "ProcessReader",
    "TorchCudaReader",
    "SimulatedReader",
    "NvmlReader",
    "reader_for",
    "resolve_device",
    "device_label",
    "default_devices",
    "Sampler",
    "DeviceSummary",
    "MemorySummary",
    "format_bytes",
    "MemoryChart",
    "figure_png",
    "ensure_figure_formatter",
]


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """One look at one device's memory.

    `used` is what is allocated to tensors (or, for NVML and the CPU, what is in use);
    `reserved` is what torch's caching allocator holds from the driver (None where the
    backend has no such notion); `limit` is the most the device can hold: a configured
    memory limit, or the device's total memory (None when unknown or not meaningful).
    `peak` is the backend's own high-water mark, where it keeps one: it catches spikes
    that fall between two samples. `timestamp` is on the `time.perf_counter()` clock.
    """

    timestamp: float
    used: int
    reserved: int | None
    limit: int | None
    label: str
    peak: int | None = None


class MemoryReader(Protocol):
    """Anything with a `label` and a `read()` returning a `MemoryReading`."""

    label: str

    def read(self) -> MemoryReading: ...


# --------------------------------------------------------------------------------------------
# Device names


def resolve_device(device: torch.device | str) -> torch.device:
    """Turn a device name into the `torch.device` work runs on.

    TensorFlow-style names (`/GPU:0`) go through `devlab.scope.resolve`, the one place that
    knows them (and soft placement); torch names and `torch.device` objects are used as is.
    """
    if isinstance(device, torch.device):
        return device
    resolve = _scope_resolve()
    if resolve is not None:
        return resolve(str(device)).device
    return torch.device(device)


def _scope_resolve() -> Callable | None:
    try:
        from devlab import scope
    except ImportError:
        return None
    return getattr(scope, "resolve", None)


def _simulated():
    """The `devlab.simulated` module when a simulation is running, else None."""
    try:
        from devlab import simulated
    except ImportError:
        return None
    is_active = getattr(simulated, "is_active", None)
    if is_active is None or not is_active():
        return None
    return simulated


def _nvml():
    try:
        from devlab import nvml
    except ImportError:
        return None
    available = getattr(nvml, "available", None)
    return nvml if available is not None and available() else None


def device_label(device: torch.device) -> str:
    """A short TensorFlow-style label for charts: `CPU:0`, `GPU:1`, `GPU:0 (simulated)`."""
    if device.type == "cpu":
        return "CPU:0"
    if device.type == "cuda":
        index = 0 if device.index is None else device.index
        return f"GPU:{index}" + (" (simulated)" if _simulated() is not None else "")
    return str(device).upper()


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

    def read(self) -> MemoryReading:
        rss = self._process.memory_info().rss
        return MemoryReading(time.perf_counter(), rss, None, None, self.label)


class TorchCudaReader:
    """A real GPU through torch's caching allocator: allocated, reserved and peak bytes.

    Allocated is what tensors use; reserved is what the allocator keeps from the driver
    (freed tensors go back to the cache, not the driver), so the two differ.
    """

    def __init__(self, index: int, label: str | None = None) -> None:
        self.index = index
        self.label = label or f"GPU:{index}"
        self._total: int | None = None

    def read(self) -> MemoryReading:
        i = self.index
        # These return zeros before CUDA is initialized and never initialize it themselves.
        used = torch.cuda.memory_allocated(i)
        reserved = torch.cuda.memory_reserved(i)
        peak = torch.cuda.max_memory_allocated(i)
        return MemoryReading(time.perf_counter(), used, reserved, self._limit(), self.label, peak)

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
    """A simulated GPU: the bytes of the tensors that live on it, its peak and its limit."""

    def __init__(self, index: int, label: str | None = None) -> None:
        self.index = index
        self.label = label or f"GPU:{index} (simulated)"

    def read(self) -> MemoryReading:
        from devlab import simulated

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

    def read(self) -> MemoryReading:
        from devlab import nvml

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


# --------------------------------------------------------------------------------------------
# The sampler


Callback = Callable[["Sampler"], None]


class Sampler:
    """Reads memory readers from ONE background thread at a fixed rate into a time series.

    >>> with Sampler(["cpu"], interval=0.05) as s:    # 20 Hz, the default
    ...     work()
    >>> print(s.summary())

    A first reading is taken in `start()` and a last one in `stop()`, from the calling
    thread, so the summary's start and end values are exact even for a short cell. The
    context manager stops and joins the thread on any exit, exceptions included.
    Callbacks run in the sampler thread after each round of readings: keep them cheap, and
    throttle them yourself (a widget redraws a few times a second, not at every sample).
    """

    def __init__(
        self,
        devices: Iterable[torch.device | str | MemoryReader] | None = None,
        interval: float = 0.05,
        callbacks: Sequence[Callback] = (),
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, not {interval!r}")
        if devices is None:
            devices = default_devices()
        self.readers: list[MemoryReader] = []
        for d in devices:
            reader = d if hasattr(d, "read") else reader_for(d)  # type: ignore[arg-type]
            # One line per device: the same device named twice ("cuda:0", "/GPU:0") is one.
            if all(r.label != reader.label for r in self.readers):
                self.readers.append(reader)
        if not self.readers:
            raise ValueError("nothing to watch: no devices given")
        self.interval = float(interval)
        self.callbacks: list[Callback] = list(callbacks)
        self.errors: list[BaseException] = []
        self._series: dict[str, list[MemoryReading]] = {r.label: [] for r in self.readers}
        self._base_peaks: dict[str, int | None] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_samples = 0
        self._thread_span: tuple[float, float] = (0.0, 0.0)  # first, last thread sample
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        # CPU time the sampler thread used (readings and callbacks), known once it stopped.
        self.thread_cpu_seconds: float | None = None

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> Sampler:
        """Take a first reading and start the background thread."""
        if self._thread is not None:
            raise RuntimeError("this Sampler was already started; make a new one")
        self.started_at = time.perf_counter()
        for reading in self._read_all():
            self._base_peaks[reading.label] = reading.peak
        self._thread = threading.Thread(target=self._run, name="devlab-memory-sampler",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop and join the thread, then take a last reading. Safe to call twice."""
        if self._thread is None or self.stopped_at is not None:
            return
        self._stop.set()
        self._thread.join()
        self._read_all()
        self.stopped_at = time.perf_counter()
        self._notify()  # one last draw with the final reading

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_callback(self, callback: Callback) -> None:
        self.callbacks.append(callback)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        # Deadlines on a fixed grid keep the rate steady: a slow round (a redraw) delays one
        # sample, and the next ones catch up instead of drifting.
        try:
            self._loop()
        finally:
            self.thread_cpu_seconds = time.thread_time()

    def _loop(self) -> None:
        next_at = time.perf_counter() + self.interval
        while not self._stop.wait(max(0.0, next_at - time.perf_counter())):
            readings = self._read_all()
            if readings:
                self._thread_samples += 1
                self._thread_span = (self._thread_span[0] or readings[0].timestamp,
                                     readings[0].timestamp)
            self._notify()
            next_at += self.interval
            now = time.perf_counter()
            if next_at < now:  # fell more than one interval behind: skip, do not burst
                next_at = now + self.interval

    def _read_all(self) -> list[MemoryReading]:
        readings = []
        for reader in self.readers:
            try:
                readings.append(reader.read())
            except Exception as e:  # noqa: BLE001 - one failing backend must not stop the watch
                if len(self.errors) < 10:
                    self.errors.append(e)
        with self._lock:
            for r in readings:
                self._series[r.label].append(r)
        return readings

    def _notify(self) -> None:
        for callback in list(self.callbacks):
            try:
                callback(self)
            except Exception as e:  # noqa: BLE001 - a broken chart must not stop the sampling
                self.callbacks.remove(callback)
                if len(self.errors) < 10:
                    self.errors.append(e)

    # -- results ---------------------------------------------------------------------------

    def series(self) -> dict[str, list[MemoryReading]]:
        """A copy of the time series so far, per device label (safe from any thread)."""
        with self._lock:
            return {label: list(rs) for label, rs in self._series.items()}

    def rate(self) -> float:
        """Rounds of readings per second the thread achieved (0 before two of them)."""
        first, last = self._thread_span
        if self._thread_samples < 2 or last <= first:
            return 0.0
        return (self._thread_samples - 1) / (last - first)

    def summary(self) -> MemorySummary:
        """Start, peak and end of each device over the watch."""
        devices = []
        for label, readings in self.series().items():
            if not readings:
                continue
            peak = max(r.used for r in readings)
            base_peak = self._base_peaks.get(label)
            last_peak = readings[-1].peak
            # The backend's high-water mark catches spikes between samples; it counts from
            # its last reset, so it only tells about this watch if it rose during it.
            if base_peak is not None and last_peak is not None and last_peak > base_peak:
                peak = max(peak, last_peak)
            devices.append(DeviceSummary(
                label=label,
                start=readings[0].used,
                peak=peak,
                end=readings[-1].used,
                limit=readings[-1].limit,
                reserved_end=readings[-1].reserved,
                samples=len(readings),
            ))
        start, stop = self.started_at or 0.0, self.stopped_at or time.perf_counter()
        return MemorySummary(devices, stop - start, self.rate())

    def plot(self, ax=None):
        """The series so far as a matplotlib `Figure` (see `MemoryChart`)."""
        chart = MemoryChart(ax=ax)
        chart.update(self.series(), self.started_at)
        return chart.fig


# --------------------------------------------------------------------------------------------
# Summaries


def format_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB' (binary units, as nvidia-smi and torch report)."""
    if n is None:
        return "—"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "") + format_bytes(n)


@dataclass(frozen=True)
class DeviceSummary:
    """One device over one watch. Bytes throughout."""

    label: str
    start: int
    peak: int
    end: int
    limit: int | None
    reserved_end: int | None
    samples: int

    @property
    def growth(self) -> int:
        """What the watched code left behind: end minus start."""
        return self.end - self.start

    @property
    def peak_increase(self) -> int:
        """How far above its starting point the device went."""
        return self.peak - self.start

    @property
    def held(self) -> int:
        """Still held at the end."""
        return self.end

    def line(self) -> str:
        text = (f"{self.label}: peak {format_bytes(self.peak)} ({_signed(self.peak_increase)}),"
                f" growth {_signed(self.growth)}, still held {format_bytes(self.held)}")
        if self.reserved_end is not None and self.reserved_end != self.end:
            text += f" (reserved {format_bytes(self.reserved_end)})"
        if self.limit:
            text += f", limit {format_bytes(self.limit)} ({self.peak / self.limit:.0%} at peak)"
        return text


@dataclass(frozen=True)
class MemorySummary:
    """Per-device start/peak/end of a watch, as text (`str`) or HTML."""

    devices: list[DeviceSummary]
    duration: float
    rate: float

    def __getitem__(self, label: str) -> DeviceSummary:
        for d in self.devices:
            if d.label == label:
                return d
        raise KeyError(label)

    def __str__(self) -> str:
        return "\n".join(d.line() for d in self.devices)

    def _repr_html_(self) -> str:
        from html import escape

        rows = "".join(
            "<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in (
                d.label, format_bytes(d.start), format_bytes(d.peak), _signed(d.growth),
                format_bytes(d.held), format_bytes(d.limit))) + "</tr>"
            for d in self.devices)
        head = "".join(f"<th>{h}</th>" for h in
                       ("device", "start", "peak", "growth", "still held", "limit"))
        return (f"<table class='devlab-memory-summary'><thead><tr>{head}</tr></thead>"
                f"<tbody>{rows}</tbody></table>"
                f"<small>{self.duration:.2f} s watched, {self.rate:.0f} samples/s</small>")

    def __repr__(self) -> str:
        return str(self)


# --------------------------------------------------------------------------------------------
# Charts (pure matplotlib: used by `Sampler.plot` and drawn live by devlab.widgets)


def figure_png(fig, dpi: float | None = None) -> bytes:
    """Render a matplotlib figure to PNG bytes with Agg, without pyplot.

    Safe from a background thread as long as no other thread draws the same figure.
    """
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    buf = io.BytesIO()
    canvas.print_png(buf) if dpi is None else fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def ensure_figure_formatter() -> None:
    """Let a bare matplotlib `Figure` show as an image when it is a cell's value.

    pyplot's inline backend registers this when pyplot is first used; devlab draws without
    pyplot, so it registers the same PNG formatter when none is there yet.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None:
        return
    from matplotlib.figure import Figure

    png = ip.display_formatter.formatters["image/png"]
    try:
        png.lookup_by_type(Figure)
    except KeyError:
        from functools import partial

        from IPython.core.pylabtools import print_figure

        png.for_type(Figure, partial(print_figure, fmt="png", base64=True))


_UNITS = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024), ("B", 1))


def _nice_above(x: float, steps: tuple[float, ...] = (1, 1.5, 2, 3, 5, 7.5)) -> float:
    """The smallest of `steps` x 10^k at or above x: axis limits that move in steps, so a
    live chart redraws its axes (a full render, ~10x a frame's cost) rarely."""
    import math

    if x <= 0:
        return 1.0
    k = math.floor(math.log10(x))
    for m in (*steps, 10):
        if m * 10**k >= x:
            return m * 10**k
    return 10 ** (k + 1)


class MemoryChart:
    """A line chart of memory over time: one color per device, allocated solid, reserved
    dotted (only where it differs from allocated), the device's limit dashed.

    `update(series)` sets the lines' data; `png()` renders. With `live=True` (widgets) the
    axes move in steps and are cached: most renders only redraw the lines over the cached
    background (blitting), a few milliseconds instead of tens. Long series are reduced to
    `max_points` per line keeping each bucket's maximum, so a short spike is never lost.
    """

    def __init__(self, ax=None, size: tuple[float, float] = (7.0, 2.8), dpi: float = 80,
                 show_limit: bool = True, max_points: int = 600, title: str | None = None,
                 live: bool = False) -> None:
        if ax is None:
            from matplotlib.figure import Figure

            ensure_figure_formatter()
            self.fig = Figure(figsize=size, dpi=dpi)
            self.ax = self.fig.add_subplot()
            # Fixed margins rather than tight_layout, which costs a second render.
            self.fig.subplots_adjust(left=0.11, right=0.98, bottom=0.17, top=0.9)
        else:
            if live:
                raise ValueError("a live chart draws its own figure; do not pass ax")
            self.fig, self.ax = ax.figure, ax
        self.show_limit = show_limit
        self.max_points = max_points
        self.live = live
        self._lines: dict[tuple[str, str], object] = {}
        self._frame: tuple | None = None  # what the cached background shows
        self._background = None
        self.full_draws = 0
        self.ax.set_xlabel("time (s)")
        self.ax.grid(True, alpha=0.3)
        if title:
            self.ax.set_title(title, fontsize=10)

    def _line(self, label: str, kind: str, color: str, **style):
        key = (label, kind)
        line = self._lines.get(key)
        if line is None:
            name = label if kind == "used" else f"{label} {kind}"
            # Limit lines are static: part of the cached background. Data lines are
            # "animated": left out of the background and drawn over it at each render.
            animated = self.live and kind != "limit"
            (line,) = self.ax.plot([], [], color=color, label=name, animated=animated, **style)
            self._lines[key] = line
        return line

    def update(self, series: dict[str, list[MemoryReading]], t0: float | None = None,
               final: bool = False) -> None:
        """Set the lines from a series (as `Sampler.series()` returns).

        `final=True` fits the axes to the data (a live chart's axes otherwise move in steps).
        """
        import numpy as np

        readings = [r for rs in series.values() for r in rs]
        if not readings:
            return
        if t0 is None:
            t0 = min(r.timestamp for r in readings)
        top = max(max(r.used, r.reserved or 0, (r.limit or 0) if self.show_limit else 0)
                  for r in readings)
        unit, scale = next((u, s) for u, s in _UNITS if top >= s or s == 1)
        t_end = 0.0
        limits = []
        for i, (label, rs) in enumerate(series.items()):
            if not rs:
                continue
            color = f"C{i % 10}"
            t = np.fromiter((r.timestamp - t0 for r in rs), float, len(rs))
            used = np.fromiter((r.used for r in rs), float, len(rs)) / scale
            t_end = max(t_end, float(t[-1]))
            self._line(label, "used", color, lw=1.8).set_data(*self._reduce(t, used))
            reserved = [r.reserved for r in rs]
            if any(v is not None and v != r.used for v, r in zip(reserved, rs, strict=True)):
                res = np.array([np.nan if v is None else v for v in reserved], float) / scale
                self._line(label, "reserved", color, lw=1.2, ls=":").set_data(
                    *self._reduce(t, res))
            limit = rs[-1].limit
            if self.show_limit and limit:
                # Spans any x range; the axes clip it.
                self._line(label, "limit", color, lw=1.2, ls="--", alpha=0.8).set_data(
                    [0, 1e12], [limit / scale] * 2)
                limits.append((label, limit))
        if self.live and not final:
            # Time only grows: coarse steps (2, 5, 10, 20 s...) keep its redraws few.
            xmax = _nice_above(max(t_end, 1.0) * 1.05, (1, 2, 5))
            ymax = _nice_above(top / scale * 1.1)
        else:
            xmax, ymax = max(t_end, 1.0) * 1.02, max(top / scale, 1e-9) * 1.1
        frame = (xmax, ymax, unit, tuple(self._lines), tuple(limits))
        if frame != self._frame:
            self.ax.set_xlim(0, xmax)
            self.ax.set_ylim(0, ymax)
            self.ax.set_ylabel(f"memory ({unit})")
            self.ax.legend(loc="upper left", fontsize=8)
            self._frame = frame
            self._background = None

    def _reduce(self, t, y):
        n = len(t)
        if n <= self.max_points:
            return t, y
        import numpy as np

        size = -(-n // self.max_points)  # ceil: points per bucket
        pad = (-n) % size
        t_b = np.concatenate([t, np.full(pad, t[-1])]).reshape(-1, size)[:, -1]
        y_b = np.concatenate([y, np.full(pad, np.nan)]).reshape(-1, size)
        # fmax ignores the NaN padding (and NaN gaps) without warnings.
        return t_b, np.fmax.reduce(y_b, axis=1)

    def png(self) -> bytes:
        """The chart as PNG bytes."""
        if not self.live:
            return figure_png(self.fig)
        import io

        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from PIL import Image

        canvas = self.fig.canvas
        if not isinstance(canvas, FigureCanvasAgg):
            canvas = FigureCanvasAgg(self.fig)
        if self._background is None:
            canvas.draw()  # everything but the animated lines
            self._background = canvas.copy_from_bbox(self.fig.bbox)
            self.full_draws += 1
        else:
            canvas.restore_region(self._background)
        for (_, kind), line in self._lines.items():
            if kind != "limit":
                self.ax.draw_artist(line)
        w, h = canvas.get_width_height(physical=True)
        image = Image.frombuffer("RGBA", (w, h), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        buf = io.BytesIO()
        # Fast compression: a live frame is replaced within a second.
        image.save(buf, format="png", compress_level=1)
        return buf.getvalue()
