"""Errors on simulated GPUs, in a real Jupyter kernel, end at the user's own line.

The d2l chapter's notebook itself (notebooks/05) is in tests/test_lessons.py."""

from __future__ import annotations

import re
import sys

import pytest
from nbutil import errors, run_cells

pytestmark = pytest.mark.notebook


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
        assert "devlab/engine/simulated" not in tb, tb
        assert [f for f in tb.splitlines() if f.startswith("File ")] == [], tb  # no library frame
    assert "found at least two devices, cuda:0 and cpu!" in errors(cells[3])[0].evalue
    assert "cuda:0 and cuda:1!" in errors(cells[4])[0].evalue
    # torch's own words, which newer releases begin with the op's name ("mm: mat1 and ...")
    assert errors(cells[5])[0].evalue.endswith("mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)")
    assert errors(cells[6])[0].evalue == "shape '[4]' is invalid for input of size 6"
    assert errors(cells[7])[0].evalue.startswith("CUDA error: invalid device ordinal")
