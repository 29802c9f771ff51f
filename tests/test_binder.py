"""Binder, stood in for: the lessons as a learner opening a Binder link would meet them.

mybinder.org and Docker cannot be reached here, so this does what repo2docker and a Binder
session do, as closely as this machine allows:

- builds a fresh virtual environment from `binder/requirements.txt` alone, with the Python
  `binder/runtime.txt` names. One line differs, and only here: PyTorch's CPU index
  (unreachable) is swapped for this machine's registry, which holds the same pinned
  `torch==...+cpu` wheel (`local_requirements`);
- runs `binder/postBuild` if there is one (there is none: nothing needs building);
- runs every notebook through `binder/start` in a real kernel (nbconvert), pinned to one core
  and with JupyterHub's `CPU_LIMIT=1`, as a mybinder session gets, measuring its wall time and
  the peak RSS of the whole process tree (nbconvert and the kernel), and fails past
  mybinder's limits: 2 GB of memory, and `TIME_LIMIT` per notebook;
- checks that `repo2docker --no-build` accepts the repository and reads `binder/` as meant.

The figures are printed and written to test-artifacts/binder/figures.json.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from tools.compat import folder_mib
from tools.measure import MIB, run_measured

pytestmark = pytest.mark.binder

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ARTIFACTS = ROOT / "test-artifacts" / "binder"

MEMORY_LIMIT = 2 * 1024**3  # mybinder.org: 2 GB per session (1 GB guaranteed)
TIME_LIMIT = 180.0  # seconds per notebook on one core: "a few minutes"
PYTORCH_CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"
# This machine's registry: pip's configured indexes, and /opt/wheels where the same CPU build
# of torch lies (the PyTorch CPU index cannot be reached from here).
LOCAL_WHEELS = Path("/opt/wheels")


def local_requirements(text: str) -> str:
    """binder/requirements.txt as this machine installs it: the PyTorch index line swapped."""
    lines = text.splitlines()
    assert PYTORCH_CPU_INDEX in lines, "binder/requirements.txt no longer names PyTorch's CPU index"
    swap = f"--find-links {LOCAL_WHEELS}" if LOCAL_WHEELS.is_dir() else "# (PyTorch CPU index left out)"
    return "\n".join(swap if line == PYTORCH_CPU_INDEX else line for line in lines) + "\n"


def runtime_python() -> tuple[int, int]:
    text = (BINDER / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(\d+)\.(\d+)", text)
    assert match, f"binder/runtime.txt should read python-X.Y, not {text!r}"
    return int(match[1]), int(match[2])


@dataclass
class BinderEnv:
    venv: Path
    home: Path
    outputs: Path
    install_seconds: float
    venv_mib: float

    def env(self, **extra: str) -> dict[str, str]:
        """A session's environment: the image's Python first, its own home, and the limits
        JupyterHub passes to a mybinder session (one CPU, 2 GB)."""
        env = {"PATH": f"{self.venv / 'bin'}:/usr/bin:/bin", "HOME": str(self.home),
               "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
               "CPU_LIMIT": "1", "MEM_LIMIT": str(MEMORY_LIMIT)}
        env.update(extra)
        return env


@pytest.fixture(scope="module")
def binder_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BinderEnv]:
    major, minor = runtime_python()
    python = shutil.which(f"python{major}.{minor}")
    if python is None:
        pytest.fail(f"binder/runtime.txt pins Python {major}.{minor}, which this machine lacks",
                    pytrace=False)
    (ARTIFACTS / "figures.json").unlink(missing_ok=True)  # figures of this run only
    where = tmp_path_factory.mktemp("binder")
    requirements = where / "requirements.txt"
    requirements.write_text(local_requirements((BINDER / "requirements.txt").read_text()))
    venv, home = where / "venv", where / "home"
    home.mkdir()
    start = time.perf_counter()
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    # From the repository's root, as repo2docker runs it (`-e .` is relative to it).
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                          "--disable-pip-version-check", "-r", str(requirements)],
                         cwd=ROOT, capture_output=True, text=True)
    assert pip.returncode == 0, f"pip install -r binder/requirements.txt failed:\n{pip.stderr[-3000:]}"
    env = BinderEnv(venv, home, where / "executed", time.perf_counter() - start, folder_mib(venv))
    post_build = BINDER / "postBuild"
    if post_build.exists():
        subprocess.run([str(post_build)], cwd=ROOT, env=env.env(), check=True)
    yield env


def _report(name: str, figures: dict[str, object]) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "figures.json"
    known = json.loads(path.read_text()) if path.exists() else {}
    known[name] = figures
    path.write_text(json.dumps(known, indent=1) + "\n")


# -- the files ----------------------------------------------------------------------------------

def test_requirements_pin_the_cpu_build_of_the_tested_torch() -> None:
    lines = [line.strip() for line in (BINDER / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    torch_lines = [line for line in lines if re.match(r"torch\b", line)]
    assert len(torch_lines) == 1 and re.fullmatch(r"torch==\d+\.\d+\.\d+\+cpu", torch_lines[0]), (
        f"torch must be pinned exactly to a +cpu build, not {torch_lines}")
    tested = re.search(r'DEVLAB_TORCH_SPEC:-torch==([\d.]+)', (ROOT / "scripts" / "setup.sh").read_text())
    assert tested and torch_lines[0] == f"torch=={tested[1]}+cpu", (
        "Binder's torch differs from the one scripts/setup.sh installs and the suite tests")
    assert PYTORCH_CPU_INDEX in lines and "-e .[lab]" in lines
    assert runtime_python() == sys.version_info[:2], "binder/runtime.txt names another Python than this suite's"


def test_repo2docker_reads_binder_as_meant() -> None:
    repo2docker = Path(sys.executable).parent / "repo2docker"
    assert repo2docker.exists(), "repo2docker is missing: pip install -e '.[test]'"
    out = subprocess.run([str(repo2docker), "--no-build", "--no-run", "--debug", str(ROOT)],
                         capture_output=True, text=True, timeout=120)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-3000:]
    major, minor = runtime_python()
    assert f"Building conda environment for python={major}.{minor}" in said, said[-3000:]
    assert 'pip install --no-cache-dir -r "binder/requirements.txt"' in said
    assert 'R2D_ENTRYPOINT="${REPO_DIR}/binder/start"' in said
    assert ("binder/postBuild" in said) == (BINDER / "postBuild").exists()


# -- the image ------------------------------------------------------------------------------------

def test_the_environment_has_the_pinned_cpu_torch_and_devlab(
        binder_env: BinderEnv, capsys: pytest.CaptureFixture[str]) -> None:
    probe = ("import json, sys, torch, devlab, ipywidgets, jupyterlab; print(json.dumps({"
             "'torch': torch.__version__, 'cuda': torch.version.cuda, 'devlab': devlab.__file__,"
             "'python': list(sys.version_info[:2])}))")
    out = subprocess.run([str(binder_env.venv / "bin" / "python"), "-c", probe], env=binder_env.env(),
                         capture_output=True, text=True, check=True, cwd=binder_env.home)
    found = json.loads(out.stdout)
    pinned = re.search(r"^torch==(.+)$", (BINDER / "requirements.txt").read_text(), re.M)[1]
    assert found["torch"] == pinned and found["cuda"] is None
    assert found["devlab"].startswith(str(ROOT / "devlab"))
    assert tuple(found["python"]) == runtime_python()
    figures = {"install_seconds": round(binder_env.install_seconds, 1),
               "venv_mib": round(binder_env.venv_mib)}
    _report("environment", figures)
    with capsys.disabled():
        print(f"\nBinder stand-in environment: built in {figures['install_seconds']} s, "
              f"{figures['venv_mib']} MiB")


def test_start_sizes_torch_threads_to_the_cpu_limit(binder_env: BinderEnv) -> None:
    probe = [str(BINDER / "start"), "python", "-c",
             "import os, torch; print(os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads())"]

    def started(**env: str) -> tuple[str, int]:
        out = subprocess.run(probe, env=binder_env.env(**env), capture_output=True, text=True,
                             check=True)
        omp, threads = out.stdout.split()
        return omp, int(threads)

    assert started(CPU_LIMIT="1") == ("1", 1)
    assert started(CPU_LIMIT="0.5") == ("1", 1)  # at least one thread
    assert started(CPU_LIMIT="2.5")[0] == "3"  # whole threads, rounded up
    assert started(CPU_LIMIT="1", OMP_NUM_THREADS="2")[0] == "2", "start overrode the user's choice"
    if not _cgroup_cpu_quota():
        # No limit anywhere: torch keeps its own default.
        env = binder_env.env()
        del env["CPU_LIMIT"]
        direct = subprocess.run(probe[1:], env=env, capture_output=True, text=True, check=True)
        through_start = subprocess.run(probe, env=env, capture_output=True, text=True, check=True)
        assert through_start.stdout == direct.stdout and direct.stdout.startswith("None ")


def _cgroup_cpu_quota() -> bool:
    """Whether this machine's cgroup limits CPU time (binder/start would read it)."""
    v2 = Path("/sys/fs/cgroup/cpu.max")
    if v2.exists():
        return not v2.read_text().startswith("max")
    v1 = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
    return v1.exists() and int(v1.read_text()) > 0


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_within_mybinders_limits(binder_env: BinderEnv, notebook: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    one_core = {max(os.sched_getaffinity(0))}
    cmd = [str(BINDER / "start"), "jupyter", "nbconvert", "--to", "notebook", "--execute",
           f"--ExecutePreprocessor.timeout={int(TIME_LIMIT)}", "--output-dir",
           str(binder_env.outputs), str(notebook)]
    run = run_measured(cmd, env=binder_env.env(), cwd=ROOT, timeout=2 * TIME_LIMIT, cpus=one_core)
    figures = {"seconds": round(run.seconds, 1), "peak_rss_mib": round(run.peak_mib)}
    _report(notebook.name, figures)
    with capsys.disabled():
        print(f"\nBinder stand-in, one core: {notebook.name}: {figures['seconds']} s, "
              f"peak RSS {figures['peak_rss_mib']} MiB (limits {TIME_LIMIT:.0f} s, "
              f"{MEMORY_LIMIT // MIB} MiB)")
    assert run.returncode == 0, f"{notebook.name} failed under binder/start:\n{run.output[-4000:]}"
    executed = nbformat.read(binder_env.outputs / notebook.name, as_version=4)
    unexpected = [i for i, c in enumerate(executed.cells) if c.cell_type == "code"
                  and any(o.output_type == "error" for o in c.outputs)
                  and "raises-exception" not in c.metadata.get("tags", [])]
    assert not unexpected, f"{notebook.name}: errors in cells {unexpected}"
    assert run.peak_rss < MEMORY_LIMIT, f"{notebook.name}: peak {run.peak_mib:.0f} MiB is over 2 GB"
    assert run.seconds < TIME_LIMIT, f"{notebook.name}: {run.seconds:.0f} s on one core"
