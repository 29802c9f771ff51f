"""devlab.widgets: MemoryMonitor and TimingChart, in-process and in real kernels with
ipywidgets 8 (installed) and 7.7 (Colab's; installed into a folder under .venv/)."""

from __future__ import annotations

import base64
import threading
import time

import nbformat
import pytest
import torch
from nbutil import execute, ipywidgets7_env

from devlab.core.memory_watch import MemoryReading
from devlab.fronts.lab.widgets import MemoryMonitor, TimingChart

MiB = 1024 * 1024


class Reader:
    def __init__(self, label: str = "GPU:0", limit: int | None = 256 * MiB) -> None:
        self.label = label
        self.used = 0
        self.limit = limit

    def read(self) -> MemoryReading:
        return MemoryReading(time.perf_counter(), self.used, None, self.limit, self.label)


def _png(output_widget) -> bytes:
    (out,) = output_widget.outputs
    return base64.b64decode(out["data"]["image/png"])


def test_memory_monitor_draws_from_the_sampler_thread_and_summarizes():
    reader = Reader()
    mon = MemoryMonitor([reader], interval=0.01, redraw_interval=0.05)
    threads = []
    redraw = mon.redraw

    def spy():
        threads.append(threading.current_thread().name)
        redraw()

    mon.redraw = spy
    mon.start()
    for _ in range(10):
        reader.used += 16 * MiB
        time.sleep(0.03)
    summary = mon.stop()
    assert "devlab-memory-sampler" in threads
    assert threads[-1] == threading.current_thread().name  # the last frame, after the join
    assert _png(mon._chart).startswith(b"\x89PNG")
    assert summary["GPU:0"].peak == 160 * MiB
    assert "peak 160.0 MiB" in mon._summary.value
    assert "stopped" in mon._status.value and "160.0 MiB of 256.0 MiB" in mon._status.value
    assert repr(mon) == "MemoryMonitor(GPU:0)"


def test_redraws_are_throttled(monkeypatch):
    # The throttle's arithmetic on a fake clock, not the machine's speed (the sampler's achieved
    # rate with a drawing widget is benchmarks/memory_sampler.py's).
    mon = MemoryMonitor([Reader()], interval=0.005, redraw_interval=0.2)
    clock = [1000.0]
    draws: list[float] = []

    def draw(cost: float) -> None:
        draws.append(clock[0])
        clock[0] += cost  # the frame takes this long on the fake clock

    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    mon._last_draw = clock[0]
    mon.redraw = lambda: draw(0.0)
    for _ in range(140):  # 0.7 s of samples every 5 ms
        clock[0] += 0.005
        mon._on_sample(mon.sampler)
    assert len(draws) == 3  # every 0.2 s, not at each of the 140 samples
    # Frames that cost 20 ms each: once the running average of the cost has settled, drawing
    # takes at most ~2% of the time (a frame per second here), however slow the machine.
    draws.clear()
    mon.redraw = lambda: draw(0.020)
    for _ in range(4000):  # 20 s
        clock[0] += 0.005
        mon._on_sample(mon.sampler)
    settled = [d for d in draws if d > draws[0] + 10]
    assert len(settled) >= 5
    assert all(b - a >= 0.99 for a, b in zip(settled, settled[1:], strict=False))  # 20 ms a second
    mon.sampler.stopped_at = clock[0]  # the last frame is always drawn
    n = len(draws)
    mon._on_sample(mon.sampler)
    assert len(draws) == n + 1


def test_context_manager_stops_on_error_and_summary_can_be_left_out():
    mon = MemoryMonitor([Reader()], show_summary=False)
    with pytest.raises(KeyError), mon:
        raise KeyError("in the cell")
    assert not mon.sampler.running
    assert mon._summary.value == ""
    assert mon.summary.devices[0].label == "GPU:0"


def test_memory_monitor_shows_what_a_simulated_gpu_without_growth_reserves():
    import devlab

    devlab.config.simulate_gpus(1, memory_limit=64)
    (gpu,) = devlab.config.list_physical_devices("GPU")
    devlab.config.set_memory_growth(gpu, False)
    mon = MemoryMonitor(["/GPU:0"], interval=0.01, redraw_interval=0.05)
    mon.start()
    x = torch.ones(4 * MiB, device="cuda:0")  # 16 MiB
    time.sleep(0.05)
    summary = mon.stop()
    lines = {line.get_label(): line for line in mon.chart.ax.get_lines()}
    used, reserved = lines["GPU:0 (simulated)"], lines["GPU:0 (simulated) reserved"]
    assert reserved.get_linestyle() == ":" and used.get_linestyle() == "-"
    # MiB: nothing before the GPU's first use, then nine tenths of its 64 MiB, in one 2 MiB-
    # rounded segment of CUDA's caching allocator, as devlab reserves it on a real GPU.
    ys = reserved.get_ydata()
    assert ys[-1] == 58 and set(ys) <= {0, 58}
    assert used.get_ydata()[-1] == 16
    assert summary["GPU:0 (simulated)"].reserved_end == 58 * MiB
    assert "(reserved 58.0 MiB)" in mon._summary.value
    del x


def test_bad_device_fails_before_showing_anything():
    with pytest.raises((ValueError, RuntimeError)):
        MemoryMonitor(["/GPU:7"])


def test_timing_chart_run_fills_progress_chart_and_table():
    x = torch.ones(1000)
    chart = TimingChart.run(lambda: x * 2, ["cpu", "/CPU:0"], display=False, min_time=0.02)
    assert chart._progress.value == chart._progress.max == 200
    assert chart._label.value == "done: 2 devices"
    assert _png(chart._chart).startswith(b"\x89PNG")
    assert chart._table.value.count("<tr>") == 3 and "speed-up vs CPU:0" in chart._table.value
    assert len(chart.comparison.results) == 2


def test_timing_chart_fed_by_hand():
    chart = TimingChart(3, show_table=False)
    chart.starting("/GPU:0")
    assert chart._label.value == "/GPU:0 (1/3)"
    chart.progress(0.5)
    assert chart._progress.value == 50
    chart.stopped("stopped on /GPU:0: RuntimeError")
    assert chart._label.value.startswith("stopped")
    with pytest.raises(TypeError):
        TimingChart.run(lambda: None, display=False)


# -- in real kernels ---------------------------------------------------------------------------

KERNEL_CODE = """
import time, ipywidgets, torch
from devlab.widgets import MemoryMonitor, TimingChart
print("ipywidgets", ipywidgets.__version__)
mon = MemoryMonitor(["cpu"], interval=0.02, redraw_interval=0.1)
with mon:
    xs = [torch.ones(1_000_000) for _ in range(32)]
    time.sleep(0.6)
print("draws", mon.draws)
chart = TimingChart.run(lambda: torch.ones(100) * 2, ["cpu", "/CPU:0"], min_time=0.02)
import gc
from ipywidgets.widgets import widget
gc.collect()
print("live widgets", len(getattr(widget, "_instances", None) or widget.Widget.widgets))  # 8 or 7
"""


def run_widget_cells(*sources: str, env: dict[str, str] | None = None):
    """Execute cells in a fresh kernel; return the cells and the saved widget state."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    execute(nb, timeout=120, env=env)
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    return nb.cells, state


def models(state: dict, name: str) -> list[dict]:
    return [m["state"] for m in state.values() if m["model_name"] == name]


def _check_kernel_widgets(cells, state, major: str) -> None:
    out = "".join(o.get("text", "") for o in cells[0].outputs)
    assert f"ipywidgets {major}." in out
    draws = int(out.split("draws")[1].split()[0])
    assert draws >= 3
    # The frames drawn from the sampler thread reached the notebook as widget state.
    pngs = [o for m in models(state, "OutputModel") for o in m["outputs"]
            if "image/png" in o.get("data", {})]
    assert len(pngs) == 2  # the memory chart and the timing chart
    html = " ".join(m["value"] for m in models(state, "HTMLModel"))
    assert "peak" in html and "still held" in html
    assert "speed-up vs CPU:0" in html
    (progress,) = models(state, "IntProgressModel")
    assert progress["value"] == progress["max"] == 200
    # Once finished, each widget gave way to its final state as plain output, and no widget
    # model is left in the kernel.
    shown = [o.get("data", {}) for o in cells[0].outputs if o.output_type == "display_data"]
    assert shown and not any("application/vnd.jupyter.widget-view+json" in d for d in shown)
    final = " ".join(d.get("text/html", "") for d in shown)
    assert final.count('<img src="data:image/png;base64,') == 2
    assert "peak" in final and "speed-up vs CPU:0" in final and "value='200' max='200'" in final
    assert "live widgets 0" in out


@pytest.mark.notebook
def test_widgets_in_a_kernel_with_ipywidgets_8():
    cells, state = run_widget_cells(KERNEL_CODE)
    _check_kernel_widgets(cells, state, "8")


@pytest.mark.notebook
def test_widgets_in_a_kernel_with_ipywidgets_7():
    cells, state = run_widget_cells(KERNEL_CODE, env=ipywidgets7_env())
    _check_kernel_widgets(cells, state, "7")
