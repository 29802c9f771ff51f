"""devlab.timing: warm-up, synchronize, repeats, median/IQR, comparisons (no kernel)."""

from __future__ import annotations

import contextlib
import queue
import threading
import time

import devlab.timing as timing
import pytest
import torch

from devlab.core.timing import Comparison, TimingResult, compare, format_seconds, time_on_device


def test_median_of_a_known_duration():
    # Bounds load cannot move: sleep overshoots (more on a busy machine), never undershoots.
    # How close devlab comes to torch's own Timer is benchmarks/timing.py's to print.
    r = time_on_device(lambda: time.sleep(0.002), "cpu", min_time=0.1)
    assert 0.002 <= r.min <= r.median
    assert r.q1 <= r.median <= r.q3 and r.iqr >= 0
    assert r.number == 1  # a 2 ms call is its own block
    assert r.total >= 0.1 and r.repeats >= 5


def test_warmup_calls_are_not_measured():
    calls = []
    r = time_on_device(lambda: calls.append(1), "cpu", warmup=3, number=4, repeats=5,
                       min_time=0)
    assert len(calls) == 3 + 4 * 5
    assert r.warmup == 3 and r.number == 4 and r.repeats == 5


def test_tiny_calls_are_grouped_into_blocks():
    x = torch.ones(4)
    r = time_on_device(lambda: x.add_(1), "cpu", min_time=0.05)
    assert r.number > 10  # microsecond calls: many per block, so the clock is exact
    assert r.min < 1e-4  # the fastest block: what load cannot slow down


def test_repeats_until_min_time():
    r = time_on_device(lambda: time.sleep(0.001), "cpu", min_time=0.08, repeats=2)
    assert r.total >= 0.08
    assert r.repeats >= 2
    r = time_on_device(lambda: None, "cpu", min_time=10, repeats=3, max_repeats=3)
    assert r.repeats == 3  # max_repeats wins over min_time


def test_fn_and_setup_run_with_the_device_as_default():
    seen = {}

    def setup():
        seen["setup"] = torch.get_default_device()
        seen["x"] = torch.ones(2)

    def fn():
        seen["fn"] = torch.get_default_device()

    before = torch.get_default_device()
    time_on_device(fn, "/CPU:0", setup=setup, min_time=0)
    assert seen["setup"] == seen["fn"] == torch.device("cpu")
    assert torch.get_default_device() == before


def test_as_default_false_leaves_the_default_device_alone():
    import devlab

    devlab.config.simulate_gpus(1)
    seen = {}
    time_on_device(lambda: seen.setdefault("fn", torch.get_default_device()), "/GPU:0",
                   setup=lambda: seen.setdefault("setup", torch.get_default_device()),
                   as_default=False, min_time=0)
    assert seen == {"setup": torch.device("cuda", 0), "fn": torch.device("cpu")}


def test_an_error_in_fn_propagates_and_restores_the_default_device():
    before = torch.get_default_device()

    def fn():
        raise ValueError("bad work")

    with pytest.raises(ValueError, match="bad work"):
        time_on_device(fn, "cpu")
    assert torch.get_default_device() == before


@pytest.mark.parametrize("options, message", [
    ({"repeats": 0}, "repeats is the number of blocks of calls to measure at least, a whole number from 1 to 1,000,000; got 0."),
    ({"number": 0}, "number is the number of calls per block, a whole number from 1 to 1,000,000; got 0."),
    ({"warmup": -1}, "warmup is the number of untimed calls before measuring, a whole number from 0 to 1,000,000; got -1."),
    ({"warmup": 1.5}, "warmup is the number of untimed calls before measuring, a whole number from 0 to 1,000,000; got 1.5."),
    ({"warmup": 10**9}, "warmup is the number of untimed calls before measuring, a whole number from 0 to 1,000,000; got 1000000000."),
    ({"repeats": 10**9}, "repeats is the number of blocks of calls to measure at least, a whole number from 1 to 1,000,000; got 1000000000."),
    ({"repeats": 5, "max_repeats": 3}, "max_repeats is the number of blocks of calls to measure at most, no fewer "
                                       "than repeats, a whole number from 5 to 1,000,000; got 3."),
    ({"min_time": -0.5}, "min_time is the least time in seconds to measure for, from 0 to 3600 (an hour); got -0.5."),
    ({"min_time": float("nan")}, "min_time is the least time in seconds to measure for, from 0 to 3600 (an hour); got nan."),
    ({"min_time": float("inf")}, "min_time is the least time in seconds to measure for, from 0 to 3600 (an hour); got inf."),
])
def test_argument_errors_name_the_option_and_what_it_takes(options, message):
    calls = []
    with pytest.raises(ValueError) as err:
        time_on_device(lambda: calls.append(1), "cpu", **options)
    assert str(err.value) == message
    assert not calls, "nothing runs before the options are checked"


def test_check_options_names_a_magic_s_flags_and_skips_what_is_left_out():
    with pytest.raises(ValueError, match="^--min-time is the least time"):
        timing.check_options(min_time=-1, flags=True)
    with pytest.raises(ValueError, match="^--warmup is the number"):
        timing.check_options(warmup=-1, repeats=1, flags=True)
    timing.check_options(repeats=1)
    timing.check_options()


class AsyncDevice:
    """A device whose calls return at once while a worker does the work: what CUDA does."""

    def __init__(self, work_s: float) -> None:
        self.work_s = work_s
        self.jobs: queue.Queue = queue.Queue()
        self.syncs = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.jobs.get()
            time.sleep(self.work_s)
            self.jobs.task_done()

    def launch(self) -> None:
        self.jobs.put(1)

    def synchronize(self, device=None) -> None:
        self.syncs += 1
        self.jobs.join()


def test_synchronize_makes_asynchronous_work_count(monkeypatch):
    dev = AsyncDevice(0.003)
    monkeypatch.setattr(timing, "_on_device", lambda name, d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", dev.synchronize)

    # What %timeit sees: the launch only (the fastest of ten, as load only adds time).
    launches = []
    for _ in range(10):
        t0 = time.perf_counter()
        dev.launch()
        launches.append(time.perf_counter() - t0)
    dev.synchronize()

    r = time_on_device(dev.launch, torch.device("cuda", 0), min_time=0.05)
    assert min(launches) < 0.003 <= r.min  # every timed call waited for its 3 ms of work
    assert dev.syncs >= 2 * r.repeats
    assert r.synchronize == "torch.cuda.synchronize"


def test_synchronizer_per_device_type():
    assert timing.synchronizer(torch.device("cpu"))[1].startswith("none")
    assert timing.synchronizer(torch.device("cuda", 0))[1] == "torch.cuda.synchronize"


def _result(label: str, times: list[float]) -> TimingResult:
    return TimingResult(label, "cpu", times, 1, 0, "none")


def test_result_statistics_and_html():
    r = _result("CPU:0", [1.0, 2.0, 3.0, 4.0, 100.0])
    assert r.median == 3.0
    assert (r.q1, r.q3, r.iqr) == (2.0, 4.0, 2.0)
    assert r.min == 1.0 and r.mean == 22.0
    html = r._repr_html_()
    assert "median per call" in html and "3 s" in html
    assert "3 s per call (median)" in str(r)
    fig = r.plot()
    assert fig.axes[0].get_ylabel() == "time per call (s)"


def test_comparison_speedups_table_and_chart():
    c = Comparison([_result("CPU:0", [0.004] * 5), _result("GPU:0", [0.001] * 5)])
    assert c.speedups == {"CPU:0": 1.0, "GPU:0": 4.0}
    assert c["GPU:0"].median == 0.001
    html = c._repr_html_()
    assert "speed-up vs CPU:0" in html and "4.00x" in html and "1.00x" in html
    fig = c.plot()
    bars = fig.axes[0].patches
    assert len(bars) == 2
    assert bars[0].get_width() == pytest.approx(4.0)  # ms
    assert c.png().startswith(b"\x89PNG")
    assert "4.00x vs CPU:0" in str(c)


def test_compare_runs_each_device_and_reports_as_it_goes():
    done = []
    c = compare({"cpu": lambda: time.sleep(0.004), "/CPU:0": lambda: time.sleep(0.001)},
                on_result=lambda r: done.append(r.name), min_time=0.05)
    assert done == ["cpu", "/CPU:0"]
    assert [r.label for r in c.results] == ["CPU:0", "CPU:0 #2"]  # one device, two runs
    assert c.speedups[c.results[1].label] == pytest.approx(c.results[0].median
                                                           / c.results[1].median)
    assert c.results[0].min >= 0.004 and c.results[1].min >= 0.001  # each timed its own work


def test_compare_argument_errors():
    with pytest.raises(TypeError):
        compare(lambda: None)
    with pytest.raises(TypeError):
        compare({"cpu": lambda: None}, ["cpu"])
    with pytest.raises(ValueError):
        compare(lambda: None, [])


def test_format_seconds():
    assert format_seconds(1.5) == "1.5 s"
    assert format_seconds(0.000123) == "123 µs"
    assert format_seconds(2.5e-9) == "2.5 ns"
    assert format_seconds(0.0421) == "42.1 ms"


def test_docstring_explains_timeit():
    assert "%timeit" in timing.__doc__ and "synchroniz" in timing.__doc__


def test_simulated_gpu_timing_waits_for_the_device(monkeypatch):
    import devlab

    devlab.config.simulate_gpus(1)
    syncs = []
    simulated_sync = torch.cuda.synchronize  # the simulation's own, patched in
    monkeypatch.setattr(torch.cuda, "synchronize",
                        lambda device=None: (syncs.append(device), simulated_sync(device)))
    a = torch.rand(256, 256, device="cuda:0")
    r = time_on_device(lambda: a @ a, "/GPU:0", min_time=0.05)
    assert r.label == "GPU:0 (simulated)" and r.device == "cuda:0"
    assert len(syncs) >= 2 * r.repeats
    assert r.median > 0


def test_comparisons_with_simulated_gpus_say_their_times_mean_nothing_for_real_gpus() -> None:
    import devlab
    from devlab.core.timing import Comparison, time_on_device

    cpu_only = Comparison()
    cpu_only.add(time_on_device(lambda: None, "cpu", warmup=0, min_time=0.0, repeats=1))
    assert cpu_only.note is None and "CPU-backed" not in cpu_only._repr_html_()
    devlab.config.simulate_gpus(1)
    try:
        both = Comparison()
        both.add(time_on_device(lambda: None, "/CPU:0", warmup=0, min_time=0.0, repeats=1))
        both.add(time_on_device(lambda: None, "/GPU:0", warmup=0, min_time=0.0, repeats=1))
        assert [r.simulated for r in both.results] == [False, True]
        assert "say nothing about a real GPU" in both._repr_html_()
        assert str(both).endswith("say nothing about a real GPU.")
    finally:
        devlab.config.stop_simulation()


# --- where the work runs ------------------------------------------------------------------


@pytest.fixture
def two_gpus():
    import devlab

    devlab.config.simulate_gpus(2)
    yield
    devlab.config.stop_simulation()


@pytest.fixture
def synced(monkeypatch):
    """Every device torch.cuda.synchronize was asked to wait for, in order."""
    calls: list[torch.device] = []
    simulated_sync = torch.cuda.synchronize  # the simulation's own, patched in

    def sync(device=None):
        calls.append(torch.device(device) if device is not None else None)
        simulated_sync(device)

    monkeypatch.setattr(torch.cuda, "synchronize", sync)
    return calls


def _idle(index: int) -> bool:
    from devlab.engine.simulated.base import gpu_workers as _workers

    return _workers.idle(index)


def test_work_on_another_gpu_is_refused_naming_both_and_left_finished(two_gpus, synced):
    # The case: x on cuda:1 timed as /GPU:0 printed "GPU:0: 100 µs" (the launch of
    # a 1000x1000 product, on the wrong device) and left its queue to the next cell.
    x = torch.rand(1024, 1024, device="cuda:1")
    with pytest.raises(timing.DeviceMismatch) as err:
        time_on_device(lambda: x @ x, "/GPU:0")
    message = str(err.value)
    assert message.startswith("The timed work ran on GPU:1 (cuda:1), not on GPU:0 (cuda:0), "
                              "the device it was timed on: its tensors live there")
    assert "Time it on '/GPU:1'" in message and "x.to" not in message
    assert torch.device("cuda", 1) in synced and _idle(1)


def test_host_tensors_timed_on_a_gpu_and_gpu_tensors_timed_on_the_cpu_are_refused(two_gpus):
    host = torch.rand(64, 64)
    with pytest.raises(timing.DeviceMismatch, match=r"^The timed work ran on CPU:0 \(cpu\), not "
                                                    r"on GPU:1 \(cuda:1\).*Time it on '/CPU:0'"):
        time_on_device(lambda: host @ host, "/GPU:1", min_time=0)
    gpu = torch.rand(64, 64, device="cuda:0")
    with pytest.raises(timing.DeviceMismatch, match=r"^The timed work ran on GPU:0 \(cuda:0\), "
                                                    r"not on CPU:0 \(cpu\).*on the host"):
        time_on_device(lambda: gpu @ gpu, "/CPU:0", min_time=0)


def test_work_on_two_gpus_is_timed_on_both_and_labelled_with_both(two_gpus, synced):
    a = torch.rand(64, 64, device="cuda:0")
    b = torch.rand(64, 64, device="cuda:1")
    r = time_on_device(lambda: (a @ a, b @ b), "/GPU:0", min_time=0, repeats=3, number=2)
    assert r.label == "GPU:0 + GPU:1 (simulated)"
    assert r.ran_on == ("cuda:0", "cuda:1")
    assert r.synchronize == "torch.cuda.synchronize (cuda:0, cuda:1)"
    for index in (0, 1):  # before and after each block's clock, at least
        assert synced.count(torch.device("cuda", index)) >= 2 * r.repeats


def test_work_made_on_the_default_device_runs_there(two_gpus):
    r = time_on_device(lambda: torch.ones(8, 8) @ torch.ones(8, 8), "/GPU:1", min_time=0)
    assert r.label == "GPU:1 (simulated)" and r.ran_on == ("cuda:1",)
    # Work without tensors says nothing about its device, and is not refused; nor do a
    # host scalar joining GPU work (as a Python number would) or a meta tensor (no data).
    assert time_on_device(lambda: None, "/GPU:0", min_time=0).ran_on == ()
    x = torch.rand(8, 8, device="cuda:0")
    r = time_on_device(lambda: (x * torch.tensor(2.0, device="cpu"), torch.empty(3, device="meta")),
                       "/GPU:0", min_time=0)
    assert r.ran_on == ("cuda:0",)


def test_only_the_first_warm_up_call_is_watched():
    modes: list[int] = []
    base = torch._C._len_torch_function_stack()
    r = time_on_device(lambda: modes.append(torch._C._len_torch_function_stack()), "cpu",
                       warmup=3, number=2, repeats=4, min_time=0)
    assert modes[0] == base + 1  # the watching mode, on the first warm-up call only
    assert modes[1:] == [base] * (2 + 2 * 4)
    assert r.warmup == 3


def test_warmup_0_still_makes_the_one_untimed_call_that_finds_the_devices():
    calls = []
    r = time_on_device(lambda: calls.append(1), "cpu", warmup=0, number=3, repeats=2, min_time=0)
    assert len(calls) == 1 + 3 * 2
    assert r.warmup == 1


def test_an_error_in_the_work_leaves_no_queued_work_on_any_device(two_gpus, synced):
    a = torch.rand(1024, 1024, device="cuda:0")
    b = torch.rand(1024, 1024, device="cuda:1")

    def fn():
        a @ a
        b @ b  # queued on GPU 1's worker (large enough to run asynchronously)
        raise ValueError("bad work")

    with pytest.raises(ValueError, match="bad work"):
        time_on_device(fn, "/GPU:0")
    assert torch.device("cuda", 1) in synced and _idle(0) and _idle(1)


def test_compare_refuses_a_device_the_work_does_not_run_on(two_gpus):
    x = torch.rand(32, 32, device="cuda:1")
    with pytest.raises(timing.DeviceMismatch, match="ran on GPU:1"):
        compare(lambda: x @ x, ["/GPU:1", "/GPU:0"], min_time=0)


# --- steady measurements, modeled ones -----------------------------------------------------


def test_a_measurement_is_steady_when_half_its_blocks_are_near_the_fastest():
    assert _result("CPU:0", [1.0, 1.1, 1.2, 9.0, 9.0]).steady  # two slow blocks: still steady
    busy = _result("CPU:0", [1.0, 2.0, 2.0, 2.0, 2.0])
    assert not busy.steady and "unsteady" in str(busy)
    assert "no: the median block took 2.00x the fastest" in busy._repr_html_()
    assert TimingResult("GPU:0", "cuda:0", [1.0, 3.0, 3.0], 1, 1, "x", modeled="T4").steady


def test_a_modeled_result_shows_no_spread(monkeypatch):
    # Blocks of a modeled clock differ only by float rounding: no IQR to print.
    r = TimingResult("GPU:0 (modeled T4)", "cuda:0", [2e-5, 2e-5 + 4.7e-20, 2e-5], 50, 2,
                     "torch.cuda.synchronize", modeled="NVIDIA T4")
    line = str(r)
    assert line == ("GPU:0 (modeled T4): 20 µs per call, 3 x 50 calls [modeled from NVIDIA T4 "
                    "specifications, not measured: the same every run]")
    assert "IQR" not in line and "e-" not in r._repr_html_()
    assert "none: the modeled clock gives every block the same time" in r._repr_html_()
    c = Comparison([_result("CPU:0", [1e-4] * 3), r])
    assert "none (modeled: every block the same)" in c._repr_html_()


def test_a_modeled_clock_stops_at_two_equal_blocks():
    import devlab

    devlab.config.simulate_gpus(1, model="T4")
    try:
        x = torch.rand(256, 256, device="cuda:0")
        r = time_on_device(lambda: x @ x, "/GPU:0", repeats=5, number=3)
        assert r.repeats == 2 and r.times[0] == pytest.approx(r.times[1], rel=1e-9)
        assert r.modeled and r.steady
    finally:
        devlab.config.stop_simulation()
