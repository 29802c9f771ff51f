"""notebooks/02-memory.ipynb runs top to bottom in a real kernel, with simulated GPUs."""

from __future__ import annotations

import base64

import pytest
from nbutil import errors, html, run_notebook, text

pytestmark = pytest.mark.notebook


@pytest.fixture(scope="module")
def nb():
    return run_notebook("02-memory.ipynb", timeout=300)


def _cell(nb, starts: str):
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(starts)]
    return cell


def test_simulated_gpus_are_said_to_be_simulated(nb):
    said = nb.cells[nb.cells.index(_cell(nb, "import time")) - 1]  # the words before that cell
    assert said.cell_type == "markdown"
    assert "simulated" in said.source.lower() and "CPU" in said.source
    assert "simulated=True" in text(_cell(nb, "import time"))


def test_growth_and_limit_settings(nb):
    assert text(_cell(nb, "devlab.config.set_memory_growth")).strip() == \
        "2 Physical GPUs, 2 Logical GPUs"
    assert "cannot be modified after being initialized" in text(_cell(nb, "try:"))


def test_memwatch_growth_summary(nb):
    cell = _cell(nb, "%%memwatch --device /GPU:0 --device /GPU:1")
    assert not errors(cell)
    out = text(cell)
    assert "GPU:0 (simulated): peak 384.0 MiB" in out and "still held 192.0 MiB" in out
    assert "GPU:1 (simulated): peak 192.0 MiB" in out and "limit 256.0 MiB" in out
    assert "<table class='devlab-memory-summary'>" in html(cell)


def test_over_the_limit_fails_clearly_and_the_kernel_lives(nb):
    cell = _cell(nb, "%%memwatch --device /GPU:1\nmore")
    (err,) = errors(cell)
    assert err.ename == "OutOfMemoryError"
    assert "Tried to allocate 32.00 MiB. GPU 1 has a total capacity of 256.00 MiB" in err.evalue
    assert "peak 256.0 MiB" in text(cell) and "100% at peak" in text(cell)
    after = text(_cell(nb, 'print(f"GPU 1 holds'))
    assert "GPU 1 holds 256 MiB in 5 + 3 tensors" in after
    assert "after freeing: 0 MiB" in after and "device='cuda:1'" in after


def test_python_api_cell(nb):
    out = text(_cell(nb, "from devlab.memory import Sampler"))
    assert "GPU:0 (simulated): peak 256.0 MiB (+64.0 MiB)" in out
    assert "CPU:0 (process RSS)" in out


def test_live_charts_reached_the_notebook(nb):
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    frames = [base64.b64decode(o["data"]["image/png"])
              for m in state.values() if m["model_name"] == "OutputModel"
              for o in m["state"]["outputs"] if "image/png" in o["data"]]
    assert len(frames) == 2 and all(f.startswith(b"\x89PNG") for f in frames)
