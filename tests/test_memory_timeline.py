"""devlab.core.memory_watch.allocation_timeline: the allocation timeline read from snapshots in torch's format (built
here by hand, and by devlab's allocator model where the tree has it), its HTML, plot and
export."""

from __future__ import annotations

import os
import pickle
import random
import re
import sysconfig
from pathlib import Path

import pytest
import torch
import torch.cuda._memory_viz as memory_viz

import devlab
from devlab.core.memory_watch import AllocationTimeline, format_bytes, is_user_file, timeline
from devlab.core.memory_watch.allocation_timeline import MIN_BAND_FRACTION, NO_STACK, NOT_USER

MiB = 1 << 20
CELL = "/tmp/ipykernel_4242/1234567.py"
TORCH_FILE = os.path.join(os.path.dirname(torch.__file__), "nn", "modules", "linear.py")
DEVLAB_FILE = os.path.join(os.path.dirname(devlab.__file__), "simulated", "_ops.py")
SITE_FILE = "/usr/local/lib/python3.11/site-packages/transformers/modeling_utils.py"
STDLIB_FILE = os.path.join(sysconfig.get_paths()["stdlib"], "contextlib.py")


def frame(filename: str, line: int, name: str = "<module>") -> dict:
    return {"filename": filename, "line": line, "name": name}


def stack(cell_line: int, name: str = "<module>") -> list[dict]:
    """A stack as torch records it, innermost first: torch and devlab inside the cell's line."""
    return [frame("/pytorch/c10/cuda/CUDACachingAllocator.cpp", 1200, "c10::cuda::malloc"),
            frame(TORCH_FILE, 125, "forward"), frame(DEVLAB_FILE, 80, "handle"),
            frame(CELL, cell_line, name), frame(STDLIB_FILE, 10, "run")]


class Trace:
    """A device trace written entry by entry, with made-up times."""

    def __init__(self) -> None:
        self.entries: list[dict] = []

    def add(self, action: str, addr: int, size: int, frames: list[dict] | None = None,
            **extra) -> int:
        self.entries.append({"action": action, "addr": addr, "size": size, "stream": 0,
                             "time_us": 1_000_000 + 10 * len(self.entries),
                             "frames": frames or [], **extra})
        return len(self.entries) - 1

    def alloc(self, addr: int, size: int, line: int = 1) -> int:
        return self.add("alloc", addr, size, stack(line))

    def free(self, addr: int, size: int, line: int = 1) -> int:
        self.add("free_requested", addr, size, stack(line))
        return self.add("free_completed", addr, size, stack(line))


def segment(address: int, blocks: list[tuple[int, int, str, list[dict]]], device: int = 0
            ) -> dict:
    """A segment of (size, requested, state, frames) blocks, laid end to end."""
    out, addr = [], address
    for size, requested, state, frames in blocks:
        out.append({"address": addr, "size": size, "requested_size": requested,
                    "state": state, "frames": frames})
        addr += size
    total = addr - address
    allocated = sum(b["size"] for b in out if b["state"] == "active_allocated")
    return {"device": device, "address": address, "total_size": total,
            "allocated_size": allocated, "active_size": allocated,
            "requested_size": sum(b["requested_size"] for b in out if b["state"] != "inactive"),
            "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [], "blocks": out}


def replay(snapshot: dict, device: int = 0) -> tuple[list[int], list[dict[int, tuple]]]:
    """The test's own reading: bytes held after each step, and which (addr -> (size, line))
    are held, from a plain dict of live addresses."""
    trace = snapshot["device_traces"][device]
    freed_in_trace = {e["addr"] for e in trace if e["action"] == "free_completed"}
    allocated_in_trace = {e["addr"] for e in trace if e["action"] == "alloc"}
    held: dict[int, tuple] = {}
    # Alive at the start: freed before being allocated in the trace, or held by the segments
    # and never allocated in the trace.
    first_alloc = {}
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            first_alloc.setdefault(e["addr"], i)
    for i, e in enumerate(trace):
        if e["action"] == "free_completed" and i < first_alloc.get(e["addr"], 1 << 60):
            held[e["addr"]] = (e["size"], e["frames"])
    for seg in snapshot["segments"]:
        for b in seg["blocks"]:
            if (b["state"] == "active_allocated" and b["address"] not in allocated_in_trace
                    and b["address"] not in freed_in_trace):
                held[b["address"]] = (b["requested_size"], b["frames"])
    totals, states = [sum(s for s, _ in held.values())], [dict(held)]
    for e in trace:
        if e["action"] == "alloc":
            held[e["addr"]] = (e["size"], e["frames"])
        elif e["action"] == "free_completed":
            held.pop(e["addr"], None)
        totals.append(sum(s for s, _ in held.values()))
        states.append(dict(held))
    return totals, states


def cell_line(frames: list[dict]) -> int | None:
    return next((f["line"] for f in frames if f["filename"] == CELL), None)


# -- reading the trace ------------------------------------------------------------------------


def test_allocations_and_frees_over_time():
    t = Trace()
    a = t.alloc(0x1000, 100 * MiB, line=3)
    b = t.alloc(0x9000000, 300 * MiB, line=4)
    t.add("segment_alloc", 0x20000000, 20 * MiB)
    fa = t.free(0x1000, 100 * MiB)
    c = t.alloc(0x1000, 50 * MiB, line=5)
    fb = t.free(0x9000000, 300 * MiB)
    snap = {"segments": [segment(0x1000, [(50 * MiB, 50 * MiB, "active_allocated",
                                            stack(5))])],
            "device_traces": [t.entries]}
    tl = timeline(snap)
    assert isinstance(tl, AllocationTimeline)
    assert tl.events == len(t.entries)
    assert tl.allocated == replay(snap)[0]
    by_line = {x.line.split(":")[1].split(" ")[0]: x for x in tl.data}
    first, second, third = by_line["3"], by_line["4"], by_line["5"]
    assert (first.alloc_index, first.free_requested_index, first.free_index) == (a, fa - 1, fa)
    assert first.alloc_time_us == t.entries[a]["time_us"]
    assert first.free_time_us == t.entries[fa]["time_us"]
    assert (second.alloc_index, second.free_index) == (b, fb)
    assert (third.alloc_index, third.free_index, third.size) == (c, None, 50 * MiB)
    assert third.block_size == 50 * MiB  # the segments still hold it
    assert first.block_size is None
    assert [x.address for x in tl.data] == [0x1000, 0x9000000, 0x1000]
    assert first.line == f"{CELL}:3 (<module>)"


def test_blocks_alive_before_recording():
    t = Trace()
    # 0x5000 was allocated before recording began and is freed during it.
    t.free(0x5000, 8 * MiB, line=9)
    t.alloc(0x7000000, 4 * MiB, line=10)
    before = stack(2)
    snap = {"segments": [
        segment(0x100000, [(2 * MiB, 2 * MiB - 512, "active_allocated", before),
                           (2 * MiB, 0, "inactive", []),
                           (6 * MiB, 6 * MiB, "active_allocated", [])]),
        segment(0x7000000, [(4 * MiB, 4 * MiB, "active_allocated", stack(10))]),
    ], "device_traces": [t.entries]}
    tl = timeline(snap)
    pre = [x for x in tl.data if x.alloc_index is None]
    assert {x.address for x in pre} == {0x5000, 0x100000, 0x100000 + 4 * MiB}
    kept = next(x for x in pre if x.address == 0x100000)
    assert (kept.size, kept.block_size, kept.free_index) == (2 * MiB - 512, 2 * MiB, None)
    assert kept.line.endswith(":2 (<module>)")
    no_stack = next(x for x in pre if x.address == 0x100000 + 4 * MiB)
    assert no_stack.line == NO_STACK
    freed = next(x for x in pre if x.address == 0x5000)
    assert freed.free_index == 1 and freed.free_requested_index == 0
    assert freed.block_size is None
    assert tl.allocated == replay(snap)[0]
    assert tl.allocated[0] == 8 * MiB + 2 * MiB - 512 + 6 * MiB
    # Blocks alive at the start come first in .data, and are stacked never-freed at the bottom.
    assert all(x.alloc_index is None for x in tl.data[:3])
    bands, _ = tl._bands()
    bottom = {a.address: corners[0][1] for a, corners, _ in bands}
    assert bottom[0x5000] == 2 * MiB - 512 + 6 * MiB  # freed first: on top


def test_a_freed_block_moves_the_blocks_above_it_down():
    t = Trace()
    t.alloc(0x1, 10 * MiB)
    t.alloc(0x2, 20 * MiB)
    t.alloc(0x3, 30 * MiB)
    t.free(0x1, 10 * MiB)  # entries 3, 4: the step after entry 4 is step 5
    tl = timeline({"segments": [], "device_traces": [t.entries]})
    corners = {a.address: c for a, c, _ in tl._bands()[0]}
    assert corners[0x1] == [(1, 0)]
    assert corners[0x2] == [(2, 10 * MiB), (5, 0)]
    assert corners[0x3] == [(3, 30 * MiB), (5, 20 * MiB)]


def test_free_requested_alone_ends_a_block_when_the_trace_has_no_free_completed():
    t = Trace()
    t.alloc(0x1, MiB)
    t.add("free_requested", 0x1, MiB)
    t.alloc(0x2, 2 * MiB)
    tl = timeline({"segments": [], "device_traces": [t.entries]})
    assert tl.allocated == [0, MiB, 0, 2 * MiB]
    # With free_completed entries in the trace, a block holds its bytes until its own one
    # (record_stream: the allocator completes the free later).
    t = Trace()
    t.alloc(0x2, 2 * MiB)
    t.add("free_requested", 0x2, 2 * MiB)
    t.alloc(0x3, MiB)
    t.add("free_completed", 0x2, 2 * MiB)
    tl = timeline({"segments": [], "device_traces": [t.entries]})
    assert tl.allocated == [0, 2 * MiB, 2 * MiB, 3 * MiB, MiB]
    assert (tl.data[0].free_requested_index, tl.data[0].free_index) == (1, 3)


def test_peak_and_the_lines_holding_the_most_at_it():
    rng = random.Random(7)
    t = Trace()
    live: list[tuple[int, int, int]] = []
    addr = 0x10000
    for _ in range(400):
        if live and rng.random() < 0.45:
            a, size, line = live.pop(rng.randrange(len(live)))
            t.free(a, size, line)
        else:
            size, line = rng.choice([MiB, 3 * MiB, 512, 40 * MiB]), rng.randrange(1, 8)
            addr += 1 << 30
            t.alloc(addr, size, line)
            live.append((addr, size, line))
    snap = {"segments": [], "device_traces": [t.entries]}
    tl = timeline(snap)
    totals, states = replay(snap)
    peak = max(totals)
    step = totals.index(peak)
    assert tl.peak.bytes == peak
    assert tl.peak.index == step - 1
    assert tl.peak.time_us == t.entries[step - 1]["time_us"]
    expected: dict[str, int] = {}
    for size, frames in states[step].values():
        key = f"{cell_line(frames)}"
        expected[key] = expected.get(key, 0) + size
    got = tl.top_lines(n=None)
    assert {u.line.split(":")[-1].split(" ")[0]: u.bytes for u in got} == expected
    assert [u.bytes for u in got] == sorted(expected.values(), reverse=True)
    assert sum(u.allocations for u in got) == len(states[step])
    assert len(tl.top_lines(n=3)) == 3
    assert sum(u.bytes for u in tl.top_lines("end", None)) == totals[-1]
    assert sum(u.bytes for u in tl.top_lines(10, None)) == totals[11]
    for bad in ("middle", -1, len(t.entries), True):
        with pytest.raises(ValueError, match="at is 'peak'"):
            tl.top_lines(bad)


def test_the_peak_can_be_the_state_recording_began_in():
    t = Trace()
    t.free(0x1, 5 * MiB)
    tl = timeline({"segments": [], "device_traces": [t.entries]})
    assert tl.peak == (5 * MiB, None, None)
    assert "when recording began" in repr(tl)


def test_devices_are_read_apart_and_oom_entries_kept():
    t0, t1 = Trace(), Trace()
    t0.alloc(0x1, MiB)
    t1.alloc(0x2, 2 * MiB)
    t1.add("oom", 0, 80 << 30, device_free=MiB)
    snap = {"segments": [segment(0x9, [(4 * MiB, 4 * MiB, "active_allocated", [])], device=1)],
            "device_traces": [t0.entries, t1.entries]}
    assert timeline(snap, 0).peak.bytes == MiB
    tl1 = timeline(snap, device=1)
    assert tl1.peak.bytes == 6 * MiB
    assert tl1.ooms == [(1, 80 << 30, MiB)]
    assert "out of memory at entry 1" in tl1._repr_html_()
    empty = timeline({"segments": [], "device_traces": []}, device=3)
    assert empty.data == [] and empty.peak == (0, None, None)
    assert "Nothing was allocated" in empty._repr_html_()
    with pytest.raises(TypeError, match="_snapshot"):
        timeline([])


# -- whose line ---------------------------------------------------------------------------------


def test_user_files_rule(tmp_path: Path):
    mine = tmp_path / "train.py"
    for name in (CELL, "<ipython-input-3-5a8f2c1e9b0d>", "/tmp/ipython-input-12-3456789.py",
                 str(mine), "<stdin>", "C:\\Users\\me\\project\\train.py"):
        assert is_user_file(name), name
    for name in (TORCH_FILE, DEVLAB_FILE, SITE_FILE, STDLIB_FILE,
                 "/usr/lib/python3/dist-packages/numpy/core/numeric.py",
                 "/opt/conda/lib/python3.10/contextlib.py",  # another machine's stdlib
                 "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "??", "", "<string>",
                 "<eval_with_key>.3", "<frozen runpy>",
                 os.path.join(os.path.dirname(os.__file__), "runpy.py")):
        assert not is_user_file(name), name


def test_the_line_is_the_innermost_frame_of_user_code(tmp_path: Path):
    helper = str(tmp_path / "helpers.py")
    t = Trace()
    # Innermost first: torch, then the user's helper, then the cell that called it.
    t.add("alloc", 0x1, MiB, [frame(TORCH_FILE, 1, "forward"), frame(helper, 7, "make"),
                              frame(CELL, 2)])
    t.add("alloc", 0x2, MiB, [frame(TORCH_FILE, 1, "forward"), frame(SITE_FILE, 3, "f")])
    t.add("alloc", 0x3, MiB, [])
    tl = timeline({"segments": [], "device_traces": [t.entries]})
    assert tl.data[0].line.endswith("helpers.py:7 (make)")
    assert tl.data[0].frame == frame(helper, 7, "make")
    assert [a.line for a in tl.data[1:]] == [NOT_USER, NO_STACK]
    # A predicate of one's own: only cells count.
    cells = timeline({"segments": [], "device_traces": [t.entries]},
                     user_files=lambda f: "ipykernel_" in f)
    # Outside a kernel an ipykernel cell's file is only a name (its number is the kernel's).
    assert cells.data[0].line == f"{CELL}:2 (<module>)"
    assert cells.data[0].frame == frame(CELL, 2)


# -- what is shown --------------------------------------------------------------------------------


def _sample() -> AllocationTimeline:
    t = Trace()
    t.alloc(0x1, 16 * MiB, line=3)
    t.alloc(0x2, 512, line=4)  # under 0.5 % of the peak: no band of its own
    t.alloc(0x3, 128 * MiB, line=5)
    t.free(0x1, 16 * MiB)
    t.alloc(0x4, 32 * MiB, line=6)
    t.add("alloc", 0x5, 16 * MiB, [frame("<ipython-input-7-abc>", 2, "<module>")])
    return timeline({"segments": [], "device_traces": [t.entries]})


def test_html_is_self_contained():
    tl = _sample()
    page = tl._repr_html_()
    assert "<svg" in page and "</svg>" in page
    assert not re.search(r"<script|<link|<iframe|<img|src=|href=|@import|url\(", page, re.I)
    assert "http" not in page
    # Hover: one <title> per band, with its size and line.
    titles = re.findall(r"<title>(.*?)</title>", page, re.S)
    assert any(format_bytes(128 * MiB) in s and ":5 (&lt;module&gt;)" in s for s in titles)
    assert any("In[7]:2" in s for s in titles)
    assert not any(format_bytes(512) + " (512 B)" in s for s in titles)
    assert "stroke-dasharray" in page  # the peak
    assert f"peak {format_bytes(tl.peak.bytes)}" in page
    # The table of lines at the peak, largest first.
    table = page[page.index("<table"):]
    rows = re.findall(r"<code>(.*?)</code>", table)
    assert [r.split(":")[1].split(" ")[0] for r in rows] == ["5", "6", "2", "4"]
    assert format_bytes(128 * MiB) in table
    # Every tag is closed: the SVG parses as XML.
    import xml.etree.ElementTree as ET

    svg = page[page.index("<svg"):page.index("</svg>") + 6]
    ET.fromstring(svg)


def test_ten_thousand_entries_stay_a_few_hundred_kb():
    rng = random.Random(3)
    t = Trace()
    live: list[tuple[int, int]] = []
    addr = 0
    while len(t.entries) < 10_000:
        # Long-lived blocks allocated among many short ones, freed in random order: the
        # blocks above a freed one move often, the worst case for the paths.
        if live and rng.random() < 0.5:
            a, size = live.pop(rng.randrange(len(live)))
            t.free(a, size)
        else:
            addr += 4096
            size = rng.choice([512, 4096, MiB, 5 * MiB, 20 * MiB])
            t.alloc(addr, size, line=rng.randrange(1, 50))
            live.append((addr, size))
    tl = timeline({"segments": [], "device_traces": [t.entries]})
    page = tl._repr_html_()
    assert len(page.encode()) < 400_000, len(page)
    bands = len(re.findall(r"<path d=[^>]*><title>", page))
    assert 1 < bands <= 200 + 2
    assert tl.peak.bytes == max(replay({"segments": [], "device_traces": [t.entries]})[0])


def test_small_blocks_go_to_the_grey_area():
    tl = _sample()
    _, drawn = tl._bands()
    assert {tl.data[i].address for i in drawn} == {0x1, 0x3, 0x4, 0x5}
    assert all(tl.data[i].size >= tl.peak.bytes * MIN_BAND_FRACTION for i in drawn)


def test_plot_is_a_figure():
    from matplotlib.figure import Figure

    from devlab._helpers.figures import figure_png

    fig = _sample().plot()
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()][:2] == ["0 B", "50.0 MiB"]
    assert figure_png(fig)[:8] == b"\x89PNG\r\n\x1a\n"


# -- export ------------------------------------------------------------------------------------


def test_save_snapshot_round_trips_and_torch_reads_it(tmp_path: Path):
    t = Trace()
    t.add("segment_alloc", 0x100000, 20 * MiB)
    t.alloc(0x100000, 6 * MiB, line=2)
    t.alloc(0x100000 + 6 * MiB, 2 * MiB, line=3)
    t.free(0x100000 + 6 * MiB, 2 * MiB)
    snap = {"segments": [segment(0x100000, [(6 * MiB, 6 * MiB, "active_allocated", stack(2)),
                                            (14 * MiB, 0, "inactive", [])])],
            "device_traces": [t.entries]}
    path = tmp_path / "snapshot.pickle"
    timeline(snap).save_snapshot(path)
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    assert loaded == snap
    assert "total_allocated: 6.0MiB" in memory_viz.segsum(loaded)
    assert "TOTAL MEM" in memory_viz.trace(loaded)
    assert timeline(loaded).allocated == timeline(snap).allocated


def test_a_snapshot_from_devlabs_allocator_model():
    allocator = pytest.importorskip("devlab.engine.gpu_model.caching_allocator")
    model = allocator.CachingAllocator(0, total=16 << 30)
    before = [model.malloc(8 * MiB), model.malloc(3 * MiB + 7)]
    where = {"line": 0}
    model.record_history("all", "all", frames=lambda: [frame(CELL, where["line"])])
    rng = random.Random(5)
    held = []
    for k in range(300):
        where["line"] = k % 9 + 1
        if held and rng.random() < 0.5:
            model.free(held.pop(rng.randrange(len(held))))
        else:
            held.append(model.malloc(rng.choice([100, 4096, MiB + 1, 25 * MiB])))
    model.free(before[0])
    snap = {"segments": model.snapshot(), "device_traces": [model.trace()]}
    tl = timeline(snap)
    stats = model.memory_stats()
    assert tl.allocated[-1] == stats["requested_bytes"]["all"]["current"]
    assert tl.allocated == replay(snap)[0]
    still = {a.address: a for a in tl.data if a.free_index is None}
    for b in held:
        assert still[b.address].block_size == b.size
    memory_viz.segsum(snap)



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a real CUDA GPU")
def test_a_trace_recorded_by_torch_on_a_real_gpu(tmp_path: Path):
    import inspect

    device = torch.cuda.current_device()
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        line = inspect.currentframe().f_lineno + 1
        keep = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        tmp = [torch.empty((k + 1) * MiB, dtype=torch.uint8, device="cuda") for k in range(4)]
        del tmp
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    tl = timeline(snap, device)
    assert tl.allocated[-1] == torch.cuda.memory_stats(device)["requested_bytes.all.current"]
    assert tl.peak.bytes >= tl.allocated[0] + 13 * MiB
    mine = [a for a in tl.data if a.address == keep.data_ptr()]
    assert mine[-1].free_index is None
    assert mine[-1].line.endswith(
        f"test_memory_timeline.py:{line} (test_a_trace_recorded_by_torch_on_a_real_gpu)")
    assert "<svg" in tl._repr_html_()
    tl.save_snapshot(tmp_path / "real.pickle")
    memory_viz.segsum(pickle.loads((tmp_path / "real.pickle").read_bytes()))
    del keep


# -- in a browser --------------------------------------------------------------------------------


@pytest.mark.browser
def test_the_timeline_in_an_nbconvert_export_in_chromium(tmp_path: Path):
    """A notebook holding the timeline as a cell's output, exported to HTML by nbconvert (as
    the rendered site and "Download as HTML" do) and opened offline in headless Chromium."""
    import nbformat
    from browser_support import ARTIFACTS, CHROMIUM, chromium_missing_message, launch_chromium
    from nbconvert import HTMLExporter
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(chromium_missing_message(), pytrace=False)
    tl = _sample()
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("%%memwatch --trace\n...")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "text/html": tl._repr_html_(), "text/plain": repr(tl)})]
    nb.cells = [cell]
    body, _ = HTMLExporter().from_notebook_node(nb)
    page_file = tmp_path / "timeline.html"
    page_file.write_text(body, encoding="utf-8")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 700})
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_file.as_uri())
            svg = page.locator(".devlab-allocation-timeline svg")
            box = svg.bounding_box()
            assert box and box["width"] > 600 and box["height"] > 200
            svg.screenshot(path=str(ARTIFACTS / "allocation-timeline.png"))
            bands = svg.locator("path:has(title)")
            assert bands.count() == 5  # the grey total and 4 bands
            tip = bands.nth(2).locator("title").text_content()
            assert "MiB" in tip and "(<module>)" in tip
            rows = page.locator(".devlab-top-lines tbody tr")
            assert rows.count() == 4
            assert format_bytes(128 * MiB) in rows.nth(0).inner_text()
            # Nothing comes from the network but what nbconvert's own template loads.
            template = set(re.findall(r'src="(https?://[^"]+)"', body))
            assert {u for u in requests if not u.startswith("file:")} <= template
        finally:
            browser.close()
