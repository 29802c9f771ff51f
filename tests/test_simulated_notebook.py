"""The d2l "GPUs" chapter, unmodified, on two simulated GPUs in a real Jupyter kernel."""

from __future__ import annotations

import re
import sys

import pytest
from nbutil import errors, run_cells, run_notebook, text

pytestmark = pytest.mark.notebook


@pytest.fixture(scope="module")
def cells() -> dict[str, str]:
    nb = run_notebook("05-d2l-gpus-chapter.ipynb")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not any(errors(c) for c in code)
    # each cell by its last line, as the chapter prints it
    return {c.source.strip().splitlines()[-1]: text(c) for c in code}


def test_devlab_turns_on_two_simulated_gpus_before_the_chapter(cells) -> None:
    # The Colab set-up cell (silent off Colab), then devlab's: it simulates two GPUs, and
    # needs_gpus, with two there, says nothing. The tests below show the chapter on them.
    setup, devlab_cell = list(cells)[:2]
    assert cells[setup] == ""
    assert devlab_cell.startswith("needs_gpus(2,") and cells[devlab_cell] == ""


def test_device_helpers_see_two_gpus(cells) -> None:
    assert cells["cpu(), gpu(), gpu(1)"] == (
        "(device(type='cpu'),\n device(type='cuda', index=0),\n device(type='cuda', index=1))")
    assert cells["num_gpus()"] == "2"
    assert cells["try_gpu(), try_gpu(10), try_all_gpus()"] == (
        "(device(type='cuda', index=0),\n device(type='cpu'),\n"
        " [device(type='cuda', index=0), device(type='cuda', index=1)])")


def test_tensors_live_where_the_chapter_says(cells) -> None:
    assert cells["x.device"] == "device(type='cpu')"
    assert cells["X"] == "tensor([[1., 1., 1.],\n        [1., 1., 1.]], device='cuda:0')"
    assert cells["Y"].endswith("device='cuda:1')")
    assert cells["print(Z)"] == (
        "tensor([[1., 1., 1.],\n        [1., 1., 1.]], device='cuda:0')\n"
        "tensor([[1., 1., 1.],\n        [1., 1., 1.]], device='cuda:1')\n")
    assert cells["Y + Z"].endswith("device='cuda:1')")
    assert cells["Z.cuda(1) is Z"] == "True"


def test_the_network_runs_on_gpu_0(cells) -> None:
    out = cells["net(X)"]
    assert out.startswith("tensor([[") and out.endswith("device='cuda:0', grad_fn=<AddmmBackward0>)")
    assert cells["net[0].weight.data.device"] == "device(type='cuda', index=0)"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="a bare raise keeps an edited "
                    "traceback from Python 3.11 on; before, IPython shows the raising frame")
def test_simulated_errors_point_at_the_users_line_only() -> None:
    # As CUDA's errors (raised in C++) do: the traceback ends at the user's own line, with
    # none of the simulation's frames; the user's own function frames stay.
    cells = run_cells(
        "import torch, devlab\ndevlab.config.simulate_gpus(2, memory_limit=64)",
        "big = torch.empty(100 * 2**20, device='cuda:0')",
        "def grow(t):\n    return torch.cat([t, t, t, t])\n"
        "w = torch.ones(4 * 2**20, device='cuda:0')\ngrow(w)",
        "x = torch.ones(3, device='cuda:0')\ny = torch.ones(3)\nz = x + y",
        "a = torch.ones(3, device='cuda:0')\nb = torch.ones(3, device='cuda:1')\nc = a * b",
        # torch's own errors, raised while the simulation runs the op
        "m = torch.ones(2, 3, device='cuda:0')\np = m @ m",
        "v = torch.ones(2, 3, device='cuda:0').view(4)",
        # a patched torch.cuda function
        "torch.cuda.set_device(7)",
    )
    assert not errors(cells[0])
    expected = [
        ("OutOfMemoryError", ["----> 1 big = torch.empty(100 * 2**20, device='cuda:0')"]),
        ("OutOfMemoryError", ["----> 4 grow(w)", "----> 2     return torch.cat([t, t, t, t])"]),
        ("RuntimeError", ["----> 3 z = x + y"]),
        ("RuntimeError", ["----> 3 c = a * b"]),
        ("RuntimeError", ["----> 2 p = m @ m"]),
        ("RuntimeError", ["----> 1 v = torch.ones(2, 3, device='cuda:0').view(4)"]),
        ("AcceleratorError", ["----> 1 torch.cuda.set_device(7)"]),
    ]
    for cell, (ename, lines) in zip(cells[1:], expected, strict=True):
        (err,) = errors(cell)
        assert err.ename == ename
        tb = _ANSI.sub("", "\n".join(err.traceback))
        for line in lines:
            assert line in tb, tb
        assert "devlab/simulated" not in tb, tb
        assert [f for f in tb.splitlines() if f.startswith("File ")] == [], tb  # no library frame
    assert "found at least two devices, cuda:0 and cpu!" in errors(cells[3])[0].evalue
    assert "cuda:0 and cuda:1!" in errors(cells[4])[0].evalue
    # torch's own words, which newer releases begin with the op's name ("mm: mat1 and ...")
    assert errors(cells[5])[0].evalue.endswith("mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)")
    assert errors(cells[6])[0].evalue == "shape '[4]' is invalid for input of size 6"
    assert errors(cells[7])[0].evalue.startswith("CUDA error: invalid device ordinal")
