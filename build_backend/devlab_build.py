"""devlab's PEP 517 build backend: setuptools' own, plus the start-up hook in every wheel.

`devlab-autostart.pth` has to sit at the top of site-packages, which setuptools has no option
for, so the wheels setuptools builds (regular, and editable for `pip install -e .`) get it added
here, with its line in the wheel's RECORD. See `_devlab_autostart.py` for what the line does.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - every other hook is setuptools' own

PTH_NAME = "devlab-autostart.pth"
# One line, run by Python's site module at start-up: a look at the environment, and the hook's
# import only when simulated GPUs are asked for.
PTH_LINE = ('import os; os.environ.get("DEVLAB_SIMULATE_GPUS", "").strip() not in ("", "0") '
            'and __import__("_devlab_autostart")\n')


def build_wheel(wheel_directory: str, config_settings: dict | None = None,
                metadata_directory: str | None = None) -> str:
    name = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    add_pth(Path(wheel_directory) / name)
    return name


def build_editable(wheel_directory: str, config_settings: dict | None = None,
                   metadata_directory: str | None = None) -> str:
    name = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    add_pth(Path(wheel_directory) / name)
    return name


def add_pth(wheel: Path) -> None:
    """Rewrite `wheel` with the .pth file at its top and a RECORD line for it."""
    data = PTH_LINE.encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    entry = f"{PTH_NAME},sha256={digest},{len(data)}\n"
    rewritten = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(rewritten, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            content = src.read(item.filename)
            if item.filename.endswith(".dist-info/RECORD"):
                kept = [line for line in content.decode().splitlines(keepends=True)
                        if not line.startswith(f"{PTH_NAME},")]
                content = (entry + "".join(kept)).encode()
            if item.filename != PTH_NAME:
                dst.writestr(item, content)
        dst.writestr(PTH_NAME, data)
    rewritten.replace(wheel)
