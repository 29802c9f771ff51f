"""`Sampler`: one background thread that reads memory readers at a fixed rate into a time
series. Widgets only draw that series; `summary()` and `plot()` report on it."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import torch

from devlab.core.memory_watch.memory_chart import MemoryChart
from devlab.core.memory_watch.readers import (
    MemoryReader,
    MemoryReading,
    PeakWindow,
    default_devices,
    reader_for,
)
from devlab.core.memory_watch.summary import DeviceSummary, MemorySummary

__all__ = ["Sampler", "check_interval", "MIN_INTERVAL", "MAX_INTERVAL"]


Callback = Callable[["Sampler"], None]

# The shortest interval: a thread waking more often than every millisecond only takes the CPU
# from the code it watches (a reading of NVML alone can take that long). The longest: the
# longest wait a thread can make (threading.TIMEOUT_MAX, about 292 years on Linux); start and
# stop still take their readings.
MIN_INTERVAL = 0.001
MAX_INTERVAL = threading.TIMEOUT_MAX
_UNITS = {"s": 1.0, "ms": 0.001}


def check_interval(value: object, name: str = "interval", unit: str = "s") -> float:
    """`value` (in `unit`, "s" or "ms") in seconds, if it is an interval a `Sampler` can keep,
    from `MIN_INTERVAL` to `MAX_INTERVAL`; else a `ValueError` naming `name`, in `unit`."""
    scale = _UNITS[unit]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} is a number of {'seconds' if unit == 's' else 'milliseconds'}, "
                        f"not {type(value).__name__}.")
    try:
        seconds = float(value) * scale
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if not MIN_INTERVAL <= seconds <= MAX_INTERVAL:  # also False for NaN
        if isinstance(value, float):
            shown = f"{value:g}"
        else:
            shown = f"{value:,}" if value.bit_length() <= 64 else f"a number of {value.bit_length():,} bits"
        raise ValueError(
            f"{name} is the time between two readings in {unit}, from {MIN_INTERVAL / scale:g} "
            f"(faster only takes the CPU from the cell being watched) to "
            f"{MAX_INTERVAL / scale:,.0f} (the longest a thread can wait); got {shown}."
        )
    return seconds


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
        interval = check_interval(interval)
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
        self.interval = interval
        self.callbacks: list[Callback] = list(callbacks)
        for callback in self.callbacks:
            if not callable(callback):
                raise TypeError(f"each callback is a function of the Sampler, not {callback!r}.")
        self.errors: list[BaseException] = []
        self._series: dict[str, list[MemoryReading]] = {r.label: [] for r in self.readers}
        self._base_peaks: dict[str, int | None] = {}
        self._windows: dict[str, PeakWindow] = {}  # exact peaks, where a reader keeps them
        self._window_peaks: dict[str, int] = {}  # their final values, once stopped
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
        for reader in self.readers:
            open_peak = getattr(reader, "open_peak", None)
            if open_peak is not None:
                try:
                    self._windows[reader.label] = open_peak()
                except Exception as e:  # noqa: BLE001 - the sampled peak is still there
                    self._note(e)
        for reading in self._read_all():
            self._base_peaks[reading.label] = reading.peak
        self._thread = threading.Thread(target=self._run, name="devlab-memory-sampler",
                                        daemon=True)
        try:
            self._thread.start()
        except BaseException:
            self._close_windows()
            raise
        return self

    def stop(self) -> None:
        """Stop and join the thread, then take a last reading. Safe to call twice."""
        if self._thread is None or self.stopped_at is not None:
            return
        self._stop.set()
        self._thread.join()
        self._read_all()
        self._close_windows()
        self.stopped_at = time.perf_counter()
        self._notify()  # one last draw with the final reading

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __repr__(self) -> str:
        labels = ", ".join(r.label for r in self.readers)
        samples = max((len(rs) for rs in self.series().values()), default=0)
        if self.started_at is None:
            state = "not started"
        elif self.stopped_at is None:
            state = f"running for {time.perf_counter() - self.started_at:.2f} s, {samples} samples"
        else:
            state = f"stopped after {self.stopped_at - self.started_at:.2f} s, {samples} samples"
        return f"Sampler({labels}; every {self.interval * 1000:g} ms; {state})"

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

    def _close_windows(self) -> None:
        for label, window in self._windows.items():
            self._window_peaks[label] = window.peak
            window.close()
        self._windows.clear()

    def _note(self, error: BaseException) -> None:
        if len(self.errors) < 10:
            self.errors.append(error)

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
            at_least = False
            exact = self._window_peaks.get(label)
            if exact is None and label in self._windows:
                exact = self._windows[label].peak
            base_peak = self._base_peaks.get(label)
            last_peak = readings[-1].peak
            if exact is not None:
                peak = max(peak, exact)
            elif base_peak is not None and last_peak is not None:
                # A high-water mark the backend keeps from its last reset (torch's allocator):
                # if it rose during the watch, the watch reached it; if not, and it stands above
                # every sample, a spike between samples would not show: the peak is "at least".
                if last_peak > base_peak:
                    peak = max(peak, last_peak)
                else:
                    at_least = base_peak > peak
            devices.append(DeviceSummary(
                label=label,
                start=readings[0].used,
                peak=peak,
                end=readings[-1].used,
                limit=readings[-1].limit,
                reserved_end=readings[-1].reserved,
                samples=len(readings),
                peak_at_least=at_least,
            ))
        start, stop = self.started_at or 0.0, self.stopped_at or time.perf_counter()
        return MemorySummary(devices, stop - start, self.rate())

    def plot(self, ax=None):
        """The series so far as a matplotlib `Figure` (see `MemoryChart`)."""
        chart = MemoryChart(ax=ax)
        chart.update(self.series(), self.started_at)
        return chart.fig
