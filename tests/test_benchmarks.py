"""The benchmark scripts run as their docstrings say: a script that stopped running would print
no figure at all, and nothing else would notice (the widget-memory script once broke so)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: float = 300) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_widget_memory_runs_both_magics_and_leaves_no_widget() -> None:
    out = _run("benchmarks/widget_memory.py", "--cells", "4", "--warmup", "1")
    for magic in ("%%memwatch", "%%compare_devices"):
        line = next((ln for ln in out.splitlines() if ln.startswith(f"after 4 {magic}")), None)
        assert line is not None, out
        # A finished cell leaves no widget model behind in the kernel.
        assert re.search(r"widgets \+0,", line), line
        assert re.search(r"growth +[-+]\d+\.\d MB", line), line


def test_allocator_benchmark_prints_its_figure() -> None:
    out = _run("benchmarks/allocator.py", "--events", "2000", "--trials", "1")
    assert re.search(r"\d+\.\d\d us per allocation \(malloc \+ free\)", out), out


def test_cuda_graphs_benchmark_prints_its_figures() -> None:
    out = _run("benchmarks/cuda_graphs.py", "--ops", "20", "--repeats", "1")
    assert re.search(r"graph replay +\d+\.\d\d µs/op +ratio replay/eager: \d+\.\d\d", out), out
    eager = float(re.search(r"T4, eager +([0-9.]+) µs per step", out)[1])
    replay = float(re.search(r"T4, one replay +([0-9.]+) µs per step", out)[1])
    assert replay < eager, out  # one launch for the graph, one per kernel eagerly


def test_profiler_benchmark_prints_its_figures() -> None:
    out = _run("benchmarks/profiler.py", "--steps", "3", "--repeats", "1")
    for mode in ("CPU", "simulated T4"):
        assert re.search(rf"^{mode} +[0-9.]+ µs/step bare +[0-9.]+ µs/step profiled", out,
                         re.M), out
    assert re.search(r"with post-processing, simulated T4 / CPU: -?\d+\.\d\dx", out), out


def test_pytest_plugin_benchmark_prints_its_figures() -> None:
    out = _run("benchmarks/pytest_plugin.py", "--tests", "5", "--repeats", "1", timeout=900)
    assert re.search(r"per-test cost, --simulate-gpus 1 +-?\d+\.\d{3} ms per empty test", out), out
    assert re.search(r"ratio simulated/plain: tests \d+\.\d\dx, whole run \d+\.\d\dx", out), out


def test_op_cost_benchmark_prints_its_ratios_and_layers() -> None:
    out = _run("benchmarks/op_cost.py", "--quick", "--rounds", "1", "--no-scaling")
    for work in ("small op", "tensor life", "100x100 loop", "MLP step", "1024^2 matmul"):
        line = next((ln for ln in out.splitlines() if ln.startswith(work)), None)
        assert line is not None, out
        # cpu, simulated, its full path, T4, its full path: four ratios, and the verdicts
        assert len(re.findall(r"\(\s*\d+\.\d\dx\)", line)) == 4, line
        assert re.search(r"(met|NOT met) <= [0-9.]+x, (met|NOT met) <= [0-9.]+x$", line), line
    out = _run("benchmarks/op_cost.py", "--layers", "--quick", "--rounds", "1")
    for label in ("simulated", "T4"):
        block = out.split(f"\n{label}: ")[1]
        for layer in ("mode entry", "routing", "marking", "allocator", "clock", "total"):
            assert re.search(rf"{layer} +-?\d+\.\d\d", block), block


def test_the_placement_log_benchmark_says_whether_tensorflow_was_measured() -> None:
    out = _run("benchmarks/placement_log.py")
    assert re.search(r"devlab log \(buffered\) +\d+\.\d\d µs/op", out), out
    assert "TensorFlow's logged op: not measured" in out, out
    # An interpreter without TensorFlow (the project's own): a clear error, no figure.
    proc = subprocess.run([sys.executable, "benchmarks/placement_log.py", "--tensorflow",
                           sys.executable, "--rounds", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    assert "TensorFlow did not start (is it installed there?)" in proc.stderr, proc.stderr
    assert "TensorFlow's costs" not in proc.stdout


def test_interception_floor_prints_each_variant_and_its_stand_ins_marks_die() -> None:
    out = _run("benchmarks/interception_floor.py", "--quick", "--rounds", "1")
    for case in ("small op", "tensor life"):
        block = out.split(f"{case}:\n")[1]
        for label in ("cpu", "empty Python mode", "native stand-in", "simulated GPU", "modeled T4"):
            assert re.search(rf"  {label} +(\d+\.\d\d us +\d+\.\d\dx the CPU|not measured: .+)",
                             block), block
    made = re.search(r"native stand-in: (\d+) marks made, (\d+) alive, (\d+) bytes held", out)
    if made is not None:  # built: each stand-in mark's callback ran when its storage died
        assert int(made[1]) > 0 and made[2] == "0" and made[3] == "0", out
    else:
        assert "not measured: " in out, out


def test_the_placement_log_benchmarks_round_times_each_place_and_before_needs_tensorflow() -> None:
    # --before's child: one round of devlab's logged op, as JSON, on each place it names
    import json

    row = json.loads(_run("benchmarks/placement_log.py", "--round", "200").splitlines()[-1])
    assert set(row) == {"cpu", "simulated GPU", "modeled T4"}, row
    assert all(isinstance(v, float) and v > 0 for v in row.values()), row
    proc = subprocess.run([sys.executable, "benchmarks/placement_log.py", "--before", "."],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "give --tensorflow PYTHON too" in proc.stderr, proc.stderr
