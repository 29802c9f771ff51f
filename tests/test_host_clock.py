"""The host's modeled time (Note [The host's modeled time] in devlab/engine/gpu_model/modeled_clock.py):
at the wall clock's pace outside the simulation, by the modeled costs inside it, never at the
CPU's time to compute the GPUs' values. So CUDA events around a sleep read the sleep, an input
stall is an idle GPU in explain() and the step timeline, and a loop of small ops is
launch-bound, as on a GPU. Bounds here are one-sided where this machine's speed enters: each
fails if the host's time stood still (the clock before it had a host) or ran with the CPU.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch
from torch import nn

import devlab
from devlab import gpu_model, simulated
from devlab.engine.gpu_model.modeled_clock import WAIT_HOST, host_wall_clock
from devlab.engine.gpu_model.specs import SPECS

pytestmark = pytest.mark.usefixtures("no_simulation")

T4 = SPECS["T4"]
LAUNCH = T4.launch_latency_us * 1e-6


@pytest.fixture
def t4():
    devlab.config.simulate_gpus(1, model="T4")
    yield simulated
    devlab.config.stop_simulation()


def _events() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _product(n: int) -> float:
    return gpu_model.predict("mm", ((n, n), (n, n)), "float32", "T4").seconds


def test_events_around_a_sleep_read_the_sleep(t4) -> None:
    start, end = _events()
    start.record()
    time.sleep(0.3)
    end.record()
    torch.cuda.synchronize()
    # time.sleep sleeps at least its time; a machine running other work may add to it.
    assert 300.0 <= start.elapsed_time(end) < 1500.0


def test_a_stall_between_two_products_is_an_idle_gpu_in_explain_and_the_timeline(t4) -> None:
    x = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()

    def stalled() -> torch.Tensor:
        y = x @ x
        time.sleep(0.05)  # the host prepares the next batch: the GPU has nothing to run
        return y @ x

    e = simulated.explain(stalled)
    assert [op.op for op in e.ops] == ["aten::matmul", "aten::matmul"]
    assert e.ops[0].gpu == e.ops[1].gpu == pytest.approx(_product(1024))  # kernels unchanged
    stalls = [w for w in e.waits if w[0] == 1]
    # At least most of the sleep: a host clock that stood still (or ran with the CPU) waits
    # none of it. (torch 2.15's job at load 25 once read it 40 µs short of the whole sleep.)
    assert stalls and stalls[0][2] >= 0.9 * 0.05 - _product(1024)
    names = [row[0] for row in e.rows()]
    second = max(i for i, name in enumerate(names) if name == "aten::matmul")
    assert names[second - 1].startswith(WAIT_HOST)  # listed just before the op it delayed
    assert "waiting for the host" in str(e)
    step = simulated.timeline(stalled).gpu_step(0)
    assert step.waited_for_host >= 0.9 * 0.05 - _product(1024)
    assert step.idle >= step.waited_for_host - 1e-9
    assert step.compute == pytest.approx(2 * _product(1024))


def test_a_loop_of_small_ops_is_launch_bound(t4) -> None:
    x = torch.randn(64, device="cuda")
    for _ in range(10):
        x = x + 1
    torch.cuda.synchronize()
    n = 200
    start, end = _events()
    start.record()
    for _ in range(n):
        x = x + 1
    end.record()
    torch.cuda.synchronize()
    elapsed = start.elapsed_time(end) * 1e-3
    kernel = simulated.explain(lambda: x + 1).ops[0].gpu
    assert elapsed >= n * LAUNCH  # each op's launch at least
    assert elapsed > 2 * n * kernel  # the GPU idles more than it works: launch-bound
    step = simulated.timeline(lambda: [x + 1 for _ in range(20)]).gpu_step(0)
    assert step.waited_for_host > step.compute


def test_synchronize_waits_for_the_gpu_not_for_the_cpu_computing_its_values(t4) -> None:
    x = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    t0, wall = simulated.modeled_time(), time.perf_counter()
    for _ in range(3):
        x @ x
    torch.cuda.synchronize()
    modeled, wall = simulated.modeled_time() - t0, time.perf_counter() - wall
    queued = 3 * _product(2048)
    assert modeled >= queued  # the host waited for the GPU's queue
    assert modeled < queued + 0.05  # ...and not for this CPU's products (seconds here)
    assert wall > modeled


def test_a_sleep_while_the_gpu_works_hides_the_work(t4) -> None:
    x = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    start, end = _events()
    start.record()
    for _ in range(3):
        x @ x  # queued: about 13 modeled ms on a T4
    time.sleep(0.2)  # longer than the queue: the GPU finishes meanwhile
    end.record()
    torch.cuda.synchronize()
    assert 200.0 <= start.elapsed_time(end) < 1500.0
    t0 = simulated.modeled_time()
    torch.cuda.synchronize()  # nothing left to wait for
    assert simulated.modeled_time() - t0 < 0.05


def test_host_work_is_host_time_and_a_backward_pass_is_the_models(t4) -> None:
    cpu = torch.randn(1024, 1024)
    t0, wall = simulated.modeled_time(), time.perf_counter()
    for _ in range(3):
        cpu @ cpu  # the host's own work (a data loader's, say): its time is the host's
    wall = time.perf_counter() - wall
    assert simulated.modeled_time() - t0 >= 0.9 * wall
    layer = nn.Linear(2048, 2048).to("cuda")
    x = torch.randn(512, 2048, device="cuda")
    torch.cuda.synchronize()
    t0, wall = simulated.modeled_time(), time.perf_counter()
    layer(x).square().mean().backward()
    torch.cuda.synchronize()
    modeled, wall = simulated.modeled_time() - t0, time.perf_counter() - wall
    assert modeled < wall / 2  # the CPU's backward pass is not the host's time


def test_a_modeled_host_clock_moves_by_the_model_alone(no_simulation, monkeypatch) -> None:
    monkeypatch.setenv("DEVLAB_HOST_CLOCK", "modeled")
    devlab.config.simulate_gpus(1, model="T4")
    start, end = _events()
    start.record()
    time.sleep(0.05)
    end.record()
    torch.cuda.synchronize()
    assert start.elapsed_time(end) == 0.0
    with pytest.raises(ValueError, match="DEVLAB_HOST_CLOCK='sometimes'.*'wall'.*'modeled'"):
        host_wall_clock({"DEVLAB_HOST_CLOCK": "sometimes"})


def test_a_modeled_board_describes_itself_as_its_datasheet_does(no_simulation) -> None:
    devlab.config.simulate_gpus(2, model="H100")
    p = torch.cuda.get_device_properties(1)
    h100 = SPECS["H100"]
    assert (p.major, p.minor, p.multi_processor_count) == (9, 0, 132)
    assert p.L2_cache_size == 50 * 1024 * 1024 and p.memory_bus_width == 5120
    # The datasheet's 3.35 TB/s on 5,120 bits at double data rate; 67 TFLOPS on 16,896 cores.
    assert 2 * p.memory_clock_rate * 1e3 * p.memory_bus_width / 8 == pytest.approx(
        h100.memory_bandwidth_gbs * 1e9, rel=1e-3)
    assert 2 * 132 * 128 * p.clock_rate * 1e3 == pytest.approx(h100.fp32_tflops * 1e12, rel=1e-3)
    assert p.warp_size == 32 and not p.is_integrated and p.pci_bus_id == 2
    assert p.uuid != torch.cuda.get_device_properties(0).uuid
    assert p.uuid == torch.cuda.get_device_properties(1).uuid
    assert p.total_memory == torch.cuda.mem_get_info(1)[1]
    assert "multi_processor_count=132," in repr(p)
    assert torch.cuda.get_device_capability(1) == (9, 0)
    devlab.config.stop_simulation()
    devlab.config.simulate_gpus(1)  # no board: this machine's cores, and the repr says so
    p = torch.cuda.get_device_properties(0)
    assert p.multi_processor_count == devlab._helpers.host.cpu_cores()
    assert "this machine's CPU cores: no board modeled" in repr(p)
    devlab.config.stop_simulation()


def test_a_storage_freed_on_a_thread_devlab_runs_is_not_the_hosts_time(t4, monkeypatch) -> None:
    # A queued product's worker drops the last reference to an input the program had deleted:
    # the block's free runs on the worker, while the host, outside the simulation, sleeps.
    from devlab.engine.simulated.base import gpu_workers
    from devlab.engine.simulated.base import session as _session

    x = torch.empty(1000, device="cuda")
    allocator = _session.session.devices[0].allocator
    free = allocator.free

    def slow_free(block):
        time.sleep(0.2)  # a free long enough to see: the host's clock must not stop for it
        return free(block)

    monkeypatch.setattr(allocator, "free", slow_free)
    held = [x]
    del x
    worker = threading.Thread(target=held.clear)
    setattr(worker, gpu_workers.UNROUTED, True)
    start, end = _events()
    start.record()
    worker.start()
    time.sleep(0.3)
    worker.join()
    end.record()
    monkeypatch.undo()
    torch.cuda.synchronize()
    assert start.elapsed_time(end) >= 300.0


def test_computing_says_whether_this_cpu_still_has_the_gpus_work_in_wall_time(t4) -> None:
    # Stream.query() answers on the modeled clock; simulated.computing on this machine's:
    # True while the GPU's worker thread has queued work it has not run.
    from devlab.engine.simulated.base import gpu_workers

    x = torch.randn(256, 256, device="cuda")
    torch.cuda.synchronize()
    assert not simulated.computing(0) and not simulated.computing(torch.device("cuda"))
    gate = threading.Event()
    gpu_workers.submit(0, lambda: gate.wait(10))  # the worker is busy until the gate opens
    try:
        assert simulated.computing(torch.device("cuda", 0)) and simulated.computing(0)
    finally:
        gate.set()
    torch.cuda.synchronize()
    assert not simulated.computing(0)
    assert float((x * 0).sum()) == 0.0
    with pytest.raises(IndexError, match="no simulated GPU 1"):
        simulated.computing(1)


def test_a_storages_free_is_not_the_hosts_time_nor_one_inside_it(t4, monkeypatch) -> None:
    # The free's bracket is one hold of the clock's lock after the allocator's work
    # (Clock.was_inside): the slow free's time is cut out of the host's, and so is a second
    # free the first one sets off (as the garbage collector may, inside the allocator),
    # which is inside the first's bracket and charges nothing of its own.
    from devlab.engine.simulated.base import session as _session

    clock = _session.session.charges.clock
    x = torch.empty(1000, device="cuda")
    inner = [torch.empty(1000, device="cuda")]
    allocator = _session.session.devices[0].allocator
    free = allocator.free
    calls = []

    def slow_free(block):
        calls.append(block)
        time.sleep(0.1)
        if len(calls) == 1:
            inner.clear()  # the second storage dies inside the first's free
            time.sleep(0.1)
        return free(block)

    monkeypatch.setattr(allocator, "free", slow_free)
    before = clock.catch_up()
    del x
    after = clock.catch_up()
    monkeypatch.undo()
    assert len(calls) == 2 and clock._held == 0
    assert after - before < 0.1  # three sleeps of 0.1 s happened inside the frees
    time.sleep(0.05)
    assert clock.catch_up() - after >= 0.05  # and outside, the host's time runs again


GC_INSIDE_THE_CLOCK = """
import gc
import torch
import devlab
from devlab.engine.simulated.base import session
devlab.config.simulate_gpus(1, model="T4")
clock = session.session.charges.clock
gc.disable()
class Cycle:
    pass
c = Cycle(); c.me = c; c.t = torch.ones(1024, device="cuda")
del c
held = torch.cuda.memory_allocated()
real = clock.wall
state = {"collected": 0}
def wall():
    if clock.lock._is_owned() and not state["collected"]:
        state["collected"] = gc.collect()  # as an allocation under the lock may start it
    return real()
clock.wall = wall
x = torch.ones(8, device="cuda") + 1
clock.wall = real
print("collected", state["collected"] > 0, "freed", held - torch.cuda.memory_allocated())
"""


def test_a_free_the_garbage_collector_makes_inside_the_clock_does_not_wait_for_it() -> None:
    # See Note [A free the garbage collector makes] in base/storage_marks.py: the collector,
    # run inside a section under the clock's lock, frees a simulated tensor held in a cycle; the
    # free had waited for the lock its own thread held, for ever. In a process of its own, so
    # that a hang is a timeout here.
    out = subprocess.run([sys.executable, "-c", GC_INSIDE_THE_CLOCK], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    # 4 KiB freed by the collector, less the 512-byte block of the op's output
    assert out.stdout.split() == ["collected", "True", "freed", "3584"], out.stdout
