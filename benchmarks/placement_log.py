"""Cost of the placement log per op: bare torch, an empty TorchDispatchMode (the mechanism's
floor), devlab's log buffered, and rendering a 10,000-op log for display.

Run: .venv/bin/python benchmarks/placement_log.py [--tensorflow PYTHON] [--rounds N]
     [--before TREE]

`--tensorflow PYTHON` also times TensorFlow's logged op in that interpreter (one with
TensorFlow installed; the project's environment has none): an eager 8x8 add with
`tf.debugging.set_log_device_placement(True)`, its output sent to /dev/null so that what is
timed is the log's work, not a terminal's; interleaved round by round with devlab's logged op
(TensorFlow's switch, `devlab.debugging.set_log_device_placement`, its lines to /dev/null too:
an 8x8 add on the CPU, on a simulated GPU and on a modeled T4), each round a median of its
timings; prints both and their ratio (issue 39: devlab's at least 2x cheaper). Without it,
says TensorFlow was not measured. `--before TREE` runs devlab's side of each round in a fresh
process per tree, TREE's devlab (a checkout of the code before a change) and this one's,
alternating, beside the same TensorFlow process, and prints both trees' figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

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


# The child that times TensorFlow's logged op: it reads a count per line on stdin and answers
# microseconds per op on the descriptor it was given, its own stdout and stderr (where
# TensorFlow writes the log's lines) sent to /dev/null.
_TF_CHILD = r"""
import os, sys, time
answer = os.fdopen(os.dup(1), "w", buffering=1)
null = os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1)
os.dup2(null, 2)
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
tf.debugging.set_log_device_placement(True)
a = tf.random.normal((8, 8))
b = tf.random.normal((8, 8))
for _ in range(2000):
    a + b
answer.write(f"ready {tf.__version__}\n")
for line in sys.stdin:
    n = int(line)
    t0 = time.perf_counter()
    for _ in range(n):
        a + b
    answer.write(f"{(time.perf_counter() - t0) / n * 1e6}\n")
"""


def _devlab_logged_op(device: str) -> tuple[object, object]:
    """(an 8x8 add on `device` with TensorFlow's switch on, its lines to /dev/null; stop)."""
    from devlab.core import debugging

    null = open(os.devnull, "w")  # noqa: SIM115 - closed by stop
    torch.manual_seed(0)
    a = torch.randn(8, 8, device=device)
    b = torch.randn(8, 8, device=device)
    with contextlib.redirect_stdout(null):  # the switch's lines go to standard output
        debugging.set_log_device_placement(True)

    def stop() -> None:
        debugging.set_log_device_placement(False)
        null.close()
    return (lambda: a + b), stop


def _timed(fn: object, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()  # type: ignore[operator]
    return (time.perf_counter() - t0) / n * 1e6


def _timed_logged_op(device: str, n: int) -> float:
    """devlab's logged op on `device`, warmed up, then timed over `n` calls (`_timed`)."""
    fn, stop = _devlab_logged_op(device)
    try:
        _timed(fn, n // 10)
        return _timed(fn, n)
    finally:
        stop()  # type: ignore[operator]


_PLACES = ("cpu", "simulated GPU", "modeled T4")


def devlab_round(n: int) -> dict[str, float]:
    """devlab's logged op, µs per op, on the CPU, a simulated GPU and a modeled T4."""
    from devlab.engine import simulated

    got = {"cpu": _timed_logged_op("cpu", n)}
    for where, model in (("simulated GPU", None), ("modeled T4", "T4")):
        simulated.start(1, model=model)
        try:
            got[where] = _timed_logged_op("cuda:0", n)
        finally:
            simulated.stop()
    return got


def _tree_round(tree: Path, n: int) -> dict[str, float]:
    """`devlab_round` in a fresh process with `tree`'s devlab first on the import path."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    argv = [sys.executable, str(Path(__file__).resolve()), "--round", str(n)]
    got = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(got.stdout.strip().splitlines()[-1])


def versus_tensorflow(python: str, rounds: int, n: int = 5000, before: str | None = None
                      ) -> None:
    """devlab's logged op against TensorFlow's in `python`, interleaved round by round (with
    `before`, devlab's rounds in a fresh process per tree: `before`'s and this one's)."""
    here = Path(__file__).resolve().parents[1]
    trees = {"before": Path(before).resolve(), "after": here} if before else {"this tree": None}
    child = subprocess.Popen([python, "-c", _TF_CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, bufsize=1)
    try:
        ready = child.stdout.readline().split()  # type: ignore[union-attr]
        if not ready or ready[0] != "ready":
            raise SystemExit(f"{python}: TensorFlow did not start (is it installed there?)")

        def tf_round() -> float:
            child.stdin.write(f"{n}\n")  # type: ignore[union-attr]
            return float(child.stdout.readline())  # type: ignore[union-attr]

        tf: list[float] = []
        got: dict[str, dict[str, list[float]]] = {t: {w: [] for w in _PLACES} for t in trees}
        for _ in range(rounds):
            tf.append(tf_round())
            for label, tree in trees.items():
                row = devlab_round(n) if tree is None else _tree_round(tree, n)
                for where in _PLACES:
                    got[label][where].append(row[where])
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait(timeout=60)
    print(f"\nthe logged op, 8x8 add, {rounds} rounds interleaved, {n} ops each "
          f"(median µs/op; ratio: the median of the rounds' TensorFlow / devlab):")
    print(f"TensorFlow {ready[1]} eager, set_log_device_placement(True)  "
          f"{statistics.median(tf):7.2f} µs/op")
    for label, tree in trees.items():
        if tree is not None:
            print(f"{label} ({tree}):")
        for where in _PLACES:
            ratios = [t / d for t, d in zip(tf, got[label][where], strict=True)]
            print(f"devlab, set_log_device_placement(True), {where:14s} "
                  f"{statistics.median(got[label][where]):7.2f} µs/op   TensorFlow's costs "
                  f"{statistics.median(ratios):.2f}x devlab's (target >= 2)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tensorflow", metavar="PYTHON",
                   help="an interpreter with TensorFlow: time its logged op beside devlab's")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--before", metavar="TREE",
                   help="with --tensorflow: also TREE's devlab, a fresh process per tree")
    p.add_argument("--round", type=int, metavar="N", help=argparse.SUPPRESS)
    opts = p.parse_args()
    torch.set_num_threads(1)
    if opts.round:  # --before's child: one round of devlab's logged op, as JSON
        print(json.dumps(devlab_round(opts.round)))
        return
    if opts.before and not opts.tensorflow:
        p.error("--before compares devlab's logged op beside TensorFlow's: give --tensorflow "
                "PYTHON too")
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "unknown"
    print(f"torch {torch.__version__}, 1 thread, load average {load}")
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
    if opts.tensorflow:
        versus_tensorflow(opts.tensorflow, opts.rounds, before=opts.before)
    else:
        print("\nTensorFlow's logged op: not measured (give --tensorflow PYTHON, an interpreter "
              "with TensorFlow installed)")
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "unknown"
    print(f"load average now {load}")


if __name__ == "__main__":
    main()
