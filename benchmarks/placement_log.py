"""Cost of the placement log per op: bare torch, an empty TorchDispatchMode (the mechanism's
floor), devlab's log buffered, and rendering a 10,000-op log for display.

Run: .venv/bin/python benchmarks/placement_log.py
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from devlab.core import placement_log


class EmptyMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def per_op_us(ctx_factory, n_ops: int = 20_000, repeats: int = 7) -> float:
    x = torch.ones(4)
    samples = []
    for _ in range(repeats):
        with ctx_factory():
            t0 = time.perf_counter()
            for _ in range(n_ops):
                x.add(1.0)
            samples.append((time.perf_counter() - t0) / n_ops * 1e6)
    return statistics.median(samples)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def main() -> None:
    torch.set_num_threads(1)
    bare = per_op_us(_Null)
    empty = per_op_us(EmptyMode)
    logged = per_op_us(placement_log.capture)
    print(f"bare torch                 {bare:7.2f} µs/op")
    print(f"empty TorchDispatchMode    {empty:7.2f} µs/op")
    print(f"devlab log (buffered)      {logged:7.2f} µs/op   ratio to empty mode: {logged / empty:.2f} (target ≤ 1.5)")

    with placement_log.capture() as log:
        x = torch.ones(4)
        for _ in range(10_000):
            x = x + 1
    t0 = time.perf_counter()
    text = log.render_text()
    html = log.render_html()
    render_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    summary = log.summary()
    summary_ms = (time.perf_counter() - t0) * 1e3
    print(f"10,000-op log: rendered text+HTML in {render_ms:.1f} ms ({len(text.splitlines())} text lines, "
          f"{html.count(chr(10)) + 1} HTML lines), summary in {summary_ms:.1f} ms ({sum(summary.ops_per_device.values())} ops)")


if __name__ == "__main__":
    main()
