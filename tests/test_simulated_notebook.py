"""The d2l "GPUs" chapter, unmodified, on two simulated GPUs in a real Jupyter kernel."""

from __future__ import annotations

import pytest
from nbutil import errors, run_notebook, text

pytestmark = pytest.mark.notebook


@pytest.fixture(scope="module")
def cells() -> dict[str, str]:
    nb = run_notebook("05-d2l-gpus-chapter.ipynb")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not any(errors(c) for c in code)
    # each cell by its last line, as the chapter prints it
    return {c.source.strip().splitlines()[-1]: text(c) for c in code}


def test_the_first_cell_turns_on_two_simulated_gpus(cells) -> None:
    assert "devlab.config.simulate_gpus(2)" in cells


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
