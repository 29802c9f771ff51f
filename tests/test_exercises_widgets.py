"""The exercises' progress bar in real kernels, with ipywidgets 8 (installed) and 7.7 (Colab's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbutil import ROOT, errors, execute, text

pytestmark = pytest.mark.notebook

# The same folder and pins as tests/test_widgets.py, so the 7.7 install is shared.
IPYWIDGETS7 = ROOT / ".venv" / "ipywidgets7"
IPYWIDGETS7_SPEC = ["ipywidgets==7.7.5", "ipython_genutils==0.2.0"]

CELLS = [
    "import ipywidgets\nprint('ipywidgets', ipywidgets.__version__)",
    "import devlab\nfrom devlab import exercises\ndevlab.config.simulate_gpus(2)\n"
    "r = exercises.norm_logging(n=5, size=4, repeats=1, warmup=0)\nr",
    "exercises.two_gpu_scaling(size=8, repeats=1, min_time=0.0, warmup=0)",
]


def _ipywidgets7() -> Path:
    if not (IPYWIDGETS7 / "ipywidgets" / "__init__.py").exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--no-deps", "--target", str(IPYWIDGETS7), *IPYWIDGETS7_SPEC],
            check=True)
    return IPYWIDGETS7


def _run(env: dict[str, str] | None = None) -> tuple[list, list[dict]]:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in CELLS]
    execute(nb, timeout=120, env=env)
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    return nb.cells, list(state.values())


@pytest.mark.parametrize("major", ["8", "7"])
def test_progress_bars_finish_in_a_kernel(major: str) -> None:
    env = None
    if major == "7":
        path = os.pathsep.join([str(_ipywidgets7()), str(ROOT), os.environ.get("PYTHONPATH", "")])
        env = {"PYTHONPATH": path}
    cells, models = _run(env)
    assert f"ipywidgets {major}." in text(cells[0])
    assert not any(errors(c) for c in cells)
    bars = [m["state"] for m in models if m["model_name"] == "IntProgressModel"]
    assert len(bars) == 2  # one per exercise run
    for bar in bars:
        assert bar["value"] == bar["max"] and bar["bar_style"] == "success"
    labels = [m["state"]["value"] for m in models if m["model_name"] == "LabelModel"]
    assert labels == ["done", "done"]
