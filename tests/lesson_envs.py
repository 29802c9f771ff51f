"""The places a lesson notebook runs, as the tests stand them in, and running a notebook there.

- `plain`: a machine without a GPU and without `DEVLAB_SIMULATE_GPUS` (a laptop);
- `sim2`: `DEVLAB_SIMULATE_GPUS=2` set from outside (a Binder deployment or a teacher);
- `sim1`: `DEVLAB_SIMULATE_GPUS=1`: one GPU, standing in for Colab's GPU runtime (one T4);
- `binder`: a fresh environment built from `binder/requirements.txt` alone, every notebook run
  through `binder/start` on one core with mybinder's limits (see tests/test_binder.py);
- `colab`: Colab's runtime without a GPU: Python 3.12, IPython 7.34, ipykernel 6.17,
  ipywidgets 7.7, a CUDA build of torch, and devlab installed by the notebooks' own set-up
  cell. Torch for Python 3.12 exists here only as a multi-GB CUDA build, so this one is built
  by the compatibility job (`bash scripts/compat.sh --colab`), which names its Python in
  `DEVLAB_COLAB_PYTHON`; without it, the tests of this column are skipped and say so.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbutil import ROOT, execute

from tools.compat import GOOGLE_COLAB, folder_mib
from tools.measure import run_measured

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
_SESSIONS = itertools.count()  # each Binder session's simulated machine
BINDER = ROOT / "binder"
ARTIFACTS = ROOT / "test-artifacts"

BINDER_MEMORY_LIMIT = 2 * 1024**3  # mybinder.org: 2 GB per session (1 GB guaranteed)
BINDER_TIME_LIMIT = 180.0  # seconds per notebook on one core: "a few minutes"
PYTORCH_CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"
# This machine's registry: pip's configured indexes, and /opt/wheels where the same CPU build
# of torch lies (the PyTorch CPU index cannot be reached from here).
LOCAL_WHEELS = Path("/opt/wheels")
COLAB_PYTHON = "DEVLAB_COLAB_PYTHON"


@dataclass(frozen=True)
class Env:
    """One place a lesson runs: the simulation switch it sets from outside, if any."""

    name: str
    simulate: int | None = None  # DEVLAB_SIMULATE_GPUS, set before the kernel starts
    kernel_env: dict[str, str] = field(default_factory=dict)

    def physical_gpus(self, lesson_gpus: int) -> int:
        """GPUs the machine shows once the lesson asked for `lesson_gpus`."""
        return self.simulate if self.simulate is not None else lesson_gpus


PLAIN = Env("plain")
ENVS = [
    PLAIN,
    Env("sim2", 2, {"DEVLAB_SIMULATE_GPUS": "2"}),
    Env("sim1", 1, {"DEVLAB_SIMULATE_GPUS": "1"}),
    Env("binder"),
    Env("colab"),
]


@dataclass
class Ran:
    """A notebook executed in one environment, with what it cost."""

    nb: nbformat.NotebookNode
    env: Env
    seconds: float
    peak_mib: float | None = None


def run(path: Path, env: Env, tmp: Path, shared: Path) -> Ran:
    """Execute `path` top to bottom in `env`, errors kept in their cells (not stopping)."""
    if env.name == "binder":
        return _run_binder(path, tmp, binder_env(shared))
    if env.name == "colab":
        return _run_colab(path, tmp)
    if env.name == "plain":
        return plain_run(path, shared)
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    execute(nb, timeout=300, allow_errors=True, env=env.kernel_env)
    return Ran(nb, env, time.perf_counter() - start)


def plain_run(path: Path, shared: Path) -> Ran:
    """`path` executed top to bottom in `plain` (errors kept in their cells, widget state
    recorded), once per test run in `shared` (`shared_dir`) for every test and worker that
    reads it: the `plain` column of tests/test_lessons.py, and tests/test_render.py, whose
    pages show what a learner without a GPU sees, this very run (the six English lessons took
    93 s, run twice)."""
    where = shared / "plain-runs"
    where.mkdir(parents=True, exist_ok=True)
    stem = f"{path.parent.name}-{path.stem}-{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
    ran, figures = where / f"{stem}.ipynb", where / f"{stem}.json"
    with _locked(where / f"{stem}.lock"):
        if ran.exists():
            seconds = json.loads(figures.read_text())["seconds"]
            return Ran(nbformat.read(ran, as_version=4), PLAIN, seconds)
        nb = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        execute(nb, timeout=300, allow_errors=True, env=PLAIN.kernel_env,
                store_widget_state=True)
        seconds = time.perf_counter() - start
        figures.write_text(json.dumps({"seconds": seconds}))
        nbformat.write(nb, ran)
        return Ran(nb, PLAIN, seconds)


def report(name: str, env: Env, figures: dict[str, object], nb: nbformat.NotebookNode) -> None:
    """What a run found, and the executed notebook, in test-artifacts/lessons/ (one pair of
    files per run: safe in parallel)."""
    where = ARTIFACTS / "lessons"
    where.mkdir(parents=True, exist_ok=True)
    stem = f"{Path(name).stem}.{env.name}"
    (where / f"{stem}.json").write_text(json.dumps(figures, indent=1) + "\n")
    nbformat.write(nb, where / f"{stem}.ipynb")


# -- Binder -------------------------------------------------------------------------------------

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
    install_seconds: float
    venv_mib: float

    def env(self, **extra: str) -> dict[str, str]:
        """A session's environment: the image's Python first, its own home, and the limits
        JupyterHub passes to a mybinder session (one CPU, 2 GB)."""
        env = {"PATH": f"{self.venv / 'bin'}:/usr/bin:/bin", "HOME": str(self.home),
               "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
               "CPU_LIMIT": "1", "MEM_LIMIT": str(BINDER_MEMORY_LIMIT),
               # a mybinder session is a container, a machine of its own
               "DEVLAB_SIMULATED_MACHINE": f"binder-{os.getpid()}-{next(_SESSIONS)}"}
        env.update(extra)
        return env


def shared_dir(basetemp: Path) -> Path:
    """A folder of this test run that all its pytest workers share (pytest-xdist's too): each
    worker's base folder lies in the run's own."""
    return basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def binder_env(shared: Path) -> BinderEnv:
    """The Binder stand-in environment: a fresh venv from binder/requirements.txt, built once
    per test run in `shared` (`shared_dir`) and used by every test and worker that needs it."""
    major, minor = runtime_python()
    python = shutil.which(f"python{major}.{minor}")
    if python is None:
        raise RuntimeError(f"binder/runtime.txt pins Python {major}.{minor}, which this machine lacks")
    requirements_text = local_requirements((BINDER / "requirements.txt").read_text())
    key = f"{major}.{minor}\n{requirements_text}{(ROOT / 'pyproject.toml').read_text()}"
    where = shared / "binder"
    with _locked(shared / "binder.lock"):
        stamp = where / "built.json"
        if stamp.exists() and json.loads(stamp.read_text()).get("key") == key:
            built = json.loads(stamp.read_text())
            return BinderEnv(where / "venv", where / "home", built["seconds"], built["mib"])
        shutil.rmtree(where, ignore_errors=True)
        venv, home = where / "venv", where / "home"
        home.mkdir(parents=True)
        requirements = where / "requirements.txt"
        requirements.write_text(requirements_text)
        start = time.perf_counter()
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        # From the repository's root, as repo2docker runs it (`-e .` is relative to it).
        pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                              "--disable-pip-version-check", "-r", str(requirements)],
                             cwd=ROOT, capture_output=True, text=True)
        if pip.returncode != 0:
            raise RuntimeError(f"pip install -r binder/requirements.txt failed:\n{pip.stderr[-3000:]}")
        built = {"key": key, "seconds": time.perf_counter() - start, "mib": folder_mib(venv)}
        env = BinderEnv(venv, home, built["seconds"], built["mib"])
        post_build = BINDER / "postBuild"
        if post_build.exists():
            subprocess.run([str(post_build)], cwd=ROOT, env=env.env(), check=True)
        stamp.write_text(json.dumps(built))
        return env


def _run_binder(path: Path, tmp: Path, env: BinderEnv) -> Ran:
    """As a mybinder session runs it: through binder/start, on one core, measured."""
    # One core, as a mybinder session gets; parallel workers each take their own.
    cores = sorted(os.sched_getaffinity(0))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    one_core = {cores[-1 - worker % len(cores)]}
    cmd = [str(BINDER / "start"), "jupyter", "nbconvert", "--to", "notebook", "--execute",
           "--allow-errors", f"--ExecutePreprocessor.timeout={int(BINDER_TIME_LIMIT)}",
           "--output-dir", str(tmp), str(path)]
    measured = run_measured(cmd, env=env.env(), cwd=ROOT, timeout=2 * BINDER_TIME_LIMIT,
                            cpus=one_core)
    if measured.returncode != 0:
        raise RuntimeError(f"{path.name} failed under binder/start:\n{measured.output[-4000:]}")
    nb = nbformat.read(tmp / path.name, as_version=4)
    return Ran(nb, Env("binder"), measured.seconds, measured.peak_mib)


# -- Colab --------------------------------------------------------------------------------------

def colab_python() -> Path | None:
    value = os.environ.get(COLAB_PYTHON)
    return Path(value) if value else None


def _run_colab(path: Path, tmp: Path) -> Ran:
    """In the Colab-like environment's own kernel: its Python, its packages, devlab as the
    set-up cell installed it (not this checkout), google.colab present."""
    python = colab_python()
    assert python is not None
    spec_dir = tmp / "jupyter" / "kernels" / "devlab-colab"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab-like", "language": "python"}))
    startup = tmp / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-colab.py").write_text(GOOGLE_COLAB)  # the set-up cell looks for it
    nb = nbformat.read(path, as_version=4)
    env = {"JUPYTER_PATH": str(tmp / "jupyter"), "IPYTHONDIR": str(tmp / "ipython"),
           "PYTHONPATH": ""}  # devlab from the environment, never this checkout
    start = time.perf_counter()
    execute(nb, timeout=300, allow_errors=True, env=env, kernel_name="devlab-colab",
            checkout_on_path=False)
    return Ran(nb, Env("colab"), time.perf_counter() - start)


def colab_versions(python: Path) -> dict[str, str]:
    """The versions the Colab-like environment really has."""
    probe = ("import json, sys, IPython, ipykernel, ipywidgets, torch, devlab; print(json.dumps({"
             "'python': '.'.join(map(str, sys.version_info[:3])), 'ipython': IPython.__version__,"
             "'ipykernel': ipykernel.__version__, 'ipywidgets': ipywidgets.__version__,"
             "'torch': torch.__version__, 'devlab': devlab.__file__}))")
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                         cwd="/")
    return json.loads(out.stdout)

