"""Cost of devlab's pytest plugin: its overhead per test, and a small suite of device-generic
tests (a model trained a few steps, ops, copies) on simulated GPUs against the same suite on
plain CPU (the issue's target: within 2x).

Per-test overhead: pytest runs N empty tests and 5N empty tests, with the plugin asked
(`--simulate-gpus 1`) and unasked; the difference of the two runs' test times over 4N is the
cost of one test, so start-up (torch's import, the simulation's start) drops out.
Test times are the sum of pytest's own per-test durations (JUnit XML), start-up excluded.

Run: .venv/bin/python benchmarks/pytest_plugin.py [--tests 40] [--repeats 3]
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


def _pytest(project: Path, *args: str) -> tuple[float, float]:
    """(sum of the tests' durations, the whole run's wall time), seconds."""
    xml = project / "out.xml"
    t0 = time.perf_counter()
    # pytest loads the plugin itself where devlab's wheel registered its entry point; naming
    # it again with -p would register it twice.
    installed = any(ep.value == "_devlab_pytest"
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "_devlab_pytest"]
    proc = subprocess.run([sys.executable, "-m", "pytest", *plugin,
                           "-p", "no:cacheprovider", "-q", f"--junitxml={xml}", *args],
                          cwd=project, env=_env(), capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stdout + proc.stderr)
    tests = sum(float(c.get("time", 0)) for c in ET.parse(xml).getroot().iter("testcase"))
    return tests, wall


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
            rows[label] = (statistics.median(r[0] for r in runs),
                           statistics.median(r[1] for r in runs))
            print(f"suite of 10 tests, {label:<14} tests {rows[label][0]:6.2f} s   "
                  f"whole run {rows[label][1]:6.2f} s")
        cpu, sim = rows["plain CPU"], rows["simulated GPU"]
        print(f"ratio simulated/plain: tests {sim[0] / cpu[0]:.2f}x, "
              f"whole run {sim[1] / cpu[1]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=40, help="N: the small run's empty tests")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    per_test_overhead(args.tests, args.repeats)
    suite(args.repeats)


if __name__ == "__main__":
    main()
