"""`MemoryChart`: memory over time as a matplotlib line chart.

Pure matplotlib (no pyplot, no ipywidgets): `Sampler.plot` draws a finished series with it
and `devlab.widgets.MemoryMonitor` redraws it live.
"""

from __future__ import annotations

from devlab._helpers.figures import figure_png, new_figure
from devlab.core.memory_watch.readers import MemoryReading

__all__ = ["MemoryChart"]


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
    dotted (only where it differs from allocated), NVML's used dash-dotted (a real GPU where
    NVML answers, or a modeled simulated one: what nvidia-smi shows), the device's limit dashed.

    `update(series)` sets the lines' data; `png()` renders. With `live=True` (widgets) the
    axes move in steps and are cached: most renders only redraw the lines over the cached
    background (blitting), a few milliseconds instead of tens. Long series are reduced to
    `max_points` per line keeping each bucket's maximum, so a short spike is never lost.
    """

    def __init__(self, ax=None, size: tuple[float, float] = (7.0, 2.8), dpi: float = 80,
                 show_limit: bool = True, max_points: int = 600, title: str | None = None,
                 live: bool = False) -> None:
        if ax is None:
            self.fig = new_figure(size, dpi)
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
        top = max(max(r.used, r.reserved or 0, r.driver_used or 0,
                      (r.limit or 0) if self.show_limit else 0)
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
            driver = [r.driver_used for r in rs]
            if any(v is not None for v in driver):
                drv = np.array([np.nan if v is None else v for v in driver], float) / scale
                self._line(label, "NVML used", color, lw=1.2, ls="-.").set_data(
                    *self._reduce(t, drv))
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

    def drawn(self) -> list[str]:
        """The lines drawn, named as the legend names them ("GPU:0 (simulated) NVML used")."""
        return [line.get_label() for line in self._lines.values()]

    def __repr__(self) -> str:
        lines = ", ".join(dict.fromkeys(label for label, _ in self._lines)) or "no data yet"
        return f"MemoryChart({lines}{'; live' if self.live else ''})"

    def close(self) -> None:
        """Free the figure's drawing (its artists and a live chart's cached background): a
        finished widget keeps its last PNG, not the figure."""
        self._background = None
        self._frame = None
        self._lines.clear()
        self.fig.clear()

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
