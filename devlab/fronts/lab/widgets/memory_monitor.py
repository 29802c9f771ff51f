"""`MemoryMonitor`: a live chart of device memory while code runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from html import escape

import ipywidgets
import torch

from devlab.core.memory_watch import MemoryChart, MemoryReader, MemorySummary, Sampler, format_bytes
from devlab.core.memory_watch.sampler import check_interval
from devlab.fronts.lab.widgets._live import LiveWidget, StaticView, img, png_of
from devlab.fronts.lab.widgets._output import show_png


class MemoryMonitor(LiveWidget, ipywidgets.VBox):
    """A live line chart of memory per device, and a short summary when it stops.

    >>> with MemoryMonitor(["/GPU:0", "/CPU:0"]):   # shows itself, starts sampling
    ...     train()                                 # the chart grows while this runs
    >>> # on exit (errors included) sampling stops, and the widget gives way to its final
    >>> # state (status, chart, summary) as static output: no widget is left in the kernel

    Or `mon = MemoryMonitor(...)`, `mon.display_live()`, `mon.start()`, `mon.stop()`, `mon.release()`.
    `show_summary=False` leaves the summary out of the widget (`stop()` returns it).

    One background thread (a `devlab.memory.Sampler`) reads memory every `interval` seconds
    and redraws the chart at most every `redraw_interval` seconds, and never spends more than
    about 2% of its time drawing (a slow machine gets fewer frames, not a slower cell).
    """

    def __init__(
        self,
        devices: Iterable[torch.device | str | MemoryReader] | None = None,
        *,
        interval: float = 0.05,
        redraw_interval: float = 0.25,
        title: str | None = None,
        show_limit: bool = True,
        show_summary: bool = True,
        **kwargs,
    ) -> None:
        # Build the sampler first: a bad device name fails here, before anything is shown.
        self.sampler = Sampler(devices, interval=interval)
        self.redraw_interval = check_interval(redraw_interval, "redraw_interval")
        self.show_summary = show_summary
        self.chart = MemoryChart(title=title, show_limit=show_limit, live=True)
        self._status = ipywidgets.HTML(value=self._status_text("ready"))
        self._chart = ipywidgets.Output()
        self._summary = ipywidgets.HTML(value="")
        self._draw_lock = threading.Lock()  # one frame at a time: a Figure is not thread-safe
        self._last_draw = 0.0
        self._draw_cost = 0.0
        self.draws = 0
        self._alt = "memory chart: " + ", ".join(r.label for r in self.sampler.readers)
        super().__init__(children=[self._status, self._chart, self._summary], **kwargs)

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> MemoryMonitor:
        """Start sampling and drawing."""
        self.sampler.start()
        # The first frame lays out the axes (the costly part) here, before the watched code
        # runs; the sampler thread draws only once it is done, so never at the same time.
        self.redraw()
        self._last_draw = time.perf_counter()
        self.sampler.add_callback(self._on_sample)
        return self

    def stop(self) -> MemorySummary:
        """Stop sampling (joins the thread), draw the last frame, show and return the summary."""
        self.sampler.stop()
        summary = self.sampler.summary()
        self._status.value = self._status_text("stopped", self.sampler.series())
        if self.show_summary:
            self._summary.value = (
                "<pre style='margin:2px 0;font-size:90%'>" + escape(str(summary)) + "</pre>")
        return summary

    @property
    def summary(self) -> MemorySummary:
        return self.sampler.summary()

    def __enter__(self) -> MemoryMonitor:
        self.display_live()
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self.release()

    def __repr__(self) -> str:
        return f"MemoryMonitor({', '.join(r.label for r in self.sampler.readers)})"

    def static(self) -> StaticView:
        """The status line, the last frame of the chart and (with `show_summary`) the summary,
        as static HTML."""
        html = (f"<div class='devlab-memory-monitor'><div>{self._status.value}</div>"
                f"{img(png_of(self._chart), self._alt)}"
                + (f"<div>{self._summary.value}</div>" if self._summary.value else "") + "</div>")
        return StaticView(html, repr(self))

    def _released(self) -> None:
        with self._draw_lock:
            self.chart.close()

    # -- drawing (in the sampler thread) ---------------------------------------------------

    def _on_sample(self, sampler: Sampler) -> None:
        now = time.perf_counter()
        final = sampler.stopped_at is not None
        # Throttle: at most one frame per redraw_interval, and drawing at most ~2% of the
        # time (by a running average: the first frame, which lays out the axes, is slow).
        wait = min(2.0, max(self.redraw_interval, 50 * self._draw_cost))
        if not final and now - self._last_draw < wait:
            return
        self._last_draw = now
        self.redraw()
        cost = time.perf_counter() - now
        self._draw_cost = 0.7 * self._draw_cost + 0.3 * cost

    def redraw(self) -> None:
        """Draw the series as it is now (the sampler thread calls this; so may you)."""
        with self._draw_lock:
            series = self.sampler.series()
            self.chart.update(series, self.sampler.started_at,
                              final=self.sampler.stopped_at is not None)
            # The image's text names the lines it draws, as its legend does: what a screen
            # reader says, and what a test reads.
            self._alt = "memory chart: " + ", ".join(self.chart.drawn() or series)
            show_png(self._chart, self.chart.png(), self._alt)
            if self.sampler.stopped_at is None:
                self._status.value = self._status_text("watching", series)
            self.draws += 1

    def _status_text(self, state: str, series=None) -> str:
        parts = []
        for reader in self.sampler.readers:
            rs = (series or {}).get(reader.label)
            if rs:
                r = rs[-1]
                now = format_bytes(r.used) + (f" of {format_bytes(r.limit)}" if r.limit else "")
                parts.append(f"<b>{escape(reader.label)}</b> {now}")
            else:
                parts.append(f"<b>{escape(reader.label)}</b>")
        rate = f"every {self.sampler.interval * 1000:.0f} ms"
        return (f"<span style='font-size:90%'>memory ({state}, {rate}): "
                + " · ".join(parts) + "</span>")
