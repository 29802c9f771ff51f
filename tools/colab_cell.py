"""The set-up cell every notebook opens with: on Colab and Kaggle it installs devlab, elsewhere it
does nothing.

Colab ships torch, ipywidgets 7.7 and matplotlib but not devlab, and so do Kaggle's notebooks
(which set KAGGLE_KERNEL_RUN_TYPE). The cell installs devlab
from its repository at the release tag with `--no-deps`, plus only those of devlab's small
dependencies the runtime lacks, so pip never upgrades or replaces what Colab ships (a plain
install could, for a requirement such as `ipython>=8`). `tools.links` writes it from
pyproject.toml; `tests/test_colab_setup.py` runs it.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import tomllib

CELL_ID = "colab-setup"
FIRST_LINE = ("# Colab and Kaggle set-up: installs devlab if this runtime lacks it. Anywhere else it "
              "does nothing.")
# devlab's requirements that Colab ships; the cell leaves them as they are. Every other
# requirement in pyproject.toml is one the cell installs if the runtime lacks it.
COLAB_SHIPS = {"torch", "ipython", "ipywidgets", "matplotlib", "numpy"}
# Where a distribution's import name is not its own name.
IMPORT_NAMES = {"nvidia-ml-py": "pynvml"}
ROOT = Path(__file__).resolve().parents[1]


def small_dependencies(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """devlab's requirements Colab may lack, import name -> pip name, from pyproject.toml."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    names = [re.match(r"[A-Za-z0-9_.-]+", d)[0].lower() for d in deps]  # type: ignore[index]
    return {IMPORT_NAMES.get(n, n.replace("-", "_")): n for n in names if n not in COLAB_SHIPS}


def source(install_source: str | None) -> str:
    """The cell's code; `install_source` is a pip requirement (`devlab @ git+URL@REF`), or
    None while the project has no public repository."""
    head = [
        FIRST_LINE,
        "# The runtime's own torch, ipywidgets and matplotlib stay as they are.",
        "import importlib, importlib.util, os, subprocess, sys",
        "",
        'hosted = "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ',
        'if hosted and importlib.util.find_spec("devlab") is None:',
    ]
    if install_source is None:
        body = [
            "    raise RuntimeError(\"devlab has no public repository yet, so this notebook cannot \"",
            "                       \"install it here. Run it on a machine where devlab is installed.\")",
        ]
    else:
        deps = repr(small_dependencies())
        body = [
            f"    missing = [pkg for mod, pkg in {deps}.items() if importlib.util.find_spec(mod) is None]",
            '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",',
            f"                    {install_source!r}, *missing], check=True)",
            "    importlib.invalidate_caches()",
        ]
    return "\n".join(head + body)


def cell(install_source: str | None) -> nbformat.NotebookNode:
    made = nbformat.v4.new_code_cell(source(install_source))
    made.id = CELL_ID
    return made


def write(path: Path, install_source: str | None) -> bool:
    """Make the notebook's first code cell the set-up cell installing `install_source` (see
    `source`); True if it changed."""
    nb = nbformat.read(path, as_version=4)
    wanted = cell(install_source)
    cells = nb.cells
    at = next((i for i, c in enumerate(cells) if c.get("id") == CELL_ID), None)
    if at is not None:
        if cells[at].source == wanted.source:
            return False
        cells[at] = wanted
    else:
        first_code = next((i for i, c in enumerate(cells) if c.cell_type == "code"), len(cells))
        cells.insert(first_code, wanted)
    nbformat.write(nb, path)
    return True
