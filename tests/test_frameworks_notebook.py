"""notebooks/06-frameworks.ipynb in a real Jupyter kernel: accelerate's notebook_launcher forks two
ranks from the kernel onto the two simulated GPUs, each rank's placement log of one step shows
its all-reduce on its own GPU, and the trained weights are the same on both ranks and the same
as one process on the host (checked here against a replay in this process, too)."""

from __future__ import annotations

import re

import nbformat
import pytest
import torch
from nbutil import NOTEBOOKS, errors, execute, html, stream, text
from torch import nn

pytestmark = pytest.mark.notebook

NAME = "06-frameworks.ipynb"
# Appended to the lesson in the test's kernel: the ranks are gone, the kernel never used CUDA.
AFTER = ("import psutil\n"
         "print('left:', [p.cmdline()[:3] for p in psutil.Process().children(recursive=True)\n"
         "                if 'resource_tracker' not in ' '.join(p.cmdline())])")


@pytest.fixture(scope="module")
def cells() -> dict[str, nbformat.NotebookNode]:
    nb = nbformat.read(NOTEBOOKS / NAME, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(AFTER))
    execute(nb, timeout=600)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for c in code:
        assert not errors(c), f"{c.source[:60]!r}: {text(c)}"

    def find(start: str) -> nbformat.NotebookNode:
        (cell,) = [c for c in code if c.source.startswith(start)]
        return cell

    return {"setup": find("# lesson set-up"), "data": find("from torch import nn"),
            "launch": find("import pickle"), "results": find("results = "),
            "logs": find("from devlab.placement_log"),
            "log0": find("logs[0]"), "same": find("ranks = "), "after": code[-1]}


def test_the_lesson_simulates_two_gpus_and_says_so(cells) -> None:
    assert stream(cells["setup"]).strip() == (
        "2 simulated GPUs (CPU-backed: values are real, speeds say nothing about a real GPU).")


def test_nothing_touches_a_gpu_in_the_notebook_before_or_after_launching(cells) -> None:
    assert stream(cells["data"]).strip() == "CUDA initialized in this notebook: False"
    assert stream(cells["same"]).strip().endswith("CUDA initialized in this notebook: False")


def _replay() -> tuple[nn.Module, list[float]]:
    """The lesson's training in one process on the host (batches of 32), and the losses the two
    ranks compute on their last batches of 16 (before the last step)."""
    def make_model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))

    torch.manual_seed(1)
    X, y = torch.randn(64, 4), torch.randn(64, 1)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = list(zip(X.split(32), y.split(32), strict=True)) * 10
    for i, (xb, yb) in enumerate(steps):
        if i == len(steps) - 1:
            with torch.no_grad():
                last = [nn.functional.mse_loss(model(h), t).item()
                        for h, t in zip(xb.chunk(2), yb.chunk(2), strict=True)]
        opt.zero_grad()
        nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
    return model, last


def test_two_ranks_train_each_on_its_own_gpu(cells) -> None:
    assert stream(cells["launch"]).strip() == "Launching training on 2 CUDAs."
    out = stream(cells["results"])
    found = re.findall(r"^rank (\d) trained on cuda:(\d): loss on its last batch (\d+\.\d{4})$",
                       out, re.M)
    assert [(r, g) for r, g, _ in found] == [("0", "0"), ("1", "1")], out
    _, last = _replay()
    assert [float(loss) for _, _, loss in found] == [round(v, 4) for v in last]
    notices = [ln for ln in stream(cells["launch"], "stderr").splitlines()
               if "simulated GPUs have no NCCL" in ln]
    assert len(notices) == 2  # said once by each rank


def test_each_ranks_step_shows_its_all_reduce_on_its_own_gpu(cells) -> None:
    lines = stream(cells["logs"]).splitlines()
    grads = 4 * sum(p.numel() for p in _replay()[0].parameters())  # float32 gradients: 388 B
    for rank in (0, 1):
        gpu = f"/job:localhost/replica:0/task:0/device:GPU:{rank}"
        assert f"rank {rank}: All-reduce {grads} B on {gpu} (c10d::allreduce_)" in lines
        (summary,) = [ln for ln in lines if ln.strip().startswith("Placement summary")
                      and f"GPU:{rank} " in ln]
        assert f"GPU:{1 - rank}" not in summary  # nothing of this rank ran on the other GPU
        assert "0 copies between devices" in summary and f"1 collective ({grads} B)" in summary
    log0 = html(cells["log0"])
    assert re.search(r'class="devlab-collective"[^>]*>All-reduce \d+ B on '
                     r"/job:localhost/replica:0/task:0/device:GPU:0", log0)
    assert "aten::addmm in device /job:localhost/replica:0/task:0/device:GPU:0" in log0
    assert "aten::_foreach_add_ in device /job:localhost/replica:0/task:0/device:GPU:0" in log0


def test_the_ranks_end_equal_and_equal_to_one_process(cells) -> None:
    out = stream(cells["same"])
    assert "both ranks hold the same weights: True" in out
    assert re.search(r"^same as one process on batches of 32: True \(largest difference "
                     r"\d\.\de-\d\d\)$", out, re.M), out


def test_no_rank_is_left(cells) -> None:
    assert stream(cells["after"]).strip() == "left: []"
