"""Conformance corpus: real third-party PyTorch programs, unmodified, on 2 simulated GPUs.

Each program (tests/conformance/corpus.py) runs in a fresh subprocess with this checkout's
devlab, once on 2 simulated GPUs and, where the manifest compares with the CPU, once on the
plain CPU. A simulated run must exit as the program does on a real GPU (status 0, or the
program's own error), must have put its tensors on the simulated GPUs (peak memory > 0 on as
many GPUs as it uses), must print what the manifest expects, and must print the same numbers
as the CPU run within the manifest's tolerance; a notebook's cells must show the outputs it
stores from its author's GPU run. docs/conformance.md lists the programs.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "conformance"))

import corpus  # noqa: E402
import run_program  # noqa: E402

pytestmark = pytest.mark.conformance

GPUS = 2
_RUNS: dict[tuple[str, int], run_program.RunResult] = {}


def _run(name: str, gpus: int) -> run_program.RunResult:
    """Run each program once per mode for the whole module (with this checkout's devlab)."""
    key = (name, gpus)
    if key not in _RUNS:
        _RUNS[key] = run_program.run(name, gpus, root=ROOT)
    return _RUNS[key]


ALL = [p.name for p in corpus.CORPUS]
COMPARED = [p.name for p in corpus.CORPUS if p.compare is not None]
NOTEBOOKS = [p.name for p in corpus.CORPUS if p.notebook_cells]


def test_corpus_is_large_enough_and_covers_two_gpus() -> None:
    assert len(corpus.CORPUS) >= 10
    assert len(set(ALL)) == len(ALL)
    assert any(p.gpus_used == 2 for p in corpus.CORPUS)
    assert len(COMPARED) >= 5


@pytest.mark.parametrize("name", ALL)
def test_program_files_are_the_stored_text(name: str) -> None:
    program = corpus.get(name)
    for f in program.files:
        data = (program.folder / f.local).read_bytes()
        assert len(data.decode("utf-8")) == f.chars, f"{f.local}: not the stored text's length"
        assert hashlib.sha256(data).hexdigest() == f.sha256, f"{f.local} was modified"
    assert (program.folder / program.entry).is_file()


@pytest.mark.parametrize("name", ALL)
def test_runs_on_simulated_gpus(name: str) -> None:
    program = corpus.get(name)
    sim = _run(name, GPUS)
    assert not sim.timed_out, f"{name} did not finish within {program.timeout:.0f} s"
    assert sim.report is not None, "no result line: " + sim.describe()
    rep = sim.report
    assert rep["simulated"] and rep["is_active"], rep
    if program.expect_error:
        assert sim.returncode == 1, sim.describe()
        assert re.search(program.expect_error, rep["error"] or ""), sim.describe()
        assert rep["error_at"] == program.expect_error_at, sim.describe()
    else:
        assert sim.returncode == 0, sim.describe()
    peaks = rep["peak"]
    assert len(peaks) == GPUS
    assert rep["is_used"], f"{name} never created a tensor on a simulated GPU"
    used = [i for i, p in enumerate(peaks) if p > 0]
    assert len(used) >= program.gpus_used, (
        f"{name} should use {program.gpus_used} simulated GPU(s); peaks {peaks}")


@pytest.mark.parametrize("name", [p.name for p in corpus.CORPUS if p.expect_stdout])
def test_prints_what_it_prints_on_a_gpu(name: str) -> None:
    program = corpus.get(name)
    sim = _run(name, GPUS)
    missing = [p for p in program.expect_stdout
               if not re.search(p, sim.stdout, re.M)]
    assert not missing, f"stdout lacks {missing}\n--- stdout ---\n{sim.stdout[-3000:]}"


@pytest.mark.parametrize("name", COMPARED)
def test_numbers_match_the_cpu_run(name: str) -> None:
    program = corpus.get(name)
    assert program.compare is not None
    cpu = _run(name, 0)
    assert cpu.returncode == 0, "the CPU baseline failed: " + cpu.describe()
    assert cpu.report is not None and not cpu.report["simulated"] and cpu.report["peak"] == []
    sim = _run(name, GPUS)
    assert sim.returncode == (1 if program.expect_error else 0), sim.describe()
    on_cpu = run_program.numbers(cpu.stdout, program.compare)
    on_gpus = run_program.numbers(sim.stdout, program.compare)
    diff = run_program.compare_numbers(on_gpus, on_cpu, program.compare)
    assert diff is None, diff


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_shows_its_stored_gpu_outputs(name: str) -> None:
    program = corpus.get(name)
    sim = _run(name, GPUS)
    assert sim.report is not None, sim.describe()
    assert len(sim.report["cells"]) == len(run_program.stored_outputs(program))
    mismatches = run_program.notebook_mismatches(program, sim.report)
    assert not mismatches, "\n".join(mismatches)


def test_cpu_run_ignores_the_callers_simulation_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVLAB_SIMULATE_GPUS", "2")
    res = run_program.run("tensorqs_tutorial", 0, root=ROOT)
    assert res.returncode == 0, res.describe()
    assert res.report is not None
    assert res.report["simulated"] is False and res.report["peak"] == []
    assert "Device tensor is stored on: cpu" in res.stdout


def test_number_comparison_catches_differences() -> None:
    spec = corpus.Compare(rf"loss ({corpus.FLOAT})", rtol=1e-3, after=r"^start", until=r"^stop")
    text = "loss 9.0\nstart\nloss 1.0\nloss 2.0\nstop\nloss 7.0\n"
    assert run_program.numbers(text, spec) == [1.0, 2.0]
    assert run_program.compare_numbers([1.0, 2.0], [1.0, 2.0005], spec) is None
    assert "differ" in (run_program.compare_numbers([1.0, 2.1], [1.0, 2.0], spec) or "")
    assert "2 numbers" in (run_program.compare_numbers([1.0, 2.0], [1.0], spec) or "")
    assert run_program.compare_numbers([], [], spec) is not None
