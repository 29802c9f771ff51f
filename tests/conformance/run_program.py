"""Run one corpus program, unmodified, in a fresh process: on the CPU or on simulated GPUs.

    python tests/conformance/run_program.py NAME [--simulate-gpus N]   # run it here, now
    python tests/conformance/run_program.py --report [NAME ...]         # CPU + 2 GPUs, judged
    python tests/conformance/run_program.py NAME --simulate-gpus 1 --reference  # a reference run

Run mode copies `programs/NAME/` into a temporary folder, writes the data files the program
reads (`datagen`), makes that folder the working directory and the first import path, sets
`sys.argv` to the manifest's arguments, seeds `random`, `numpy` and `torch` with 0, and runs the
entry with `runpy.run_path(..., run_name="__main__")`; a notebook's code cells run in order in
one namespace, an error recorded and execution going on (as nbclient's --allow-errors). With
`--simulate-gpus N` it sets `DEVLAB_SIMULATE_GPUS=N` and imports devlab first; without it
devlab is not imported at all. At the end, failure included, the last stdout line is
`CONFORMANCE-RESULT {json}`: whether the simulation was used, each simulated GPU's peak bytes,
the error and the program line that raised it, and a notebook's per-cell outputs. The exit
status is the program's: 0, 1 for an uncaught exception, or its SystemExit code. A program from
an installed package (`module`) has no folder to copy: its module runs with `-m`. A reference
run (`--reference`, for a program that refuses the CPU) runs on simulated GPUs with the
program's cpu_* settings.

A program with a `launch` command runs under that launcher (torchrun, `fabric run`, `accelerate
launch`), in this process as its console script runs it: the launcher starts the ranks with
torchrun's agent, which starts its workers with `python -u`, so two ranks' writes could
interleave within a line on a shared stdout; each rank's stdout and stderr go to files of its
own instead (torchrun's `--redirects 3` and log folder, given as torchrun's PET_* variables or
the launcher's own flag), which run mode copies to its stdout and stderr, rank by rank, once
the launcher returns. A `kernel` program runs in a real Jupyter kernel (nbclient), as a notebook
user runs it: its code cells in order (a script: its text as one cell), an error recorded and
execution going on; each cell's outputs are copied to run mode's stdout and stderr and kept in
the result line. The program's `env` settings are set before it starts, so its processes (and
the kernel) inherit them.

For a program with `ranks`, the processes it runs as ranks are observed: before running it,
run mode sets CONFORMANCE_OBSERVE to a temporary folder, where the observer
(`observer/sitecustomize.py`, on the import path of every process) of each process the program
starts writes its record at exit, and observes its own process too (where a framework makes the
script's process rank 0, as Lightning's Trainer does); a process forked from an observed one
(the ranks Lightning's `ddp_notebook` and accelerate's `notebook_launcher` fork from a kernel)
writes a record of its own. The result line lists the records (`processes`), and its `is_used`
and `peak` cover them too (per GPU, the largest peak any process saw). Their stdout is
block-buffered (PYTHONUNBUFFERED is removed for them, and this process's own stdout is
line-buffered), so that each process's lines reach the shared pipe whole. Rank 0's checkpoint,
if the manifest names one, is read back on the CPU into the result line. The CPU run of a
program whose ranks are replayed (`--replay FILE`, the simulated run's records) runs the replay
of `references.py` instead of the program.

`run()` is the API the tests use: it starts run mode in a subprocess with PYTHONPATH set to the
folder holding the devlab that `import devlab` resolves to here (plus the program's stand-ins
and the observer), never passes on the caller's DEVLAB_SIMULATE_GPUS, applies the program's
time limit, gives a program that listens on fixed ports a network namespace of its own where
the machine allows it, and returns the exit status, stdout, stderr and parsed result. The
helpers below judge a run against the manifest; `--report` uses them to print what passes and
fails.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib.util
import io
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A terminal colour or style (rich writes them into display data's text too).
ANSI = re.compile(r"\x1b\[[0-9;]*m")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import corpus  # noqa: E402
import datagen  # noqa: E402

MARKER = "CONFORMANCE-RESULT "
OBSERVER = HERE / "observer"
OBSERVE_VARIABLE = "CONFORMANCE_OBSERVE"
# Which launch of a relaunched program a rank belongs to (the observer records it), and the
# stdout line between the launches' outputs.
LAUNCH_VARIABLE = "CONFORMANCE_LAUNCH"
RELAUNCH_MARKER = "CONFORMANCE-RELAUNCH"


# --------------------------------------------------------------------------- run mode (child)

class _Tee(io.TextIOBase):
    """Writes to the real stream and keeps a copy (a notebook cell's stdout)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.buffer_text = io.StringIO()

    def write(self, s: str) -> int:
        self.buffer_text.write(s)
        return self.real.write(s)

    def flush(self) -> None:
        self.real.flush()


def _run_notebook(path: Path) -> list[dict[str, Any]]:
    """Run the code cells of notebook `path` in order in one namespace; per cell: its stdout,
    the repr of its last expression's value (as the notebook shows it) and its error."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    namespace: dict[str, Any] = {"__name__": "__main__"}
    cells: list[dict[str, Any]] = []
    code_cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for i, cell in enumerate(code_cells):
        src = "".join(cell["source"])
        tee = _Tee(sys.stdout)
        result: str | None = None
        error: str | None = None
        filename = f"<cell {i}>"
        with contextlib.redirect_stdout(tee):
            try:
                tree = ast.parse(src, filename)
                last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
                exec(compile(tree, filename, "exec"), namespace)
                if last is not None:
                    value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
                    if value is not None:
                        result = repr(value)
            except Exception as exc:
                error = _error_line(exc)
                traceback.print_exc(file=sys.stderr)
        sys.stdout.flush()
        if result is not None:
            print(f"Out[{i}]: {result}", flush=True)
        cells.append({"index": i, "stdout": tee.buffer_text.getvalue(), "result": result,
                      "error": error})
    return cells


def rst_code(text: str, blocks: int = 0) -> str:
    """The program a reStructuredText tutorial shows: its `.. code:: python` (or `code-block`)
    blocks, dedented, in order, as its reader puts them into one file; with `blocks`, the
    first that many only (a tutorial whose later blocks are variants of lines in the program,
    not more of it)."""
    import textwrap

    lines = text.splitlines()
    found: list[str] = []
    i = 0
    while i < len(lines):
        if re.match(r"^\s*\.\. (?:code|code-block|sourcecode)::\s*python\s*$", lines[i]):
            i += 1
            block: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i][:1].isspace()):
                block.append(lines[i])
                i += 1
            found.append(textwrap.dedent("\n".join(block)).strip("\n"))
        else:
            i += 1
    if blocks > len(found):
        raise ValueError(f"the tutorial has {len(found)} python blocks, not {blocks}")
    return "\n\n".join(found[:blocks or len(found)]) + "\n"


def literal_block(text: str, pseudo: tuple[tuple[str, str], ...] = ()) -> str:
    """The code of a document's literal block (an example of PyTorch's notes), dedented, as
    its reader runs it: the output the document shows inside the block (lines indented under
    a line that opens nothing) left out, and each line of pseudo-code (`use grads`) replaced
    by the Python `pseudo` gives for it."""
    import textwrap

    lines = textwrap.dedent(text).splitlines()
    kept: list[str] = []
    shown_at: int | None = None  # the indentation of the code above a shown output
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if not line.strip():
            kept.append(line)
            continue
        if shown_at is not None and indent > shown_at:
            continue
        shown_at = None
        code = [k for k in kept if k.strip()]
        above = code[-1] if code else None
        if above is not None and indent > len(above) - len(above.lstrip()) and not (
                above.rstrip().endswith((":", "(", "[", "{", ",", "\\"))):
            shown_at = len(above) - len(above.lstrip())
            continue
        for old, new in pseudo:
            if line.strip() == old:
                line = line[:indent] + new
        kept.append(line)
    return "\n".join(kept).strip("\n") + "\n"


def script_from_example(program: corpus.Program, workdir: Path) -> Path:
    """Write an example program of a document (`program.steps`) as `<name>.py`: the
    runner's `prelude` (what the examples assume is defined), then each stored block's code
    (`literal_block`) followed by its step, the runner's lines that print what the document
    says of it."""
    parts = [program.prelude]
    for f, step in zip(program.files, program.steps, strict=True):
        parts.append(literal_block((workdir / f.local).read_text(encoding="utf-8"),
                                   program.pseudo))
        parts.append(step)
    script = workdir / f"{program.name}.py"
    script.write_text("\n".join(p.strip("\n") + "\n" for p in parts if p), encoding="utf-8")
    return script


def script_from_rst(path: Path, blocks: int = 0) -> Path:
    """Write the program of tutorial `path` (see rst_code) beside it as `<name>.py`, the file
    the tutorial tells its reader to run."""
    script = path.with_suffix(".py")
    script.write_text(rst_code(path.read_text(encoding="utf-8"), blocks), encoding="utf-8")
    return script


def _error_line(exc: BaseException) -> str:
    """'Type: first line of the message', as Python's last traceback line shows it. A message
    that starts with an empty line (`mp.spawn`'s ProcessRaisedException, whose message is the
    failed rank's traceback) gives its last line, the rank's own error, as the traceback
    Python prints ends with it."""
    lines = str(exc).splitlines()
    msg = lines[0] if lines else ""
    if not msg.strip():
        msg = next((line for line in reversed(lines) if line.strip()), "")
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def _frames(exc: BaseException, workdir: Path) -> tuple[str | None, list[str]]:
    """The deepest frame inside the program's folder ('file:line') and the last frames."""
    tb = traceback.extract_tb(exc.__traceback__)
    at = None
    for fr in tb:
        p = Path(fr.filename)
        if p.is_absolute() and workdir in p.parents:
            at = f"{p.relative_to(workdir)}:{fr.lineno}"
    tail = [f"{fr.filename}:{fr.lineno} in {fr.name}: {(fr.line or '').strip()}" for fr in tb[-8:]]
    return at, tail


def _simulation_report(simulate: int) -> dict[str, Any]:
    if not simulate:
        return {"simulated": False, "is_used": False, "peak": []}
    import devlab

    sim = devlab.simulated
    out: dict[str, Any] = {"simulated": True, "is_active": sim.is_active(),
                           "is_used": bool(sim.is_used()), "peak": []}
    with contextlib.suppress(Exception):
        out["peak"] = [int(sim.memory_stats(i)["peak"]) for i in range(sim.device_count())]
    return out


def _observed(folder: Path) -> list[dict[str, Any]]:
    """The records the observer wrote in `folder`, one per observed process, by rank."""
    records = []
    for path in sorted(folder.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            records.append(json.loads(path.read_text(encoding="utf-8")))
    return sorted(records, key=lambda r: (r.get("rank") is None, r.get("rank") or 0, r["pid"]))


def _include_processes(report: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """The result line's `is_used` and `peak` cover the observed processes too."""
    report["processes"] = records
    for rec in records:
        report["is_used"] = bool(report.get("is_used")) or bool(rec.get("is_used"))
        peaks = rec.get("peak") or []
        mine = report.get("peak") or []
        report["peak"] = [max(a, b) for a, b in zip(mine + [0] * (len(peaks) - len(mine)),
                                                    peaks + [0] * (len(mine) - len(peaks)),
                                                    strict=True)]


def _checkpoint_values(folder: Path, pattern: str, key: str | None) -> list[float] | None:
    """The tensors of the saved state_dict (or of `key` in the dict saved; a dotted path for a
    nested one) in the one file of `folder` that matches the glob `pattern`, flattened in
    order, read on the CPU; None if no file matches. A folder is a distributed checkpoint
    (`torch.distributed.checkpoint`), read back whole in this one process, as DCP reads one
    without a process group."""
    import tempfile

    import torch

    found = sorted(folder.glob(pattern))
    if not found:
        return None
    if len(found) > 1:
        raise RuntimeError(f"{len(found)} files match {pattern}: {[str(f) for f in found]}")
    if found[0].is_dir():
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(found[0], Path(tmp) / "whole.pt")
            saved = torch.load(Path(tmp) / "whole.pt", map_location="cpu", weights_only=True)
    else:
        saved = torch.load(found[0], map_location="cpu", weights_only=True)
    state = saved
    for part in key.split(".") if key is not None else ():
        state = state[part]
    return [v for t in state.values() for v in t.detach().reshape(-1).tolist()]


def _echo_rank_logs(logs: Path) -> None:
    """Each torchrun worker's stdout.log and stderr.log (under logs/<run>/attempt_N/<rank>/),
    onto this process's stdout and stderr, in the order of attempts and ranks."""
    def order(folder: Path) -> tuple[str, int]:
        return folder.parent.name, int(folder.name) if folder.name.isdigit() else -1

    for folder in sorted((d for d in logs.glob("*/attempt_*/*") if d.is_dir()), key=order):
        for name, stream in (("stdout.log", sys.stdout), ("stderr.log", sys.stderr)):
            with contextlib.suppress(OSError):
                stream.write((folder / name).read_text(encoding="utf-8", errors="replace"))
        sys.stdout.flush()
        sys.stderr.flush()


def _rank_logs(launcher: str, folder: Path) -> tuple[tuple[str, ...], dict[str, str]]:
    """The flags and variables that make `launcher` write each rank's stdout and stderr to files
    of its own under `folder`: torchrun (also inside `fabric run`) reads its options from PET_*
    variables; `accelerate launch` hands torchrun its own --log_dir, so it is given that."""
    variables = {"PET_REDIRECTS": "3", "PET_LOG_DIR": str(folder)}
    if launcher == "accelerate":
        return ("--log_dir", str(folder)), variables
    return (), variables


def _console_script(name: str) -> Any:
    """The function the console script `name` (torchrun, fabric, accelerate) runs."""
    from importlib.metadata import entry_points

    found = list(entry_points(group="console_scripts", name=name))
    if not found:
        raise RuntimeError(f"no console script {name!r} is installed (this program's launcher)")
    return found[0].load()


def _run_in_kernel(program: corpus.Program, entry: Path, workdir: Path) -> list[dict[str, Any]]:
    """Run the program in a fresh Jupyter kernel (nbclient), its working directory `workdir`:
    a notebook's code cells but `program.skip_cells`, or a script's text as one cell, errors
    recorded and execution going on (a script with `program.cells`: loaded with `%run -n`, then
    those cells). Per cell run: its code-cell index, stdout, text/plain result and error;
    stdout and stderr are copied here as they are shown."""
    import nbformat
    from nbclient import NotebookClient

    if program.is_notebook:
        code = [c for c in nbformat.read(entry, as_version=4).cells if c.cell_type == "code"]
    elif program.cells:
        code = [nbformat.v4.new_code_cell(f"%run -n {entry.name}"),
                *(nbformat.v4.new_code_cell(text) for text in program.cells)]
    else:
        code = [nbformat.v4.new_code_cell(entry.read_text(encoding="utf-8"))]
    chosen = [(i, c) for i, c in enumerate(code) if i not in program.skip_cells]
    nb = nbformat.v4.new_notebook()
    nb.cells = [c for _, c in chosen]
    for c in nb.cells:
        c.outputs, c.execution_count = [], None
    NotebookClient(nb, timeout=int(program.timeout), kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(workdir)}}).execute()
    cells = []
    for (i, _), cell in zip(chosen, nb.cells, strict=True):
        stdout, result, error = "", None, None
        for out in cell.outputs:
            if out.output_type == "stream":
                (sys.stdout if out.name == "stdout" else sys.stderr).write(out.text)
                if out.name == "stdout":
                    stdout += out.text
            elif out.output_type == "execute_result":
                result = out.data.get("text/plain")
                print(f"Out[{i}]: {result}")
            elif out.output_type == "display_data" and "text/plain" in out.data:
                # What rich prints in a kernel (Lightning's tables and progress bars where rich
                # is installed) is display data, its text a terminal's, colours aside.
                text = ANSI.sub("", out.data["text/plain"]).rstrip("\n") + "\n"
                sys.stdout.write(text)
                stdout += text
            elif out.output_type == "error":
                error = f"{out.ename}: {out.evalue}"
                sys.stderr.write("\n".join(out.traceback) + "\n")
        cells.append({"index": i, "stdout": stdout, "result": result, "error": error})
    sys.stdout.flush()
    return cells


def _wait_for_ranks(timeout: float = 120.0) -> None:
    """Wait for the processes this one started to end (but multiprocessing's resource tracker
    and the simulated machine's register watcher, which live as long as their parent: waiting
    for them cost every simulated run the whole timeout): a framework that runs rank 0 in the
    script's process (Lightning) lets the script end without waiting for the other ranks, which
    write their records as they exit."""
    import psutil

    def ours(p: psutil.Process) -> bool:
        with contextlib.suppress(psutil.Error):
            line = " ".join(p.cmdline())
            return "resource_tracker" not in line and "devlab-gpus-" not in line
        return False

    children = [p for p in psutil.Process().children(recursive=True) if ours(p)]
    psutil.wait_procs(children, timeout=timeout)


def _observe_here(folder: Path) -> Any:
    """Observe this process too (see the observer): for a framework that makes the script's own
    process rank 0. The observer's module is loaded from its file under a name of its own."""
    spec = importlib.util.spec_from_file_location("conformance_observer",
                                                  OBSERVER / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.observe(str(folder))


def run_here(name: str, simulate: int, replay: str | None = None,
             reference: bool = False) -> int:
    """Run mode: run program `name` in this process (see the module docstring); with `replay`
    (the simulated run's records, a JSON file), the CPU replay of references.py instead. The CPU
    run, and a `reference` run on simulated GPUs, take the program's cpu_* settings."""
    program = corpus.get(name)
    if simulate:
        os.environ["DEVLAB_SIMULATE_GPUS"] = str(simulate)
    else:
        os.environ.pop("DEVLAB_SIMULATE_GPUS", None)
    own = simulate and not reference  # the run with the program's own settings
    env = program.env if own or program.cpu_env is None else program.cpu_env
    os.environ.update(dict(env))
    launch = program.launch if own or program.cpu_launch is None else program.cpu_launch
    workdir = Path(tempfile.mkdtemp(prefix=f"conformance-{name}-")).resolve()
    observe = logs = here = None
    report: dict[str, Any] = {"program": name, "error": None, "error_at": None, "frames": []}
    code = 0
    start = time.perf_counter()
    try:
        if program.files:
            shutil.copytree(program.folder, workdir, dirs_exist_ok=True)
        if program.data:
            datagen.GENERATORS[program.data](workdir)
        if simulate:
            import devlab  # noqa: F401  (reads DEVLAB_SIMULATE_GPUS and starts the simulation)
        import random

        import numpy as np
        import torch

        random.seed(0)
        np.random.seed(0)
        torch.manual_seed(0)
        os.chdir(workdir)
        sys.path.insert(0, str(workdir))
        entry = workdir / program.entry
        if program.steps:
            entry = script_from_example(program, workdir)
        elif entry.suffix == ".rst":
            entry = script_from_rst(entry, program.rst_blocks)
        argv = program.argv if own or program.cpu_argv is None else program.cpu_argv
        target = ("-m", program.module) if program.module else (str(entry),)
        sys.argv = [target[-1], *argv]
        if program.ranks is not None and not replay:
            observe = Path(tempfile.mkdtemp(prefix=f"conformance-{name}-ranks-")).resolve()
            os.environ[OBSERVE_VARIABLE] = str(observe)
            os.environ.pop("PYTHONUNBUFFERED", None)
            # This process may be a rank too; whole lines, as the others write them.
            sys.stdout.reconfigure(line_buffering=True, write_through=False)
            here = _observe_here(observe)
        if replay:
            import references

            assert program.ranks is not None and program.ranks.replay is not None
            records = json.loads(Path(replay).read_text(encoding="utf-8"))
            report["replay"] = references.REPLAYS[program.ranks.replay](workdir, records)
        elif program.kernel:
            report["cells"] = cells = _run_in_kernel(program, entry, workdir)
            failed = [c for c in cells if c["error"]]
            if failed:
                code = 1
                report["error"] = failed[0]["error"]
                report["error_at"] = f"cell {failed[0]['index']}"
        elif program.is_notebook:
            report["cells"] = _run_notebook(entry)
        elif launch:
            launcher, *launch_args = launch
            # A relaunch (Program.relaunch) comes after the first launch ended well, in the
            # same folder; each launch's rank logs are echoed when it ends, then a marker line.
            launches = [(), program.relaunch] if program.relaunch else [()]
            for number, added in enumerate(launches):
                if logs is not None:
                    _echo_rank_logs(logs)
                    shutil.rmtree(logs, ignore_errors=True)
                    print(f"{RELAUNCH_MARKER} {' '.join(added)}", flush=True)
                logs = Path(tempfile.mkdtemp(prefix=f"conformance-{name}-logs-")).resolve()
                flags, variables = _rank_logs(launcher, logs)
                os.environ.update(variables)
                os.environ[LAUNCH_VARIABLE] = str(number)
                sys.argv = [launcher, *launch_args, *flags, *target, *argv, *added]
                status = _console_script(launcher)()
                if status:
                    sys.exit(status)
        else:
            import runpy

            if program.module:
                runpy.run_module(program.module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(str(entry), run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
        if code:
            report["error"] = f"SystemExit: {exc.code}"
    except BaseException as exc:
        traceback.print_exc()
        code = 1
        report["error"] = _error_line(exc)
        report["error_at"], report["frames"] = _frames(exc, workdir)
    finally:
        if logs is not None:
            _echo_rank_logs(logs)
        report["seconds"] = round(time.perf_counter() - start, 2)
        try:
            report.update(_simulation_report(simulate))
            if here is not None:
                here.write()
            if observe is not None:
                _wait_for_ranks()
                _include_processes(report, _observed(observe))
            ranks = program.ranks
            if ranks is not None and ranks.checkpoint:
                report["checkpoint"] = _checkpoint_values(workdir, ranks.checkpoint,
                                                          ranks.checkpoint_key)
        except Exception as exc:  # the report must still be printed
            report["report_error"] = _error_line(exc)
        sys.stdout.flush()
        sys.stderr.flush()
        print(MARKER + json.dumps(report), flush=True)
        os.chdir(HERE)
        shutil.rmtree(workdir, ignore_errors=True)
        for folder in (observe, logs):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
    return code


# --------------------------------------------------------------------------- API (parent)

@dataclass
class RunResult:
    """One run of one program: exit status, output, and the run mode's result line."""

    name: str
    simulate_gpus: int
    returncode: int | None
    timed_out: bool
    seconds: float
    stdout: str
    stderr: str
    report: dict[str, Any] | None = field(default=None)
    isolated: bool = False  # run in a network namespace of its own (Program.own_network)
    # CPU time of the run's process tree (user + system, the processes that were waited for): on
    # a shared machine, a figure the other engineers' load moves far less than the wall time.
    cpu_seconds: float = 0.0

    def describe(self) -> str:
        """Status, error and the end of stderr, for assertion messages."""
        tail = "\n".join(self.stderr.strip().splitlines()[-25:])
        err = (self.report or {}).get("error")
        return (f"{self.name} (simulate_gpus={self.simulate_gpus}): returncode={self.returncode}"
                f" timed_out={self.timed_out} error={err!r}\n--- stderr tail ---\n{tail}")


def devlab_root() -> Path:
    """The folder holding the devlab package that `import devlab` resolves to here."""
    spec = importlib.util.find_spec("devlab")
    if spec is None or spec.origin is None:
        raise RuntimeError("devlab is not importable from this interpreter")
    return Path(spec.origin).resolve().parent.parent


def run(name: str, simulate_gpus: int = 0, timeout: float | None = None,
        root: Path | None = None, replay_of: RunResult | None = None,
        reference: bool = False) -> RunResult:
    """Run program `name` in a fresh subprocess (run mode) and collect what it did. The CPU run
    of a program whose ranks are replayed needs the simulated run to replay (`replay_of`);
    `reference`: a run on simulated GPUs with the program's reference (cpu_*) settings."""
    program = corpus.get(name)
    env = dict(os.environ)
    env.pop("DEVLAB_SIMULATE_GPUS", None)
    env.pop(OBSERVE_VARIABLE, None)
    env["PYTHONPATH"] = os.pathsep.join([str(root or devlab_root()),
                                         *(str(HERE / s) for s in program.standins),
                                         str(OBSERVER)])
    env["MPLBACKEND"] = "Agg"
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, str(Path(__file__).resolve()), name]
    if simulate_gpus:
        cmd += ["--simulate-gpus", str(simulate_gpus)]
    if reference:
        cmd += ["--reference"]
    records = None
    if not simulate_gpus and program.replays:
        if replay_of is None or replay_of.report is None:
            raise ValueError(f"{name}: the CPU run replays the simulated run's ranks; "
                             "pass the simulated run (with its result line) as replay_of")
        fd, records = tempfile.mkstemp(prefix=f"conformance-{name}-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(replay_of.report.get("processes") or [], f)
        cmd += ["--replay", records]
    isolated = program.own_network and network_of_its_own() is not None
    if isolated:
        cmd = [*network_of_its_own(), *cmd]  # type: ignore[misc]
    limit = timeout if timeout is not None else program.timeout
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, env=env, cwd=str(HERE), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_tree(proc.pid)
        out, err = proc.communicate()
    finally:
        if records is not None:
            os.unlink(records)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    report = None
    lines = out.splitlines(keepends=True)
    if lines and lines[-1].startswith(MARKER):
        report = json.loads(lines[-1][len(MARKER):])
        out = "".join(lines[:-1])
    return RunResult(name, simulate_gpus, None if timed_out else proc.returncode, timed_out,
                     seconds, out, err, report, isolated, cpu_seconds)


def reference_run(name: str, root: Path | None = None,
                  replay_of: RunResult | None = None) -> RunResult:
    """The run a simulated run of `name` is compared with: on the CPU, or for a program that
    refuses the CPU, on its `reference_gpus` simulated GPUs with its reference settings."""
    program = corpus.get(name)
    if program.reference_gpus:
        return run(name, program.reference_gpus, root=root, reference=True)
    return run(name, 0, root=root, replay_of=replay_of)


def _kill_tree(pid: int) -> None:
    """Kill process `pid`, its process group and every descendant (a Jupyter kernel runs in a
    session of its own, and its forked ranks with it)."""
    import psutil

    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


@functools.cache
def network_of_its_own() -> tuple[str, ...] | None:
    """A command prefix that runs a command in a network namespace of its own with loopback up
    (`unshare --net`, as root), or None where this machine does not allow it."""
    prefix = ("unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh")
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return prefix if probe.returncode == 0 else None


# --------------------------------------------------------------------------- judging a run

def numbers(text: str, spec: corpus.Compare) -> list[float]:
    """The numbers `spec` takes from a run's stdout (see corpus.Compare); of a relaunched
    program, those of each launch's output in turn (`after` and `until` apply to each)."""
    return [n for launch in launch_numbers(text, spec) for n in launch]


def launch_numbers(text: str, spec: corpus.Compare) -> list[list[float]]:
    """The numbers `spec` takes from each launch's part of a run's stdout (one part, unless
    the run has RELAUNCH_MARKER lines)."""
    parts = re.split(rf"^{RELAUNCH_MARKER}\b.*\n?", text, flags=re.M)
    return [_numbers_of(part, spec) for part in parts]


def _numbers_of(text: str, spec: corpus.Compare) -> list[float]:
    lines = text.splitlines(keepends=True)
    if spec.by_process:
        def process(line: str) -> str:
            m = re.search(spec.by_process, line)
            return m.group(1) if m else ""

        lines = sorted(lines, key=process)  # stable: each process's lines keep their order
    start, stop = 0, len(lines)
    if spec.after:
        start = next((i for i, ln in enumerate(lines) if re.search(spec.after, ln)), len(lines))
    if spec.until:
        stop = next((i for i, ln in enumerate(lines) if i >= start and re.search(spec.until, ln)),
                    len(lines))
    region = "".join(lines[start:stop])
    found: list[float] = []
    for m in re.finditer(spec.pattern, region, re.M):
        found.extend(float(g) for g in (m.groups() or (m.group(0),)) if g is not None)
    return found


def compare_numbers(simulated: list[float], cpu: list[float], spec: corpus.Compare) -> str | None:
    """None when the two lists agree (see corpus.Compare), else what differs."""
    if not cpu:
        return "the CPU run printed no numbers to compare"
    if len(simulated) != len(cpu):
        return f"{len(simulated)} numbers on the simulated GPUs, {len(cpu)} on the CPU"
    bad = [(i, s, c) for i, (s, c) in enumerate(zip(simulated, cpu, strict=True))
           if not math.isclose(s, c, rel_tol=spec.rtol, abs_tol=spec.atol)]
    if bad:
        shown = ", ".join(f"#{i}: {s} vs {c}" for i, s, c in bad[:5])
        return f"{len(bad)} of {len(cpu)} numbers differ (simulated vs CPU): {shown}"
    return None


def stored_outputs(program: corpus.Program) -> list[dict[str, str | None]]:
    """Per code cell of the notebook: the stdout, result and error it stores."""
    nb = json.loads((program.folder / program.entry).read_text(encoding="utf-8"))
    cells = []
    for cell in (c for c in nb["cells"] if c["cell_type"] == "code"):
        stream = result = error = None
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream" and out.get("name") == "stdout":
                stream = (stream or "") + "".join(out["text"])
            elif out["output_type"] == "execute_result":
                result = "".join(out["data"].get("text/plain", ""))
            elif out["output_type"] == "error":
                error = f"{out['ename']}: {out['evalue']}"
        cells.append({"stdout": stream or "", "result": result, "error": error})
    return cells


def notebook_mismatches(program: corpus.Program, report: dict[str, Any]) -> list[str]:
    """Cells (of program.notebook_cells) whose outputs differ from the stored ones."""
    stored = stored_outputs(program)
    ran = report.get("cells") or []
    problems = []
    for i in program.notebook_cells:
        if i >= len(ran):
            problems.append(f"cell {i} did not run")
            continue
        for key in ("stdout", "result", "error"):
            if ran[i][key] != stored[i][key]:
                problems.append(f"cell {i} {key}: got {ran[i][key]!r}, the notebook stores "
                                f"{stored[i][key]!r}")
    return problems


def _rank_records(ranks: corpus.Ranks, processes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The observed processes that are ranks, sorted by rank: those that stepped an optimizer in
    a process group (their rank recorded), or for a program whose ranks need not train, the
    processes a launcher gave a RANK (a process forked from one, as a DataLoader worker, is not
    one)."""
    if ranks.trains:
        found = [r for r in processes if r.get("rank") is not None]
    else:
        pids = {r["pid"] for r in processes}
        found = [{**r, "rank": int(r["env_rank"])} for r in processes
                 if r.get("env_rank") not in (None, "") and r.get("parent") not in pids]
    return sorted(found, key=lambda r: r["rank"])


def rank_problems(program: corpus.Program, report: dict[str, Any],
                  replay: dict[str, Any] | None = None) -> list[str]:
    """What the observed rank processes of a simulated run (`report`, its result line) break of
    the manifest's `ranks` (see corpus.Ranks); `replay`: the CPU replay's result line."""
    ranks = program.ranks
    assert ranks is not None
    records = _rank_records(ranks, report.get("processes") or [])
    if program.relaunch:  # the first launch's ranks here; relaunch_problems the second's
        records = [r for r in records if r.get("launch") in (None, "0")]
    found = sorted(r["rank"] for r in records)
    if found != list(range(ranks.world)):
        return [f"observed ranks {found} (processes: {len(report.get('processes') or [])}), "
                f"expected ranks 0..{ranks.world - 1}"]
    out = [f"rank {r['rank']}: observer error {e}" for r in records for e in r["errors"]]
    for r in records:
        peaks = r.get("peak") or []
        if not r.get("is_used") or r["rank"] >= len(peaks) or not peaks[r["rank"]]:
            out.append(f"rank {r['rank']} did not hold tensors on cuda:{r['rank']}: peaks {peaks}")
        if ranks.trains and (not r["steps"] or r["initial"] is None or r["final"] is None):
            out.append(f"rank {r['rank']} never stepped its optimizer")
    if out or not ranks.trains:
        return out
    rank0 = records[0]
    for r in records[1:]:
        if r["initial"] != rank0["initial"]:
            out.append(f"rank {r['rank']} started from other parameters than rank 0 "
                       "(DDP broadcasts rank 0's)")
        if r["final"] != rank0["final"]:
            out.append(f"rank {r['rank']} ended with other parameters than rank 0")
    if ranks.unchanged and rank0["final"] != rank0["initial"]:
        out.append("the final parameters differ from the initial ones (the loss's gradient is 0)")
    if ranks.checkpoint:
        saved = report.get("checkpoint")
        if saved is None:
            out.append(f"no checkpoint {ranks.checkpoint} could be read: "
                       f"{report.get('report_error') or 'no such file'}")
        elif saved != rank0["final"]:
            out.append(f"{ranks.checkpoint} does not hold rank 0's final parameters")
    # a record holds numbers or, past the observer's LIMIT, digests: its first value says which
    if ranks.replay and rank0["initial"] and isinstance(rank0["initial"][0], str):
        out.append("the ranks recorded digests, not numbers (more parameters than the "
                   "observer's LIMIT): a replay cannot be compared")
    elif ranks.replay:
        replayed = (replay or {}).get("replay") or {}
        if replayed.get("final") is None:
            out.append("the CPU replay gave no final parameters")
        for which in ("initial", "final"):
            values = replayed.get(which)
            if values is None:
                continue
            if len(values) != len(rank0[which]):
                out.append(f"{len(values)} {which} parameters in the CPU replay, "
                           f"{len(rank0[which])} on rank 0")
                continue
            bad = [i for i, (s, c) in enumerate(zip(rank0[which], values, strict=True))
                   if not math.isclose(s, c, rel_tol=ranks.rtol, abs_tol=ranks.atol)]
            if bad:
                out.append(f"{len(bad)} of {len(values)} {which} parameters differ from the CPU "
                           f"replay's, e.g. #{bad[0]}: {rank0[which][bad[0]]} vs "
                           f"{values[bad[0]]}")
    return out


def relaunch_problems(program: corpus.Program, sim: RunResult) -> list[str]:
    """What a relaunched program's second launch breaks: it must print the numbers (`compare`)
    the first launch printed last, as many as it prints, and its ranks end with the parameters
    the first launch's same ranks ended with (each rank, bit for bit: the same steps from the
    same saved state)."""
    if not program.relaunch:
        return []
    if not re.search(rf"^{RELAUNCH_MARKER}\b", sim.stdout, re.M):
        return [f"no {RELAUNCH_MARKER} line: the second launch never started"]
    out: list[str] = []
    if program.compare is not None:
        before, after = launch_numbers(sim.stdout, program.compare)[:2]
        if not after or len(after) > len(before):
            out.append(f"the second launch printed {len(after)} numbers, the first "
                       f"{len(before)}")
        elif (diff := compare_numbers(after, before[len(before) - len(after):],
                                      program.compare)):
            out.append("the resumed steps differ from the first launch's: " + diff)
    if program.ranks is not None:
        records = _rank_records(program.ranks, (sim.report or {}).get("processes") or [])
        launches = {n: {r["rank"]: r for r in records if r.get("launch") == n}
                    for n in ("0", "1")}
        if sorted(launches["1"]) != sorted(launches["0"]) or not launches["1"]:
            out.append(f"ranks {sorted(launches['1'])} in the second launch, "
                       f"{sorted(launches['0'])} in the first")
        for rank, second_rank in launches["1"].items():
            first_rank = launches["0"].get(rank)
            if first_rank is not None and second_rank.get("final") != first_rank.get("final"):
                out.append(f"rank {rank} of the second launch ended with other parameters "
                           "than the first launch's")
    return out


def problems(program: corpus.Program, sim: RunResult, cpu: RunResult | None) -> list[str]:
    """Everything about a simulated run (and its CPU twin) that breaks the manifest."""
    out: list[str] = []
    rep = sim.report or {}
    if sim.timed_out:
        return [f"timed out after {program.timeout:.0f} s"]
    if sim.report is None:
        out.append("no result line (the process died before reporting)")
    if program.expect_error:
        if sim.returncode != 1:
            out.append(f"exit status {sim.returncode}, expected 1 with {program.expect_error}")
        if not re.search(program.expect_error, rep.get("error") or ""):
            out.append(f"error {rep.get('error')!r} at {rep.get('error_at')}, expected "
                       f"{program.expect_error} at {program.expect_error_at}")
        elif program.expect_error_at and rep.get("error_at") != program.expect_error_at:
            out.append(f"error raised at {rep.get('error_at')}, expected {program.expect_error_at}")
    elif sim.returncode != 0:
        out.append(f"exit status {sim.returncode}: {rep.get('error')} at {rep.get('error_at')}")
    peaks = rep.get("peak") or []
    used = sum(1 for p in peaks if p > 0)
    if program.gpus_used and (not rep.get("is_used") or used < program.gpus_used):
        out.append(f"simulated GPUs barely used: is_used={rep.get('is_used')}, peaks={peaks}, "
                   f"expected {program.gpus_used} GPU(s) with peak > 0")
    for pattern in program.expect_stdout:
        if not re.search(pattern, sim.stdout, re.M):
            out.append(f"stdout lacks {pattern!r}")
    if program.notebook_cells:
        out.extend(notebook_mismatches(program, rep))
    if program.ranks is not None:
        out.extend(rank_problems(program, rep, cpu.report if cpu is not None else None))
    out.extend(relaunch_problems(program, sim))
    if program.compare is not None:
        if cpu is None or cpu.returncode != 0:
            out.append("the CPU run failed: " + (cpu.describe() if cpu else "not run"))
        elif sim.returncode == 0 or program.expect_error:
            diff = compare_numbers(numbers(sim.stdout, program.compare),
                                   numbers(cpu.stdout, program.compare), program.compare)
            if diff:
                out.append(diff)
    return out


# --------------------------------------------------------------------------- CLI

def _report(names: list[str], gpus: int | None, json_path: str | None) -> int:
    rows = []
    total = cpu_time = 0.0
    for name in names or [p.name for p in corpus.CORPUS]:
        program = corpus.get(name)
        sim = run(name, gpus or program.machine_gpus)
        cpu = (reference_run(name, replay_of=sim)
               if program.replays or program.compare is not None else None)
        total += sim.seconds + (cpu.seconds if cpu else 0.0)
        cpu_time += sim.cpu_seconds + (cpu.cpu_seconds if cpu else 0.0)
        found = problems(program, sim, cpu)
        rep = sim.report or {}
        rows.append({"name": name, "ok": not found, "problems": found,
                     "sim_seconds": round(sim.seconds, 1),
                     "cpu_seconds": round(cpu.seconds, 1) if cpu else None,
                     "sim_cpu_time": round(sim.cpu_seconds, 1),
                     "cpu_cpu_time": round(cpu.cpu_seconds, 1) if cpu else None,
                     "isolated": sim.isolated,
                     "returncode": sim.returncode, "error": rep.get("error"),
                     "error_at": rep.get("error_at"), "frames": rep.get("frames"),
                     "peak": rep.get("peak"), "stderr_tail": sim.stderr[-3000:]})
        status = "PASS" if not found else "FAIL"
        print(f"{status} {name}  sim {sim.seconds:.1f}s (CPU time {sim.cpu_seconds:.1f}s)"
              + (f"  cpu {cpu.seconds:.1f}s (CPU time {cpu.cpu_seconds:.1f}s)" if cpu else "")
              + f"  peaks={rep.get('peak')}" + ("  own network" if sim.isolated else ""),
              flush=True)
        for p in found:
            print(f"    - {p}", flush=True)
    print(f"total {total:.1f}s (CPU time {cpu_time:.1f}s)", flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="program name(s) from corpus.py")
    parser.add_argument("--simulate-gpus", type=int, default=0, metavar="N")
    parser.add_argument("--report", action="store_true",
                        help="run each program on the CPU (or its reference GPUs) and on N "
                             "(default: its machine's, 2 for most) simulated GPUs")
    parser.add_argument("--json", help="with --report: write the results here")
    parser.add_argument("--replay", metavar="FILE",
                        help="the CPU run of a program whose ranks are replayed: the simulated "
                             "run's observed processes (JSON)")
    parser.add_argument("--reference", action="store_true",
                        help="with --simulate-gpus: the reference run of a program that refuses "
                             "the CPU (its cpu_* settings)")
    args = parser.parse_args(argv)
    if args.report:
        return _report(args.names, args.simulate_gpus or None, args.json)
    if len(args.names) != 1:
        parser.error("give one program name (or --report)")
    if args.replay and args.simulate_gpus:
        parser.error("--replay is a CPU run: without --simulate-gpus")
    if args.reference and not args.simulate_gpus:
        parser.error("--reference runs on simulated GPUs: give --simulate-gpus")
    return run_here(args.names[0], args.simulate_gpus, args.replay, args.reference)


if __name__ == "__main__":
    sys.exit(main())
