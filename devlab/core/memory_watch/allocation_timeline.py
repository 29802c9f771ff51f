"""The allocation timeline: every allocation and free of a recorded stretch of code, with the
line of the user's code behind it, drawn as stacked bands over time.

`timeline(snapshot, device)` reads a snapshot in the format of `torch.cuda.memory._snapshot()`
(`{"segments": [...], "device_traces": [[TraceEntry, ...], ...]}`), whoever made it: torch's
allocator on a real GPU after `torch.cuda.memory._record_memory_history()`, or devlab's model
of it on a simulated GPU. It returns an `AllocationTimeline`: `.data` (one `Allocation` per
block), `.peak`, `.top_lines()`, `_repr_html_()` (a self-contained SVG and table: no script,
no CDN, hover by SVG `<title>`), `plot()` (matplotlib) and `save_snapshot(path)` (the pickle
pytorch.org/memory_viz opens).

How the trace is read, as PyTorch's viewer (`MemoryViz.js`, "Active Memory Timeline") reads
it:

- An allocation holds its bytes from its `alloc` entry to its `free_completed` entry (a
  `free_requested` entry only marks that the program let go of it; with `record_stream` the
  allocator completes the free later). A trace recorded without `free_completed` entries
  (`skip_actions`) ends blocks at `free_requested`. The bytes counted are the entry's `size`,
  the size the program asked for (torch's trace records it, not the rounded block).
- Blocks alive when recording began are those the trace frees without having allocated them,
  and the segments' `active_allocated` blocks the trace never allocated.
- x is the position in the device's trace: step k is the state after the first k entries,
  step 0 the state when recording began.
- Stacking: a block takes the top of the stack when it is allocated and keeps its place while
  it lives; when a block is freed, those above it move down by its size. Blocks alive at the
  start are stacked first: those never freed at the bottom, then those freed later, the first
  freed on top.
"""

from __future__ import annotations

import html
import os
import pickle
import re
import sys
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from devlab._helpers.sizes import format_bytes

__all__ = ["timeline", "AllocationTimeline", "Allocation", "LineUsage", "Peak", "is_user_file",
           "MIN_BAND_FRACTION", "MAX_BANDS"]

# -- which frame is the user's --------------------------------------------------------------

# A notebook cell's code: IPython's `<ipython-input-3-1a2b3c>`, ipykernel's
# `/tmp/ipykernel_123/456.py`, Colab's `/tmp/ipython-input-3-456.py`.
_CELL = re.compile(r"(^<ipython-input-\d+-\w+>$)|(ipykernel_\d+/\d+\.py$)"
                   r"|((^|/)ipython-input-\d+-\w+\.py$)")
# The standard library anywhere (a snapshot may come from another machine):
# .../lib/python3.11/..., .../lib64/python3.11t/..., ...\Lib\...
_STDLIB = re.compile(r"/lib(64)?/python\d+(\.\d+)?t?/|^[A-Za-z]:/[^/]*python[^/]*/Lib/",
                     re.IGNORECASE)


@lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    """This machine's directories of code that is not the user's: the standard library,
    devlab and torch (a source checkout of torch is not under site-packages)."""
    dirs = {os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))}  # devlab/
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(path)
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        dirs.add(os.path.dirname(torch.__file__))
    out = set()
    for d in dirs:
        out.add(os.path.normcase(os.path.abspath(d)))
        out.add(os.path.normcase(os.path.realpath(d)))
    return tuple(sorted(out))


def is_user_file(filename: str) -> bool:
    """Whether a frame's file is the user's code: a notebook cell, or a Python file that is
    not part of torch, devlab, an installed package (site-packages, dist-packages) or the
    standard library; code typed at Python's prompt (`<stdin>`) too. C++ frames (`.cpp`, `.h`, `??`) and generated code (`<string>`,
    `<eval_with_key>.3`, `<frozen ...>`) are not."""
    if not filename:
        return False
    name = filename.replace("\\", "/")
    if _CELL.search(name) or name == "<stdin>":
        return True
    if name.startswith("<") or not name.endswith(".py"):
        return False
    if "/site-packages/" in name or "/dist-packages/" in name or _STDLIB.search(name):
        return False
    paths = {os.path.normcase(os.path.abspath(filename))}
    paths.add(os.path.normcase(os.path.realpath(filename)))
    return not any(p.startswith(d + os.sep) for p in paths for d in _library_dirs())


def _short_file(filename: str) -> str:
    """A cell as IPython names it in tracebacks (`In[3]`) where the kernel knows it; a file
    under the working directory relative to it; else the path as recorded."""
    name = filename.replace("\\", "/")
    if _CELL.search(name):
        number = None
        try:
            from IPython import get_ipython

            ip = get_ipython()
            number = ip.compile._filename_map.get(filename) if ip is not None else None
        except (ImportError, AttributeError):
            pass
        match = re.match(r"<?ipython-input-(\d+)-", os.path.basename(name))
        if number is None and match:
            number = int(match.group(1))
        return f"In[{number}]" if number is not None else filename
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # another drive
        return filename
    return filename if rel.startswith("..") else rel


def _user_frame(frames: Sequence[dict], user_files: Callable[[str], bool]) -> dict | None:
    # torch lists a stack innermost first.
    for f in frames:
        if user_files(str(f.get("filename", ""))):
            return f
    return None


def _line_text(frame: dict) -> str:
    return f"{_short_file(str(frame['filename']))}:{frame.get('line', '?')} ({frame.get('name', '?')})"


NO_STACK = "(no stack recorded)"
NOT_USER = "(not from user code)"

# -- result objects ----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Allocation:
    """One block of the timeline. Indices are positions in the device's trace.

    `size` is the bytes the timeline counts: the size asked for, as torch's trace records it.
    `block_size` is the allocator's rounded block, known only for blocks the snapshot's
    segments still hold (else None). `alloc_index` is None for a block alive before recording
    began; `free_index` (the `free_completed` entry) is None for a block still held at the end.
    `line` is the user's line behind the allocation, "file:line (name)" (`NO_STACK` or
    `NOT_USER` where there is none); `frame` the frame it comes from.
    """

    address: int
    size: int
    block_size: int | None
    stream: int
    alloc_index: int | None
    alloc_time_us: int | None
    free_requested_index: int | None
    free_index: int | None
    free_time_us: int | None
    line: str
    frame: dict | None
    frames: tuple

    @property
    def start_step(self) -> int:
        return 0 if self.alloc_index is None else self.alloc_index + 1

    @property
    def end_step(self) -> float:
        return float("inf") if self.free_index is None else self.free_index + 1

    def alive_at(self, step: int) -> bool:
        """Whether the block holds its bytes at `step` (the state after `step` entries)."""
        return self.start_step <= step < self.end_step


class Peak(NamedTuple):
    """The most bytes allocated at once: `index` is the trace entry that reached it (None when
    the peak is the state recording began in), `time_us` that entry's time."""

    bytes: int
    index: int | None
    time_us: int | None


class LineUsage(NamedTuple):
    """Bytes one user line holds at a moment, in how many allocations."""

    line: str
    bytes: int
    allocations: int


# Bands drawn one by one: blocks of at least this fraction of the peak, at most this many
# (those held at the peak first, then those covering the most bytes x entries). The rest, and
# bands under a pixel wide, show only in the total's grey area.
MIN_BAND_FRACTION = 0.005
MAX_BANDS = 200
# The SVG's step paths hold at most about this many corners; past it the x axis is drawn in
# coarser columns (a 10,000-entry trace stays a few hundred KB).
_MAX_CORNERS = 16_000

_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
            "#ff9da7", "#9c755f", "#86bcb6", "#d37295", "#a0cbe8", "#ffbe7d", "#8cd17d")
_GREY = "#c8c8c8"
_PEAK = "#d62728"


def _nice_step(span: float, target: int = 5) -> float:
    """A 1-2-5 step giving about `target` ticks over `span`."""
    import math

    if span <= 0:
        return 1.0
    raw = span / target
    k = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * k >= raw:
            return m * k
    return 10 * k


def _byte_ticks(top: int) -> list[int]:
    """Ticks at round numbers of the unit `format_bytes` will show `top` in."""
    unit = 1
    while top >= unit * 1024 and unit < 1024**4:
        unit *= 1024
    step = max(1, int(_nice_step(top / unit) * unit))
    return list(range(0, int(top) + 1, step))


class AllocationTimeline:
    """The allocations of one device over a recorded trace (see the module's docstring for how
    the trace is read).

    - `.data`: the `Allocation`s, oldest first (blocks alive before recording first).
    - `.allocated`: bytes allocated at each step (`allocated[k]` after the first k entries).
    - `.peak`: a `Peak`; `.top_lines(at="peak", n=10)`: the user lines holding the most.
    - `.ooms`: the out-of-memory entries, `(index, size asked, bytes CUDA still had free)`.
    - `_repr_html_()`: the timeline as inline SVG (hover a band for its size and line) and a
      table of the lines holding the most at the peak. Each allocation of at least
      `MIN_BAND_FRACTION` (0.5 %) of the peak is a band of its own, colored by its line, up to
      `MAX_BANDS` (200) of them: those held at the peak first, then those covering the most
      area (bytes x entries); all other bytes show in the grey area of the total behind the
      bands (drawn per pixel column at the column's highest, so a short spike still shows).
      Above about 16,000 path corners the columns are made wider, which bounds the HTML to a
      few hundred KB whatever the trace's length.
    - `plot()`: the same as a matplotlib `Figure`; `save_snapshot(path)`: the input snapshot
      as a pickle for pytorch.org/memory_viz.
    """

    def __init__(self, snapshot: dict, device: int, allocations: list[Allocation],
                 allocated: list[int], trace: list[dict], ooms: list[tuple[int, int, int]]
                 ) -> None:
        self.snapshot = snapshot
        self.device = device
        self.data = allocations
        self.allocated = allocated
        self.ooms = ooms
        self._trace = trace
        top = max(allocated)
        step = allocated.index(top)
        index = step - 1 if step > 0 else None
        time_us = trace[index].get("time_us") if index is not None else None
        self.peak = Peak(top, index, time_us)
        self._peak_step = step

    @property
    def events(self) -> int:
        """Entries in the device's trace."""
        return len(self._trace)

    def _step(self, at: str | int) -> int:
        if at == "peak":
            return self._peak_step
        if at == "start":
            return 0
        if at == "end":
            return len(self._trace)
        if isinstance(at, int) and not isinstance(at, bool) and 0 <= at < len(self._trace):
            return at + 1
        raise ValueError(f"at is 'peak', 'start', 'end' or a trace index from 0 to "
                         f"{len(self._trace) - 1}, not {at!r}")

    def held_at(self, at: str | int = "peak") -> list[Allocation]:
        """The allocations holding bytes at `at`: "peak", "start", "end", or a trace index
        (the state just after that entry)."""
        step = self._step(at)
        return [a for a in self.data if a.alive_at(step)]

    def top_lines(self, at: str | int = "peak", n: int | None = 10) -> list[LineUsage]:
        """Bytes held per user line at `at` (as `held_at`), largest first, at most `n`."""
        lines: dict[str, list[int]] = {}
        for a in self.held_at(at):
            entry = lines.setdefault(a.line, [0, 0])
            entry[0] += a.size
            entry[1] += 1
        usage = sorted((LineUsage(line, b, c) for line, (b, c) in lines.items()),
                       key=lambda u: (-u.bytes, u.line))
        return usage if n is None else usage[:n]

    def save_snapshot(self, path: str | os.PathLike) -> None:
        """Write the snapshot as `torch.cuda.memory._dump_snapshot` does: a pickle that
        pytorch.org/memory_viz opens (drag the file onto the page; nothing is uploaded)."""
        with open(path, "wb") as f:
            pickle.dump(self.snapshot, f)

    def __repr__(self) -> str:
        return (f"<AllocationTimeline device {self.device}: {len(self.data)} allocations over "
                f"{self.events} trace entries, {self._peak_text()}>")

    def _peak_text(self) -> str:
        where = ("when recording began" if self.peak.index is None
                 else f"at entry {self.peak.index}")
        return f"peak {format_bytes(self.peak.bytes)} {where}"

    def _duration_text(self) -> str:
        times = [e["time_us"] for e in self._trace if e.get("time_us") is not None]
        if len(times) < 2:
            return ""
        span = (max(times) - min(times)) / 1e6
        return f" over {span * 1e3:.1f} ms" if span < 1 else f" over {span:.2f} s"

    # -- geometry shared by the SVG and the matplotlib plot ------------------------------------

    def _bands(self) -> tuple[list[tuple[Allocation, list[tuple[int, int]], int]], set[int]]:
        """The allocations drawn as bands, each with its corners [(step, offset), ...] and its
        end step, stacked among themselves as the module docstring says."""
        threshold = self.peak.bytes * MIN_BAND_FRACTION
        n = len(self._trace)

        def rank(i: int) -> tuple:
            a = self.data[i]
            area = a.size * (min(a.end_step, n + 1) - a.start_step)
            return (not a.alive_at(self._peak_step), -area, i)

        drawn = set(sorted((i for i, a in enumerate(self.data)
                            if a.size > 0 and a.size >= threshold), key=rank)[:MAX_BANDS])
        # (step, 0 = end / 1 = start, order) events of the drawn blocks.
        starts: dict[int, list[int]] = {}
        ends: dict[int, list[int]] = {}
        for i in drawn:
            a = self.data[i]
            if a.alloc_index is not None:
                starts.setdefault(a.start_step, []).append(i)
            if a.free_index is not None:
                ends.setdefault(a.free_index + 1, []).append(i)
        corners: dict[int, list[tuple[int, int]]] = {}
        stack: list[int] = []
        offsets: list[int] = []
        top = 0
        for i in _initial_order(self.data):
            if i in drawn:
                stack.append(i)
                offsets.append(top)
                corners[i] = [(0, top)]
                top += self.data[i].size
        for step in sorted(set(starts) | set(ends)):
            for i in ends.get(step, ()):
                k = stack.index(i)
                size = self.data[i].size
                del stack[k], offsets[k]
                for j in range(k, len(stack)):
                    offsets[j] -= size
                    corners[stack[j]].append((step, offsets[j]))
                top -= size
            for i in sorted(starts.get(step, ())):
                stack.append(i)
                offsets.append(top)
                corners[i] = [(step, top)]
                top += self.data[i].size
        bands = []
        for i in sorted(drawn):
            a = self.data[i]
            end = n + 1 if a.free_index is None else a.free_index + 1
            bands.append((a, corners[i], end))
        return bands, drawn

    def _colors(self, lines: Sequence[str]) -> dict[str, str]:
        order = [u.line for u in self.top_lines("peak", None)]
        for line in lines:
            if line not in order:
                order.append(line)
        return {line: _PALETTE[k % len(_PALETTE)] for k, line in enumerate(order)}

    # -- HTML ------------------------------------------------------------------------------------

    def _repr_html_(self) -> str:
        return self.to_html()

    def to_html(self, width: int = 760, height: int = 260) -> str:
        """The timeline as one HTML block: a caption, an inline SVG and the table of the lines
        holding the most at the peak. Self-contained: no script, no style sheet, no link."""
        caption = (f"<div style='font:12px sans-serif;margin:2px 0'><b>Allocation timeline</b>"
                   f", device {self.device}: {len(self.data)} allocations, {self.events} trace "
                   f"entries{html.escape(self._duration_text())}, "
                   f"{html.escape(self._peak_text())}</div>")
        if not self.data:
            return (f"<div class='devlab-allocation-timeline'>{caption}<div style='font:12px "
                    "sans-serif'>Nothing was allocated while recording, and nothing was held "
                    "when it began.</div></div>")
        return (f"<div class='devlab-allocation-timeline'>{caption}{self._svg(width, height)}"
                f"{self._table()}</div>")

    def _svg(self, width: int, height: int) -> str:
        ml, mr, mt, mb = 64, 22, 24, 34
        pw, ph = width - ml - mr, height - mt - mb
        n = len(self._trace)
        steps = n + 1  # x runs over [0, steps)
        ticks_y = _byte_ticks(int(self.peak.bytes * 1.08) or 1)
        ymax = max(ticks_y[-1], int(self.peak.bytes * 1.08), 1)

        def Y(b: float) -> str:
            return f"{mt + ph - b * ph / ymax:.1f}"

        bands, _ = self._bands()
        colors = self._colors([a.line for a, _, _ in bands])
        columns = pw
        while True:
            body, corners = self._band_paths(bands, colors, steps, columns, ml, pw, Y)
            if corners <= _MAX_CORNERS or columns <= 16:
                break
            columns //= 2
        parts = [f"<svg width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
                 "role='img' style='font:11px sans-serif;display:block'>",
                 f"<title>{html.escape(self._peak_text())}</title>"]
        # Axes and grid.
        for t in ticks_y:
            y = Y(t)
            parts.append(f"<line x1='{ml}' x2='{ml + pw}' y1='{y}' y2='{y}' stroke='#e6e6e6'/>"
                         f"<text x='{ml - 4}' y='{y}' dy='3.5' text-anchor='end'>"
                         f"{html.escape(format_bytes(t))}</text>")
        xstep = max(1, int(_nice_step(steps, 6)))
        for t in range(0, steps + 1, xstep):
            x = f"{ml + t * pw / steps:.1f}"
            parts.append(f"<line x1='{x}' x2='{x}' y1='{mt + ph}' y2='{mt + ph + 4}' "
                         f"stroke='#666'/><text x='{x}' y='{mt + ph + 15}' "
                         f"text-anchor='middle'>{t}</text>")
        parts.append(f"<text x='{ml + pw / 2:.0f}' y='{height - 4}' text-anchor='middle' "
                     "fill='#444'>trace entries (step k: after the first k)</text>")
        # The total, grey, behind the bands: the highest of each pixel column.
        parts.append(self._total_path(steps, ml, pw, Y))
        parts.extend(body)
        parts.append(f"<line x1='{ml}' x2='{ml}' y1='{mt}' y2='{mt + ph}' stroke='#666'/>"
                     f"<line x1='{ml}' x2='{ml + pw}' y1='{mt + ph}' y2='{mt + ph}' "
                     "stroke='#666'/>")
        # The peak.
        px = f"{ml + self._peak_step * pw / steps:.1f}"
        # The label stays inside the picture when the peak is near an edge.
        anchor = ("start" if self._peak_step < steps * 0.1
                  else "end" if self._peak_step > steps * 0.9 else "middle")
        peak_tip = html.escape(f"{self._peak_text()}"
                               + (f" ({self.peak.bytes:,} B)" if self.peak.bytes else ""))
        parts.append(f"<g><title>{peak_tip}</title><line x1='{px}' x2='{px}' y1='{mt}' "
                     f"y2='{mt + ph}' stroke='{_PEAK}' stroke-dasharray='5 3' "
                     f"stroke-width='1.5'/><line x1='{ml}' x2='{ml + pw}' "
                     f"y1='{Y(self.peak.bytes)}' y2='{Y(self.peak.bytes)}' stroke='{_PEAK}' "
                     "stroke-dasharray='2 3' stroke-width='0.8'/>"
                     f"<text x='{px}' y='{mt - 5}' text-anchor='{anchor}' fill='{_PEAK}'>peak "
                     f"{html.escape(format_bytes(self.peak.bytes))}</text></g>")
        for index, size, free in self.ooms:
            x = ml + (index + 1) * pw / steps
            tip = html.escape(f"out of memory at entry {index}: asked for {format_bytes(size)}, "
                              f"{format_bytes(free)} free on the device")
            parts.append(f"<path d='M{x - 5:.1f} {mt}h10l-5 8z' fill='{_PEAK}'>"
                         f"<title>{tip}</title></path>")
        parts.append("</svg>")
        return "".join(parts)

    def _band_paths(self, bands, colors, steps, columns, ml, pw, Y) -> tuple[list[str], int]:
        def col(step: float) -> int:
            return round(min(step, steps) * columns / steps)

        def X(c: int) -> str:
            return f"{ml + c * pw / columns:.1f}".removesuffix(".0")

        out = []
        total_corners = 0
        for a, corners, end in bands:
            c0, c1 = col(corners[0][0]), col(end)
            if c1 <= c0:
                continue  # under a pixel: in the grey total only
            # The band's bottom as (column, offset) steps, the last offset of each column.
            edge: list[tuple[int, int]] = []
            for step, offset in corners:
                c = max(col(step), c0)
                if edge and edge[-1][0] == c:
                    edge[-1] = (c, offset)
                elif not edge or edge[-1][1] != offset:
                    edge.append((c, offset))
            # Along the bottom left to right, up, along the top right to left.
            d = [f"M{X(c0)} {Y(edge[0][1])}"]
            for c, offset in edge[1:]:
                d.append(f"H{X(c)}V{Y(offset)}")
            d.append(f"H{X(c1)}V{Y(edge[-1][1] + a.size)}")
            for k in range(len(edge) - 1, 0, -1):
                d.append(f"H{X(edge[k][0])}V{Y(edge[k - 1][1] + a.size)}")
            d.append(f"H{X(c0)}Z")
            total_corners += 2 * len(edge) + 2
            out.append(f"<path d='{''.join(d)}' fill='{colors[a.line]}' stroke='#fff' "
                       f"stroke-width='0.4'><title>{html.escape(_tooltip(a))}</title></path>")
        return out, total_corners

    def _total_path(self, steps: int, ml: int, pw: int, Y) -> str:
        columns = min(pw, steps)
        highest = [0] * columns
        for k, b in enumerate(self.allocated):
            c = min(columns - 1, k * columns // steps)
            highest[c] = max(highest[c], b)
        d = [f"M{ml} {Y(0)}"]
        prev = None
        for c, b in enumerate(highest):
            if b != prev:
                d.append(f"H{ml + c * pw / columns:.1f}V{Y(b)}")
                prev = b
        d.append(f"H{ml + pw}V{Y(0)}Z")
        threshold = format_bytes(self.peak.bytes * MIN_BAND_FRACTION)
        tip = ("all allocated bytes; grey where no band is drawn: blocks under "
               f"{threshold} (0.5 % of the peak), past the {MAX_BANDS} drawn, or under a "
               "pixel wide")
        return f"<path d='{''.join(d)}' fill='{_GREY}'><title>{html.escape(tip)}</title></path>"

    def _table(self) -> str:
        usage = self.top_lines("peak", 10)
        colors = self._colors([u.line for u in usage])
        rows = []
        for u in usage:
            share = u.bytes / self.peak.bytes if self.peak.bytes else 0
            rows.append(
                f"<tr><td><span style='display:inline-block;width:10px;height:10px;"
                f"background:{colors[u.line]}'></span></td><td style='text-align:left'>"
                f"<code>{html.escape(u.line)}</code></td><td>{html.escape(format_bytes(u.bytes))}"
                f"</td><td>{share:.0%}</td><td>{u.allocations}</td></tr>")
        head = "".join(f"<th>{h}</th>" for h in
                       ("", "line", "held at the peak", "of the peak", "allocations"))
        return (f"<table class='devlab-top-lines' style='font-size:12px'><thead><tr>{head}"
                f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")

    # -- matplotlib --------------------------------------------------------------------------

    def plot(self, ax=None, size: tuple[float, float] = (8.0, 3.2), dpi: float = 90):
        """The timeline as a matplotlib `Figure` (drawn on `ax` if given): the total in grey,
        the bands over it colored by line, the peak dashed."""
        from matplotlib.ticker import FixedLocator, FuncFormatter

        from devlab._helpers.figures import ensure_figure_formatter

        if ax is None:
            from matplotlib.figure import Figure

            ensure_figure_formatter()
            fig = Figure(figsize=size, dpi=dpi)
            ax = fig.add_subplot()
            fig.subplots_adjust(left=0.12, right=0.98, bottom=0.16, top=0.9)
        fig = ax.figure
        steps = len(self._trace) + 1
        xs = list(range(steps + 1))
        ax.fill_between(xs, [*self.allocated, self.allocated[-1]], step="post", color=_GREY,
                        lw=0, label="all allocations")
        bands, _ = self._bands()
        colors = self._colors([a.line for a, _, _ in bands])
        for a, corners, end in bands:
            x, lo = [], []
            for (s, off), nxt in zip(corners, [*corners[1:], (end, None)], strict=True):
                x += [s, nxt[0]]
                lo += [off, off]
            ax.fill_between(x, lo, [v + a.size for v in lo], color=colors[a.line], lw=0.3,
                            edgecolor="white")
        ax.axvline(self._peak_step, color=_PEAK, ls="--", lw=1.2,
                   label=f"peak {format_bytes(self.peak.bytes)}")
        top = int(self.peak.bytes * 1.08) or 1
        ticks = _byte_ticks(top)
        ax.set_ylim(0, max(top, ticks[-1]))
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
        ax.set_xlim(0, steps)
        ax.set_xlabel("trace entries")
        ax.set_title(f"Allocation timeline, device {self.device}: {self._peak_text()}",
                     fontsize=10)
        ax.legend(loc="upper left", fontsize=8)
        return fig


def _tooltip(a: Allocation) -> str:
    born = ("alive when recording began" if a.alloc_index is None
            else f"allocated at entry {a.alloc_index}")
    died = "still held at the end" if a.free_index is None else f"freed at entry {a.free_index}"
    block = (f", block {format_bytes(a.block_size)}"
             if a.block_size is not None and a.block_size != a.size else "")
    return (f"{format_bytes(a.size)} ({a.size:,} B{block})\n{a.line}\n{born}, {died}\n"
            f"address {a.address:#x}, stream {a.stream}")


def _initial_order(data: list[Allocation]) -> list[int]:
    """Blocks alive at the start, bottom first: never freed (by address), then freed, the
    first freed on top (as PyTorch's viewer stacks them)."""
    pre = [i for i, a in enumerate(data) if a.alloc_index is None]
    kept = sorted((i for i in pre if data[i].free_index is None), key=lambda i: data[i].address)
    freed = sorted((i for i in pre if data[i].free_index is not None),
                   key=lambda i: -data[i].free_index)
    return kept + freed


# -- reading a snapshot --------------------------------------------------------------------


class _Block:
    __slots__ = ("address", "size", "block_size", "stream", "frames", "alloc_index",
                 "alloc_time", "free_requested", "free_index", "free_time")

    def __init__(self, address: int, size: int, stream: int, frames: list,
                 alloc_index: int | None = None, alloc_time: int | None = None) -> None:
        self.address, self.size, self.stream, self.frames = address, size, stream, frames
        self.block_size: int | None = None
        self.alloc_index, self.alloc_time = alloc_index, alloc_time
        self.free_requested: int | None = None
        self.free_index: int | None = None
        self.free_time: int | None = None


def timeline(snapshot: dict, device: int = 0, *,
             user_files: Callable[[str], bool] | None = None) -> AllocationTimeline:
    """The allocation timeline of `device` in `snapshot` (the format of
    `torch.cuda.memory._snapshot()`; see the module docstring for how it is read).

    `user_files(filename) -> bool` says which frames are the user's code; the innermost such
    frame of an allocation's stack is its line. The default, `is_user_file`, takes notebook
    cells and Python files outside torch, devlab, installed packages and the standard library.
    """
    if not isinstance(snapshot, dict) or "segments" not in snapshot:
        raise TypeError("timeline() reads a snapshot as torch.cuda.memory._snapshot() returns "
                        "it: a dict with 'segments' and 'device_traces'")
    user_files = user_files or is_user_file
    traces = snapshot.get("device_traces") or []
    trace = list(traces[device]) if 0 <= device < len(traces) else []
    ends_at = ("free_completed"
               if any(e.get("action") == "free_completed" for e in trace) else "free_requested")
    blocks: list[_Block] = []
    live: dict[int, _Block] = {}
    ooms: list[tuple[int, int, int]] = []

    def before_recording(e: dict) -> _Block:
        b = _Block(e["addr"], e.get("size", 0), e.get("stream", 0), e.get("frames") or [])
        blocks.append(b)
        live[b.address] = b
        return b

    for i, e in enumerate(trace):
        action = e.get("action")
        if action == "alloc":
            b = _Block(e["addr"], e.get("size", 0), e.get("stream", 0), e.get("frames") or [],
                       i, e.get("time_us"))
            blocks.append(b)
            live[b.address] = b
        elif action in ("free_requested", "free"):  # "free": the name in older snapshots
            b = live.get(e["addr"]) or before_recording(e)
            if b.free_requested is None:
                b.free_requested = i
        elif action == "free_completed":
            b = live.get(e["addr"]) or before_recording(e)
        elif action == "oom":
            ooms.append((i, e.get("size", 0), e.get("device_free", 0)))
            continue
        else:
            continue
        if action == ends_at or (action == "free" and ends_at == "free_requested"):
            b.free_index, b.free_time = i, e.get("time_us")
            del live[b.address]

    # The segments hold the blocks alive at the snapshot: those the trace never allocated were
    # alive when recording began; those it did tell their rounded size.
    for seg in snapshot.get("segments") or []:
        if seg.get("device", device) != device:
            continue
        address = seg.get("address", 0)
        for sb in seg.get("blocks") or []:
            baddr = sb.get("address", address)
            address = baddr + sb.get("size", 0)
            if sb.get("state") != "active_allocated":
                continue
            b = live.get(baddr)
            if b is None:
                b = _Block(baddr, sb.get("requested_size", sb.get("size", 0)),
                           seg.get("stream", 0), sb.get("frames") or [])
                blocks.append(b)
                live[baddr] = b
            b.block_size = sb.get("size")

    blocks.sort(key=lambda b: (b.alloc_index is not None, b.alloc_index or 0))
    data = []
    for b in blocks:
        frame = _user_frame(b.frames, user_files)
        line = _line_text(frame) if frame else (NOT_USER if b.frames else NO_STACK)
        data.append(Allocation(b.address, b.size, b.block_size, b.stream, b.alloc_index,
                               b.alloc_time, b.free_requested, b.free_index, b.free_time, line,
                               frame, tuple(b.frames)))
    # Bytes at each step: a difference array over the blocks' lifetimes.
    n = len(trace)
    delta = [0] * (n + 2)
    for a in data:
        delta[a.start_step] += a.size
        if a.free_index is not None:
            delta[a.free_index + 1] -= a.size
    allocated, running = [], 0
    for k in range(n + 1):
        running += delta[k]
        allocated.append(running)
    return AllocationTimeline(snapshot, device, data, allocated, trace, ooms)
