"""`TimingChart`: a device timing comparison that fills in as each device finishes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from html import escape
from typing import Any

import ipywidgets
import torch

from devlab._helpers.figures import figure_png
from devlab.core.timing import Comparison, TimingResult, compare
from devlab.fronts.lab.widgets._live import LiveWidget, StaticView, img, png_of
from devlab.fronts.lab.widgets._output import show_png


class TimingChart(LiveWidget, ipywidgets.VBox):
    """A progress bar while timing runs, then a bar chart and a table with speed-ups.

    >>> TimingChart.run(lambda: x @ x, ["/CPU:0", "/GPU:0"])   # shows itself and times

    Or build one for `n` devices, `display_live()` it, feed it `add(result)` / `progress(fraction)`,
    and `release()` it when done: its final state stays as static output, and no widget is
    left in the kernel.
    """

    def __init__(self, devices: int = 1, *, title: str | None = None, show_table: bool = True,
                 **kwargs) -> None:
        self.comparison = Comparison()
        self.show_table = show_table
        self.expected = max(1, int(devices))
        self.title = title
        self._progress = ipywidgets.IntProgress(value=0, min=0, max=100 * self.expected,
                                                description="timing")
        self._label = ipywidgets.Label(value="")
        self._chart = ipywidgets.Output()
        self._table = ipywidgets.HTML(value="")
        header = ipywidgets.HBox(children=[self._progress, self._label])
        super().__init__(children=[header, self._chart, self._table], **kwargs)

    def starting(self, name: str) -> None:
        """Say which device is being timed now."""
        done = len(self.comparison.results)
        self._label.value = f"{name} ({done + 1}/{self.expected})"

    def stopped(self, why: str) -> None:
        """Timing ended early (an error in the timed code): say so."""
        self._label.value = why

    def progress(self, fraction: float) -> None:
        """Progress of the device being timed, 0 to 1 (for `time_on_device(progress=...)`)."""
        done = len(self.comparison.results)
        self._progress.value = min(self._progress.max, int(100 * (done + fraction)))

    def add(self, result: TimingResult) -> None:
        """One more device finished: redraw the chart and the table."""
        self.comparison.add(result)
        self.show(self.comparison)

    def show(self, comparison: Comparison) -> None:
        """Show a whole comparison."""
        self.comparison = comparison
        done = len(comparison.results)
        self.expected = max(self.expected, done)
        self._progress.max = 100 * self.expected
        self._progress.value = 100 * done
        if done >= self.expected:
            self._label.value = f"done: {done} device{'s' if done != 1 else ''}"
        if comparison.results:
            fig = comparison.plot()
            if self.title:
                fig.suptitle(self.title, fontsize=10)
            show_png(self._chart, figure_png(fig), escape(str(comparison)))
            if self.show_table:
                self._table.value = comparison._repr_html_()

    def __repr__(self) -> str:
        return f"TimingChart({', '.join(r.label for r in self.comparison.results)})"

    def static(self) -> StaticView:
        """The progress, the label, the chart and the table as static HTML."""
        bar = (f"<progress class='devlab-progress' value='{self._progress.value}' "
               f"max='{self._progress.max}'></progress>")
        html = (f"<div class='devlab-timing-chart'><div>{bar} {escape(self._label.value)}</div>"
                f"{img(png_of(self._chart), 'timing chart')}{self._table.value}</div>")
        return StaticView(html, repr(self) + (f"\n{self.comparison}" if self.comparison.results else ""))

    @classmethod
    def run(
        cls,
        fn: Callable[[], Any] | Mapping[Any, Callable[[], Any]],
        devices: Iterable[torch.device | str] | None = None,
        *,
        title: str | None = None,
        display: bool = True,
        **timing: Any,
    ) -> TimingChart:
        """Show a chart, then time `fn` on each device (see `devlab.timing.compare`). When
        the timing ends (errors included), a displayed chart gives way to its final state."""
        if isinstance(fn, Mapping):
            pairs = list(fn.items())
        elif devices is None:
            raise TypeError("TimingChart.run(fn, devices): which devices?")
        else:
            pairs = [(d, fn) for d in devices]
        chart = cls(len(pairs), title=title)
        if display:
            chart.display_live()
        try:
            for device, f in pairs:
                chart.starting(str(device))
                one = compare({device: f}, progress=chart.progress, **timing)
                chart.add(one.results[0])
        finally:
            if display:
                chart.release()
        return chart
