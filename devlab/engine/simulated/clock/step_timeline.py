"""`timeline(fn)`: one step's modeled timeline per GPU: kernels, collectives, what overlapped
and what waited.

Each modeled GPU has two streams on the clock (`clock.Clock`): its queue, where kernels and
copies run, and NCCL's communication stream, where collectives run. While `fn` runs, the clock
records when each stream ran what (`clock.Span`), and three kinds of waiting:

- *waits for the slowest rank*: a collective starts on every rank when the last one reaches it
  (NCCL's kernels wait for each other), so a rank that came early waits on its comm stream;
- *waits for a collective*: the queue waits for a collective's result (a blocking call,
  `work.wait()`, DDP's reducer at the end of the backward pass);
- *waits for the host*: the queue is idle until the host launches its next work (an input
  stall, a host-bound loop: the host's time follows the wall clock outside the simulation).

Per GPU the numbers add up by construction: the communication is the part hidden behind compute
(`overlap`) plus the part that is not (`exposed`), and the step is compute + exposed
communication + `idle` (neither stream busy: the host still launching, or waiting for another
rank). In a distributed run each rank records its own GPU; `Timeline.merge` puts the ranks'
timelines together (their clocks agree at every collective). Pure data once recorded, so a rank
can return it to the notebook; shown as text or as a self-contained SVG drawn by matplotlib
(devlab._helpers.figures: hover by `<title>`, no script).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from html import escape
from typing import Any, NamedTuple

from devlab.engine.gpu_model.modeled_clock import (
    COLLECTIVE,
    COMM,
    COMPUTE,
    COPY_SPAN,
    KERNEL,
    WAIT_COMM,
    WAIT_HOST,
    WAIT_RANKS,
    Span,
)
from devlab.engine.simulated.clock.charges import record
from devlab.engine.simulated.clock.explain import machine


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals merged where they touch or overlap, in order."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _intersection(xs: Sequence[tuple[float, float]], ys: Sequence[tuple[float, float]]) -> float:
    """Seconds where two unions of intervals both hold."""
    total, i, j = 0.0, 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            total += b - a
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


class GpuStep(NamedTuple):
    """One GPU's share of the step (seconds): `step` = `compute` + `exposed` + `idle`, and
    `communication` = `overlap` + `exposed`."""

    device: int
    step: float  # from the timeline's start to this GPU's last work
    compute: float  # its queue busy with kernels and copies
    communication: float  # its comm stream busy with collectives
    overlap: float  # communication hidden behind compute
    exposed: float  # communication while the queue had nothing to run
    idle: float  # neither stream busy: waiting for the host's launches or for another rank
    waited_for_ranks: float  # its comm stream waiting for the slowest rank
    waited_for_comm: float  # its queue waiting for a collective's result
    kernels: int
    collectives: int
    waited_for_host: float = 0.0  # its queue idle until the host launched the next work


@dataclasses.dataclass
class Timeline:
    """What each modeled GPU's two streams did during some work (`spans`, seconds on the
    modeled clock), from `start` (the host's time when it began). Modeled, not measured.

    `gpus()` gives each GPU's `GpuStep`; `str()` a summary and the collectives; the HTML
    form draws each GPU's compute and communication streams as lanes."""

    gpu: str  # the full name of the GPU modeled
    spans: list[Span]
    start: float
    machine: str = ""
    result: Any = None

    @classmethod
    def merge(cls, timelines: Sequence[Timeline]) -> Timeline:
        """The timelines of a distributed run's ranks (each its own GPU's) as one: their
        clocks agree at every collective, so they share one time axis."""
        if not timelines or not all(isinstance(t, Timeline) for t in timelines):
            raise TypeError("Timeline.merge takes a list of Timelines, e.g. the values "
                            "devlab.launch returns when each rank returns "
                            f"devlab.simulated.timeline(step); got {timelines!r:.200}")
        seen: dict[int, int] = {}
        for k, t in enumerate(timelines):
            for d in t.devices():
                if d in seen:
                    raise ValueError(f"timelines {seen[d]} and {k} both hold GPU:{d}: merge the "
                                     "timelines of ranks that each use their own GPU")
                seen[d] = k
        if len({t.gpu for t in timelines}) > 1:
            raise ValueError("timelines of different modeled GPUs: "
                             f"{sorted({t.gpu for t in timelines})}")
        spans = [s for t in timelines for s in t.spans]
        return cls(timelines[0].gpu, spans, min(t.start for t in timelines),
                   timelines[0].machine, [t.result for t in timelines])

    def devices(self) -> list[int]:
        return sorted({s.device for s in self.spans})

    @property
    def end(self) -> float:
        """When the last stream is done."""
        return max((s.end for s in self.spans), default=self.start)

    @property
    def seconds(self) -> float:
        """The step: from the start to the last GPU's last work."""
        return self.end - self.start

    def gpu_step(self, device: int) -> GpuStep:
        """GPU `device`'s share of the step."""
        mine = [s for s in self.spans if s.device == device]
        compute = _union((s.start, s.end) for s in mine if s.kind in (KERNEL, COPY_SPAN))
        comm = _union((s.start, s.end) for s in mine if s.kind == COLLECTIVE)
        step = max((s.end for s in mine), default=self.start) - self.start
        busy, talking = _length(compute), _length(comm)
        overlap = _intersection(compute, comm)
        exposed = talking - overlap
        return GpuStep(device, step, busy, talking, overlap, exposed,
                       max(0.0, step - busy - exposed),
                       sum(s.end - s.start for s in mine if s.kind == WAIT_RANKS),
                       sum(s.end - s.start for s in mine if s.kind == WAIT_COMM),
                       sum(s.kind == KERNEL for s in mine),
                       sum(s.kind == COLLECTIVE for s in mine),
                       sum(s.end - s.start for s in mine if s.kind == WAIT_HOST))

    def gpus(self) -> list[GpuStep]:
        """Every GPU's share of the step, by index."""
        return [self.gpu_step(d) for d in self.devices()]

    @property
    def note(self) -> str:
        return f"Modeled from {self.gpu} specifications and NCCL's tuning model, not measured."

    def summary_lines(self) -> list[str]:
        lines = []
        for g in self.gpus():
            hidden = f" ({g.overlap / g.communication:.0%})" if g.communication else ""
            lines.append(
                f"GPU:{g.device}: step {_ms(g.step)} = compute {_ms(g.compute)} + exposed "
                f"communication {_ms(g.exposed)} + idle {_ms(g.idle)}; communication "
                f"{_ms(g.communication)} in {g.collectives} collectives, {_ms(g.overlap)}"
                f"{hidden} hidden behind compute; waited {_ms(g.waited_for_ranks)} for the "
                f"slowest rank; compute waited {_ms(g.waited_for_comm)} for collectives "
                f"and {_ms(g.waited_for_host)} for the host")
        return lines

    def __str__(self) -> str:
        lines = [f"Timeline of {_ms(self.seconds)} on {len(self.devices())} modeled GPU(s)"
                 " (each GPU: compute stream and NCCL's stream):"]
        lines += self.summary_lines()
        for s in sorted(self.spans, key=lambda s: (s.device, s.start)):
            if s.kind in (COLLECTIVE, WAIT_RANKS, WAIT_COMM):
                lines.append(f"  GPU:{s.device} {s.stream:7} {_ms(s.start - self.start):>12} "
                             f"→ {_ms(s.end - self.start):>12}  {s.name}")
        lines.append(self.note)
        if self.machine:
            lines.append(self.machine)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        return self.to_html()

    def to_html(self, width: int = 760) -> str:
        """The timeline as one HTML block: an inline SVG with two lanes per GPU and each
        GPU's summary. Self-contained: no script, no style sheet, no link."""
        items = "".join(f"<li>{escape(line)}</li>" for line in self.summary_lines())
        foot = escape(self.note) + (f"<br>{escape(self.machine)}" if self.machine else "")
        return (f"<div class='devlab-step-timeline' style='font:12px sans-serif'><b>Step "
                f"timeline</b>, {escape(_ms(self.seconds))} (modeled){self._svg(width)}"
                f"<ul style='margin:2px 0'>{items}</ul><i>{foot}</i></div>")

    def _svg(self, width: int) -> str:
        import numpy as np
        from matplotlib.collections import PolyCollection

        from devlab._helpers import figures

        devices = self.devices()
        ml, mr, mt, lane, gap = 118, 14, 8, 18, 10
        pw = width - ml - mr
        rows = len(devices) * (2 * lane + gap)
        height = mt + rows + 40
        span = self.seconds or 1e-9

        def X(t: float) -> float:  # pixels from the plot's left
            return (t - self.start) * pw / span

        solid: list = []  # (rectangle, color, hover text), one list per kind of fill
        waits: list = []
        marks: list = []
        labels: list[tuple[float, str]] = []
        for row, d in enumerate(devices):
            y0 = row * (2 * lane + gap)
            for k, (stream, label) in enumerate(((COMPUTE, f"GPU:{d} compute"),
                                                 (COMM, f"GPU:{d} NCCL"))):
                y = y0 + k * lane
                labels.append((y + lane / 2, label))
                mine = [s for s in self.spans if s.device == d and s.stream == stream]
                for x0, x1, kind, tip in _blocks(mine, X, self.start):
                    box = _box(x0, max(x1 - x0, 0.6), y + 2, lane - 4)
                    (waits if kind in _WAITS else solid).append(
                        (box, _COLORS.get(kind, _OTHER), tip))
            # Under the NCCL lane: which part of the communication compute hid (green) and
            # which it did not (red).
            compute = _union((s.start, s.end) for s in self.spans
                             if s.device == d and s.kind in (KERNEL, COPY_SPAN))
            for s in self.spans:
                if s.device != d or s.kind != COLLECTIVE:
                    continue
                for a, b, hidden in _split(s.start, s.end, compute):
                    marks.append((_box(X(a), max(X(b) - X(a), 0.6), y0 + 2 * lane - 1, 3),
                                  "#59a14f" if hidden else "#d62728",
                                  f"{'hidden behind compute' if hidden else 'exposed'} "
                                  f"{_ms(b - a)}"))
        with figures.svg_axes(width, height,
                              (ml / width, 30 / height, pw / width, rows / height)) as ax:
            tips = {}
            for items, hatch in ((solid, None), (waits, "////"), (marks, None)):
                if not items:
                    continue
                colors = [c for _, c, _ in items]
                # One collection per kind of fill: an artist per block would cost more than
                # the drawing. Hatched: the lines in the block's color on white. The blocks
                # as one array of corners: matplotlib makes their paths from it at once.
                drawn = PolyCollection(
                    np.asarray([r for r, _, _ in items], float), clip_on=False, linewidths=0,
                    hatch=hatch,
                    facecolors="#fff" if hatch else colors,
                    edgecolors=colors if hatch else "none")
                ax.add_collection(drawn, autolim=False)
                tips[drawn] = [t for _, _, t in items]
            ax.set_xlim(0, pw)
            ax.set_ylim(rows, 0)
            ms = span * 1e3
            ticks = figures.nice_ticks(0, ms, 6)
            ax.set_xticks([t * pw / ms for t in ticks], [f"{t:g}" for t in ticks])
            ax.set_yticks([y for y, _ in labels], [label for _, label in labels])
            ax.tick_params(axis="y", length=0)
            ax.grid(True, axis="x", color="#e6e6e6", lw=0.8, clip_on=False)
            ax.set_axisbelow(True)
            for side in ("top", "right", "left"):
                ax.spines[side].set_visible(False)
            ax.set_xlabel("modeled ms from the step's start", fontsize=10, color="#444")
            return figures.svg_markup(ax.figure, tips,
                                      title=f"Step timeline, {_ms(self.seconds)}, modeled")


# Kinds drawn hatched: a stream waiting (for the slowest rank, for a collective). A kind the
# clock adds later is drawn solid, in its color here or grey.
_WAITS = {WAIT_RANKS, WAIT_COMM, WAIT_HOST}
_COLORS = {KERNEL: "#4e79a7", COPY_SPAN: "#76b7b2", COLLECTIVE: "#f28e2b",
           WAIT_RANKS: "#bbbbbb", WAIT_COMM: "#bbbbbb", WAIT_HOST: "#bbbbbb"}
_OTHER = "#bbbbbb"


def _box(x: float, w: float, y: float, h: float) -> list[tuple[float, float]]:
    return [(x, y), (x + w, y), (x + w, y + h), (x, y + h)]


def _blocks(spans: list[Span], X: Callable[[float], float],
            start: float) -> list[tuple[float, float, str, str]]:
    """Rectangles for one lane: consecutive spans of a kind narrower than a pixel drawn as
    one (a step's hundreds of small kernels stay a few dozen rectangles)."""
    out: list[list[Any]] = []
    for s in sorted(spans, key=lambda s: s.start):
        x0, x1 = X(s.start), X(s.end)
        if out and out[-1][2] == s.kind and x1 - out[-1][0] < 1.0 and x0 - out[-1][1] < 0.5:
            last = out[-1]
            last[1], last[4] = x1, last[4] + 1
            last[5] = s.end
            continue
        out.append([x0, x1, s.kind, s.name, 1, s.end, s.start])
    return [(x0, x1, kind, f"{name}: {_ms(e - b)} from {_ms(b - start)}" if n == 1 else
             f"{n} {kind}s: {_ms(e - b)} from {_ms(b - start)}")
            for x0, x1, kind, name, n, e, b in out]


def _split(a: float, b: float,
           compute: Sequence[tuple[float, float]]) -> list[tuple[float, float, bool]]:
    """[a, b) cut where it is and is not under the compute intervals."""
    out, at = [], a
    for c0, c1 in compute:
        if c1 <= at or c0 >= b:
            continue
        if c0 > at:
            out.append((at, c0, False))
        out.append((max(at, c0), min(b, c1), True))
        at = min(b, c1)
    if at < b:
        out.append((at, b, False))
    return out


def timeline(fn: Callable[[], Any]) -> Timeline:
    """Run `fn()` on the modeled GPUs and return what each GPU's compute and communication
    streams did meanwhile (a `Timeline`; `.result` holds what fn returned). For a clean step,
    synchronize before; the timeline ends when the last stream's recorded work ends."""
    rec = record(fn)
    return Timeline(rec.spec.full_name, rec.spans, rec.start, machine(rec.spec, rec.topology),
                    rec.result)
