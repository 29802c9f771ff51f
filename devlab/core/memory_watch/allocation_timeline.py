"""The allocation timeline: every allocation and free of a recorded stretch of code, with the
line of the user's code behind it, drawn as stacked bands over time.

`timeline(snapshot, device)` reads a snapshot in the format of `torch.cuda.memory._snapshot()`
(`{"segments": [...], "device_traces": [[TraceEntry, ...], ...]}`), whoever made it: torch's
allocator on a real GPU after `torch.cuda.memory._record_memory_history()`, or devlab's model
of it on a simulated GPU. It returns an `AllocationTimeline`: `.data` (one `Allocation` per
block), `.peak`, `.top_lines()`, `_repr_html_()` (a self-contained SVG and table: no script,
no CDN, hover by SVG `<title>`), `plot()` (the same picture as a matplotlib `Figure`: both are
drawn by `_draw` through devlab._helpers.figures) and `save_snapshot(path)` (the pickle
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from devlab._helpers.sizes import format_bytes
from devlab._helpers.tracebacks import CELL_FILE, is_user_file

__all__ = ["timeline", "AllocationTimeline", "Allocation", "LineUsage", "Peak", "is_user_file",
           "MIN_BAND_FRACTION", "MAX_BANDS"]

# -- the user's line (whose frame it is: devlab._helpers.tracebacks.whose) -----------------


def _short_file(filename: str) -> str:
    """A cell as IPython names it in tracebacks (`In[3]`) where the kernel knows it; a file
    under the working directory relative to it; else the path as recorded."""
    name = filename.replace("\\", "/")
    if CELL_FILE.search(name):
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
# The bands hold at most about this many corners; past it the x axis is drawn in coarser
# columns (the SVG of a 10,000-entry trace stays a few hundred KB).
_MAX_CORNERS = 16_000

_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
            "#ff9da7", "#9c755f", "#86bcb6", "#d37295", "#a0cbe8", "#ffbe7d", "#8cd17d")
_GREY = "#c8c8c8"
_PEAK = "#d62728"


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
        from devlab._helpers import figures

        rect = (64 / width, 34 / height, 1 - 86 / width, 1 - 58 / height)
        with figures.svg_axes(width, height, rect) as ax:
            tips = self._draw(ax, legend=False)  # hover says what the legend would
            return figures.svg_markup(ax.figure, tips, title=self._peak_text())

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

    # -- the drawing (one for the HTML's SVG and for plot()) ---------------------------------

    def plot(self, ax=None, size: tuple[float, float] = (8.0, 3.2), dpi: float = 90):
        """The timeline as a matplotlib `Figure` (drawn on `ax` if given): the total in grey,
        the bands over it colored by line, the peak dashed; the picture the HTML form shows."""
        if ax is None:
            from devlab._helpers.figures import new_figure

            fig = new_figure(size, dpi)
            ax = fig.add_subplot()
            fig.subplots_adjust(left=0.12, right=0.98, bottom=0.16, top=0.84)
        ax.set_title(f"Allocation timeline, device {self.device}: {self._peak_text()}",
                     fontsize=10, pad=14)
        self._draw(ax, legend=True)
        return ax.figure

    def _draw(self, ax, legend: bool) -> dict:
        """Draw the timeline on `ax` at its width in pixels; the hover text of what it drew."""
        import numpy as np
        from matplotlib.collections import PolyCollection
        from matplotlib.patches import Polygon

        from devlab._helpers.figures import byte_axis, nice_ticks

        steps = len(self._trace) + 1  # x runs over [0, steps)
        top = int(self.peak.bytes * 1.08) or 1
        pixels = max(16, int(ax.bbox.width))
        tips: dict = {}
        threshold = format_bytes(self.peak.bytes * MIN_BAND_FRACTION)
        # add_artist, not add_patch: the limits are set below, and fitting them to each band
        # would cost more than drawing it.
        total = Polygon(np.asarray(self._total_corners(steps, min(pixels, steps)), float),
                        closed=True, facecolor=_GREY, lw=0, label="all allocations",
                        clip_on=False, joinstyle="round")
        ax.add_artist(total)
        tips[total] = [("all allocated bytes; grey where no band is drawn: blocks under "
                        f"{threshold} (0.5 % of the peak), past the {MAX_BANDS} drawn, or under "
                        "a pixel wide")]
        bands, _ = self._bands()
        colors = self._colors([a.line for a, _, _ in bands])
        columns = pixels
        while True:
            polygons, corners = self._band_corners(bands, steps, columns)
            if corners <= _MAX_CORNERS or columns <= 16:
                break
            columns //= 2
        if polygons:  # one collection: an artist per band would cost more than the drawing
            drawn = PolyCollection([np.asarray(c, float) for _, c in polygons],
                                   facecolors=[colors[a.line] for a, _ in polygons],
                                   edgecolors="#fff", linewidths=0.4, clip_on=False,
                                   joinstyle="round")
            ax.add_collection(drawn, autolim=False)
            tips[drawn] = [_tooltip(a) for a, _ in polygons]
        peak = format_bytes(self.peak.bytes)
        line = ax.axvline(self._peak_step, color=_PEAK, ls=(0, (5, 3)), lw=1.5,
                          label=f"peak {peak}", clip_on=False)
        tips[line] = (f"{self._peak_text()}"
                      + (f" ({self.peak.bytes:,} B)" if self.peak.bytes else ""))
        ax.axhline(self.peak.bytes, color=_PEAK, ls=(0, (2, 3)), lw=0.8, clip_on=False)
        # The label stays inside the picture when the peak is near an edge.
        where = self._peak_step / steps
        ax.annotate(f"peak {peak}", (self._peak_step, 1), xycoords=("data", "axes fraction"),
                    xytext=(0, 4), textcoords="offset points", color=_PEAK, fontsize=9,
                    ha="left" if where < 0.1 else "right" if where > 0.9 else "center")
        for index, size, free in self.ooms:
            mark = ax.plot([index + 1], [1], marker="v", ms=7, color=_PEAK, ls="",
                           transform=ax.get_xaxis_transform(), clip_on=False)[0]
            tips[mark] = [f"out of memory at entry {index}: asked for {format_bytes(size)}, "
                          f"{format_bytes(free)} free on the device"]
        ax.set_ylim(0, top)
        byte_axis(ax.yaxis, top)
        ax.set_xlim(0, steps)
        ax.set_xticks(nice_ticks(0, steps, 6, integer=True))
        ax.grid(True, axis="y", color="#e6e6e6", lw=0.8, clip_on=False)
        ax.tick_params(axis="y", length=0)  # the grid marks them
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        ax.set_xlabel("trace entries (step k: after the first k)", fontsize=9, color="#444")
        if legend:
            ax.legend(loc="upper left", fontsize=8)
        return tips

    def _total_corners(self, steps: int, columns: int) -> list[tuple[float, float]]:
        """The total's outline: the highest of each column, so a short spike still shows."""
        highest = [0] * columns
        for k, b in enumerate(self.allocated):
            c = min(columns - 1, k * columns // steps)
            highest[c] = max(highest[c], b)
        out: list[tuple[float, float]] = [(0, 0)]
        prev = 0
        for c, b in enumerate(highest):
            if b != prev:
                x = c * steps / columns
                out += [(x, prev), (x, b)]
                prev = b
        return [*out, (steps, prev), (steps, 0)]

    def _band_corners(self, bands, steps: int, columns: int
                      ) -> tuple[list[tuple[Allocation, list[tuple[float, float]]]], int]:
        """Each band's outline at `columns` columns over the x axis (a band under a column
        wide is left to the grey total), and how many corners they have together."""
        def col(step: float) -> int:
            return round(min(step, steps) * columns / steps)

        def X(c: int) -> float:
            return c * steps / columns

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
            poly = [(X(c0), edge[0][1])]
            for c, offset in edge[1:]:
                poly += [(X(c), poly[-1][1]), (X(c), offset)]
            poly += [(X(c1), edge[-1][1]), (X(c1), edge[-1][1] + a.size)]
            for k in range(len(edge) - 1, 0, -1):
                poly += [(X(edge[k][0]), edge[k][1] + a.size),
                         (X(edge[k][0]), edge[k - 1][1] + a.size)]
            poly.append((X(c0), edge[0][1] + a.size))
            total_corners += 2 * len(edge) + 2
            out.append((a, poly))
        return out, total_corners


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
