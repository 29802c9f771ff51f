"""devlab installed by pip into a fresh virtual environment, as a user installs it.

The wheel is built from a copy of this checkout by devlab's own build backend (regular with
`pip wheel`, editable with the backend's `build_editable` hook, as `pip install -e` calls
it), and installed with `pip --python VENV install`, so the start-up hook under test is the one
pip puts in site-packages. Only devlab is installed there: torch and the other dependencies
are read from this interpreter's site-packages through a path file added afterwards (a path
file's directory is searched, its own .pth files are not run, so this environment's editable
devlab stays out).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "_devlab_autostart.py", "build_backend", "devlab", "share")
PTH = "devlab-autostart.pth"


def _copy_sources(dest: Path) -> Path:
    src = dest / "src"
    src.mkdir(parents=True)
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    return src


def build_wheel(dest: Path, editable: bool) -> Path:
    """Build devlab's wheel (regular or editable) from a copy of the checkout; its path."""
    src = _copy_sources(dest)
    out = dest / "wheels"
    out.mkdir()
    if editable:
        code = ("from pip._vendor.pyproject_hooks import BuildBackendHookCaller as C; import sys; "
                "print(C(sys.argv[1], 'devlab_build', backend_path=['build_backend'])"
                ".build_editable(sys.argv[2]))")
        _run([sys.executable, "-c", code, str(src), str(out)])
    else:
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
              "--no-index", "-w", str(out), str(src)])
    (wheel,) = out.glob("devlab-*.whl")
    return wheel


def make_venv(dest: Path, editable: bool = False) -> Path:
    """A fresh virtual environment with devlab installed by pip; its python."""
    wheel = build_wheel(dest, editable)
    venv = dest / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
          "--no-index", str(wheel)])
    (site_packages(python) / "zz-devlab-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def site_packages(python: Path) -> Path:
    return Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())


def env(**extra: str) -> dict[str, str]:
    """This environment without PYTHONPATH (the installed devlab is the one under test) and
    without a simulation switch, plus `extra`."""
    e = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "DEVLAB_SIMULATE_GPUS", "DEVLAB_SIMULATE_GPU_MEMORY_MB")}
    e.update(extra)
    return e


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env())
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
