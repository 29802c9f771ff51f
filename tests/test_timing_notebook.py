"""What a teacher sees of timing in a real kernel: work timed where it runs, no queue left
behind, modeled times without a spread, claims only from steady measurements, and the device
messages around them."""

from __future__ import annotations

import re

import pytest
from nbutil import errors, html, run_cells, text

# One worker runs this module: its tests share one expensive module fixture, which
# each worker would otherwise build again.
pytestmark = [pytest.mark.notebook, pytest.mark.xdist_group("test_timing_notebook")]

CELLS = {
    "load": "%load_ext devlab",
    # On a machine without a GPU: what to do about /GPU:1.
    "no_gpu": "%%device /GPU:1\nx = torch.ones(3)",
    "simulate": "import devlab, torch\n"
                "devlab.config.simulate_gpus(2, model=\"T4\")",
    # The cell: x lives on GPU 1, the timing names GPU 0.
    "elsewhere": "x = torch.rand(1000, 1000, device=\"cuda:1\")\n"
                 "devlab.time_on_device(lambda: x @ x, \"/GPU:0\")",
    "no_backlog": "before = devlab.simulated.modeled_time()\n"
                  "torch.cuda.synchronize(1)\n"
                  "left = devlab.simulated.modeled_time() - before\n"
                  "print(f\"GPU 1 had {left * 1e6:.0f} µs of work left (modeled)\")",
    "right_device": "devlab.time_on_device(lambda: x @ x, \"/GPU:1\")",
    "host_x": "h = torch.rand(500, 500)  # made on the host",
    "compare_host_x": "%%compare_devices /CPU:0 /GPU:0\ny = h @ h",
    "compare_setup": "%%compare_devices /CPU:0 /GPU:0 --setup \"h = torch.rand(500, 500)\" -o\n"
                     "y = h @ h",
    "both_gpus": "y0 = torch.rand(1000, 1000, device=\"cuda:0\")\n"
                 "devlab.time_on_device(lambda: (y0 @ y0, x @ x), \"/GPU:0\")",
    "matmul": "from devlab import exercises\n"
              "matmul = exercises.matmul_cpu_vs_gpu(sizes=(16, 64, 256), min_time=0.05)\n"
              "matmul",
    "matmul_plot": "matmul.plot()",
}


@pytest.fixture(scope="module")
def cells() -> dict:
    return dict(zip(CELLS, run_cells(*CELLS.values(), timeout=300), strict=True))


def test_an_unknown_gpu_suggests_soft_placement_and_simulated_gpus(cells) -> None:
    shown = text(cells["no_gpu"])
    assert shown.startswith("UsageError: /job:localhost/replica:0/task:0/device:GPU:1 unknown "
                            "device.")
    assert "devlab.config.set_soft_device_placement(True), or %%device --soft" in shown
    assert "Or simulate GPUs on the CPU: devlab.config.simulate_gpus(2), before placing any " \
           "work." in shown
    assert not errors(cells["simulate"])  # and what it suggests then works


def test_work_timed_on_the_wrong_gpu_is_refused_and_leaves_nothing_queued(cells) -> None:
    (err,) = errors(cells["elsewhere"])
    assert err.ename == "DeviceMismatch"
    assert err.evalue.startswith("The timed work ran on GPU:1 (cuda:1), not on GPU:0 (cuda:0)")
    assert "Time it on '/GPU:1'" in err.evalue
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err.traceback))
    assert 'devlab.time_on_device(lambda: x @ x, "/GPU:0")' in shown
    assert "timing.py" not in shown  # the traceback ends at the teacher's line
    # Nothing was left queued on GPU 1: waiting for it costs no modeled work (before, the
    # next synchronize(1) took 1.4 s). The host's modeled time still passes at the wall
    # clock's pace between the cell's lines (tests/test_host_clock.py), microseconds here.
    left = re.fullmatch(r"GPU 1 had (\d+) µs of work left \(modeled\)\n", text(cells["no_backlog"]))
    assert left and int(left[1]) < 50_000, text(cells["no_backlog"])
    assert text(cells["right_device"]).startswith("GPU:1 (modeled T4): ")


def test_modeled_times_show_no_spread(cells) -> None:
    shown = text(cells["right_device"])
    assert re.fullmatch(r"GPU:1 \(modeled T4\): [0-9.]+ µs per call, \d+ x \d+ calls \[modeled "
                        r"from NVIDIA T4 \(16 GB, PCIe\) specifications, not measured: the same "
                        r"every run\]", shown.strip()), shown
    page = html(cells["compare_setup"]) + text(cells["compare_setup"])
    modeled = [line for line in text(cells["compare_setup"]).splitlines()
               if line.startswith("GPU:0 (modeled T4): ")]
    assert modeled and not any("IQR" in line for line in modeled), modeled
    assert "e-1" not in page and "e-2" not in page  # no float dust shown as a spread


def test_compare_devices_refuses_a_cell_whose_tensors_live_elsewhere(cells) -> None:
    shown = text(cells["compare_host_x"])
    assert shown.count("UsageError") == 1 and "Traceback" not in shown
    assert "The timed work ran on CPU:0 (cpu), not on GPU:0 (cuda:0)" in shown
    assert "Tensors made in --setup or in the cell itself are made on each device in turn." \
        in shown
    ok = text(cells["compare_setup"])
    assert not errors(cells["compare_setup"])
    assert re.search(r"GPU:0 \(modeled T4\): .* per call, .*x vs CPU:0", ok), ok


def test_work_on_two_gpus_is_labelled_with_both(cells) -> None:
    shown = text(cells["both_gpus"])
    assert shown.startswith("GPU:0 + GPU:1 (modeled T4): "), shown


def test_the_matmul_exercise_states_only_what_its_measurements_support(cells) -> None:
    cell = cells["matmul"]
    assert not errors(cell)
    page = html(cell)
    rows = re.findall(r"<tr><td[^>]*>(\d+)</td>(.*?)</tr>", page)
    assert [n for n, _ in rows] == ["16", "64", "256"]
    calls = [re.findall(r">([^<]*)</td>", row)[-2] for _, row in rows]  # the "faster" column
    assert set(calls) <= {"CPU:0", "GPU:0", "too noisy to call"}
    said = text(cell)
    if "No crossover can be called" in said:
        noisy = re.search(r"at n=(\d+) the measurements were too noisy", said)[1]
        assert calls[[n for n, _ in rows].index(noisy)] == "too noisy to call"
        assert "Run it again on a quieter machine, or with more time per size" in said
    else:
        # A crossover is the first of the sizes the GPU wins through to the largest, the
        # size below it (if any) one the CPU won, and every one of them called.
        crossover = re.search(r"wins from n=(\d+) on \(crossover\)|faster at every size tried "
                              r"\(crossover at n=(\d+)", said)
        assert crossover, said
        n = crossover[1] or crossover[2]
        at = [r for r, _ in rows].index(n)
        assert calls[at:] == ["GPU:0"] * (len(rows) - at)
        assert at == 0 or calls[at - 1] == "CPU:0"
    assert "Each time is the fastest block" in said
    assert "launch-bound" in said  # the modeled side, whatever the load


def test_the_matmul_plot_is_drawn(cells) -> None:
    (png,) = [o.data["image/png"] for o in cells["matmul_plot"].outputs
              if "image/png" in o.get("data", {})]
    assert len(png) > 1000


SPLIT = {
    "split": "import devlab\n"
             "devlab.config.simulate_gpus(1)\n"
             "gpu, = devlab.config.list_physical_devices(\"GPU\")\n"
             "devlab.config.set_logical_device_configuration(\n"
             "    gpu, [devlab.config.LogicalDeviceConfiguration(memory_limit=1024)] * 2)\n"
             "%load_ext devlab",
    "devices": "%devices",
}


def test_the_devices_footer_counts_physical_and_logical_gpus() -> None:
    split, devices = run_cells(*SPLIT.values(), timeout=120)
    assert not errors(split)
    footer = text(devices).strip().splitlines()[-1]
    assert footer.startswith("1 simulated GPU (CPU-backed")
    assert footer.endswith("1 Physical GPU, 2 Logical GPUs: /physical_device:GPU:0 is split into "
                           "/device:GPU:0 and /device:GPU:1.")
    assert "1 Physical GPU, 2 Logical GPUs" in html(devices)
