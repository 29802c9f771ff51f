"""benchmarks/memory_published.py runs its published programs on simulated GPUs and prints a
row per published figure (docs/gpu-memory-validation.md). Only quick programs run here, and no
devlab figure is checked: the table is the check."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "memory_published"
QUICK = ("linear_1x1_issue95668", "cublas_workspace_test_cuda", "rand_loop_issue_maskrcnn182")


def test_memory_published_prints_a_row_per_figure() -> None:
    proc = subprocess.run([sys.executable, "benchmarks/memory_published.py", *QUICK], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(DATA / "published.csv", newline="") as f:
        wanted = [r for r in csv.DictReader(f) if r["program"].removesuffix(".py") in QUICK]
    lines = proc.stdout.splitlines()[1:]
    assert len(lines) == len(wanted), proc.stdout
    for row, line in zip(wanted, lines, strict=True):
        assert line.startswith(row["program"].removesuffix(".py")), line
        assert row["figure"] in line, line
        # published bytes, devlab's bytes, a signed error and the verdict against the target
        assert re.search(r"[\d,]+ B \(.*MiB\) +[\d,]+ B \(.*MiB\) +[-+]\d+\.\d% +(within|MISS) ",
                         line + " "), line


def test_every_program_cites_its_source_and_quotes_its_output() -> None:
    with open(DATA / "published.csv", newline="") as f:
        table = list(csv.DictReader(f))
    for name in {r["program"] for r in table}:
        head = (DATA / name).read_text().split('"""')[1]
        assert re.search(r"https://|index file id", head), name
        # each program's header quotes (a part of) every figure published for it
        assert any(r["printed"].split(" (")[0].split("=")[-1].strip()[:8] in head
                   for r in table if r["program"] == name), name
