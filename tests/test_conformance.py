"""Conformance corpus: real third-party PyTorch programs, unmodified, on 2 simulated GPUs.

Each program (tests/conformance/corpus.py) runs in a fresh subprocess with this checkout's
devlab, once on 2 simulated GPUs and, where the manifest compares with the CPU, once on the
plain CPU. A simulated run must exit as the program does on a real GPU (status 0, or the
program's own error), must have put its tensors on the simulated GPUs (peak memory > 0 on as
many GPUs as it uses), must print what the manifest expects, and must print the same numbers
as the CPU run within the manifest's tolerance; a notebook's cells must show the outputs it
stores from its author's GPU run. A distributed program's ranks (separate processes, each on its
own simulated GPU) must train one model: start and end with the same parameters, which match
its checkpoint and, where the manifest has one, a CPU replay of the training (its CPU run).
Programs that a framework starts (Lightning's Trainer, `fabric run`, `accelerate launch`) run as
their users start them, notebooks that fork their ranks from the kernel in a real Jupyter
kernel. docs/conformance.md lists the programs.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "conformance"))

import corpus  # noqa: E402
import run_program  # noqa: E402

pytestmark = pytest.mark.conformance

GPUS = 2
_RUNS: dict[tuple[str, int], run_program.RunResult] = {}


def _run(name: str, gpus: int) -> run_program.RunResult:
    """Run each program once per mode for the whole module (with this checkout's devlab): on
    its machine's simulated GPUs (`GPUS`: 2 for most), or its reference run (0: on the CPU,
    replaying its simulated run where its ranks are replayed, or on its reference GPUs)."""
    program = corpus.get(name)
    key = (name, gpus)
    if key not in _RUNS:
        if gpus:
            _RUNS[key] = run_program.run(name, program.machine_gpus, root=ROOT)
        else:
            replay_of = _run(name, GPUS) if program.replays else None
            _RUNS[key] = run_program.reference_run(name, root=ROOT, replay_of=replay_of)
    return _RUNS[key]


def _runs_of(names: list[str]) -> list[Any]:
    """`names` as parameters of tests that read a program's runs: all the tests of one program go
    to one pytest-xdist worker (`--dist loadgroup`), which runs the program once for them all."""
    return [pytest.param(n, marks=pytest.mark.xdist_group(f"corpus-{n}")) for n in names]


ALL = [p.name for p in corpus.CORPUS]
COMPARED = [p.name for p in corpus.CORPUS if p.compare is not None]
NOTEBOOKS = [p.name for p in corpus.CORPUS if p.notebook_cells]
RANKED = [p.name for p in corpus.CORPUS if p.ranks is not None]
PRINTING = [p.name for p in corpus.CORPUS if p.expect_stdout]
RELAUNCHED = [p.name for p in corpus.CORPUS if p.relaunch]


def test_corpus_is_large_enough_and_covers_two_gpus() -> None:
    assert len(corpus.CORPUS) >= 10
    assert len(set(ALL)) == len(ALL)
    assert any(p.gpus_used == 2 for p in corpus.CORPUS)
    assert len(COMPARED) >= 5
    assert any(p.launch for p in corpus.CORPUS) and any(p.replays for p in corpus.CORPUS)
    assert any(p.kernel for p in corpus.CORPUS)
    for p in corpus.CORPUS:
        if p.ranks is not None:
            assert p.gpus_used == p.ranks.world, p.name


@pytest.mark.parametrize("name", ALL)
def test_program_files_are_the_stored_text(name: str) -> None:
    program = corpus.get(name)
    for f in program.files:
        data = (program.folder / f.local).read_bytes()
        assert len(data.decode("utf-8")) == f.chars, f"{f.local}: not the stored text's length"
        assert hashlib.sha256(data).hexdigest() == f.sha256, f"{f.local} was modified"
    if program.module:
        # a program from an installed package: the version the test extra pins is installed
        dist, version = (program.package or "").split("==")
        assert importlib.metadata.version(dist) == version, f"{dist} is not {version}"
        import tomllib  # Python 3.11+: the suite's own environment

        extra = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        assert program.package in extra["project"]["optional-dependencies"]["test"]
        assert importlib.util.find_spec(program.module) is not None
        assert not program.folder.exists()
    else:
        assert (program.folder / program.entry).is_file()


@pytest.mark.parametrize("name", _runs_of(ALL))
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
    assert len(peaks) == program.machine_gpus
    if not program.gpus_used:  # a launcher's test whose ranks make no tensor (see its notes)
        return
    assert rep["is_used"], f"{name} never created a tensor on a simulated GPU"
    used = [i for i, p in enumerate(peaks) if p > 0]
    assert len(used) >= program.gpus_used, (
        f"{name} should use {program.gpus_used} simulated GPU(s); peaks {peaks}")


@pytest.mark.parametrize("name", _runs_of(PRINTING))
def test_prints_what_it_prints_on_a_gpu(name: str) -> None:
    program = corpus.get(name)
    sim = _run(name, GPUS)
    missing = [p for p in program.expect_stdout
               if not re.search(p, sim.stdout, re.M)]
    assert not missing, f"stdout lacks {missing}\n--- stdout ---\n{sim.stdout[-3000:]}"


@pytest.mark.parametrize("name", _runs_of(COMPARED))
def test_numbers_match_the_cpu_run(name: str) -> None:
    program = corpus.get(name)
    assert program.compare is not None
    cpu = _run(name, 0)
    assert cpu.returncode == 0, f"the run on {program.reference} failed: " + cpu.describe()
    assert cpu.report is not None
    assert cpu.report["simulated"] == bool(program.reference_gpus)
    assert len(cpu.report["peak"]) == program.reference_gpus
    sim = _run(name, GPUS)
    assert sim.returncode == (1 if program.expect_error else 0), sim.describe()
    on_cpu = run_program.numbers(cpu.stdout, program.compare)
    on_gpus = run_program.numbers(sim.stdout, program.compare)
    diff = run_program.compare_numbers(on_gpus, on_cpu, program.compare)
    assert diff is None, diff


@pytest.mark.parametrize("name", _runs_of(RANKED))
def test_ranks_train_one_model(name: str) -> None:
    program = corpus.get(name)
    sim = _run(name, GPUS)
    # a program that ends in its own error (expect_error) is judged on the steps before it
    assert sim.returncode == (1 if program.expect_error else 0), sim.describe()
    assert sim.report is not None, sim.describe()
    replay = _run(name, 0).report if program.replays else None
    found = run_program.rank_problems(program, sim.report, replay)
    assert not found, "\n".join(found) + "\n" + sim.describe()


@pytest.mark.parametrize("name", _runs_of(RELAUNCHED))
def test_second_launch_resumes_where_the_first_saved(name: str) -> None:
    # torchtitan's own checkpoint test: the relaunch loads the step the first launch saved
    # part way and must take the same steps to the same parameters
    program = corpus.get(name)
    sim = _run(name, GPUS)
    assert sim.returncode == 0, sim.describe()
    assert program.compare is not None
    first, second = run_program.launch_numbers(sim.stdout, program.compare)
    assert second and len(second) < len(first)
    found = run_program.relaunch_problems(program, sim)
    assert not found, "\n".join(found) + "\n" + sim.describe()


@pytest.mark.parametrize("name", _runs_of(NOTEBOOKS))
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


def test_lines_of_processes_sharing_stdout_are_compared_per_process() -> None:
    spec = corpus.Compare(rf"^\[P(\d)\] loss ({corpus.FLOAT})$", by_process=r"^\[P(\d)\]")
    one = "[P1] loss 3.0\n[P0] loss 1.0\nother\n[P1] loss 4.0\n[P0] loss 2.0\n"
    other = "[P0] loss 1.0\n[P0] loss 2.0\n[P1] loss 3.0\n[P1] loss 4.0\n"
    assert run_program.numbers(one, spec) == run_program.numbers(other, spec)
    assert run_program.numbers(one, spec) == [0, 1.0, 0, 2.0, 1, 3.0, 1, 4.0]


def test_rank_checks_catch_ranks_that_disagree() -> None:
    program = corpus.get("ddp_series_multigpu")

    def rank(r: int, initial: list[float], final: list[float]) -> dict:
        peak = [0, 0]
        peak[r] = 512
        return {"pid": 100 + r, "rank": r, "world_size": 2, "steps": 3, "initial": initial,
                "final": final, "errors": [], "is_used": True, "peak": peak}

    good = {"processes": [rank(0, [1.0, 2.0], [1.0, 2.0]), rank(1, [1.0, 2.0], [1.0, 2.0])],
            "checkpoint": [1.0, 2.0]}
    assert run_program.rank_problems(program, good) == []
    apart = {**good, "processes": [rank(0, [1.0, 2.0], [1.0, 2.0]),
                                   rank(1, [1.0, 2.5], [1.0, 2.0])]}
    assert any("started from other parameters" in p
               for p in run_program.rank_problems(program, apart))
    moved = {**good, "processes": [rank(0, [1.0, 2.0], [1.0, 3.0]),
                                   rank(1, [1.0, 2.0], [1.0, 3.0])], "checkpoint": [1.0, 3.0]}
    assert any("differ from the initial" in p for p in run_program.rank_problems(program, moved))
    one_rank = {**good, "processes": good["processes"][:1]}
    assert "expected ranks 0..1" in run_program.rank_problems(program, one_rank)[0]
    replayed = corpus.get("llms_from_scratch_ddp")
    assert run_program.rank_problems(replayed, good, {"replay": {"final": [1.0, 2.0]}}) == []
    assert "final parameters differ from the CPU replay" in " ".join(
        run_program.rank_problems(replayed, good, {"replay": {"final": [1.0, 2.1]}}))
    seeded = {"replay": {"initial": [0.5, 2.0], "final": [1.0, 2.0]}}
    assert "initial parameters differ from the CPU replay" in " ".join(
        run_program.rank_problems(replayed, good, seeded))


def test_relaunch_checks_catch_a_resume_that_is_not_the_first_launchs_steps() -> None:
    program = corpus.get("torchtitan_llama3_resume")
    marker = run_program.RELAUNCH_MARKER

    def out(first: str, second: str) -> str:
        lines = [f"step: {i}  loss: {v}  grad_norm: 1.5\n" for i, v in enumerate(first.split())]
        again = [f"step: {i}  loss: {v}  grad_norm: 1.5\n" for i, v in enumerate(second.split())]
        return "".join([*lines, "Training completed\n", f"{marker} --x\n", *again,
                        "Training completed\n"])

    def rank(r: int, launch: str, final: list[str]) -> dict:
        return {"pid": 10 * int(launch) + r, "rank": r, "launch": launch, "final": final}

    ranks = [rank(0, "0", ["a"]), rank(1, "0", ["a"]), rank(0, "1", ["a"]), rank(1, "1", ["a"])]

    def run(stdout: str, processes: list[dict]) -> run_program.RunResult:
        return run_program.RunResult(program.name, 2, 0, False, 1.0, stdout, "",
                                     {"processes": processes})

    assert run_program.launch_numbers(out("8.0 7.5 7.0", "7.5 7.0"), program.compare) == [
        [8.0, 1.5, 7.5, 1.5, 7.0, 1.5], [7.5, 1.5, 7.0, 1.5]]
    assert run_program.relaunch_problems(program, run(out("8.0 7.5 7.0", "7.5 7.0"), ranks)) == []
    assert "resumed steps differ" in " ".join(
        run_program.relaunch_problems(program, run(out("8.0 7.5 7.0", "8.0 7.5"), ranks)))
    moved = [*ranks[:3], rank(1, "1", ["b"])]
    assert "rank 1 of the second launch ended with other parameters" in " ".join(
        run_program.relaunch_problems(program, run(out("8.0 7.5 7.0", "7.5 7.0"), moved)))
    assert "second launch never started" in " ".join(
        run_program.relaunch_problems(program, run("step: 1  loss: 8.0  grad_norm: 1.5\n",
                                                   ranks[:2])))
    assert "ranks [] in the second launch" in " ".join(
        run_program.relaunch_problems(program, run(out("8.0 7.5 7.0", "7.5 7.0"), ranks[:2])))


def test_ranks_that_need_not_train_are_known_by_their_launchers_rank() -> None:
    program = corpus.get("accelerate_test_ops")

    def process(pid: int, env_rank: str | None, peak: list[int], parent: int | None = None) -> dict:
        return {"pid": pid, "parent": parent, "rank": None, "env_rank": env_rank, "steps": 0,
                "initial": None, "final": None, "errors": [], "is_used": any(peak), "peak": peak}

    launcher = process(10, None, [0, 0])
    rank0, rank1 = process(11, "0", [512, 0]), process(12, "1", [0, 512])
    assert run_program.rank_problems(program, {"processes": [launcher, rank0, rank1]}) == []
    worker = process(13, "1", [0, 512], parent=12)  # a DataLoader worker forked from rank 1
    assert run_program.rank_problems(program, {"processes": [launcher, rank0, rank1, worker]}) == []
    wrong_gpu = process(12, "1", [512, 0])
    assert "did not hold tensors on cuda:1" in " ".join(
        run_program.rank_problems(program, {"processes": [launcher, rank0, wrong_gpu]}))
    assert "expected ranks 0..1" in run_program.rank_problems(
        program, {"processes": [launcher, rank0]})[0]


RST = """Title
=====

.. note::
   Not code.

.. code:: python

   import os

   def f():
      return os.sep

Prose between.

.. code-block:: python

      print(f())
.. code:: bash

   echo not python
"""


def test_a_tutorials_program_is_its_python_blocks_in_order(tmp_path: Path) -> None:
    assert run_program.rst_code(RST) == "import os\n\ndef f():\n   return os.sep\n\nprint(f())\n"
    tutorial = tmp_path / "tutorial.rst"
    tutorial.write_text(RST)
    script = run_program.script_from_rst(tutorial)
    assert script == tmp_path / "tutorial.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout == os.sep + "\n"
    assert run_program.rst_code(RST, blocks=1) == "import os\n\ndef f():\n   return os.sep\n"
    with pytest.raises(ValueError, match="has 2 python blocks, not 3"):
        run_program.rst_code(RST, blocks=3)


OBSERVED_FORK = """
import multiprocessing, torch

def train():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.5)
    for _ in range(2):
        p.grad = torch.ones(2)
        opt.step()

if __name__ == "__main__":
    child = multiprocessing.get_context("fork").Process(target=train)
    child.start()
    child.join()
    print(child.pid, flush=True)
"""


def test_error_line_of_a_spawned_rank_is_the_ranks_own_error() -> None:
    # mp.spawn's ProcessRaisedException carries the failed rank's traceback after an empty line
    from torch.multiprocessing.spawn import ProcessRaisedException

    msg = ("\n\n-- Process 0 terminated with the following error:\nTraceback (most recent "
           "call last):\n  File \"x.py\", line 1, in f\nNameError: name 'model' is not "
           "defined\n")
    assert (run_program._error_line(ProcessRaisedException(msg, 0, 1))
            == "ProcessRaisedException: NameError: name 'model' is not defined")
    assert run_program._error_line(ValueError("bad\nmore")) == "ValueError: bad"
    assert run_program._error_line(KeyError()) == "KeyError"


def test_a_checkpoint_may_be_a_distributed_checkpoint_folder(tmp_path: Path) -> None:
    # DCP saves without a process group in one process, as a rank-0 checkpoint is read back
    import torch
    import torch.distributed.checkpoint as dcp

    model = {"w": torch.arange(6.0).view(2, 3), "b": torch.tensor([7.0])}
    dcp.save({"app": {"model": model, "optim": {"lr": torch.tensor(0.5)}}},
             checkpoint_id=str(tmp_path / "checkpoint"))
    assert run_program._checkpoint_values(tmp_path, "checkpoint", "app.model") == [
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 7.0]
    assert run_program._checkpoint_values(tmp_path, "nothing*", None) is None


def test_observer_records_a_forked_child_that_exits_without_atexit(tmp_path: Path) -> None:
    # A multiprocessing child ends with os._exit, after multiprocessing's own exit handlers:
    # the ranks Lightning's ddp_notebook and accelerate's notebook_launcher fork end so.
    import json

    script = tmp_path / "fork.py"
    script.write_text(OBSERVED_FORK)
    folder = tmp_path / "records"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(run_program.OBSERVER)]),
           run_program.OBSERVE_VARIABLE: str(folder)}
    env.pop("DEVLAB_SIMULATE_GPUS", None)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    child = int(done.stdout.split()[-1])
    records = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    # The parent never stepped and never imported devlab: it writes nothing.
    assert [r["pid"] for r in records] == [child], records
    (record,) = records
    assert record["parent"] == int(record["parent"]) and record["parent"] != child
    assert record["steps"] == 2
    assert record["initial"] == [1.0, 1.0] and record["final"] == [0.0, 0.0]


def test_observer_keeps_digests_of_parameters_beyond_its_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # torchtitan's 6.2 million parameters per rank: digests, which ranks that agree share and
    # ranks that differ in one number do not; a replay cannot compare them.
    import torch

    spec = importlib.util.spec_from_file_location("observer_digests",
                                                  run_program.OBSERVER / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    params = [torch.nn.Parameter(torch.arange(6.0)), torch.nn.Parameter(torch.ones(2))]
    optimizer = torch.optim.SGD(params, lr=0.1)
    assert module._parameters(optimizer) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 1.0, 1.0]
    monkeypatch.setattr(module, "LIMIT", 7)
    first = module._parameters(optimizer)
    assert len(first) == 2 and all(d.startswith("sha256:") for d in first)
    assert module._parameters(optimizer) == first
    with torch.no_grad():
        params[0][5] += 1e-6
    second = module._parameters(optimizer)
    assert second[0] != first[0] and second[1] == first[1]
    program = corpus.get("examples_tensor_parallel")  # one whose ranks are replayed
    record = {"rank": 0, "pid": 1, "parent": None, "steps": 1, "initial": first,
              "final": second, "errors": [], "is_used": True, "peak": [1, 1]}
    report = {"processes": [record, {**record, "rank": 1, "pid": 2}]}
    found = run_program.rank_problems(program, report, {"replay": {"initial": [0.0] * 8}})
    assert found and "digests" in found[0], found


def test_data_parallel_expectations_hold_when_the_replicas_prints_interleave() -> None:
    # Printed by CI's run: two replica threads' print() pieces interleaved, as they may on GPUs.
    interleaved = ("Let's use 2 GPUs!\n"
                   "\tIn Model: input size torch.Size([15, 5]) output size torch.Size([15, 2])\n"
                   "\tIn Model: input size\tIn Model: input size  torch.Size([5, 5])"
                   "torch.Size([5, 5]) output size torch.Size([5, 2])\n"
                   " output size torch.Size([5, 2])\n")
    in_order = ("Let's use 2 GPUs!\n"
                "\tIn Model: input size torch.Size([15, 5]) output size torch.Size([15, 2])\n"
                "\tIn Model: input size torch.Size([5, 5]) output size torch.Size([5, 2])\n")
    patterns = corpus.get("data_parallel_tutorial").expect_stdout
    for out in (interleaved, in_order):
        assert all(re.search(p, out, re.M) for p in patterns), out
    # and a replica line that lost a piece does not pass
    broken = in_order.replace("output size torch.Size([5, 2])", "output size")
    assert not all(re.search(p, broken, re.M) for p in patterns)
