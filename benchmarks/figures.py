"""What devlab's drawn outputs cost: bytes of the HTML a cell shows (and of the nbconvert page
holding it, beyond the empty page) and the time to make it, for the allocation timeline (a
small trace and a 10,000-entry one) and a step timeline (two GPUs, a DDP-like step).

    python benchmarks/figures.py

Times are the median of 5 calls in this process (warm: wall clock, and this process's CPU
time, which a machine shared with other work inflates less) and one call in a fresh interpreter
(cold: matplotlib's first import and font lookup included)."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


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


def step_timeline():
    """Two GPUs, 400 kernels each and 8 all-reduces overlapping the second half."""
    from devlab.engine.gpu_model import modeled_clock as clk
    from devlab.engine.simulated.clock.step_timeline import Timeline

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
    from devlab.core.memory_watch import timeline

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


def measure() -> dict:
    out = {}
    for name, obj in cases().items():
        times, cpu = [], []
        for _ in range(5):
            t0, c0 = time.perf_counter(), time.process_time()
            html = obj._repr_html_()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        out[name] = {"html_bytes": len(html.encode()), "nbconvert_bytes": nbconvert_bytes(html),
                     "warm_ms": statistics.median(times) * 1e3,
                     "warm_cpu_ms": statistics.median(cpu) * 1e3}
    return out


def cold(name: str) -> float:
    """Milliseconds of the first `_repr_html_()` of case `name` in a fresh interpreter."""
    code = (f"import sys, time; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'benchmarks')!r}]; "
            f"import figures; c = figures.cases()[{name!r}]; t0 = time.perf_counter(); "
            "c._repr_html_(); print((time.perf_counter() - t0) * 1e3)")
    return float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                text=True).stdout.split()[-1])


def main() -> None:
    results = measure()
    for name, r in results.items():
        r["cold_ms"] = cold(name)
        print(f"{name:36} html {r['html_bytes']:>8,} B  in nbconvert {r['nbconvert_bytes']:>8,} B"
              f"  warm {r['warm_ms']:7.1f} ms (CPU {r['warm_cpu_ms']:6.1f} ms)"
              f"  cold {r['cold_ms']:7.1f} ms")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
