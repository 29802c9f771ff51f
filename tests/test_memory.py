"""devlab.memory: readers, the background sampler, summaries and the chart (no kernel)."""

from __future__ import annotations

import importlib
import mmap
import re
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from devlab.core import placement_scope as scope
from devlab.core.memory_watch import (
    MemoryChart,
    MemoryReading,
    NvmlReader,
    ProcessReader,
    Sampler,
    SimulatedReader,
    TorchCudaReader,
    format_bytes,
    reader_for,
)

MiB = 1024 * 1024


class ScriptedReader:
    """A reader whose values a test sets; counts the threads that read it."""

    def __init__(self, label: str = "fake", used: int = 0, limit: int | None = None) -> None:
        self.label = label
        self.used = used
        self.reserved: int | None = None
        self.peak: int | None = None
        self.limit = limit
        self.threads: set[str] = set()
        self.reads = 0

    def read(self) -> MemoryReading:
        self.threads.add(threading.current_thread().name)
        self.reads += 1
        return MemoryReading(time.perf_counter(), self.used, self.reserved, self.limit,
                             self.label, self.peak)


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "devlab-memory-sampler"]


# -- readers ---------------------------------------------------------------------------------


def test_process_reader_sees_a_big_tensor_in_rss():
    # The tensor lives in a fresh anonymous mapping: torch's allocator may hand back memory an
    # earlier test freed and is still resident (CI once saw RSS unchanged), a new mapping cannot.
    reader = ProcessReader()
    before = reader.read()
    pages = mmap.mmap(-1, 64 * MiB)
    x = torch.frombuffer(pages, dtype=torch.float32).fill_(1.0)  # 64 MiB, touched: resident
    after = reader.read()
    assert after.used - before.used > 48 * MiB
    assert after.reserved is None and after.limit is None
    assert after.timestamp > before.timestamp
    del x
    pages.close()


def test_reader_for_cpu_names():
    assert isinstance(reader_for("cpu"), ProcessReader)
    assert isinstance(reader_for(torch.device("cpu")), ProcessReader)
    assert isinstance(reader_for("/CPU:0"), ProcessReader)


def test_reader_for_a_missing_gpu_says_so():
    with pytest.raises((ValueError, RuntimeError)):
        reader_for("cuda:0" if not torch.cuda.is_available() else "cuda:99")


def test_reader_for_unknown_source():
    with pytest.raises(ValueError, match="unknown memory source"):
        reader_for("cpu", source="magic")


class FakeSimulation:
    """Stands in for devlab.simulated's accounting contract."""

    def __init__(self, count: int = 2) -> None:
        self.count = count
        self.stats = {i: {"allocated": 0, "peak": 0, "limit": None} for i in range(count)}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from devlab.engine import simulated

        monkeypatch.setattr(simulated, "is_active", lambda: True, raising=False)
        monkeypatch.setattr(simulated, "device_count", lambda: self.count, raising=False)
        monkeypatch.setattr(simulated, "memory_stats", lambda i: dict(self.stats[i]),
                            raising=False)
        # Resolution of names is the scope's business; keep it to torch names here.
        monkeypatch.setattr(scope, "resolve",
                            lambda name, soft=None: SimpleNamespace(device=torch.device(name)))


def test_simulated_reader_reads_the_accounting(monkeypatch):
    sim = FakeSimulation()
    sim.install(monkeypatch)
    sim.stats[1] = {"allocated": 3 * MiB, "peak": 5 * MiB, "limit": 100 * MiB}
    reader = reader_for("cuda:1")
    assert isinstance(reader, SimulatedReader)
    r = reader.read()
    assert (r.used, r.peak, r.limit, r.reserved) == (3 * MiB, 5 * MiB, 100 * MiB, None)
    assert r.label == "GPU:1 (simulated)"
    with pytest.raises(ValueError, match="2 simulated GPU"):
        reader_for("cuda:2")
    # Reserved memory, where the simulation reports it (memory growth off), is read too.
    sim.stats[0] = {"allocated": MiB, "peak": MiB, "limit": 64 * MiB, "reserved": 64 * MiB}
    assert reader_for("cuda:0").read().reserved == 64 * MiB


def test_nvml_reader_device_and_process(monkeypatch):
    from devlab.engine import nvml_reader as nvml

    monkeypatch.setattr(nvml, "available", lambda: True)
    monkeypatch.setattr(nvml, "memory_info", lambda i: (7 * MiB, 80 * MiB))
    monkeypatch.setattr(nvml, "process_memory", lambda i: 2 * MiB)
    assert reader_for("cpu", source="nvml").read().used == 7 * MiB
    r = NvmlReader(0, scope="process").read()
    assert (r.used, r.limit) == (2 * MiB, 80 * MiB)
    # Where NVML does not report per-process memory, the device figure is what there is.
    monkeypatch.setattr(nvml, "process_memory", lambda i: None)
    assert NvmlReader(0, scope="process").read().used == 7 * MiB
    with pytest.raises(ValueError):
        NvmlReader(0, scope="everything")


def test_nvml_source_without_driver(monkeypatch):
    from devlab.engine import nvml_reader as nvml

    monkeypatch.setattr(nvml, "available", lambda: False)
    with pytest.raises(ValueError, match="NVML is not available"):
        reader_for("cpu", source="nvml")


def test_torch_cuda_reader_never_initializes_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 10)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 20)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda i: 15)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)

    def properties(i):
        raise AssertionError("get_device_properties would initialize CUDA")

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    r = TorchCudaReader(0).read()
    assert (r.used, r.reserved, r.peak, r.limit) == (10, 20, 15, None)


def test_torch_cuda_reader_limit_is_the_memory_fraction(monkeypatch):
    class Props:
        total_memory = 8 * 1024 * MiB

    for name, value in (("memory_allocated", 1), ("memory_reserved", 2),
                        ("max_memory_allocated", 3)):
        monkeypatch.setattr(torch.cuda, name, lambda i, v=value: v)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    fraction = {"value": 1.0}
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction",
                        lambda i: fraction["value"])
    reader = TorchCudaReader(1)
    assert reader.read().limit == 8 * 1024 * MiB
    fraction["value"] = 0.125
    assert reader.read().limit == 1024 * MiB


def test_a_real_gpus_chart_draws_nvmls_used_line_when_nvml_answers(monkeypatch):
    # A fake NVML and a fake allocator: what a real GPU's reader would see with a driver. The
    # device's used memory (nvidia-smi's) includes the CUDA context and libraries' buffers
    # that torch's allocator does not count, so it is its own line.
    from devlab.engine import nvml_reader as nvml

    used = {"bytes": 700 * MiB}
    monkeypatch.setattr(nvml, "available", lambda: True)
    monkeypatch.setattr(nvml, "memory_info", lambda i: (used["bytes"], 16 * 1024 * MiB))
    for name, value in (("memory_allocated", 100 * MiB), ("memory_reserved", 400 * MiB),
                        ("max_memory_allocated", 100 * MiB)):
        monkeypatch.setattr(torch.cuda, name, lambda i, v=value: v)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    reader = TorchCudaReader(0)
    first = reader.read()
    used["bytes"] = 900 * MiB
    second = reader.read()
    assert (first.driver_used, second.driver_used) == (700 * MiB, 900 * MiB)
    chart = MemoryChart()
    chart.update({"GPU:0": [first, second]})
    lines = {li.get_label(): li for li in chart.ax.get_lines()}
    assert sorted(lines) == ["GPU:0", "GPU:0 NVML used", "GPU:0 reserved"]
    nvml_line = lines["GPU:0 NVML used"]
    assert nvml_line.get_linestyle() == "-."
    assert list(nvml_line.get_ydata()) == [700.0, 900.0]  # MiB, the chart's unit
    assert chart.ax.get_ylim()[1] >= 900  # the axes hold the highest line
    labels = [t.get_text() for t in chart.ax.get_legend().get_texts()]
    assert "GPU:0 NVML used" in labels
    # Without a driver the reading carries no such figure and the chart draws no such line.
    monkeypatch.setattr(nvml, "available", lambda: False)
    bare = reader.read()
    assert bare.driver_used is None
    chart = MemoryChart()
    chart.update({"GPU:0": [bare]})
    assert "GPU:0 NVML used" not in [li.get_label() for li in chart.ax.get_lines()]


# -- the sampler -----------------------------------------------------------------------------


def test_sampler_reads_at_the_rate_asked_from_one_thread():
    reader = ScriptedReader()
    with Sampler([reader], interval=0.02) as s:
        time.sleep(0.6)
    assert s.rate() == pytest.approx(50, rel=0.2)
    # The first and last readings come from the caller, all others from one sampler thread.
    assert reader.threads == {threading.current_thread().name, "devlab-memory-sampler"}
    assert len(s.series()["fake"]) == reader.reads
    assert not _sampler_threads()


def test_default_rate_is_twenty_per_second_and_cheap():
    with Sampler(["cpu"]) as s:
        time.sleep(0.5)
    assert s.interval == 0.05
    assert s.rate() == pytest.approx(20, rel=0.15)
    # The thread's own CPU time: well under 2% of the watch (it is ~0.5% on a laptop).
    assert 0 < s.thread_cpu_seconds < 0.02 * 0.5


def test_sampler_stops_and_joins_when_the_block_fails():
    reader = ScriptedReader()
    with pytest.raises(ZeroDivisionError), Sampler([reader]) as s:
        time.sleep(0.1)
        1 / 0  # noqa: B018
    assert not s.running and not _sampler_threads()
    reads = reader.reads
    time.sleep(0.15)
    assert reader.reads == reads  # nothing reads after the stop


def test_summary_peak_growth_and_held():
    reader = ScriptedReader(used=100, limit=1000)
    with Sampler([reader], interval=0.01) as s:
        time.sleep(0.05)
        reader.used = 900
        time.sleep(0.05)
        reader.used = 300
        time.sleep(0.05)
    d = s.summary()["fake"]
    assert (d.start, d.peak, d.end) == (100, 900, 300)
    assert (d.growth, d.peak_increase, d.held) == (200, 800, 300)
    text = str(s.summary())
    assert "peak 900 B" in text and "growth +200 B" in text and "still held 300 B" in text
    assert "90% at peak" in text
    assert "<table" in s.summary()._repr_html_()


def test_backend_peak_catches_a_spike_between_samples():
    reader = ScriptedReader(used=100)
    reader.peak = 500  # an old high-water mark, before the watch: not this watch's peak
    with Sampler([reader], interval=0.05) as s:
        time.sleep(0.06)
    assert s.summary()["fake"].peak == 100
    reader.peak = 500
    with Sampler([reader], interval=0.05) as s:
        reader.peak = 2000  # rose and fell between two samples
    assert s.summary()["fake"].peak == 2000


def test_callbacks_run_in_the_sampler_thread_and_a_broken_one_is_dropped():
    seen: list[str] = []
    calls = {"broken": 0}

    def good(sampler):
        seen.append(threading.current_thread().name)

    def broken(sampler):
        calls["broken"] += 1
        raise RuntimeError("chart broke")

    with Sampler([ScriptedReader()], interval=0.01, callbacks=[broken, good]) as s:
        time.sleep(0.1)
    assert "devlab-memory-sampler" in seen and len(seen) > 3
    assert calls["broken"] == 1
    assert any("chart broke" in str(e) for e in s.errors)


def test_a_failing_reader_does_not_stop_the_others():
    class Broken:
        label = "broken"

        def read(self):
            raise RuntimeError("driver gone")

    good = ScriptedReader()
    with Sampler([Broken(), good], interval=0.01) as s:
        time.sleep(0.08)
    assert good.reads > 3
    assert s.errors and "driver gone" in str(s.errors[0])
    assert [d.label for d in s.summary().devices] == ["fake"]


def test_sampler_argument_errors():
    with pytest.raises(ValueError, match="interval"):
        Sampler([ScriptedReader()], interval=0)
    with pytest.raises(ValueError, match="nothing to watch"):
        Sampler([])
    s = Sampler([ScriptedReader()]).start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            s.start()
    finally:
        s.stop()
    s.stop()  # twice is harmless


def test_the_same_device_named_twice_is_one_line():
    s = Sampler(["cpu", "/CPU:0", torch.device("cpu")])
    assert len(s.readers) == 1


def test_sampler_defaults_to_the_cpu_without_gpus():
    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    assert [r.label for r in Sampler().readers] == ["CPU:0 (process RSS)"]


def test_sampler_on_simulated_gpus_by_default(monkeypatch):
    sim = FakeSimulation(2)
    sim.install(monkeypatch)
    s = Sampler()
    assert [r.label for r in s.readers] == ["GPU:0 (simulated)", "GPU:1 (simulated)"]
    with s:
        sim.stats[1]["allocated"] = 8 * MiB
        time.sleep(0.12)
    assert s.summary()["GPU:1 (simulated)"].peak == 8 * MiB


# -- chart and formatting --------------------------------------------------------------------


def _series(n: int) -> dict[str, list[MemoryReading]]:
    a = [MemoryReading(i * 0.05, i * MiB, i * MiB + 64 * MiB, 1024 * MiB, "GPU:0", None)
         for i in range(n)]
    b = [MemoryReading(i * 0.05, 5 * MiB, None, None, "CPU:0") for i in range(n)]
    return {"GPU:0": a, "CPU:0": b}


def test_chart_lines_reserved_and_limit():
    chart = MemoryChart()
    chart.update(_series(50))
    names = sorted(line.get_label() for line in chart.ax.get_lines())
    assert names == ["CPU:0", "GPU:0", "GPU:0 limit", "GPU:0 reserved"]
    limit = next(li for li in chart.ax.get_lines() if li.get_label() == "GPU:0 limit")
    assert limit.get_linestyle() == "--" and limit.get_ydata()[0] == pytest.approx(1.0)  # GiB
    assert chart.ax.get_ylabel() == "memory (GiB)"
    assert chart.png().startswith(b"\x89PNG")


def test_chart_without_limits_or_reserved():
    chart = MemoryChart(show_limit=False)
    series = _series(10)
    chart.update({"CPU:0": series["CPU:0"]})
    assert [li.get_label() for li in chart.ax.get_lines()] == ["CPU:0"]
    assert chart.ax.get_ylabel() == "memory (MiB)"


def test_long_series_are_reduced_without_losing_a_spike():
    flat = [MemoryReading(i * 0.05, 100 * MiB, None, None, "GPU:0") for i in range(5000)]
    flat[2345] = MemoryReading(2345 * 0.05, 900 * MiB, None, None, "GPU:0")
    chart = MemoryChart(max_points=100)
    chart.update({"GPU:0": flat})
    line = chart.ax.get_lines()[0]
    assert len(line.get_ydata()) <= 100
    assert max(line.get_ydata()) == pytest.approx(900)  # MiB
    assert min(line.get_ydata()) == pytest.approx(100)


def test_live_chart_redraws_axes_rarely():
    chart = MemoryChart(live=True)
    for n in range(2, 200, 2):
        chart.update(_series(n))
        png = chart.png()
    assert png.startswith(b"\x89PNG")
    # 99 frames; the axes move in steps (x: 1, 1.5, 2, 3, 5, 7.5, 10 s; y: fixed by limit).
    assert chart.full_draws <= 10


def test_sampler_plot_is_a_figure():
    with Sampler([ScriptedReader(used=5 * MiB)], interval=0.01) as s:
        time.sleep(0.03)
    fig = s.plot()
    assert fig.axes and fig.axes[0].get_lines()


def test_format_bytes():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * MiB) == "3.0 MiB"
    assert format_bytes(-2 * 1024**3) == "-2.0 GiB"
    assert format_bytes(None) == "—"
    assert format_bytes(5 * 1024**4) == "5.0 TiB"
    assert format_bytes(1023) == "1023 B"


# -- with the real simulation --------------------------------------------------------------------


def test_sampler_reads_simulated_gpus():
    import devlab

    devlab.config.simulate_gpus(2, memory_limit=256)
    reader = reader_for("/GPU:1")
    assert isinstance(reader, SimulatedReader) and reader.label == "GPU:1 (simulated)"
    with Sampler(["/GPU:0", "/GPU:1"], interval=0.01) as s:
        x = torch.ones(16, 1024, 1024, device="cuda:1")  # 64 MiB
        torch.cuda.synchronize()
        time.sleep(0.05)
        del x
        torch.cuda.synchronize()
    gpu1 = s.summary()["GPU:1 (simulated)"]
    assert (gpu1.start, gpu1.peak, gpu1.end) == (0, 64 * MiB, 0)
    assert gpu1.limit == 256 * MiB
    assert s.summary()["GPU:0 (simulated)"].peak == 0


def test_the_package_exports_every_public_name_once():
    # `devlab.memory` is a package of small modules; its public names stay importable from it
    # and are the very objects the modules define (no second copy anywhere).
    import devlab.memory

    import devlab._helpers.figures
    from devlab.core.memory_watch import (
        fresh_process as fresh,
    )
    from devlab.core.memory_watch import (
        memory_chart as chart,
    )
    from devlab.core.memory_watch import (
        readers,
        sampler,
        summary,
    )

    # devlab.core.memory_watch.allocation_timeline is the function; its module is devlab.memory's "timeline" module.
    timeline_module = importlib.import_module("devlab.core.memory_watch.allocation_timeline")
    homes = (readers, sampler, summary, chart, fresh, timeline_module, devlab._helpers.figures)
    for name in devlab.memory.__all__:
        obj = getattr(devlab.memory, name)
        assert [m for m in homes if getattr(m, name, None) is obj and name in m.__all__], name


def test_issue_16_peak_of_a_cell_after_an_earlier_higher_one():
    from devlab.core import config
    from devlab.engine import simulated

    config.simulate_gpus(2)
    # As the issue wrote it: a cell that allocated 50 MiB after an earlier cell reached
    # 100 MiB reported peak 0 B (the high-water mark was never reset).
    x = torch.ones(25 * MiB, device="cuda:0")  # 100 MiB
    del x
    assert torch.cuda.max_memory_allocated(0) == 100 * MiB
    with Sampler(["cuda:0"], interval=1.0) as s:  # no sample falls inside: only the watch's peak
        y = torch.ones(12_800 * 1024, device="cuda:0")  # 50 MiB
        seen_inside = torch.cuda.max_memory_allocated(0)
        del y
    d = s.summary()["GPU:0 (simulated)"]
    assert (d.start, d.peak, d.end) == (0, 50 * MiB, 0)
    assert not d.peak_at_least and "peak 50.0 MiB" in str(s.summary())
    # The user's own reading of torch's peak was never changed: not inside, not after.
    assert seen_inside == torch.cuda.max_memory_allocated(0) == 100 * MiB
    assert not simulated.base.session.session.devices[0].watches  # the watch ended with the sampler


def test_nested_watches_keep_their_own_peaks():
    from devlab.core import config

    config.simulate_gpus(2)
    with Sampler(["cuda:1"], interval=1.0) as outer:
        a = torch.ones(2 * MiB, device="cuda:1")  # 8 MiB
        del a
        with Sampler(["cuda:1"], interval=1.0) as inner:
            b = torch.ones(MiB, device="cuda:1")  # 4 MiB
            del b
    assert outer.summary().devices[0].peak == 8 * MiB
    assert inner.summary().devices[0].peak == 4 * MiB


def test_an_old_high_water_mark_above_every_sample_makes_the_peak_at_least():
    reader = ScriptedReader(used=100)
    reader.peak = 500  # set before the watch, never risen: a spike between samples could hide
    with Sampler([reader], interval=1.0) as s:
        pass
    d = s.summary()["fake"]
    assert d.peak == 100 and d.peak_at_least
    assert "peak ≥ 100 B" in str(s.summary())
    assert "torch.cuda.reset_peak_memory_stats()" in s.summary()._repr_html_()
    reader.peak = 50  # below what was sampled: a spike above the samples would have raised it
    with Sampler([reader], interval=1.0) as s:
        pass
    assert not s.summary()["fake"].peak_at_least


def test_public_objects_have_a_useful_repr():
    # As the issue wrote it: `devlab.memory.Sampler([...])` showed as
    # `<devlab.core.memory_watch.sampler.Sampler object at 0x…>`.
    from IPython.core.interactiveshell import InteractiveShell

    from devlab.core.memory_watch import NvmlReader, ProcessReader, SimulatedReader, TorchCudaReader
    from devlab.fronts.lab.magics.monitoring_magics import MonitoringMagics
    from devlab.fronts.lab.magics.placement_magics import PlacementMagics

    s = Sampler([ScriptedReader()], interval=0.02)
    assert repr(s) == "Sampler(fake; every 20 ms; not started)"
    with s:
        time.sleep(0.05)
    assert re.fullmatch(r"Sampler\(fake; every 20 ms; stopped after 0\.\d\d s, \d+ samples\)", repr(s))
    ip = InteractiveShell.instance()
    for obj in (ProcessReader(), TorchCudaReader(0), SimulatedReader(1), NvmlReader(0, "process"),
                MemoryChart(), PlacementMagics(ip), MonitoringMagics(ip)):
        assert " object at 0x" not in repr(obj), repr(obj)
    assert repr(SimulatedReader(1)) == "SimulatedReader(1, label='GPU:1 (simulated)')"
