"""%%memwatch and %%compare_devices: in-process (IPython shell) and in a real kernel."""

from __future__ import annotations

import re
import threading

import nbformat
import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from nbutil import errors, execute, html, text

from devlab.core.timing import Comparison
from devlab.fronts.lab.magics.monitoring_magics import MonitoringMagics


@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance()
    shell.register_magics(MonitoringMagics)
    return shell


def _no_sampler_thread() -> bool:
    return not [t for t in threading.enumerate() if t.name == "devlab-memory-sampler"]


def test_help_lists_every_option(ip):
    doc = ip.find_cell_magic("memwatch").__doc__
    assert "%%memwatch [--device NAME] [--interval MS]" in doc
    for option in ("--device", "--interval", "MS", "summary", "--trace", "--save", "timeline"):
        assert option in doc
    doc = ip.find_cell_magic("compare_devices").__doc__
    assert "%%compare_devices" in doc
    for option in ("NAME", "--setup", "--warmup", "--min-time", "--repeats", "%timeit"):
        assert option in doc


def test_memwatch_runs_the_cell_in_the_user_namespace(ip, capsys):
    ip.user_ns["base"] = 20
    value = ip.run_cell_magic("memwatch", "--device cpu --interval 10",
                              "import torch\nbig = torch.ones(4_000_000)\nbase + 1")
    assert value == 21
    assert ip.user_ns["big"].numel() == 4_000_000
    out = capsys.readouterr().out
    assert "MemoryMonitor(CPU:0 (process RSS))" in out
    assert "peak" in out and "still held" in out
    assert _no_sampler_thread()


def test_memwatch_error_propagates_and_stops_the_sampler(ip, capsys):
    with pytest.raises(ZeroDivisionError):
        ip.run_cell_magic("memwatch", "--device cpu", "before = 1\n1 / 0")
    assert ip.user_ns["before"] == 1
    assert _no_sampler_thread()
    assert "peak" in capsys.readouterr().out  # the summary still shows


@pytest.mark.parametrize("line, message", [
    ("--interval 0", "--interval is the time between two readings in ms, from 1 "),
    ("--interval -5", "got -5."),
    # As the issue wrote it: --interval inf killed the sampler thread with OverflowError.
    ("--interval inf", "to 9,223,372,036,000 (the longest a thread can wait); got inf."),
    ("--interval nan", "got nan."),
    ("--interval 1e300", "got 1e+300."),
    ("--interval 0.5", "from 1 (faster only takes the CPU from the cell being watched)"),
    ("--device /GPU:9", "unknown device"),
    ("--device /foo:1", "Unknown attribute 'foo'"),
    ("--bogus", "unrecognized arguments"),
    ("--save out.pickle", "--save writes what --trace records: add --trace"),
    ("--trace --device cpu", "--trace records a GPU's allocations, and the watched devices "
                             "(CPU:0 (process RSS)) have none"),
])
def test_memwatch_bad_input_is_one_line_usage_error(ip, line, message):
    with pytest.raises(UsageError) as e:
        ip.run_cell_magic("memwatch", line, "pass")
    assert message in str(e.value)
    assert "\n" not in str(e.value).strip()
    assert _no_sampler_thread()


def test_compare_devices_returns_a_comparison_and_does_not_leak(ip, capsys):
    ip.user_ns.pop("y", None)
    result = ip.run_cell_magic(
        "compare_devices", "cpu /CPU:0 --setup \"import torch; x = torch.rand(64, 64)\" --min-time 0.02 -o",
        "import torch\ny = x @ x")
    assert isinstance(result, Comparison)
    assert [r.name for r in result.results] == ["cpu", "/CPU:0"]
    assert list(result.speedups) == ["CPU:0", "CPU:0 #2"]
    assert result.speedups["CPU:0"] == 1.0
    assert "y" not in ip.user_ns and "x" not in ip.user_ns
    assert "TimingChart(" in capsys.readouterr().out  # the chart was shown


def test_compare_devices_error_in_the_cell_restores_the_device(ip):
    before = torch.get_default_device()
    with pytest.raises(NameError):
        ip.run_cell_magic("compare_devices", "cpu", "undefined_name + 1")
    assert torch.get_default_device() == before


@pytest.mark.parametrize("line, message", [
    ("/GPU:5", "unknown device"),
    ("cpu --min-time -1", "^--min-time is the least time in seconds to measure for, from 0 to 3600 \\(an hour\\); got -1.0."),
    ("cpu --repeats 0", "^--repeats is the number of blocks of calls to measure at least"),
    ("cpu --warmup -2", "^--warmup is the number of untimed calls"),
    ("", "the following arguments are required"),
])
def test_compare_devices_bad_input(ip, line, message):
    with pytest.raises(UsageError, match=message):
        ip.run_cell_magic("compare_devices", line, "pass")


def test_compare_devices_setup_syntax_error_is_a_usage_error(ip):
    with pytest.raises(UsageError, match="SyntaxError in the setup"):
        ip.run_cell_magic("compare_devices", "cpu --setup 'x = ('", "pass")


def _live_widgets() -> int:
    from ipywidgets.widgets import widget

    return len(widget._instances)


def test_the_widget_registry_does_not_grow_across_cells(ip, capsys):
    # A count, not a time: each cell's widgets (chart, status, summary, progress, their
    # layouts and styles) are closed when it ends, errors included.
    ip.run_cell_magic("memwatch", "--device cpu", "pass")
    ip.run_cell_magic("compare_devices", "cpu --min-time 0 --warmup 0 --repeats 1", "1 + 1")
    before = _live_widgets()
    for _ in range(2):
        ip.run_cell_magic("memwatch", "--device cpu --interval 5", "x = [0] * 1000")
        with pytest.raises(ZeroDivisionError):
            ip.run_cell_magic("memwatch", "--device cpu", "1 / 0")
        ip.run_cell_magic("compare_devices", "cpu /CPU:0 --min-time 0 --warmup 0 --repeats 1",
                          "1 + 1")
        with pytest.raises(NameError):
            ip.run_cell_magic("compare_devices", "cpu", "undefined_name")
    assert _live_widgets() == before
    out = capsys.readouterr().out
    assert out.count("MemoryMonitor(CPU:0 (process RSS))") >= 4  # shown live, then final


# -- in a real kernel, with simulated GPUs -----------------------------------------------------

KERNEL_CELLS = {
    "setup": "import devlab, torch, threading\n"
             "devlab.config.simulate_gpus(1, memory_limit=256)\n"
             "from devlab.fronts.lab.magics.monitoring_magics import MonitoringMagics\n"
             "get_ipython().register_magics(MonitoringMagics)",
    "watch": "%%memwatch --interval 20\n"
             "import time\n"
             "xs = []\n"
             "for i in range(8):\n"
             "    xs.append(torch.ones(4, 1024, 1024, device='cuda:0'))  # 16 MiB each\n"
             "    time.sleep(0.05)\n"
             "del xs[4:]\n"
             "len(xs)",
    "over_limit": "%%memwatch --device /GPU:0 --device /CPU:0\n"
                  "huge = torch.ones(512, 1024, 1024, device='cuda:0')",
    # The machine's register publishes this process's GPU use while the simulation runs
    # (NVML's view); every other devlab thread belongs to a cell and ends with it.
    "alive": "print([t.name for t in threading.enumerate() if 'devlab' in t.name "
             "and t.name != 'devlab-gpu-register'], "
             "torch.get_default_device(), 'huge' in globals())",
    "bad_interval": "%%memwatch --interval 0\npass",
    "bad_device": "%%memwatch --device /GPU:3\npass",
    "compare": "%%compare_devices /CPU:0 /GPU:0 --setup \"a = torch.rand(256, 256)\" --min-time 0.1\n"
               "b = a @ a",
    # The issue's case: a cell that allocates 50 MiB after an earlier one reached 100 MiB.
    "free_xs": "del xs",
    "peak_big": "%%memwatch --interval 1000\nbig = torch.ones(25, 1024, 1024, device='cuda:0')\n"
                "del big",
    "user_peak": "users_peak = torch.cuda.max_memory_allocated(0)",
    "peak_small": "%%memwatch --interval 1000\nsmall = torch.ones(12800, 1024, device='cuda:0')\n"
                  "del small",
    "user_peak_after": "print(torch.cuda.max_memory_allocated(0) == users_peak, users_peak >> 20)",
    "interval_inf": "%%memwatch --interval inf\npass",
    # An allocation timeline of the cell: the lines are the cell's own.
    "trace": "%%memwatch --trace --save trace.pickle\n"
             "weights = torch.ones(4, 1024, 1024, device='cuda:0')  # 16 MiB\n"
             "for _ in range(3):\n"
             "    act = torch.ones(2, 1024, 1024, device='cuda:0')  # 8 MiB\n"
             "    del act\n"
             "del weights",
    "trace_read": "import pickle\nsnap = pickle.load(open('trace.pickle', 'rb'))\n"
                  "print(sorted(set(e['action'] for e in snap['device_traces'][0])), "
                  "torch.cuda.memory._snapshot()['device_traces'][0] == [])",
    "trace_cpu": "%%memwatch --trace --device /CPU:0\npass",
    # The figures devlab keeps for its next drawing of a size (at most _KEPT_MAX of them,
    # Note [Axes kept between drawings]) are not a cell's: every other one is.
    "widgets_left": "import gc\ngc.collect()\n"
                    "from ipywidgets.widgets.widget import _instances\n"
                    "from matplotlib.figure import Figure\n"
                    "from devlab._helpers import figures\n"
                    "kept = {id(ax.figure) for _, ax in figures._KEPT.values()}\n"
                    "print(len(_instances), sum(type(o) is Figure and id(o) not in kept\n"
                    "                           for o in gc.get_objects()),\n"
                    "      len(kept) <= figures._KEPT_MAX)",
}


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in KERNEL_CELLS.values()]
    # in a folder of its own: the trace cell saves trace.pickle where the kernel runs
    execute(nb, allow_errors=True, timeout=300, cwd=tmp_path_factory.mktemp("kernel"))
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    return dict(zip(KERNEL_CELLS, nb.cells, strict=True)), state


def _models(state, name):
    return [m["state"] for m in state.values() if m["model_name"] == name]


@pytest.mark.notebook
def test_kernel_memwatch_on_a_simulated_gpu(kernel):
    cells, state = kernel
    cell = cells["watch"]
    assert not errors(cell)
    # The live widget gave way to its final state as plain output: status, chart, summary.
    final = cell.outputs[0]["data"]
    assert "application/vnd.jupyter.widget-view+json" not in final
    assert "memory (stopped, every 20 ms)" in final["text/html"]
    assert '<img src="data:image/png;base64,' in final["text/html"]
    summary = html(cell)
    assert "GPU:0 (simulated)" in summary
    assert "<td>128.0 MiB</td>" in summary  # peak: 8 x 16 MiB
    assert "+64.0 MiB" in summary  # growth: 4 tensors still held
    assert text(cell).strip().endswith("4")  # the cell's value


@pytest.mark.notebook
def test_kernel_memwatch_trace_draws_the_cells_allocations_line_by_line(kernel):
    cells, _ = kernel
    cell = cells["trace"]
    assert not errors(cell)
    page = html(cell)
    assert "Allocation timeline" in page and "<svg" in page and "<script" not in page
    # The bands name the cell's own lines as the notebook numbers them (the magic's line is
    # line 1): the weights (line 2), the activations (line 4).
    assert "16.0 MiB" in page and "In[" in page
    top = page[page.index("Allocation timeline"):]
    assert "]:2 (" in top and "]:4 (" in top
    # The snapshot went to the file in torch's format, and recording stopped with the cell.
    # (The cached segments of earlier cells serve it: no segment_alloc needed.)
    assert text(cells["trace_read"]).strip() == (
        "['alloc', 'free_completed', 'free_requested'] True")
    out = text(cells["trace_cpu"])
    assert "UsageError" in out and "--trace records a GPU's allocations" in out


@pytest.mark.notebook
def test_kernel_out_of_memory_cell(kernel):
    cells, state = kernel
    cell = cells["over_limit"]
    (err,) = errors(cell)
    assert err.ename == "OutOfMemoryError"
    tb = "\n".join(err.traceback)
    assert "huge = torch.ones(512, 1024, 1024" in tb
    assert "monitoring.py" not in tb  # devlab's own frames are hidden
    # The summary still shows, with the limit.
    assert "limit 256.0 MiB" in text(cell) or "256.0 MiB" in html(cell)
    # The kernel is alive, the sampler thread gone, torch's default device untouched.
    assert text(cells["alive"]).strip() == "[] cpu False"


@pytest.mark.notebook
def test_kernel_bad_input_one_line(kernel):
    cells, _ = kernel
    for name, message in (("bad_interval", "--interval is the time between two readings in ms"),
                          ("bad_device", "unknown device")):
        out = text(cells[name])
        assert "UsageError" in out and message in out
        assert "Traceback" not in out


@pytest.mark.notebook
def test_kernel_chart_frames_and_compare(kernel):
    cells, state = kernel
    pngs = [o for m in _models(state, "OutputModel") for o in m["outputs"]
            if "image/png" in o.get("data", {})]
    # five memory charts (watch, over_limit, trace, peak_*), one timing chart
    assert len(pngs) == 6
    assert not errors(cells["compare"])
    tables = " ".join(m["value"] for m in _models(state, "HTMLModel"))
    assert "speed-up vs CPU:0" in tables and "GPU:0 (simulated)" in tables
    statuses = [m["value"] for m in _models(state, "HTMLModel") if "memory (stopped" in m["value"]]
    assert any("of 256.0 MiB" in s for s in statuses)


@pytest.mark.notebook
def test_kernel_issue_16_peak_is_the_cells_own_and_torchs_is_untouched(kernel):
    cells, _ = kernel
    def start_and_peak_mib(out: str) -> tuple[float, float]:
        row = re.search(r"<tbody><tr>(.*?)</tr>", out)
        assert row, out
        start, peak = re.findall(r"<td>([^<]*)</td>", row[1])[1:3]
        mib = [float(v.removesuffix(" MiB")) if v.endswith("MiB") else 0.0 for v in (start, peak)]
        return mib[0], mib[1]

    # What the GPU held before the cell (cuBLAS's workspace, since earlier cells' products) is
    # in the start; the cell's own tensor adds its size on top.
    start, peak = start_and_peak_mib(html(cells["peak_big"]))
    assert peak == pytest.approx(start + 100.0, abs=0.05)
    small = html(cells["peak_small"])
    start, peak = start_and_peak_mib(small)
    assert peak == pytest.approx(start + 50.0, abs=0.05), small  # was 0 B: the cell's own peak
    assert "≥" not in small
    assert text(cells["user_peak_after"]).split() == ["True", "128"]  # the user's reading


@pytest.mark.notebook
def test_kernel_issue_16_interval_inf_is_a_usage_error_and_no_thread_dies(kernel):
    cells, _ = kernel
    out = text(cells["interval_inf"])
    assert "UsageError: --interval is the time between two readings in ms" in out
    assert "OverflowError" not in out and "Traceback" not in out


@pytest.mark.notebook
def test_kernel_no_widget_or_figure_outlives_its_cell(kernel):
    # As the issue wrote it: each %%memwatch left ~10 widgets and a matplotlib figure, each
    # %%compare_devices 15 widgets. Every one of this kernel's cells has ended.
    cells, _ = kernel
    assert text(cells["widgets_left"]).strip() == "0 0 True"
