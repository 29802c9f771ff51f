"""devlab._helpers.figures: matplotlib's SVG as an HTML output (hover text, self-contained, compact)
and the one tick rule."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest
from matplotlib.collections import PolyCollection
from matplotlib.patches import Rectangle

from devlab._helpers import figures
from devlab._helpers.sizes import format_bytes

MiB = 1 << 20


def _svg(tips_for):
    with figures.svg_figure(300, 120) as fig:
        ax = fig.add_axes((0.1, 0.2, 0.85, 0.7))
        box = Rectangle((1, 1), 2, 1, color="#4e79a7", clip_on=False)
        ax.add_artist(box)
        boxes = PolyCollection([[(4, 0), (5, 0), (5, 2), (4, 2)], [(6, 0), (7, 0), (7, 1), (6, 1)]],
                               facecolors=["#f28e2b", "#59a14f"], clip_on=False)
        ax.add_collection(boxes, autolim=False)
        ax.set_xlim(0, 8)
        ax.set_ylim(0, 3)
        return figures.svg_markup(fig, tips_for(box, boxes), title="the whole picture")


def test_hover_text_per_artist_and_per_collection_item():
    svg = _svg(lambda box, boxes: {box: "one <box>", boxes: ["first", "second"]})
    root = ET.fromstring(svg)
    assert root.tag == "svg" and root.get("width") == "300" and root.get("height") == "120"
    assert root.find("title").text == "the whole picture"
    # The patch's group holds its title; each item of the collection its own.
    group = next(g for g in root.iter("g") if g.get("class") == "devlab-tip")
    assert group.find("title").text == "one <box>" and group.find("path") is not None
    items = [p for p in root.iter("path") if p.find("title") is not None]
    assert [p.find("title").text for p in items] == ["first", "second"]
    assert ["#f28e2b" in p.get("style") for p in items] == [True, False]


def test_the_markup_is_self_contained_and_compact():
    svg = _svg(lambda box, boxes: {box: "a", boxes: ["b", "c"]})
    assert not re.search(r"<script|<style|<link|<use|href=|url\(|http|<\?xml|<!DOCTYPE", svg)
    assert "id=" not in svg  # no ids to collide with another figure's on the page
    assert "<g>" not in svg  # groups without attributes are gone
    assert "font-family" not in svg[svg.index(">"):]  # set once, on the <svg> element
    numbers = re.findall(r'\sd="([^"]*)"', svg)
    assert numbers and all(not re.search(r"\.\d\d", d) for d in numbers)  # to 0.1 px
    # The collection's second item: x 6..7 of 0..8 over 85 % of 300 px from 30 px.
    items = re.findall(r'<path d="([^"]*)" style="fill:#59a14f', svg)
    assert items
    x0 = 30 + 6 / 8 * 255
    assert items[0].startswith(f"M{round(x0, 1):g} ")
    assert "H" in items[0] and "V" in items[0]


def test_the_artists_keep_no_gid():
    kept = {}

    def tips(box, boxes):
        kept["artists"] = (box, boxes)
        return {box: "a", boxes: ["b", "c"]}

    _svg(tips)
    assert all(a.get_gid() is None for a in kept["artists"])


@pytest.mark.parametrize(("lo", "hi", "target"), [(0, 190, 5), (0, 10_001, 6), (0, 0.011, 6),
                                                   (0, 7, 5)])
def test_ticks_are_matplotlibs_rule_inside_the_range(lo, hi, target):
    from matplotlib.ticker import MaxNLocator

    ticks = figures.nice_ticks(lo, hi, target)
    assert ticks[0] >= lo and ticks[-1] <= hi * (1 + 1e-9)
    expected = MaxNLocator(nbins=target, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)
    assert ticks == [t for t in expected if lo <= t <= hi * (1 + 1e-9)]
    steps = {round(b - a, 12) for a, b in zip(ticks, ticks[1:], strict=False)}
    assert len(steps) == 1
    mantissa = steps.pop() / 10 ** math.floor(math.log10(ticks[1]))
    assert any(abs(mantissa - m) < 1e-9 for m in (1, 2, 2.5, 5, 10))


def test_byte_ticks_are_round_in_the_unit_shown():
    ticks = figures.ticks_in_unit(190 * MiB)
    assert ticks == [0, 50 * MiB, 100 * MiB, 150 * MiB]
    assert [format_bytes(t) for t in ticks][:2] == ["0 B", "50.0 MiB"]
    assert figures.ticks_in_unit(900) == [0, 200, 400, 600, 800]
    assert [format_bytes(t) for t in figures.ticks_in_unit(12 << 30)] == [
        "0 B", "2.5 GiB", "5.0 GiB", "7.5 GiB", "10.0 GiB"]


def _memory_timeline(blocks: int):
    from devlab.core.memory_watch import timeline

    frames = [{"filename": "/tmp/ipykernel_1/2.py", "line": 3, "name": "<module>"}]
    trace = [{"action": "alloc", "addr": 4096 * k, "size": (k + 1) * MiB, "frames": frames}
             for k in range(blocks)]
    trace += [{"action": "free_completed", "addr": 0, "size": MiB, "frames": frames}]
    return timeline({"segments": [], "device_traces": [trace]})


def _step_timeline(kernels: int):
    from devlab.engine.gpu_model import modeled_clock as clk
    from devlab.engine.simulated.clock.step_timeline import Timeline

    spans = [clk.Span(d, clk.COMPUTE, clk.KERNEL, f"k{k}", k * 1e-4, k * 1e-4 + 8e-5)
             for d in (0, 1) for k in range(kernels)]
    spans.append(clk.Span(0, clk.COMM, clk.COLLECTIVE, "all_reduce", 1e-4, 5e-4))
    return Timeline("NVIDIA T4 (16 GB, PCIe)", spans, 0.0)


def test_kept_axes_draw_what_fresh_axes_draw():
    # Note [Axes kept between drawings]: what one drawing set on the axes never shows in the
    # next one's, whatever drew in between (two timelines of one size share their axes).
    pictures = [_memory_timeline(2), _memory_timeline(7), _step_timeline(5), _step_timeline(9)]
    fresh = []
    for p in pictures:
        figures._KEPT.clear()
        fresh.append(p._repr_html_())
    assert fresh[0] != fresh[1] and fresh[2] != fresh[3]
    assert [p._repr_html_() for p in pictures * 2] == fresh * 2
    assert len(figures._KEPT) == 2  # one pair of axes for each size drawn


def test_axes_in_use_are_not_handed_out_again():
    with figures.svg_axes(200, 100, (0.1, 0.1, 0.8, 0.8)) as outer:
        outer.plot([0, 1], [0, 1])
        with figures.svg_axes(200, 100, (0.1, 0.1, 0.8, 0.8)) as inner:
            assert inner is not outer and not inner.lines
            inner.plot([0, 1], [1, 0])
        assert len(outer.lines) == 1
    with figures.svg_axes(200, 100, (0.1, 0.1, 0.8, 0.8)) as again:
        assert again is outer and not again.lines  # emptied for the next drawing


def test_devlabs_renderer_writes_what_matplotlibs_writes(monkeypatch):
    # Note [devlab's SVG renderer]: the collections written from their corners at once, the
    # styles kept, the text measured once: the same markup as matplotlib's own renderer (only
    # its paths compacted, as svg_markup wants them) draws.
    from matplotlib.backends.backend_svg import RendererSVG

    def picture(seed: int) -> str:
        with figures.svg_figure(320, 160) as fig:
            ax = fig.add_axes((0.15, 0.2, 0.8, 0.7))
            squares = [[(k, 0), (k + 0.8, 0), (k + 0.8, 1 + k % 3), (k, 1 + k % 3)]
                       for k in range(seed)]
            ax.add_collection(PolyCollection(  # colors, alpha, edges and dashes per item
                squares, facecolors=["#4e79a7", (1, 0, 0, 0.5), "#59a14f"][: 1 + seed % 3],
                edgecolors=["#fff", "#000"], linewidths=[0.4, 1.5, 1], linestyles=["-", "--"],
                clip_on=False), autolim=False)
            ax.add_collection(PolyCollection(squares[:2], facecolors="#fff", hatch="//",
                                             edgecolors="#f28e2b", clip_on=False))  # hatched
            ax.add_collection(PolyCollection(squares[:3], facecolors="#bbb"))  # clipped
            ax.add_collection(PolyCollection(  # unfilled: matplotlib clips and simplifies it
                [[(0, 0), (1, 3), (2, 0)]], facecolors="none", edgecolors="#000"))
            ax.set_xlim(0, seed)
            ax.set_ylim(0, 4)
            ax.set_title(f"picture {seed}")
            return figures.svg_markup(fig, {ax.collections[0]: [str(k) for k in range(seed)]})

    ours = [picture(seed) for seed in (4, 7)]

    class Plain(RendererSVG):
        def _convert_path(self, *args, **kwargs):
            return figures._compact_path(super()._convert_path(*args, **kwargs))

    monkeypatch.setattr(figures, "_renderer_class", lambda: Plain)
    assert [picture(seed) for seed in (4, 7)] == ours
    assert ours[0] != ours[1] and ours[1].count("<title>") == 7
