"""devlab's PEP 517 build backend: setuptools' own, plus the start-up hook in every wheel.

`devlab-autostart.pth` has to sit at the top of site-packages, which setuptools has no option
for, so the wheels setuptools builds (regular, and editable for `pip install -e .`) get it added
here, with its line in the wheel's RECORD. See `_devlab_autostart.py` for what the line does.

The editable wheel also gets the project's data files (`[tool.setuptools.data-files]`: devlab's
JupyterLab extension), which setuptools puts in a regular wheel but leaves out of an editable
one (setuptools 84 asks its distribution for `has_data`, which it does not have), so that
`pip install -e .[lab]`, as Binder installs devlab, installs the extension too.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - every other hook is setuptools' own

PTH_NAME = "devlab-autostart.pth"
# One line, run by Python's site module at start-up (site runs a .pth line that begins with
# "import"). It puts a finder first on sys.meta_path that compares each imported module's name
# with "torch" and "pynvml", and nothing more, until one of them is imported: only then does it
# read DEVLAB_SIMULATE_GPUS, so a program that sets the variable itself (`os.environ[...]` in a
# script, `%env` in a notebook) before `import torch` gets its simulated GPUs too, and only then,
# with the variable set, is `_devlab_autostart` imported (`found` takes over from this finder).
# (pynvml: a program that asks NVML before it imports torch, as Hugging Face's memory guide
# does, finds the simulated GPUs.) A process that imports neither, or imports them without the
# variable, imports nothing more.
# The line's last clause is for torch imported before site ran this line (an earlier .pth file):
# the hook starts the simulation at once. The finder is a class made with type() because a
# .pth line is one line; its `environ` is bound as the lambda's default, read at each call.
PTH_LINE = (
    'import os, sys; '
    'sys.meta_path.insert(0, type("DevlabAutostart", (), {"__slots__": (), "find_spec": '
    'lambda self, name, path=None, target=None, environ=os.environ: None if name not in '
    '("torch", "pynvml") '
    'or environ.get("DEVLAB_SIMULATE_GPUS", "").strip() in ("", "0") '
    'else __import__("_devlab_autostart").found(self, name, path, target)})()); '
    '"torch" in sys.modules and os.environ.get("DEVLAB_SIMULATE_GPUS", "").strip() '
    'not in ("", "0") and __import__("_devlab_autostart")\n')


def build_wheel(wheel_directory: str, config_settings: dict | None = None,
                metadata_directory: str | None = None) -> str:
    name = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    add_pth(Path(wheel_directory) / name)
    return name


def build_editable(wheel_directory: str, config_settings: dict | None = None,
                   metadata_directory: str | None = None) -> str:
    name = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    add_pth(Path(wheel_directory) / name)
    add_data_files(Path(wheel_directory) / name)
    return name


def add_pth(wheel: Path) -> None:
    """Rewrite `wheel` with the .pth file at its top and a RECORD line for it."""
    add_files(wheel, {PTH_NAME: PTH_LINE.encode()})


def data_files(root: Path = Path(".")) -> dict[str, Path]:
    """The project's data files: their paths under a wheel's .data/data folder, and where
    they are in the source tree."""
    from setuptools.config.pyprojecttoml import read_configuration

    config = read_configuration(root / "pyproject.toml", expand=False)
    table = config.get("tool", {}).get("setuptools", {}).get("data-files", {})
    return {f"{folder}/{Path(file).name}": root / file
            for folder, files in table.items() for file in files}


def add_data_files(wheel: Path) -> None:
    """Add to `wheel` each data file it lacks, under <name>-<version>.data/data/."""
    with zipfile.ZipFile(wheel) as src:
        names = src.namelist()
    dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
    data = dist_info.removesuffix(".dist-info") + ".data/data/"
    missing = {data + target: source.read_bytes() for target, source in data_files().items()
               if data + target not in names}
    if missing:
        add_files(wheel, missing)


def add_files(wheel: Path, files: dict[str, bytes]) -> None:
    """Rewrite `wheel` with `files` (path in the wheel: content) added or replaced, each with
    its line in RECORD."""
    entries = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        entries += f"{name},sha256={digest},{len(data)}\n"
    rewritten = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(rewritten, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            content = src.read(item.filename)
            if item.filename.endswith(".dist-info/RECORD"):
                kept = [line for line in content.decode().splitlines(keepends=True)
                        if line.split(",", 1)[0] not in files]
                content = (entries + "".join(kept)).encode()
            if item.filename not in files:
                dst.writestr(item, content)
        for name, data in files.items():
            dst.writestr(name, data)
    rewritten.replace(wheel)
