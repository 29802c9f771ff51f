"""What devlab's drawn outputs cost, before and after a change: the bytes of the HTML a cell
shows (and of the nbconvert page holding it, beyond the empty page), the CPU time to make it,
and the browser's time to lay it out and paint it, for the allocation timeline (a small trace
and a 10,000-entry one) and a step timeline (two GPUs, a DDP-like step), the same data drawn
by this tree and by an earlier commit's.

    python benchmarks/figures.py [--before REV] [--rounds N] [--no-browser]

`--before` defaults to the commit before the figures went through matplotlib (7a9e309^, the
hand-built SVGs). Each tree draws in fresh interpreters of its own (`git archive` of REV in a
temporary folder), three rounds, before and after in turn: the CPU time is this process's
(`time.process_time`, which other work on a shared machine inflates less than the wall
clock), the median of 5 warm calls, the least of the rounds; `cold` is the CPU time of the
first call in a fresh interpreter (matplotlib's first import and font lookup included). The browser's time is
headless Chromium's own trace (Playwright, `/usr/bin/chromium`; never a downloaded browser):
the output put into a page as a cell's HTML is, then two frames, summing the trace's events
for parsing, style and layout (`ParseHTML`, `UpdateLayoutTree`, `Layout`) and for painting
(`PrePaint`, `Paint`, `Layerize`, and the raster workers' `RasterTask`), the median of
`--rounds` insertions, before and after in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
BEFORE = "7a9e309^"  # the hand-built SVGs, before both timelines were drawn by matplotlib
CHROMIUM = "/usr/bin/chromium"


def memory_trace(entries: int, seed: int = 3) -> dict:
    """A snapshot whose trace has `entries` entries: long-lived blocks among many short ones,
    freed in random order (the worst case for the bands)."""
    rng = random.Random(seed)
    trace: list[dict] = []
    live: list[tuple[int, int]] = []
    addr = 0
    while len(trace) < entries:
        if live and rng.random() < 0.5:
            a, size = live.pop(rng.randrange(len(live)))
            trace.append({"action": "free_requested", "addr": a, "size": size, "frames": []})
            trace.append({"action": "free_completed", "addr": a, "size": size, "frames": []})
        else:
            addr += 4096
            size = rng.choice([512, 4096, MiB, 5 * MiB, 20 * MiB])
            frames = [{"filename": "/tmp/ipykernel_1/2.py", "line": rng.randrange(1, 50),
                       "name": "<module>"}]
            trace.append({"action": "alloc", "addr": addr, "size": size, "frames": frames})
            live.append((addr, size))
    return {"segments": [], "device_traces": [trace]}


def _tree_has(path: str) -> bool:
    import devlab

    return (Path(devlab.__file__).parent / path).exists()


def step_timeline():
    """Two GPUs, 400 kernels each and 8 all-reduces overlapping the second half."""
    if _tree_has("engine"):
        from devlab.engine.gpu_model import modeled_clock as clk
        from devlab.engine.simulated.clock.step_timeline import Timeline
    else:  # the layout before issue 36
        from devlab.simulated.clock import clock as clk
        from devlab.simulated.clock.timeline import Timeline

    spans = []
    for d in (0, 1):
        t = 0.0
        for k in range(400):
            spans.append(clk.Span(d, clk.COMPUTE, clk.KERNEL, f"aten::mm #{k}", t, t + 20e-6))
            t += 25e-6
        for k in range(8):
            a = 5e-3 + k * 0.7e-3
            spans.append(clk.Span(d, clk.COMM, clk.COLLECTIVE, f"all_reduce #{k}", a, a + 0.6e-3))
        spans.append(clk.Span(d, clk.COMPUTE, clk.WAIT_COMM, "wait", t, 11e-3))
    return Timeline("NVIDIA T4 (16 GB, PCIe)", spans, 0.0)


def cases() -> dict:
    if _tree_has("core"):
        from devlab.core.memory_watch import timeline
    else:
        from devlab.memory import timeline

    return {"memory timeline, 12 entries": timeline(memory_trace(12)),
            "memory timeline, 10,000 entries": timeline(memory_trace(10_000)),
            "step timeline, 2 GPUs x 408 spans": step_timeline()}


def nbconvert_bytes(html: str) -> int:
    """Bytes `html` as a cell's output adds to nbconvert's HTML page."""
    import nbformat
    from nbconvert import HTMLExporter

    def page(data: dict | None) -> int:
        nb = nbformat.v4.new_notebook()
        cell = nbformat.v4.new_code_cell("x")
        if data:
            cell.outputs = [nbformat.v4.new_output("display_data", data=data)]
        nb.cells = [cell]
        return len(HTMLExporter().from_notebook_node(nb)[0].encode())

    return page({"text/html": html}) - page(None)


# -- drawing, in a fresh interpreter on one tree ------------------------------------------------


def _child(tree: str, mode: str) -> None:
    """In a fresh interpreter whose devlab is `tree`'s: print JSON of each case's HTML and its
    warm CPU time (`mode` "warm"), or the first call's CPU time of case `mode`."""
    # devlab's editable install answers for modules a tree lacks (its finder follows the path
    # finder): an older tree must not borrow this one's.
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__
                        and "editable" not in getattr(f, "__module__", "")]
    sys.path.insert(0, tree)
    import devlab

    assert Path(devlab.__file__).resolve().is_relative_to(Path(tree).resolve()), devlab.__file__
    if mode != "warm":
        case = cases()[mode]
        c0 = time.process_time()
        case._repr_html_()
        print(json.dumps((time.process_time() - c0) * 1e3))
        return
    out = {}
    for name, obj in cases().items():
        cpu = []
        for _ in range(6):
            c0 = time.process_time()
            html = obj._repr_html_()
            cpu.append(time.process_time() - c0)
        out[name] = {"html": html, "cpu_ms": statistics.median(cpu[1:]) * 1e3}
    print(json.dumps(out))


def _run_child(tree: Path, mode: str):
    return json.loads(subprocess.run(
        [sys.executable, __file__, "--child", str(tree), mode], check=True, capture_output=True,
        text=True, env={**os.environ, "PYTHONPATH": ""}).stdout.splitlines()[-1])


# -- the browser --------------------------------------------------------------------------------

_LAYOUT = ("ParseHTML", "UpdateLayoutTree", "Layout")
_PAINT = ("PrePaint", "Paint", "Layerize", "RasterTask")
_PUT = """h => { const c = document.getElementById('c'); c.innerHTML = h;
  return new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r()))); }"""
_CLEAR = """() => { document.getElementById('c').innerHTML = '';
  return new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r()))); }"""


def _event_ms(events: list[dict], names: tuple[str, ...]) -> float:
    """Milliseconds of the complete events named `names`, an event inside another of its name
    on its thread counted once."""
    total = 0.0
    for name in names:
        spans = sorted((e["tid"], e["ts"], e["ts"] + e["dur"]) for e in events
                       if e.get("ph") == "X" and e.get("name") == name and "dur" in e)
        last: dict[int, float] = {}
        for tid, a, b in spans:
            if a >= last.get(tid, -1.0):
                total += b - a
                last[tid] = b
    return total / 1e3


def browser_times(htmls: dict[str, dict[str, str]], rounds: int) -> dict:
    """{case: {tree: (layout ms, paint ms)}}: the medians of `rounds` insertions of each HTML,
    the trees in turn."""
    from playwright.sync_api import sync_playwright

    times: dict = {c: {t: [] for t in trees} for c, trees in htmls.items()}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1000, "height": 900})
        page.set_content("<!doctype html><html><body style='font:13px sans-serif'>"
                         "<div id=c></div></body></html>")
        for case, trees in htmls.items():
            for r in range(rounds + 1):  # the first round warms the page up
                for tree, html in trees.items():
                    page.evaluate(_CLEAR)
                    browser.start_tracing(page=page, categories=[
                        "devtools.timeline", "disabled-by-default-devtools.timeline", "cc"])
                    page.evaluate(_PUT, html)
                    events = json.loads(browser.stop_tracing())["traceEvents"]
                    if r:
                        times[case][tree].append((_event_ms(events, _LAYOUT),
                                                  _event_ms(events, _PAINT)))
        browser.close()
    return {c: {t: tuple(statistics.median(v[k] for v in runs) for k in (0, 1))
                for t, runs in trees.items()} for c, trees in times.items()}


# -- the table ----------------------------------------------------------------------------------


def _pair(before: float, after: float, fmt: str) -> str:
    ratio = f"{after / before:5.1f}x" if before else "   - "
    return f"{format(before, fmt):>8} {format(after, fmt):>8} {ratio}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE, help=f"commit to compare (default {BEFORE})")
    parser.add_argument("--rounds", type=int, default=9, help="browser insertions per figure")
    parser.add_argument("--no-browser", action="store_true", help="bytes and CPU time only")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        _child(*opts.child)
        return
    with tempfile.TemporaryDirectory() as old:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", opts.before],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
        trees = {"before": Path(old), "after": ROOT}
        runs: dict[str, list[dict]] = {t: [] for t in trees}
        for _ in range(3):
            for tree, path in trees.items():
                runs[tree].append(_run_child(path, "warm"))
        names = list(runs["after"][0])
        cold = {t: {n: _run_child(path, n) for n in names} for t, path in trees.items()}
    htmls = {n: {t: runs[t][0][n]["html"] for t in trees} for n in names}
    cpu = {n: {t: min(r[n]["cpu_ms"] for r in runs[t]) for t in trees} for n in names}
    nbytes = {n: {t: len(h.encode()) for t, h in htmls[n].items()} for n in names}
    page = {n: {t: nbconvert_bytes(h) for t, h in htmls[n].items()} for n in names}
    shown = None
    if not opts.no_browser and Path(CHROMIUM).exists():
        shown = browser_times(htmls, opts.rounds)
    print(f"before: {opts.before}, after: this tree; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    head = f"{'':36} {'before':>8} {'after':>8} {'ratio':>6}"
    for n in names:
        print(f"\n{n}{head[len(n):]}")
        print(f"  {'HTML bytes':34} {_pair(nbytes[n]['before'], nbytes[n]['after'], ',')}")
        print(f"  {'in nbconvert page, bytes':34} "
              f"{_pair(page[n]['before'], page[n]['after'], ',')}")
        print(f"  {'CPU ms, warm':34} {_pair(cpu[n]['before'], cpu[n]['after'], '.2f')}")
        print(f"  {'CPU ms, cold (fresh interpreter)':34} "
              f"{_pair(cold['before'][n], cold['after'][n], '.1f')}")
        if shown:
            (lb, pb), (la, pa) = shown[n]["before"], shown[n]["after"]
            print(f"  {'browser ms, parse+style+layout':34} {_pair(lb, la, '.2f')}")
            print(f"  {'browser ms, paint+raster':34} {_pair(pb, pa, '.2f')}")
    if shown is None:
        print(f"\n(no browser times: {CHROMIUM} is missing or --no-browser)")
    print(json.dumps({n: {"html_bytes": nbytes[n], "nbconvert_bytes": page[n], "cpu_ms": cpu[n],
                          "cold_ms": {t: cold[t][n] for t in trees},
                          "browser_ms": shown[n] if shown else None} for n in names}))


if __name__ == "__main__":
    main()
