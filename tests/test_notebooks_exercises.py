"""Notebooks 03 (d2l exercises) and 04 (multiple GPUs), executed top to bottom in a real kernel."""

from __future__ import annotations

import re

import nbformat
import pytest
import torch
from nbutil import errors, html, run_notebook, text

pytestmark = [
    pytest.mark.notebook,
    # The expected outputs are those of a machine without a GPU, where the notebooks simulate.
    pytest.mark.skipif(torch.cuda.is_available(), reason="expectations are for simulated GPUs"),
]

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
GPU0 = "/job:localhost/replica:0/task:0/device:GPU:0"
GPU1 = "/job:localhost/replica:0/task:0/device:GPU:1"
WIDGET = "application/vnd.jupyter.widget-view+json"


def cell_with(nb: nbformat.NotebookNode, snippet: str) -> nbformat.NotebookNode:
    """The one code cell whose source contains `snippet`."""
    found = [c for c in nb.cells if c.cell_type == "code" and snippet in c.source]
    assert len(found) == 1, f"{len(found)} cells contain {snippet!r}"
    return found[0]


def pngs(cell: nbformat.NotebookNode) -> list[str]:
    return [o.data["image/png"] for o in cell.outputs
            if o.output_type in ("execute_result", "display_data") and "image/png" in o.data]


def widgets(cell: nbformat.NotebookNode) -> list[dict]:
    return [o.data[WIDGET] for o in cell.outputs
            if o.output_type == "display_data" and WIDGET in o.data]


# --- 03 ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nb03() -> nbformat.NotebookNode:
    return run_notebook("03-d2l-exercises.ipynb", timeout=120)


def test_03_simulates_two_gpus_and_says_so(nb03) -> None:
    assert all(not errors(c) for c in nb03.cells if c.cell_type == "code")
    assert "2 simulated GPUs (CPU-backed" in text(cell_with(nb03, "simulate_gpus(2, model=\"T4\")"))
    said = " ".join(" ".join(c.source.split()) for c in nb03.cells if c.cell_type == "markdown")
    assert "simulates two GPUs with the timing of an NVIDIA T4" in said
    assert "GPU times are modeled, not measured" in said


def test_03_compare_devices_times_a_cell_on_each_device(nb03) -> None:
    cell = cell_with(nb03, "%%compare_devices /CPU:0 /GPU:0")
    assert not errors(cell)
    # The live chart, once the cell ended, gave way to its final state as static output.
    assert not widgets(cell) and "<img src=\"data:image/png;base64," in html(cell), "the timing chart"
    shown = text(cell)
    assert re.search(r"CPU:0: .* per call \(median\).* 1\.00x vs CPU:0", shown), shown
    assert re.search(r"GPU:0 \(modeled T4\): .* per call \(median\).*x vs CPU:0", shown), shown
    assert "modeled from NVIDIA T4 (16 GB, PCIe) specifications, not measured" in shown
    assert "speed-up vs CPU:0" in html(cell)


@pytest.mark.parametrize(
    ("call", "must_show"),
    [
        ("exercises.matmul_cpu_vs_gpu(", ["CPU:0 = torch cpu", "GPU:0 = torch cuda:0", "GFLOP/s"]),
        ("exercises.parameters_on_device(", ["state_dict to host", "load_state_dict from host"]),
        ("exercises.norm_logging(", ["per step: .item() each step", "one transfer at the end"]),
        ("exercises.two_gpu_scaling(", ["GPU:0 = torch cuda:0", "GPU:1 = torch cuda:1", "(ideal 2x)"]),
    ],
)
def test_03_each_exercise_shows_a_progress_bar_and_its_table(nb03, call: str, must_show: list[str]) -> None:
    cell = cell_with(nb03, call)
    assert len(widgets(cell)) == 1, "no progress bar"
    page = html(cell)
    assert "class='devlab-exercise-table'" in page
    assert "simulated GPU, CPU-backed" in page
    assert "modeled from NVIDIA T4 (16 GB, PCIe) specifications, not measured" in page
    for snippet in must_show:
        assert snippet in page, snippet


def test_03_progress_bars_reached_the_end(nb03) -> None:
    state = nb03.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    bars = [m["state"] for m in state.values() if m["model_name"] == "IntProgressModel"]
    exercise_bars = [b for b in bars if b["description"] != "timing"]
    assert len(exercise_bars) == 4 and len(bars) == 5  # one more: %%compare_devices's
    assert all(b["value"] == b["max"] and b["bar_style"] == "success" for b in exercise_bars)
    (timing,) = [b for b in bars if b["description"] == "timing"]
    assert timing["value"] == timing["max"]


def test_03_every_plot_is_a_png(nb03) -> None:
    plot_cells = [c for c in nb03.cells if c.cell_type == "code" and c.source.strip().endswith(".plot()")]
    assert len(plot_cells) == 4
    for cell in plot_cells:
        (png,) = pngs(cell)
        assert len(png) > 1000


def test_03_results_are_measured(nb03) -> None:
    matmul = html(cell_with(nb03, "exercises.matmul_cpu_vs_gpu("))
    assert re.search(r"wins from n=\d+ on|faster at every size tried|No crossover in this range", matmul)
    norms = html(cell_with(nb03, "exercises.norm_logging("))
    assert "made the host wait 1000 times, the on-device version 1" in norms
    summary = text(nb03.cells[-1])
    assert "'host syncs (per step, on device)': [1000, 1]" in summary
    speedup = float(re.search(r"'two-GPU speed-up': ([0-9.]+)", summary).group(1))
    assert speedup > 0


def test_03_a_modeled_t4_teaches_the_chapters_three_lessons(nb03) -> None:
    # The crossover: the CPU wins small products, the T4 large ones.
    matmul = html(cell_with(nb03, "exercises.matmul_cpu_vs_gpu("))
    crossover = int(re.search(r"wins from n=(\d+) on \(crossover\)", matmul).group(1))
    assert 64 <= crossover <= 2048
    assert "launch-bound" in matmul and "compute-bound" in matmul
    # A host sync per step costs at least twice keeping the log on the device.
    norms = html(cell_with(nb03, "exercises.norm_logging("))
    ratio = float(re.search(r"keeping the log on the device was ([0-9.]+)x faster", norms).group(1))
    assert ratio >= 2.0, norms
    # Two GPUs, two queues, whatever this machine's cores.
    summary = text(nb03.cells[-1])
    assert float(re.search(r"'two-GPU speed-up': ([0-9.]+)", summary).group(1)) >= 1.8
    explained = html(cell_with(nb03, "devlab.simulated.explain(lambda: x @ x)"))
    assert "aten::matmul" in explained and "compute-bound" in explained
    assert "Modeled from NVIDIA T4 (16 GB, PCIe) specifications, not measured." in explained


# --- 04 ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nb04() -> nbformat.NotebookNode:
    return run_notebook("04-multi-device.ipynb", timeout=120)


def test_04_splits_one_gpu_into_two_logical_gpus(nb04) -> None:
    assert all(not errors(c) for c in nb04.cells if c.cell_type == "code")
    assert "simulated=True" in text(cell_with(nb04, "simulate_gpus(1)"))
    assert text(cell_with(nb04, "Create 2 virtual GPUs")).strip() == "1 Physical GPU, 2 Logical GPUs"
    listed = text(cell_with(nb04, "for d in devlab.config.list_logical_devices"))
    assert "/device:GPU:0 -> cuda:0 (1024 MB)" in listed
    assert "/device:GPU:1 -> cuda:1 (1024 MB)" in listed
    table = html(cell_with(nb04, "%devices"))
    assert table.count("simulated") >= 2 and GPU1 in table
    refused = text(cell_with(nb04, "set_logical_device_configuration(gpus[0], None)"))
    assert "Virtual devices cannot be modified after being initialized" in refused


def test_04_manual_replication_shows_the_copies_to_the_cpu(nb04) -> None:
    cell = cell_with(nb04, "%%placement_log")
    out = text(cell)
    assert "[[ 44.,  56.]," in out and "[ 98., 128.]]" in out  # the guide's tf.add_n result
    log = html(cell)
    for gpu in (GPU0, GPU1):
        assert f"Executing op aten::mm in device {gpu}" in log
        assert f"Copy 16 B from {gpu} to {CPU0} (aten::_to_copy)" in log
        assert f"Host sync: the host waited for {gpu}" in log
    assert f"Executing op aten::sum in device {CPU0}" in log
    assert "2 copies between devices (32 B)" in log and "2 host syncs" in log
    assert "devlab-copy" in log  # copies are highlighted


def test_04_mixing_devices_fails_with_pytorchs_words(nb04) -> None:
    out = text(cell_with(nb04, "print(c[0] + c[1])"))
    assert "Expected all tensors to be on the same device, but found at least two devices, " \
           "cuda:0 and cuda:1!" in out


def test_04_model_parallel_trains_across_two_gpus_as_on_the_host(nb04) -> None:
    out = text(cell_with(nb04, "def train_split("))
    assert "(same as on the host: True)" in out
    assert ("layer 1: weights on cuda:0, gradients on cuda:0, Adam state on cuda:0" in out)
    assert ("layer 2: weights on cuda:1, gradients on cuda:1, Adam state on cuda:1" in out)


def test_04_model_replicas_agree_with_the_host_model(nb04) -> None:
    out = text(cell_with(nb04, "replicas = ["))
    assert "same as the model on the host: True" in out
    assert "(CPU:0 " in out and "GPU:0 " in out and "GPU:1 " in out
    assert "4 copies between devices" in out and "2 host syncs" in out


def test_04_ddp_trains_on_two_ranks_to_the_weights_of_one_process(nb04) -> None:
    cell = cell_with(nb04, "loss.backward()  # DDP all-reduces the gradients here")
    assert not errors(cell)
    out = text(cell)
    for rank in (0, 1):
        assert re.search(rf"\[rank{rank}\] loss on my half of the last batch: [0-9.]+ "
                         rf"\(computed on cuda:{rank}\)", out), out
        assert f"[rank{rank}] devlab: simulated GPUs have no NCCL" in out
    compared = text(cell_with(nb04, "rank_weights = _"))
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        assert f"{name}: rank 0's on cuda:0, rank 1's on cuda:1, equal: True" in compared
    assert "same as one process on the whole batches: True" in compared


def test_04_the_placement_log_of_one_ddp_step_shows_where_the_gradients_travel(nb04) -> None:
    cell = cell_with(nb04, "%%distributed -n 2 --log")
    assert not errors(cell)
    log = html(cell)
    # 4x16 + 16 + 16x1 + 1 float32 parameters: 388 bytes, broadcast at the start and the
    # gradients all-reduced once, each rank on its own GPU
    for gpu in (GPU0, GPU1):
        assert f"Broadcast 388 B on {gpu} (c10d::broadcast_)" in log
        assert f"All-reduce 388 B on {gpu} (c10d::allreduce_)" in log
        assert f"Executing op aten::addmm in device {gpu}" in log
    assert log.index("<b>rank 0</b>") < log.index("<b>rank 1</b>")
    assert "devlab-collective" in log
