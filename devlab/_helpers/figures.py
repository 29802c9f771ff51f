"""devlab's one way to draw: matplotlib figures without pyplot, as PNG bytes, as a cell's value,
or as inline SVG with hover text; and the one tick rule every axis uses.

- `new_figure(size, dpi)`: a bare `Figure` (no pyplot: shown once, as the cell's value, and safe
  to draw from a widget's thread). The memory chart, timing results, exercises, widgets and
  both timelines draw on one.
- `figure_png(fig)`: PNG bytes (Agg).
- `svg_figure(width, height)` and `svg_markup(fig, tips)`: a figure sized in CSS pixels and its
  SVG as one self-contained `<svg>` element for an HTML output, each artist of `tips` showing
  its text on hover (See Note [Hover text in matplotlib's SVG]), written by matplotlib's SVG
  renderer with three costs cut (See Note [devlab's SVG renderer]). `svg_axes(width, height,
  rect)`: axes on such a figure, kept for the next drawing of that size (See Note [Axes kept
  between drawings]).
- `nice_ticks` / `ticks_in_unit` / `byte_axis`: ticks at 1-2-2.5-5 steps (matplotlib's own
  `MaxNLocator` rule), bytes at round numbers of the unit `format_bytes` shows.
"""

from __future__ import annotations

import html
import io
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

__all__ = ["new_figure", "figure_png", "ensure_figure_formatter", "svg_figure", "svg_axes",
           "svg_markup", "nice_ticks", "ticks_in_unit", "byte_axis"]

# The one tick rule: matplotlib's default locator's steps.
_STEPS = (1, 2, 2.5, 5, 10)
_BYTE_UNITS = (1, 1 << 10, 1 << 20, 1 << 30, 1 << 40)


def new_figure(size: tuple[float, float], dpi: float = 100):
    """A bare matplotlib `Figure` (not pyplot's): shown once when it is a cell's value (see
    `ensure_figure_formatter`), never leaking into a later cell's output, and safe to draw from
    a widget's thread."""
    from matplotlib.figure import Figure

    ensure_figure_formatter()
    return Figure(figsize=size, dpi=dpi)


def figure_png(fig, dpi: float | None = None) -> bytes:
    """Render a matplotlib figure to PNG bytes with Agg, without pyplot.

    Safe from a background thread as long as no other thread draws the same figure.
    """
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


# -- ticks ----------------------------------------------------------------------------------------


def nice_ticks(lo: float, hi: float, target: int = 5, integer: bool = False) -> list[float]:
    """About `target` ticks at 1-2-2.5-5 x 10^k steps inside [lo, hi], as matplotlib's own
    axes place them (`MaxNLocator`)."""
    from matplotlib.ticker import MaxNLocator

    if hi <= lo:
        hi = lo + 1
    eps = 1e-9 * (hi - lo)
    values = MaxNLocator(nbins=target, steps=list(_STEPS), integer=integer).tick_values(lo, hi)
    return [float(v) for v in values if lo - eps <= v <= hi + eps]


def _byte_unit(top: float) -> int:
    return next(u for u in reversed(_BYTE_UNITS) if top >= u or u == 1)


def ticks_in_unit(top: float, target: int = 5) -> list[int]:
    """Byte ticks from 0 to `top` at round numbers of the unit `format_bytes` shows `top` in
    (0, 50 MiB, 100 MiB, ... rather than 0, 52428800, ...)."""
    unit = _byte_unit(top)
    return sorted({int(round(v * unit)) for v in nice_ticks(0, top / unit, target)})


def byte_axis(axis, top: float, target: int = 5) -> None:
    """Put `ticks_in_unit(top)` on a matplotlib axis, labelled by `format_bytes`."""
    from matplotlib.ticker import FixedLocator, FuncFormatter

    from devlab._helpers.sizes import format_bytes

    ticks = ticks_in_unit(top, target)
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))


# -- inline SVG -----------------------------------------------------------------------------------

# Note [Hover text in matplotlib's SVG]
# matplotlib's SVG backend writes an artist's gid as the id of the <g> it draws the artist in
# (its "SVG Tooltip" example adds hover boxes so). A <title> inside an element is the hover
# text every browser shows, with no script: `svg_markup` gives each artist of `tips` a gid,
# then puts the <title> into that group, or one into each element of it (a collection's
# items, each with its own text; a patch's one path). The rest of the markup is
# made fit for an HTML output that may hold several figures: no XML prolog, no global
# stylesheet (matplotlib's `*{stroke-linejoin...}` would style the whole page), no group ids
# (matplotlib numbers them from 1 in every figure), no attribute-less groups, markers (tick
# marks) written where they are placed rather than by <use> reference, and coordinates
# to 0.1 px, with horizontal and vertical path segments as H and V: the output is then as
# small as a hand-written SVG's. Text stays text (`svg.fonttype: none`), in the page's font
# where DejaVu Sans is missing; `svg.hashsalt` makes the clip and marker ids matplotlib
# derives from their contents the same on every run.

_SVG_RC = {"svg.fonttype": "none", "svg.hashsalt": "devlab", "font.size": 10,
           "font.family": "sans-serif", "font.sans-serif": ["DejaVu Sans"]}
_TIP = "devlab-tip-"


@contextmanager
def svg_figure(width: int, height: int) -> Iterator[Any]:
    """A `Figure` whose SVG is `width` x `height` CSS pixels (1 point = 1 pixel), drawn under
    the settings `svg_markup` writes it with; use it inside the `with` block."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(_SVG_RC):
        fig = Figure(figsize=(width / 72, height / 72), dpi=72)
        fig.patch.set_visible(False)  # the page's background, as an image's would be
        yield fig


# Note [Axes kept between drawings]
# Making a matplotlib Axes (its two axes, their ticks, four spines, three titles, each a few
# artists with their own properties) costs more than drawing most of devlab's figures on it:
# for the allocation timeline of a dozen entries, about a third of the whole. So `svg_axes`
# keeps the axes a drawing used, emptied of what the drawing added (its artists, titles and
# labels), and hands them to the next drawing of the same size and place. What the drawing
# set on the axes themselves (limits, ticks and their labels, the grid, tick lengths, which
# spines show) stays: a drawing through `svg_axes` sets all of it every time, as the two
# timelines do, and tests/test_figures.py checks that kept axes draw exactly the SVG fresh ones
# draw. Axes in use (another thread's drawing, or a drawing inside one) are not shared: the
# second gets fresh ones. The ticks are laid out again each time (matplotlib's Axis draws
# them anew), their text measured once (See Note [devlab's SVG renderer]): the axes' ticks,
# grid and labels are most of what drawing a small figure still costs.

_KEPT: dict[tuple, tuple[threading.Lock, Any]] = {}
_KEPT_LOCK = threading.Lock()
_KEPT_MAX = 16  # sizes kept; past it, the oldest goes


def _kept_axes(key: tuple) -> tuple[threading.Lock, Any]:
    from matplotlib.figure import Figure

    with _KEPT_LOCK:
        entry = _KEPT.get(key)
        if entry is None:
            width, height, rect = key
            import matplotlib

            with matplotlib.rc_context(_SVG_RC):
                fig = Figure(figsize=(width / 72, height / 72), dpi=72)
                fig.patch.set_visible(False)
                entry = (threading.Lock(), fig.add_axes(rect))
            if len(_KEPT) >= _KEPT_MAX:
                del _KEPT[next(iter(_KEPT))]
            _KEPT[key] = entry
        return entry


def _empty(ax: Any) -> None:
    """Take away what a drawing added to `ax`: its artists, legend, titles and labels."""
    for artist in (*ax.collections, *ax.patches, *ax.lines, *ax.texts, *ax.artists,
                   *ax.images, *ax.tables):
        artist.remove()
    if ax.legend_ is not None:
        ax.legend_.remove()
    for loc in ("center", "left", "right"):
        ax.set_title("", loc=loc)
    ax.set_xlabel("")
    ax.set_ylabel("")


@contextmanager
def svg_axes(width: int, height: int, rect: tuple[float, float, float, float]
             ) -> Iterator[Any]:
    """Axes at `rect` (fractions of the figure: left, bottom, width, height) on an
    `svg_figure(width, height)`, kept for the next drawing of that size (See Note [Axes kept
    between drawings]): draw on them and `svg_markup(ax.figure, ...)` inside the `with` block,
    setting the limits, ticks and labels the drawing uses every time."""
    import matplotlib

    key = (int(width), int(height), tuple(float(v) for v in rect))
    lock, ax = _kept_axes(key)
    if not lock.acquire(blocking=False):  # in use: fresh axes for this drawing
        with svg_figure(width, height) as fig:
            yield fig.add_axes(key[2])
        return
    try:
        with matplotlib.rc_context(_SVG_RC):
            yield ax
    finally:
        try:
            _empty(ax)
        except Exception:  # axes that cannot be emptied are not kept
            with _KEPT_LOCK:
                if _KEPT.get(key, (None,))[0] is lock:
                    del _KEPT[key]
        lock.release()


_PATH_TOKEN = re.compile(r"[MLQCz]|-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_GROUP_TAG = re.compile(r"<g\b[^>]*>|</g>")


@lru_cache(maxsize=65536)  # a figure repeats its coordinates (rows, columns, edges)
def _num(text: str) -> str:
    return _num_of(float(text))


@lru_cache(maxsize=65536)
def _num_of(value: float) -> str:
    """A coordinate to 0.1 px, as short as it writes."""
    v = round(value, 1)
    return f"{v:.1f}".removesuffix(".0") if v else "0"


def _compact_path(d: str) -> str:
    """A path's data with numbers to 0.1 px and straight segments that keep x or y as V or H."""
    out: list[str] = []
    tokens = _PATH_TOKEN.findall(d)
    i, x, y = 0, None, None
    while i < len(tokens):
        cmd = tokens[i]
        if cmd in ("M", "L"):
            nx, ny = _num(tokens[i + 1]), _num(tokens[i + 2])
            if cmd == "L" and nx == x:
                out.append(f"V{ny}")
            elif cmd == "L" and ny == y:
                out.append(f"H{nx}")
            else:
                out.append(f"{cmd}{nx} {ny}")
            x, y = nx, ny
            i += 3
        elif cmd == "z":
            out.append("z")
            i += 1
        else:  # a curve: its numbers rounded
            n = 6 if cmd == "C" else 4
            out.append(cmd + " ".join(_num(t) for t in tokens[i + 1:i + 1 + n]))
            x, y = _num(tokens[i + n - 1]), _num(tokens[i + n])
            i += 1 + n
    return "".join(out)


_MARKER = re.compile(r'<defs><path id="(m[0-9a-f]+)" d="([^"]*)"[^>]*/></defs>')
_USE = re.compile(r'<use xlink:href="#(m[0-9a-f]+)" x="([^"]*)" y="([^"]*)" (style="[^"]*")/>')


def _moved(d: str, dx: float, dy: float) -> str:
    """A compacted path's data (M, L, H, V, z) moved by (dx, dy)."""
    def move(m: re.Match) -> str:
        cmd, nums = m.group(1), m.group(2).split()
        if cmd == "H":
            return f"H{_num(str(float(nums[0]) + dx))}"
        if cmd == "V":
            return f"V{_num(str(float(nums[0]) + dy))}"
        return f"{cmd}{_num(str(float(nums[0]) + dx))} {_num(str(float(nums[1]) + dy))}"

    return re.sub(r"([MLHV])([-\d. e+]+)", move, d)


def _inline_markers(svg: str) -> str:
    """Each marker matplotlib defines once and places with <use> (a tick mark) written where
    it is placed: no reference inside the markup, which an HTML sanitizer may drop."""
    shapes = dict(_MARKER.findall(svg))
    svg = _MARKER.sub("", svg)

    def placed(m: re.Match) -> str:
        d = _moved(shapes[m.group(1)], float(m.group(2)), float(m.group(3)))
        return f'<path d="{d}" {m.group(4)}/>'

    return _USE.sub(placed, svg)


@lru_cache(maxsize=4096)  # a figure's thousands of shapes share a few styles
def _compact_style(style: str) -> str:
    """A style attribute without spaces, the font family (the <svg> element sets it once)
    or a zero dash offset, with #rrggbb colors as #rgb where they can be."""
    style = re.sub(r"\s*([:;])\s*", r"\1", style)
    style = re.sub(r"font-family:[^;]*;?|stroke-dashoffset:0;?", "", style)
    return re.sub(r"#([0-9a-f])\1([0-9a-f])\2([0-9a-f])\3\b", r"#\1\2\3", style).rstrip(";")


def _drop_bare_groups(svg: str) -> str:
    """The markup without `<g>` elements that carry no attribute (and their closing tags)."""
    out: list[str] = []
    bare: list[bool] = []
    at = 0
    for m in _GROUP_TAG.finditer(svg):
        out.append(svg[at:m.start()])
        at = m.end()
        tag = m.group()
        if tag == "</g>":
            if not bare.pop():
                out.append(tag)
        else:
            bare.append(tag == "<g>")
            if tag != "<g>":
                out.append(tag)
    out.append(svg[at:])
    return "".join(out)


_BARE_ELEMENT = re.compile(r"<(\w+)\b[^>]*?/>")


def _put_titles(svg: str, gid: str, text: str | Sequence[str]) -> str:
    """Hover text into the group matplotlib drew artist `gid` in: a text for the whole group,
    a list of texts one into each of its shapes (empty elements) in order: a collection's
    items, a patch's path, a line's markers."""
    start = f'<g id="{gid}">'
    at = svg.index(start) + len(start)
    if isinstance(text, str):
        return (f"{svg[:at - len(start)]}<g class='devlab-tip'><title>"
                f"{html.escape(text, quote=False)}</title>{svg[at:]}")
    out = [svg[:at]]
    for t in text:
        m = _BARE_ELEMENT.search(svg, at)
        if m is None:
            break
        out += [svg[at:m.end() - 2], f"><title>{html.escape(t, quote=False)}</title>",
                f"</{m.group(1)}>"]
        at = m.end()
    out.append(svg[at:])
    return "".join(out)


# Note [devlab's SVG renderer]
# matplotlib's SVG renderer, three things changed, each where a profile of the timelines found
# the time (benchmarks/figures.py): a path is written compact as `svg_markup` wants it (0.1 px,
# H and V), not written at six digits and parsed again; a collection of filled paths (a band,
# a block of kernels: thousands in a step timeline) writes each item's path from its corners
# at once and its style from a cache of the styles it has written, where matplotlib's generic
# loop builds a transform, a style dictionary and a string per item; and text is measured once
# per string and font for the process rather than once per drawing (matplotlib keeps its
# measures per renderer, and a drawing is a new renderer). What it writes is what
# matplotlib's renderer writes, compacted: a collection with hatching, clipping, links or
# curves, and every other artist, goes through matplotlib's own code.

_MOVETO, _LINETO, _CLOSEPOLY = 1, 2, 79


def _corners_d(points: list[list[float]], codes: Sequence[int] | None) -> str:
    """Compact path data of straight segments: points already in SVG pixels."""
    out: list[str] = []
    x = y = None
    for k, (px, py) in enumerate(points):
        code = codes[k] if codes is not None else (_MOVETO if k == 0 else _LINETO)
        if code == _CLOSEPOLY:
            out.append("z")
            continue
        nx, ny = _num_of(px), _num_of(py)
        if code == _LINETO and nx == x:
            out.append(f"V{ny}")
        elif code == _LINETO and ny == y:
            out.append(f"H{nx}")
        else:
            out.append(f"{'M' if code == _MOVETO else 'L'}{nx} {ny}")
        x, y = nx, ny
    return "".join(out)


_EXTENTS: dict[tuple, tuple[float, float, float]] = {}
_EXTENTS_MAX = 4096


def _text_extent(text: str, prop: Any, ismath: Any) -> tuple[float, float, float]:
    """The width, height and descent of `text` in `prop`, measured once per process."""
    # Keyed by the font's values now: a FontProperties is mutable (a caller may change it
    # after asking), so it is no key itself.
    key = (text, ismath, tuple(prop.get_family()), prop.get_slant(), prop.get_variant(),
           prop.get_weight(), prop.get_stretch(), prop.get_size(), prop.get_file(),
           prop.get_math_fontfamily())
    extent = _EXTENTS.get(key)
    if extent is None:
        extent = _text_to_path().get_text_width_height_descent(text, prop, ismath)
        if len(_EXTENTS) >= _EXTENTS_MAX:
            _EXTENTS.clear()
        _EXTENTS[key] = extent
    return extent


@lru_cache(maxsize=1)
def _text_to_path() -> Any:
    from matplotlib.textpath import TextToPath

    return TextToPath()  # its fonts are matplotlib's, one per thread


def _hashable(values: Any) -> list:
    """A collection's property values (colors, widths, dash patterns) as hashable items,
    which matplotlib takes as it takes the lists or arrays they were."""
    items = values.tolist() if hasattr(values, "tolist") else list(values)
    return [tuple(tuple(x) if isinstance(x, list) else x for x in v)
            if isinstance(v, (list, tuple)) else v for v in items]

@lru_cache(maxsize=1)
def _renderer_class() -> type:
    import numpy as np
    from matplotlib.backends.backend_svg import RendererSVG

    straight = {_MOVETO, _LINETO, _CLOSEPOLY}

    class Renderer(RendererSVG):
        """See Note [devlab's SVG renderer]."""

        def get_text_width_height_descent(self, s, prop, ismath):
            return _text_extent(s, prop, ismath)

        def _convert_path(self, path, transform=None, clip=None, simplify=None, sketch=None):
            return _compact_path(super()._convert_path(path, transform, clip, simplify, sketch))

        def __init__(self, width, height, out, **kwargs):
            super().__init__(width, height, out, **kwargs)
            self._out = out  # the file the writer writes to

        def draw_path_collection(self, gc, master_transform, paths, all_transforms, offsets,
                                 offset_trans, facecolors, edgecolors, linewidths, linestyles,
                                 antialiaseds, urls, offset_position, *, hatchcolors=None):
            items = self._plain_items(gc, master_transform, paths, all_transforms, offsets,
                                      offset_trans, facecolors, edgecolors, linewidths,
                                      linestyles, antialiaseds, urls, offset_position)
            if items is None:
                return super().draw_path_collection(
                    gc, master_transform, paths, all_transforms, offsets, offset_trans,
                    facecolors, edgecolors, linewidths, linestyles, antialiaseds, urls,
                    offset_position, hatchcolors=hatchcolors)
            # The first item through the writer (which closes the group's start tag it holds
            # open), the others straight to its file, as it would write them.
            (first, codes, style), *rest = items
            self.writer.element("path", d=_corners_d(first, codes), style=style)
            self._out.write("".join(f'<path d="{_corners_d(c, cs)}" style="{style}"/>'
                                    for c, cs, style in rest))

        def _plain_items(self, gc, master_transform, paths, all_transforms, offsets,
                         offset_trans, facecolors, edgecolors, linewidths, linestyles,
                         antialiaseds, urls, offset_position):
            """Each item's corners in SVG pixels, codes and style, for a collection of
            filled straight paths with nothing that matplotlib's own loop alone writes
            (hatching, clipping, links, sketching, curves, per-item transforms); else None."""
            n = len(paths)
            if (not n or len(all_transforms) or gc.get_hatch() is not None
                    or any(u is not None for u in urls) or self._get_clip_attrs(gc)
                    or gc.get_sketch_params() is not None or not len(facecolors)
                    or len(offsets) > 1):
                return None
            codes = [None if p.codes is None else p.codes.tolist() for p in paths]
            if not straight.issuperset(c for cs in codes if cs is not None for c in cs):
                return None
            shift = offset_trans.transform(offsets)[0] if len(offsets) else (0.0, 0.0)
            flip = np.array([[1.0, 0, 0], [0, -1.0, self.height], [0, 0, 1.0]])
            m = flip @ master_transform.get_matrix()
            # All the items' corners at once, then cut back into items.
            points = np.concatenate([p.vertices for p in paths]) @ m[:2, :2].T + m[:2, 2]
            points += (shift[0], -shift[1])
            if not np.isfinite(points).all():  # matplotlib breaks a path there
                return None
            flat = points.tolist()
            ends = np.cumsum([len(p.vertices) for p in paths]).tolist()
            corners = [flat[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
            # Each item's style, through matplotlib's own loop once per distinct one.
            sides = [_hashable(v) for v in (facecolors, edgecolors, linewidths, linestyles,
                                            antialiaseds)]
            keys = [tuple(v[k % len(v)] if v else None for v in sides) for k in range(n)]
            styles: dict[tuple, str] = {}
            for key in dict.fromkeys(keys):
                one = [[] if v is None else [v] for v in key]
                for _, _, _, gc0, face in self._iter_collection(
                        gc, [None], [], offset_trans, *one, [None], offset_position,
                        hatchcolors=[]):
                    if face is None:  # unfilled: matplotlib clips and simplifies it
                        return None
                    styles[key] = self._get_style(gc0, face)
            return [(c, cs, styles[k]) for c, cs, k in zip(corners, codes, keys, strict=True)]

    return Renderer


def _write_svg(fig, out: io.StringIO) -> None:
    """`fig` as SVG into `out`, as `savefig(format="svg")` writes it (at 72 dpi, no metadata),
    by devlab's renderer (See Note [devlab's SVG renderer])."""
    from matplotlib.backends.backend_mixed import MixedModeRenderer

    dpi = fig.dpi
    width, height = fig.get_size_inches()
    renderer = MixedModeRenderer(fig, width, height, dpi, _renderer_class()(
        width * 72, height * 72, out, image_dpi=dpi,
        metadata={"Date": None, "Creator": None, "Format": None, "Type": None}))
    if dpi != 72:  # SVG's unit is the point, as savefig draws it
        fig.dpi = 72
    try:
        fig.draw(renderer)
        renderer.finalize()
    finally:
        if dpi != 72:
            fig.dpi = dpi


def svg_markup(fig, tips: Mapping[Any, str | Sequence[str]] | None = None,
               title: str | None = None, css_class: str | None = None) -> str:
    """`fig` as one `<svg>` element to put in an HTML output: self-contained (no script, no
    stylesheet, no link), each artist of `tips` showing its text on hover (a list of texts:
    one for each element the artist draws, as a collection's items), `title` for the whole
    picture (See Note [Hover text in matplotlib's SVG])."""
    import matplotlib

    tips = tips or {}
    gids = {}
    for k, (artist, text) in enumerate(tips.items()):
        gid = f"{_TIP}{k}"
        artist.set_gid(gid)
        gids[gid] = text
    for ax in fig.axes:  # the page's background shows through, as around an image
        ax.patch.set_visible(False)
    buf = io.StringIO()
    with matplotlib.rc_context(_SVG_RC):
        _write_svg(fig, buf)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r">\s+<", "><", svg).strip()
    svg = re.sub(r'<style type="text/css">[^<]*</style>', "", svg).replace("<defs></defs>", "")
    svg = re.sub(r'\s(x|y|x1|x2|y1|y2|width|height)="(-?[\d.e+-]+)"',
                 lambda m: f' {m.group(1)}="{_num(m.group(2))}"', svg)
    svg = re.sub(r' transform="rotate\(-?0 [^)]*\)"', "", svg)
    svg = re.sub(r'style="([^"]*)"', lambda m: 'style="' + _compact_style(m.group(1)) + '"', svg)

    svg = _inline_markers(svg)
    for gid, text in gids.items():
        svg = _put_titles(svg, gid, text)
    svg = re.sub(r"<g\b[^>]*/>", "", svg)  # an empty group: an artist with nothing to draw
    svg = re.sub(r'<g id="[^"]*">', "<g>", svg)
    svg = _drop_bare_groups(svg)
    w, h = f"{fig.get_figwidth() * 72:.0f}", f"{fig.get_figheight() * 72:.0f}"
    head = (f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img"'
            ' style="display:block;stroke-linejoin:round;stroke-linecap:butt;'
            "font-family:'DejaVu Sans',sans-serif\""
            + (f' class="{css_class}"' if css_class else "") + ">"
            + (f"<title>{html.escape(title, quote=False)}</title>" if title else ""))
    svg = head + svg[svg.index(">") + 1:]
    for artist in tips:  # the artists keep no trace of this rendering
        artist.set_gid(None)
    return svg
