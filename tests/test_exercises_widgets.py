"""The exercises' progress bar in real kernels, with ipywidgets 8 (installed) and 7.7 (Colab's)."""

from __future__ import annotations

import nbformat
import pytest
from nbutil import errors, execute, ipywidgets7_env, text

pytestmark = pytest.mark.notebook

# The same folder and pins as tests/test_widgets.py, so the 7.7 install is shared.

CELLS = [
    "import ipywidgets\nprint('ipywidgets', ipywidgets.__version__)",
    "import devlab\nfrom devlab import exercises\ndevlab.config.simulate_gpus(2)\n"
    "r = exercises.norm_logging(n=5, size=4, repeats=1, warmup=0)\nr",
    "exercises.two_gpu_scaling(size=8, repeats=1, min_time=0.0, warmup=0)",
]


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
        env = ipywidgets7_env()
    cells, models = _run(env)
    assert f"ipywidgets {major}." in text(cells[0])
    assert not any(errors(c) for c in cells)
    bars = [m["state"] for m in models if m["model_name"] == "IntProgressModel"]
    assert len(bars) == 2  # one per exercise run
    for bar in bars:
        assert bar["value"] == bar["max"] and bar["bar_style"] == "success"
    labels = [m["state"]["value"] for m in models if m["model_name"] == "LabelModel"]
    assert labels == ["done", "done"]
