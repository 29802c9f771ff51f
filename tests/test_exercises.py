"""devlab.exercises run small, on the CPU and on simulated GPUs, asserting what they measured."""

from __future__ import annotations

import io
import json

import pytest
import torch
from matplotlib.figure import Figure

import devlab
from devlab.fronts.lab import exercises
from devlab.fronts.lab.exercises import scaling
from devlab.fronts.lab.exercises._common import Progress

FAST = {"min_time": 0.0, "repeats": 1, "warmup": 1}


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _drawn_artists(fig: Figure) -> int:
    return sum(len(ax.lines) + len(ax.patches) for ax in fig.axes)


# --- 1. matrix product CPU vs GPU ------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu", "gpu", "expected"),
    [
        ([1, 2, 3, 4], [2, 3, 1, 1], 32),  # the GPU wins from the third size on
        ([1, 2, 3, 4], [0.5, 3, 1, 1], 32),  # an early win that does not last is no crossover
        ([1, 2, 3, 4], [0.5, 1, 1, 1], 8),  # wins everywhere: the smallest size
        ([1, 2, 3, 4], [2, 3, 4, 5], None),  # never wins
        ([1, 2, 3, 4], [0.5, 1, 1, 5], None),  # loses at the largest size: no crossover
    ],
)
def test_crossover_is_where_the_gpu_starts_winning_for_good(cpu, gpu, expected) -> None:
    assert exercises.crossover_size([8, 16, 32, 64], cpu, gpu) == expected


US, MS = 1e-6, 1e-3
CPU, GPU = "cpu", "gpu"


@pytest.mark.parametrize(
    ("cpu", "cpu_steady", "gpu", "expected"),
    [
        # Steady on both sides: each size goes to the faster one.
        ([2, 3, 10, 50], [True] * 4, [5, 5, 5, 5], [CPU, CPU, GPU, GPU]),
        # The table: 32 ms for n=32 on a busy CPU. Unsteady, so no call there.
        ([2, 32000, 10, 50], [True, False, True, True], [5, 5, 5, 5], [CPU, None, GPU, GPU]),
        # Unsteady at the largest size, but a steady smaller product already took longer
        # than the GPU's time there: a larger product never takes less.
        ([2, 3, 900, 40000], [True, True, True, False], [5, 5, 5, 500], [CPU, CPU, GPU, GPU]),
        # The CPU's fastest block beats the GPU: certain, steady or not (load only adds time).
        ([2, 3, 10, 50], [False] * 4, [5, 5, 5, 5], [CPU, CPU, None, None]),
    ],
)
def test_which_device_is_faster_is_called_only_where_steady_times_make_it_certain(
        cpu, cpu_steady, gpu, expected) -> None:
    from devlab.fronts.lab.exercises import matmul

    cpu = [t * US for t in cpu]
    gpu = [t * US for t in gpu]
    assert matmul.faster(cpu, gpu, cpu_steady, [True] * 4) == expected
    # A measured GPU whose time is unsteady cannot be beaten for certain either.
    assert matmul.faster([1 * US], [5 * US], [True], [False]) == [None]


@pytest.mark.parametrize(
    ("winners", "expected"),
    [
        ([CPU, CPU, GPU, GPU], (32, None)),
        ([GPU, GPU, GPU, GPU], (8, None)),
        ([CPU, GPU, CPU, CPU], (None, None)),  # loses the largest: no crossover
        ([CPU, None, GPU, GPU], (None, 16)),  # the size below the GPU's wins decides it
        ([None, CPU, CPU, GPU], (64, None)),  # noise below the crossover does not matter
        ([CPU, CPU, GPU, None], (None, 64)),
    ],
)
def test_a_crossover_is_called_only_when_every_size_deciding_it_was_called(winners, expected):
    from devlab.fronts.lab.exercises import matmul

    assert matmul.called_crossover([8, 16, 32, 64], winners) == expected


def test_a_smaller_product_slower_than_a_larger_one_is_unsteady() -> None:
    from devlab.core.timing import TimingResult
    from devlab.fronts.lab.exercises import matmul

    def result(times):
        return TimingResult("CPU:0", "cpu", [t * US for t in times], 1, 1, "none")

    results = [result([2, 2, 2]), result([900, 900, 950]), result([10, 10, 11]),
               result([50, 200, 200])]
    # n=16 steady in itself but slower than n=32 (a waiting machine); n=64 not steady.
    assert matmul.unsteady([8, 16, 32, 64], results) == [16, 64]


class FixedTimes:
    """Stands in for the exercise's clock: each (device type, n) gives the next measurement
    from a fixed table, as blocks of seconds per call (the last one again when it runs out)."""

    def __init__(self, table: dict[tuple[str, int], list[list[float]]]) -> None:
        self.table = table
        self.calls: dict[tuple[str, int], int] = {}

    def __call__(self, a: torch.Tensor, device: torch.device, timing: dict) -> object:
        from devlab.core.timing import TimingResult

        key = (device.type, a.shape[0])
        k = self.calls[key] = self.calls.get(key, 0) + 1
        blocks = self.table[key][min(k, len(self.table[key])) - 1]
        return TimingResult(device.type, str(device), [t * US for t in blocks], 1, 1, "none")


STEADY_GPU = {("cuda", n): [[5, 5, 5]] for n in (16, 32, 64, 128)}


def test_a_size_too_noisy_to_call_is_measured_again_then_named_not_claimed(monkeypatch) -> None:
    from devlab.fronts.lab.exercises import matmul

    devlab.config.simulate_gpus(1)
    # The busy machine: n=32 took 32 ms a product on the CPU, every time it was tried.
    clock = FixedTimes({("cpu", 16): [[2, 2, 2]], ("cpu", 32): [[32000, 60000, 70000]],
                        ("cpu", 64): [[10, 10, 10]], ("cpu", 128): [[50, 50, 51]],
                        **STEADY_GPU})
    monkeypatch.setattr(matmul, "_time_product", clock)
    r = exercises.matmul_cpu_vs_gpu(sizes=(16, 32, 64, 128), **FAST)
    d = r.data
    threads = len({torch.get_num_threads(), 1})  # the CPU is timed with its threads and with 1
    assert clock.calls[("cpu", 32)] == threads * (1 + exercises.RETRIES)
    assert clock.calls[("cpu", 16)] == threads and clock.calls[("cuda", 32)] == 1
    assert d["crossover"] is None and d["too_noisy"] == [32]
    assert d["faster"] == ["CPU:0", None, "GPU:0", "GPU:0"]
    assert d["cpu_steady"] == [True, False, True, True]
    shown = str(r)
    assert d["verdict"] == (
        "No crossover can be called: at n=32 the measurements were too noisy to say which "
        "device is faster. GPU:0 (simulated) was faster from n=64 on; below that the "
        "measurements cannot say where it starts to win. Run it again on a quieter machine, "
        "or with more time per size (min_time=0.5).")
    assert "32 ms (noisy)" in shown and "too noisy to call" in shown
    assert "Still noisy after 2 more tries: CPU:0 at n=32" in shown
    assert "crossover)" not in shown and "wins from" not in shown


def test_a_noisy_size_that_settles_when_measured_again_keeps_the_claim(monkeypatch) -> None:
    from devlab.fronts.lab.exercises import matmul

    devlab.config.simulate_gpus(1)
    clock = FixedTimes({("cpu", 16): [[2, 2, 2]], ("cpu", 32): [[32000, 60000, 70000], [3, 3, 3]],
                        ("cpu", 64): [[10, 10, 10]], ("cpu", 128): [[50, 50, 51]],
                        **STEADY_GPU})
    monkeypatch.setattr(matmul, "_time_product", clock)
    threads = torch.get_num_threads()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # one measurement per try
    try:
        r = exercises.matmul_cpu_vs_gpu(sizes=(16, 32, 64, 128), **FAST)
    finally:  # the exercise put back the 1 it was told of: this process's tests keep theirs
        torch.set_num_threads(threads)
    assert r.data["attempts"][0] == [1, 2, 1, 1]
    assert r.data["cpu"][1] == pytest.approx(3 * US)
    assert r.data["crossover"] == 64 and r.data["too_noisy"] == []
    assert r.data["verdict"] == "GPU:0 (simulated) wins from n=64 on (crossover)."
    assert "noisy" not in str(r)


def test_the_cpu_counts_at_its_faster_thread_count(monkeypatch) -> None:
    from devlab.fronts.lab.exercises import matmul

    devlab.config.simulate_gpus(1)
    seen = []

    def clock(a, device, timing):
        from devlab.core.timing import TimingResult

        threads = torch.get_num_threads()
        seen.append((device.type, a.shape[0], threads))
        # Two threads help the large product and hurt the small one.
        us = {(16, 1): 2, (16, 2): 4, (256, 1): 800, (256, 2): 450}.get((a.shape[0], threads), 5)
        return TimingResult("x", str(device), [us * US] * 3, 1, 1, "none")

    monkeypatch.setattr(matmul, "_time_product", clock)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        r = exercises.matmul_cpu_vs_gpu(sizes=(16, 256), **FAST)
    finally:
        torch.set_num_threads(before)
    assert r.data["cpu_threads"] == [1, 2]
    assert r.data["cpu"] == pytest.approx([2 * US, 450 * US])
    assert [s for s in seen if s[0] == "cpu"] == [("cpu", 16, 2), ("cpu", 16, 1),
                                                  ("cpu", 256, 2), ("cpu", 256, 1)]
    assert "threads" in r.headers


def test_matmul_times_every_size_on_the_cpu_and_a_simulated_gpu() -> None:
    devlab.config.simulate_gpus(2)
    r = exercises.matmul_cpu_vs_gpu(sizes=(32, 8, 16), **FAST)
    d = r.data
    assert d["sizes"] == [8, 16, 32]
    assert len(d["cpu"]) == len(d["gpu"]) == 3
    assert all(t > 0 for t in d["cpu"] + d["gpu"])
    assert d["speedup"] == pytest.approx([c / g for c, g in zip(d["cpu"], d["gpu"], strict=True)])
    assert d["crossover"] == exercises.crossover_size(d["sizes"], d["cpu"], d["gpu"])
    assert [dev["torch_device"] for dev in d["devices"]] == ["cpu", "cuda:0"]
    assert [dev["simulated"] for dev in d["devices"]] == [False, True]
    page = r._repr_html_()
    assert "CPU:0" in page and "GPU:0" in page
    assert "CPU-backed" in page and "say nothing about a real GPU" in page
    assert page.count("<tr>") == 1 + 3  # header and one row per size
    if d["crossover"] is None:
        assert "No crossover in this range" in d["verdict"]
    else:
        assert f"n={d['crossover']}" in d["verdict"]
    json.dumps(d)  # plain Python


def test_the_matmul_plot_names_the_devices_as_the_table_does() -> None:
    devlab.config.simulate_gpus(1, model="T4")
    r = exercises.matmul_cpu_vs_gpu(sizes=(8, 16), **FAST)
    legend = [t.get_text() for t in r.plot().axes[0].get_legend().get_texts()]
    assert legend[:2] == ["CPU:0", "GPU:0 (modeled T4)"]
    assert "GPU:0 (modeled T4) time" in r.headers
    assert not any("simulated" in t for t in legend)


def test_matmul_takes_tensorflow_names_for_the_gpu() -> None:
    devlab.config.simulate_gpus(2)
    r = exercises.matmul_cpu_vs_gpu(sizes=(8,), device="/device:GPU:1", **FAST)
    assert r.data["devices"][1]["torch_device"] == "cuda:1"
    assert r.data["devices"][1]["name"] == "GPU:1"


def test_matmul_without_a_gpu_times_the_cpu_and_says_there_is_no_gpu() -> None:
    r = exercises.matmul_cpu_vs_gpu(sizes=(8, 16), **FAST)
    assert r.data["gpu"] is None and r.data["crossover"] is None
    assert len(r.data["cpu"]) == 2
    assert [dev["name"] for dev in r.data["devices"]] == ["CPU:0"]
    page = r._repr_html_()
    assert "No GPU to compare with" in page and "simulate_gpus(2)" in page
    assert "CPU-backed" not in page  # nothing simulated ran
    assert _drawn_artists(r.plot()) >= 1


def test_matmul_asked_for_the_cpu_only_says_so() -> None:
    devlab.config.simulate_gpus(1)
    r = exercises.matmul_cpu_vs_gpu(sizes=(8,), device="/CPU:0", **FAST)
    assert r.data["gpu"] is None
    assert "CPU:0 was asked for" in r.data["verdict"]


def test_matmul_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="sizes"):
        exercises.matmul_cpu_vs_gpu(sizes=(0, 4), **FAST)


# --- 2. parameters on the device ---------------------------------------------------------------


def _by_name(result: exercises.ParametersResult) -> dict[str, dict]:
    return {op["operation"]: op for op in result.data["operations"]}


def test_parameter_access_on_a_simulated_gpu_costs_what_a_gpu_would() -> None:
    devlab.config.simulate_gpus(1)
    inputs, hidden, outputs = 6, 5, 3
    r = exercises.parameters_on_device(inputs=inputs, hidden=hidden, outputs=outputs)
    ops = _by_name(r)
    state_bytes = 4 * (inputs * hidden + hidden + hidden * outputs + outputs)  # float32
    assert r.data["parameters"] == state_bytes // 4
    # References to the parameters: nothing moves.
    for name in ("state_dict()", "read .data", "write .data on device", "no_grad SGD update"):
        assert (ops[name]["copies"], ops[name]["syncs"]) == (0, 0), name
    # Every tensor of the state dict crosses once; to the host, the host waits for each.
    to_host = ops["state_dict to host"]
    assert (to_host["copies"], to_host["bytes"], to_host["syncs"]) == (4, state_bytes, 4)
    from_host = ops["load_state_dict from host"]
    assert (from_host["copies"], from_host["bytes"], from_host["syncs"]) == (4, state_bytes, 0)
    assert all("device:CPU:0 to /job:localhost/replica:0/task:0/device:GPU:0" in line
               for line in from_host["copy_lines"])
    write = ops["write .data from host"]
    assert (write["copies"], write["bytes"]) == (1, 4 * inputs * hidden)
    for name in (".item() of one weight", ".item() of a sum", "repr() / print"):
        assert (ops[name]["copies"], ops[name]["syncs"]) == (0, 1), name
    # The SGD update ran on the device, nowhere else.
    assert set(ops["no_grad SGD update"]["ops_per_device"]) == {
        "/job:localhost/replica:0/task:0/device:GPU:0"}
    page = r._repr_html_()
    assert "GPU:0" in page and "CPU-backed" in page
    assert page.count("<tr>") == 1 + len(ops)
    assert "Made the host wait for the device: " in page
    json.dumps(r.data)


def test_parameter_access_on_the_cpu_copies_nothing() -> None:
    r = exercises.parameters_on_device(device="/CPU:0", inputs=4, hidden=4, outputs=2)
    assert all(op["copies"] == 0 and op["syncs"] == 0 for op in r.data["operations"])
    assert r.data["device"]["name"] == "CPU:0"
    assert "already live in host memory" in r._repr_html_()


# --- 3. logging the norm -------------------------------------------------------------------------


@pytest.mark.parametrize("n", [7, 20])
def test_norm_logging_per_step_syncs_n_times_on_device_once(n: int) -> None:
    devlab.config.simulate_gpus(1)
    r = exercises.norm_logging(n=n, size=8, repeats=1, warmup=0)
    per, on = r.data["versions"]
    assert (per["syncs"], per["copies"]) == (n, 0)
    assert (on["syncs"], on["copies"], on["bytes"]) == (1, 1, 4 * n)  # n float32 norms, once
    assert per["time"] > 0 and on["time"] > 0
    assert per["time_per_step"] == pytest.approx(per["time"] / n)
    assert r.data["max_difference"] < 1e-4  # both logged the same norms
    page = r._repr_html_()
    assert "GPU:0" in page and "CPU-backed" in page
    assert f"wait {n} times" in page
    json.dumps(r.data)


def test_norm_logging_compares_times_only_when_they_are_steady(monkeypatch) -> None:
    import importlib

    from devlab.core.timing import TimingResult

    module = importlib.import_module("devlab.fronts.lab.exercises.norm_logging")  # not the function

    devlab.config.simulate_gpus(1)
    timed = []

    def busy(fn, device, **timing):  # every run waited for the machine: unsteady
        timed.append(fn.__name__)
        return TimingResult("GPU:0", str(device), [0.01, 0.03, 0.03], 1, 1, "x")

    monkeypatch.setattr(module, "time_on_device", busy)
    r = exercises.norm_logging(n=7, size=8, repeats=3, warmup=0)
    assert timed == ["per_step"] * (1 + exercises.RETRIES) + ["on_device"] * (1 + exercises.RETRIES)
    said = str(r)
    # The counts are what the placement log saw, whatever the load; the speed is not called.
    assert "The per-step version made the host wait 7 times, the on-device version 1; " \
           "which version is faster is too noisy to call: the per step and on device runs " \
           "spread over more than 1.5x their fastest even after 2 more tries" in said
    assert "x faster" not in said and "x slower" not in said
    assert [v["steady"] for v in r.data["versions"]] == [False, False]


def test_norm_logging_on_the_cpu_has_nothing_to_wait_for() -> None:
    r = exercises.norm_logging(n=5, size=4, repeats=1, warmup=0)
    per, on = r.data["versions"]
    assert per["syncs"] == on["syncs"] == 0
    assert "no device to wait for" in r._repr_html_()


# --- 4. two GPUs ---------------------------------------------------------------------------------


def test_two_gpu_scaling_without_two_gpus_says_how_to_simulate_them() -> None:
    with pytest.raises(exercises.NeedsTwoGPUs, match=r"has 0\..*simulate_gpus\(2\)"):
        exercises.two_gpu_scaling(size=8)
    devlab.config.simulate_gpus(1)
    with pytest.raises(exercises.NeedsTwoGPUs, match=r"has 1\."):
        exercises.two_gpu_scaling(size=8)


def test_two_gpu_scaling_on_simulated_gpus_reports_what_it_measured() -> None:
    devlab.config.simulate_gpus(2)
    r = exercises.two_gpu_scaling(size=64, repeats=2, min_time=0.0, warmup=1)
    d = r.data
    assert d["speedup"] == pytest.approx(d["sequential"] / d["parallel"])
    assert d["efficiency"] == pytest.approx(d["speedup"] / 2)
    assert [dev["torch_device"] for dev in d["devices"]] == ["cuda:0", "cuda:1"]
    assert isinstance(d["asynchronous_launch"], bool)
    assert d["asynchronous_launch"] == (d["launch_time"] < 0.5 * d["work_time"])
    assert any("CPU-backed" in line for line in d["explanation"])
    page = r._repr_html_()
    assert "GPU:0" in page and "GPU:1" in page and "(ideal 2x)" in page
    assert _drawn_artists(r.plot()) >= 3
    json.dumps(d)


def test_launch_check_sees_that_cpu_work_is_synchronous() -> None:
    a = torch.randn(256, 256)
    launch, work = scaling._launch_check(a, a, torch.device("cpu"))
    assert launch >= 0.5 * work  # the CPU returns only when the product is done


def test_launch_check_sees_that_a_simulated_gpu_launches_asynchronously() -> None:
    devlab.config.simulate_gpus(1)
    # Big enough that the product takes tens of milliseconds: a launch that waited for it
    # cannot pass for asynchronous, and one that did not cannot look synchronous on a busy
    # machine (with 384x384 the check failed about one run in three under load).
    a = torch.randn(1024, 1024, device="cuda:0")
    launch, work = scaling._launch_check(a, a, torch.device("cuda:0"))
    assert launch < 0.5 * work, (launch, work)


def test_scaling_explanation_says_why_there_is_no_speed_up() -> None:
    sync = " ".join(scaling._explain(1.0, asynchronous=False, simulated=True, cores=2, load=0.5))
    assert "no real speed-up" in sync and "cannot overlap" in sync and "CPU-backed" in sync
    shared = " ".join(scaling._explain(1.05, asynchronous=True, simulated=True, cores=2, load=3.0))
    assert "asynchronous" in shared and "2 CPU cores" in shared and "3.0" in shared
    real = " ".join(scaling._explain(1.9, asynchronous=True, simulated=False, cores=8, load=0.1))
    assert "same time" in real and "CPU-backed" not in real
    noisy = " ".join(scaling._explain(1.9, asynchronous=True, simulated=True, cores=2, load=3.0,
                                      steady=False))
    assert noisy.startswith("1.90x, but too noisy to call") and "same time" not in noisy
    assert "CPU-backed" in noisy


# --- shared behaviour --------------------------------------------------------------------------


def test_every_result_plots_a_figure() -> None:
    devlab.config.simulate_gpus(2)
    results = [
        exercises.matmul_cpu_vs_gpu(sizes=(8, 16), **FAST),
        exercises.parameters_on_device(inputs=4, hidden=4, outputs=2),
        exercises.norm_logging(n=3, size=4, repeats=1, warmup=0),
        exercises.two_gpu_scaling(size=16, repeats=1, min_time=0.0, warmup=0),
    ]
    for r in results:
        fig = r.plot()
        assert isinstance(fig, Figure)
        assert _drawn_artists(fig) >= 2, type(r).__name__
        assert _png(fig).startswith(b"\x89PNG")
        assert any("simulated GPUs: CPU-backed" in t.get_text() for t in fig.texts)


def test_a_busy_machine_is_called_out() -> None:
    from devlab._helpers.host import cpu_cores
    from devlab.fronts.lab.exercises._common import busy_note

    assert busy_note(None) is None
    assert busy_note(cpu_cores() * 0.5) is None
    note = busy_note(cpu_cores() + 1.5)
    assert note is not None and f"{cpu_cores() + 1.5:.1f} on {cpu_cores()} cores" in note


def test_progress_is_silent_outside_a_notebook(capsys: pytest.CaptureFixture[str]) -> None:
    exercises.norm_logging(n=3, size=4, repeats=1, warmup=0)
    bar = Progress(3, "x")
    bar.step("a")
    bar.finish()
    assert bar.widget is None
    assert capsys.readouterr() == ("", "")


def test_progress_bar_counts_steps_with_core_widgets() -> None:
    import ipywidgets

    bar = Progress(4, "work", show=True)
    assert isinstance(bar.widget, ipywidgets.HBox)
    bar.step("first")
    bar.step("second", n=2)
    progress, label = bar.widget.children
    assert isinstance(progress, ipywidgets.IntProgress)
    assert (progress.value, progress.max, label.value) == (3, 4, "second")
    bar.finish()
    assert (progress.value, progress.bar_style, label.value) == (4, "success", "done")
    with pytest.raises(KeyError), Progress(2, "fails", show=True) as failing:
        raise KeyError("x")
    assert failing.widget.children[0].bar_style == "danger"
