"""`Sampler`: one background thread that reads memory readers at a fixed rate into a time
series. Widgets only draw that series; `summary()` and `plot()` report on it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence

import torch

from devlab.memory.chart import MemoryChart
from devlab.memory.readers import MemoryReader, MemoryReading, default_devices, reader_for
from devlab.memory.summary import DeviceSummary, MemorySummary

__all__ = ["Sampler"]


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
