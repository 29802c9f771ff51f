"""Cost of devlab's pytest plugin: its overhead per test, and a small suite of device-generic
tests (a model trained a few steps, ops, copies) on simulated GPUs against the same suite on
plain CPU (the issue's target: within 2x).

Per-test overhead: pytest runs N empty tests and 5N empty tests, with the plugin asked
(`--simulate-gpus 1`) and unasked; the difference of the two runs' test times over 4N is the
cost of one test, so start-up (torch's import, the simulation's start) drops out.
Test times are the sum of pytest's own per-test durations (JUnit XML), start-up excluded; the
tests' CPU time (the process's, setup to teardown: a shared, loaded machine moves it less
than the wall clock) is printed beside them.
Isolation: the plugin's per-test fresh start (default device, queued work, hazards, the
allocators' caches and peaks, streams) timed in process, after a test that touched no GPU
and after one that made a tensor, on 1 and 8 GPUs.

Run: .venv/bin/python benchmarks/pytest_plugin.py [--tests 40] [--repeats 3] [--only isolation]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SUITE = textwrap.dedent('''
    import pytest
    import torch

    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

    @pytest.mark.parametrize("seed", range(6))
    def test_train_steps(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10)).to(DEVICE)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(32, 64, device=DEVICE)
        y = torch.randint(0, 10, (32,), device=DEVICE)
        for _ in range(10):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        assert loss.item() < 3.0

    @pytest.mark.parametrize("n", [16, 64, 256])
    def test_ops(n):
        a = torch.randn(n, n, device=DEVICE)
        b = (a @ a.T).softmax(-1).cumsum(0)
        assert torch.isfinite(b).all()
        assert b.cpu().shape == (n, n)

    def test_copies():
        x = torch.arange(1000.0)
        for _ in range(50):
            x = x.to(DEVICE).mul(2).cpu().div(2)
        assert x[-1].item() == 999.0
''')


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVLAB_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


# A plugin the benchmark adds to the runs it times: the process CPU time of each test (its
# intra-op threads too), setup to teardown, summed into a file.
CPU_CLOCK = textwrap.dedent('''
    import os, time
    import pytest

    TOTAL = [0.0]

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        t0 = time.process_time()
        try:
            return (yield)
        finally:
            TOTAL[0] += time.process_time() - t0

    def pytest_unconfigure(config):
        with open(os.environ["BENCH_CPU_FILE"], "w") as f:
            f.write(repr(TOTAL[0]))
''')


def _pytest(project: Path, *args: str) -> tuple[float, float, float]:
    """(sum of the tests' durations, the whole run's wall time, the tests' CPU time), seconds."""
    xml = project / "out.xml"
    (project / "_bench_cpu_clock.py").write_text(CPU_CLOCK)
    cpu_file = project / "cpu.txt"
    t0 = time.perf_counter()
    # pytest loads the plugin itself where devlab's wheel registered its entry point; naming
    # it again with -p would register it twice.
    installed = any(ep.value == "_devlab_pytest"
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "_devlab_pytest"]
    proc = subprocess.run([sys.executable, "-m", "pytest", *plugin, "-p", "_bench_cpu_clock",
                           "-p", "no:cacheprovider", "-q", f"--junitxml={xml}", *args],
                          cwd=project, env={**_env(), "BENCH_CPU_FILE": str(cpu_file)},
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stdout + proc.stderr)
    tests = sum(float(c.get("time", 0)) for c in ET.parse(xml).getroot().iter("testcase"))
    return tests, wall, float(cpu_file.read_text())


def per_test_overhead(n: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        for count in (n, 5 * n):
            p = Path(d) / f"empty{count}"
            p.mkdir()
            (p / "test_empty.py").write_text(
                f"import pytest\n\n@pytest.mark.parametrize('i', range({count}))\n"
                "def test_empty(i):\n    pass\n")
        for label, args in (("unasked", ()), ("--simulate-gpus 1", ("--simulate-gpus", "1"))):
            small = statistics.median(_pytest(Path(d) / f"empty{n}", *args)[0]
                                      for _ in range(repeats))
            big = statistics.median(_pytest(Path(d) / f"empty{5 * n}", *args)[0]
                                    for _ in range(repeats))
            per = (big - small) / (4 * n) * 1e3
            print(f"per-test cost, {label:<18} {per:7.3f} ms per empty test")


def suite(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d)
        (p / "test_suite.py").write_text(SUITE)
        rows = {}
        for label, args in (("plain CPU", ()), ("simulated GPU", ("--simulate-gpus", "1"))):
            runs = [_pytest(p, *args) for _ in range(repeats)]
            rows[label] = tuple(statistics.median(r[k] for r in runs) for k in range(3))
            print(f"suite of 10 tests, {label:<14} tests {rows[label][0]:6.2f} s   "
                  f"whole run {rows[label][1]:6.2f} s   tests' CPU time {rows[label][2]:6.2f} s")
        cpu, sim = rows["plain CPU"], rows["simulated GPU"]
        print(f"ratio simulated/plain: tests {sim[0] / cpu[0]:.2f}x, "
              f"whole run {sim[1] / cpu[1]:.2f}x, tests' CPU time {sim[2] / cpu[2]:.2f}x")


def isolation(repeats: int) -> None:
    """The plugin's per-test fresh start, in process (no pytest around it)."""
    import types

    import torch

    from devlab.core import config
    from devlab.fronts.pytest_plugin import Settings, SimulatedGpus

    for n in (1, 8):
        config.simulate_gpus(n)
        plugin = SimulatedGpus(types.SimpleNamespace(), Settings(n))
        try:
            fresh = plugin._fresh

            def clean(fresh=fresh) -> None:
                fresh()

            def touched(fresh=fresh) -> None:
                x = torch.ones(1000, device="cuda")
                del x
                fresh()

            def bare() -> None:
                x = torch.ones(1000, device="cuda")
                del x

            per = {}
            for name, f in (("clean", clean), ("touched", touched), ("bare", bare)):
                f()
                runs = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    for _ in range(2000):
                        f()
                    runs.append((time.perf_counter() - t0) / 2000 * 1e6)
                per[name] = statistics.median(runs)
            print(f"isolation per test, {n} GPU{'s' if n > 1 else ' '}: after a test that touched "
                  f"no GPU {per['clean']:6.1f} us; after one that made a tensor "
                  f"{per['touched'] - per['bare']:6.1f} us")
        finally:
            plugin._stop_listening()
            config.stop_simulation()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=40, help="N: the small run's empty tests")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=("isolation", "per-test", "suite"), default=None)
    args = parser.parse_args()
    if args.only in (None, "isolation"):
        isolation(args.repeats)
    if args.only in (None, "per-test"):
        per_test_overhead(args.tests, args.repeats)
    if args.only in (None, "suite"):
        suite(args.repeats)


if __name__ == "__main__":
    main()
