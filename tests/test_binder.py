"""Binder, stood in for: the environment a learner opening a Binder link gets.

mybinder.org and Docker cannot be reached here, so this does what repo2docker does, as closely
as this machine allows (`lesson_envs.binder_env`):

- builds a fresh virtual environment from `binder/requirements.txt` alone, with the Python
  `binder/runtime.txt` names. One line differs, and only here: PyTorch's CPU index
  (unreachable) is swapped for this machine's registry, which holds the same pinned
  `torch==...+cpu` wheel (`local_requirements`);
- runs `binder/postBuild` if there is one (there is none: nothing needs building);
- checks that `repo2docker --no-build` accepts the repository and reads `binder/` as meant,
  and that `binder/start` sizes torch's threads to the session's CPU limit.

Every notebook then runs through `binder/start` in a real kernel, on one core with mybinder's
limits (2 GB, `BINDER_TIME_LIMIT` per notebook), as the `binder` column of
tests/test_lessons.py, which writes each one's time and peak memory to test-artifacts/lessons/.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from lesson_envs import (
    ARTIFACTS,
    BINDER,
    PYTORCH_CPU_INDEX,
    BinderEnv,
    binder_env,
    runtime_python,
    shared_dir,
)

# One worker runs this module: its tests share the environment's build (70 s), which a second
# worker would otherwise wait for, idle, on its lock (62 s in a fresh-clone run).
pytestmark = [pytest.mark.binder, pytest.mark.xdist_group("test_binder")]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> BinderEnv:
    try:
        return binder_env(shared_dir(tmp_path_factory.getbasetemp()))
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


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
        built: BinderEnv, capsys: pytest.CaptureFixture[str]) -> None:
    probe = ("import json, sys, torch, devlab, ipywidgets, jupyterlab; print(json.dumps({"
             "'torch': torch.__version__, 'cuda': torch.version.cuda, 'devlab': devlab.__file__,"
             "'python': list(sys.version_info[:2])}))")
    out = subprocess.run([str(built.venv / "bin" / "python"), "-c", probe], env=built.env(),
                         capture_output=True, text=True, check=True, cwd=built.home)
    found = json.loads(out.stdout)
    pinned = re.search(r"^torch==(.+)$", (BINDER / "requirements.txt").read_text(), re.M)[1]
    assert found["torch"] == pinned and found["cuda"] is None
    assert found["devlab"].startswith(str(ROOT / "devlab"))
    assert tuple(found["python"]) == runtime_python()
    figures = {"install_seconds": round(built.install_seconds, 1),
               "venv_mib": round(built.venv_mib)}
    (ARTIFACTS / "binder").mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "binder" / "environment.json").write_text(json.dumps(figures, indent=1) + "\n")
    with capsys.disabled():
        print(f"\nBinder stand-in environment: built in {figures['install_seconds']} s, "
              f"{figures['venv_mib']} MiB")


def test_the_environment_is_the_checkouts_interpreter(built: BinderEnv) -> None:
    """The lessons' translations run in the checkout's interpreter and not again in Binder's
    (tests/test_lessons.py, `TRANSLATED_ENVS`), which holds while the two are one: the same
    Python, and the IPython, ipykernel and notebook executor that handle a translation's text."""
    probe = ("import json, sys, importlib.metadata as m; print(json.dumps([sys.version] + "
             "[m.version(d) for d in ('ipython', 'ipykernel', 'nbconvert', 'nbclient')]))")
    binder = subprocess.run([str(built.venv / "bin" / "python"), "-c", probe], env=built.env(),
                            capture_output=True, text=True, check=True, cwd=built.home)
    here = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    assert json.loads(binder.stdout) == json.loads(here.stdout), (
        f"Binder's interpreter (Python, IPython, ipykernel, nbconvert, nbclient) is "
        f"{binder.stdout.strip()}, the checkout's {here.stdout.strip()}: run the translations in "
        f"Binder's too (add \"binder\" to TRANSLATED_ENVS in tests/test_lessons.py)")


def test_start_sizes_torch_threads_to_the_cpu_limit(built: BinderEnv) -> None:
    probe = [str(BINDER / "start"), "python", "-c",
             "import os, torch; print(os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads())"]

    def started(**env: str) -> tuple[str, int]:
        out = subprocess.run(probe, env=built.env(**env), capture_output=True, text=True,
                             check=True)
        omp, threads = out.stdout.split()
        return omp, int(threads)

    assert started(CPU_LIMIT="1") == ("1", 1)
    assert started(CPU_LIMIT="0.5") == ("1", 1)  # at least one thread
    assert started(CPU_LIMIT="2.5")[0] == "3"  # whole threads, rounded up
    assert started(CPU_LIMIT="1", OMP_NUM_THREADS="2")[0] == "2", "start overrode the user's choice"
    if not _cgroup_cpu_quota():
        # No limit anywhere: torch keeps its own default.
        env = built.env()
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
