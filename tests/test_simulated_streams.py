"""CUDA streams and events on simulated GPUs, read through torch's own API: a simulated stream
is a `torch.Stream` (torch's C++ argument parser takes it), with CUDA's stream ids, the current
stream kept per thread and per GPU, and `record_stream` reaching the caching allocator."""

from __future__ import annotations

import threading

import pytest
import torch

import devlab
from devlab.engine.simulated.base import gpu_workers as _workers

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _stop():
    yield
    devlab.config.reset()


def test_streams_are_torch_streams_with_cudas_ids() -> None:
    devlab.config.simulate_gpus(2)
    default = torch.cuda.current_stream()
    assert isinstance(default, torch.Stream) and isinstance(default, torch.cuda.Stream)
    assert (default.stream_id, default.device_index, default.device_type) == (0, 0, 1)
    assert default == torch.cuda.default_stream(0) == torch.cuda.default_stream()
    # c10's pool: priority 0 gives (index << 5) | 3, round robin over 32 streams per GPU;
    # priority -1 is the next pool, (index << 5) | 5.
    ids = [torch.cuda.Stream().stream_id for _ in range(33)]
    assert ids[:3] == [3, 35, 67] and ids[32] == ids[0] and len(set(ids)) == 32
    high = torch.cuda.Stream(priority=-1)
    assert (high.stream_id, high.priority) == (5, -1)
    assert torch.cuda.Stream(priority=-9).priority == -3  # clamped, as CUDA's
    assert torch.cuda.Stream.priority_range() == (0, -3)
    on1 = torch.cuda.Stream("cuda:1")
    assert (on1.stream_id, on1.device) == (3, torch.device("cuda:1"))  # its own pool
    assert torch.Stream("cuda:1").stream_id == 35  # the device-generic class is the same
    assert type(torch.Stream("cpu")) is torch._C.Stream  # another device: torch's own


def test_the_current_stream_is_per_thread_and_per_gpu() -> None:
    devlab.config.simulate_gpus(2)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert torch.cuda.current_stream() == s
        assert torch.cuda.current_stream(1).stream_id == 0
        seen: list[int] = []
        t = threading.Thread(target=lambda: seen.append(torch.cuda.current_stream().stream_id))
        t.start()
        t.join()
        assert seen == [0]  # a new thread starts on the default stream
    assert torch.cuda.current_stream().stream_id == 0
    other = torch.cuda.Stream(1)
    with torch.cuda.stream(other):  # a stream on another GPU makes that GPU current
        assert torch.cuda.current_device() == 1 and torch.cuda.current_stream() == other
    assert torch.cuda.current_device() == 0 and torch.cuda.current_stream(1).stream_id == 0
    torch.cuda.set_stream(other)
    assert torch.cuda.current_device() == 1 and torch.cuda.current_stream(1) == other
    torch.cuda.set_stream(torch.cuda.default_stream(0))
    assert torch.cuda.current_device() == 0
    with s:  # torch.Stream's own context manager
        assert torch.cuda.current_stream() == s
        with torch.cuda.default_stream(), s:
            assert torch.cuda.current_stream() == s
        assert torch.cuda.current_stream() == s
    assert torch.cuda.current_stream().stream_id == 0
    with torch.cuda.stream(None):
        assert torch.cuda.current_stream().stream_id == 0
    with pytest.raises(TypeError, match="stream of a simulated GPU"):
        torch.cuda.stream(object())


def test_streams_go_where_torch_takes_a_cuda_stream() -> None:
    devlab.config.simulate_gpus(1)
    s = torch.cuda.Stream()
    x = torch.ones(4, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x * 2
    torch.cuda.current_stream().wait_stream(s)
    e = torch.cuda.Event()
    e.record(s)
    s.wait_event(e)
    e.wait(torch.cuda.current_stream())
    assert s.record_event().query()
    y.record_stream(s)
    x.record_stream(torch.cuda.current_stream())
    assert y.tolist() == [2.0] * 4
    with pytest.raises(NotImplementedError, match="'CPU' backend"):
        torch.ones(1).record_stream(s)  # torch's own error for a host tensor


def test_record_stream_holds_the_block_until_the_stream_is_done() -> None:
    devlab.config.simulate_gpus(1)
    s = torch.cuda.Stream()
    x = torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")
    x.record_stream(s)
    del x
    stats = torch.cuda.memory_stats()
    reserved = stats["reserved_bytes.all.current"]
    # freed by the program, still active for the allocator until s's work is done
    assert (stats["allocated_bytes.all.current"], stats["active_bytes.all.current"]) == (
        0, 4 * MIB)
    # s has no work pending, so the next allocation (which processes the allocator's events,
    # as CUDA's malloc does) frees the block first and reuses it
    y = torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")
    stats = torch.cuda.memory_stats()
    assert (stats["active_bytes.all.current"], stats["reserved_bytes.all.current"]) == (
        4 * MIB, reserved)
    del y


# --- the modeled clock: a T4 -----------------------------------------------------------------

def _event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)


def _ms(work, side: torch.cuda.Stream) -> float:
    """Modeled milliseconds from an idle GPU until `work()` is done, the default stream
    waiting for `side` at the end."""
    torch.cuda.synchronize()
    start, end = _event(), _event()
    start.record()
    work()
    torch.cuda.current_stream().wait_stream(side)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


@pytest.mark.usefixtures("modeled_host")
def test_a_copy_on_a_side_stream_overlaps_a_product_on_the_default_stream() -> None:
    devlab.config.simulate_gpus(1, model="T4")
    a = torch.randn(1024, 1024, device="cuda")
    host = torch.empty(16 * MIB, dtype=torch.uint8, pin_memory=True)
    s = torch.cuda.Stream()
    product = _ms(lambda: a @ a, s)
    copy = _ms(lambda: host.to("cuda", non_blocking=True), s)

    def overlapped() -> None:
        with torch.cuda.stream(s):
            host.to("cuda", non_blocking=True)
        a @ a

    def serial() -> None:
        host.to("cuda", non_blocking=True)
        a @ a

    both, one_stream = _ms(overlapped, s), _ms(serial, s)
    # (the same copy's end less its start, from two starting points: equal up to rounding)
    assert max(product, copy) <= both * (1 + 1e-12) and both < 0.9 * (product + copy)
    assert one_stream >= 0.99 * (product + copy)  # one stream: one after the other


def test_work_on_a_stream_starts_after_what_it_waits_for() -> None:
    devlab.config.simulate_gpus(1, model="T4")
    a = torch.randn(1024, 1024, device="cuda")
    host = torch.empty(MIB, dtype=torch.uint8, pin_memory=True)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    begin, product_done, copied, waited = _event(), _event(), _event(), _event()
    begin.record()
    a @ a
    product_done.record()
    with torch.cuda.stream(s):
        host.to("cuda", non_blocking=True)  # no wait: runs beside the product
        copied.record()
        s.wait_stream(torch.cuda.default_stream())
        host.to("cuda", non_blocking=True)  # after the product
        waited.record(s)
    torch.cuda.synchronize()  # waits for every stream
    product_ms = begin.elapsed_time(product_done)
    assert begin.elapsed_time(copied) < product_ms  # events on two streams compare
    assert begin.elapsed_time(waited) > product_ms
    assert copied.elapsed_time(waited) > 0
    # wait_event: the same, from an event
    e = torch.cuda.Event()
    a @ a
    e.record()
    after = _event()
    with torch.cuda.stream(s):
        s.wait_event(e)
        host.to("cuda", non_blocking=True)
        after.record()
    torch.cuda.synchronize()
    assert product_done.elapsed_time(after) > product_ms


@pytest.mark.usefixtures("modeled_host")
def test_synchronize_waits_for_every_stream_and_a_stream_for_its_own() -> None:
    devlab.config.simulate_gpus(1, model="T4")
    host = torch.empty(64 * MIB, dtype=torch.uint8, pin_memory=True)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    start, side_done = _event(), _event()
    start.record()
    with torch.cuda.stream(s):
        host.to("cuda", non_blocking=True)
        side_done.record()
    torch.cuda.default_stream().synchronize()  # the default stream has nothing queued
    early = _event()
    early.record()
    torch.cuda.synchronize()
    late = _event()
    late.record()
    assert start.elapsed_time(early) < start.elapsed_time(side_done) <= start.elapsed_time(late)
    s.synchronize()


def test_allocations_on_a_side_stream_come_from_its_own_pool() -> None:
    devlab.config.simulate_gpus(1)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.empty(MIB, dtype=torch.uint8, device="cuda")
    segments = torch.cuda.memory_snapshot()
    assert [seg["stream"] for seg in segments] == [s.stream_id]
    reserved = torch.cuda.memory_reserved()
    del x  # cached in s's pool: an allocation on the default stream takes a new segment
    y = torch.empty(MIB, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_reserved() == 2 * reserved
    del y
    with torch.cuda.stream(s):  # on s again, the cached block is reused
        z = torch.empty(MIB, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_reserved() == 2 * reserved
    del z


@pytest.mark.usefixtures("modeled_host")
def test_record_stream_delays_reuse_until_the_streams_modeled_work_is_done() -> None:
    devlab.config.simulate_gpus(1, model="T4")
    host = torch.empty(64 * MIB, dtype=torch.uint8, pin_memory=True)
    a = torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        host.to("cuda", non_blocking=True)  # ~5 ms of modeled work queued on s
        a.add_(1)  # then a is used on s
    a.record_stream(s)
    del a
    # s has not reached its work yet: the block is held back, the next one is another
    b = torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")
    stats = torch.cuda.memory_stats()
    assert (stats["allocated_bytes.all.current"], stats["active_bytes.all.current"]) == (
        4 * MIB, 8 * MIB)
    del b
    torch.cuda.synchronize()  # the host has waited for s: the next allocation frees it
    c = torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_stats()["active_bytes.all.current"] == 4 * MIB
    del c


def test_backward_ops_run_on_their_forward_ops_stream() -> None:
    devlab.config.simulate_gpus(1, model="T4")
    w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    x = torch.randn(1024, 1024, device="cuda")
    s = torch.cuda.Stream()
    product = _ms(lambda: x @ x, s)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        loss = (x @ w).sum()
    torch.cuda.synchronize()
    on_s_before, on_s_after, after = _event(), _event(), _event()
    on_s_before.record(s)
    loss.backward()  # from the default stream: the engine syncs it with s at the end
    on_s_after.record(s)
    after.record()
    torch.cuda.synchronize()
    # the product's backward (a product for w's gradient) ran on s, where its forward ran
    assert on_s_before.elapsed_time(on_s_after) >= 0.9 * product
    # and the default stream waited for it
    assert on_s_before.elapsed_time(after) >= on_s_before.elapsed_time(on_s_after)
    assert torch.allclose(w.grad, x.t() @ torch.ones(1024, 1024, device="cuda"))


def test_backward_called_on_a_side_stream_runs_the_ops_on_their_forward_stream() -> None:
    devlab.config.simulate_gpus(1, model="T4")
    w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    x = torch.randn(1024, 1024, device="cuda")
    loss = (x @ w).sum()  # forward on the default stream
    s = torch.cuda.Stream()
    product = _ms(lambda: x @ x, s)
    torch.cuda.synchronize()
    default_before, default_after, on_s = _event(), _event(), _event()
    default_before.record()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        loss.backward()
        on_s.record()  # "use grads" in the same stream context: safe
    default_after.record()
    torch.cuda.synchronize()
    # the backward product ran on the default stream, and s (the caller's) waited for it
    assert default_before.elapsed_time(default_after) >= 0.9 * product
    assert default_before.elapsed_time(on_s) >= default_before.elapsed_time(default_after)


def test_bad_streams_are_refused_in_torchs_words_and_change_nothing() -> None:
    devlab.config.simulate_gpus(2)
    with pytest.raises(ValueError, match="Expected a cuda device"):
        torch.cuda.Stream("cpu")
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.cuda.Stream(5)
    s = torch.cuda.Stream()
    with pytest.raises(TypeError, match="wait_stream expects a CUDA stream"):
        s.wait_stream(object())
    with pytest.raises(TypeError, match="Event.record expects a CUDA stream"):
        torch.cuda.Event().record(torch.Stream("cpu"))
    with pytest.raises(TypeError, match="stream_id="):
        torch.cuda.Stream(stream_ptr=1)
    with pytest.raises(AssertionError, match="Invalid device id"), torch.cuda.stream(
            torch.cuda.Stream(stream_id=3, device_index=7)):
        pass
    assert torch.cuda.current_stream().stream_id == 0 and torch.cuda.current_device() == 0
    torch.cuda.set_stream(s)
    devlab.config.reset()  # a new simulation starts on default streams, its pools from the start
    devlab.config.simulate_gpus(1)
    assert torch.cuda.current_stream().stream_id == 0
    assert torch.cuda.Stream().stream_id == 3


def test_caching_allocator_alloc_takes_the_stream_it_is_given() -> None:
    devlab.config.simulate_gpus(1)
    s = torch.cuda.Stream()
    ptr = torch.cuda.caching_allocator_alloc(MIB, 0, s)
    assert [seg["stream"] for seg in torch.cuda.memory_snapshot()] == [s.stream_id]
    torch.cuda.caching_allocator_delete(ptr)


_REAL_EXTERNAL_STREAM = torch.cuda.ExternalStream  # torch's own, before any simulation


def test_an_external_stream_is_the_simulated_stream_its_pointer_names() -> None:
    devlab.config.simulate_gpus(2, model="T4")
    s = torch.cuda.Stream()
    ext = torch.cuda.ExternalStream(s.cuda_stream)
    assert isinstance(ext, torch.cuda.ExternalStream) and isinstance(ext, torch.Stream)
    assert ext == s and (ext.stream_id, ext.device_index) == (s.stream_id, 0)
    on1 = torch.cuda.ExternalStream(torch.cuda.default_stream(1).cuda_stream, device=1)
    assert on1 == torch.cuda.default_stream(1)
    # work queued through the external stream is the pool stream's: one queue on the clock
    a = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(ext):
        assert torch.cuda.current_stream() == s
        a @ a
    assert not s.query() and torch.cuda.current_stream().query()
    s.synchronize()
    assert ext.query()
    y = torch.ones(4, device="cuda")
    y.record_stream(ext)  # torch's C++ argument parser takes it
    before = torch.cuda.current_stream()
    for ptr, error, words in ((0x7F3A_2000_0000, ValueError, "no CUDA stream of another"),
                              (2, ValueError, "stream_ptr=0x2"), (-1, TypeError, "integer"),
                              ("3", TypeError, "integer")):
        with pytest.raises(error, match=words):
            torch.cuda.ExternalStream(ptr)
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.cuda.ExternalStream(0, device=5)
    assert torch.cuda.current_stream() == before
    devlab.config.reset()
    assert torch.cuda.ExternalStream is _REAL_EXTERNAL_STREAM  # restored at stop


@pytest.mark.usefixtures("modeled_host")
def test_queries_answer_from_the_modeled_clock() -> None:
    devlab.config.simulate_gpus(1, model="T4")
    a = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    assert torch.cuda.Event().query()  # never recorded: done, as CUDA's
    e = torch.cuda.Event(enable_timing=True)
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    a @ a  # milliseconds of modeled T4 work; the host's next call comes microseconds later
    e.record()
    _workers.wait(0)  # the CPU has computed the product: only the modeled clock is behind
    assert not e.query() and not torch.cuda.current_stream().query()
    assert e.query() is False  # asking again does not wait for it
    e.synchronize()
    assert e.query() and torch.cuda.current_stream().query()
    # a loop polling an unfinished event ends, each query costing the host a call's time
    a @ a
    e.record()
    polls = 0
    while not e.query():
        polls += 1
    assert polls > 10 and torch.cuda.current_stream().query()
    assert start.elapsed_time(e) > 0
    # a side stream's query is its own: the default stream's work does not keep it busy
    s = torch.cuda.Stream()
    a @ a
    assert s.query() and not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert torch.cuda.current_stream().query()


def test_the_pure_clock_queues_work_on_the_stream_its_caller_names() -> None:
    # The pure clock (gpu_model.modeled_clock) knows no thread: the simulation passes the
    # current stream; a GPU its caller does not name runs on its default stream.
    from devlab.engine import gpu_model
    from devlab.engine.gpu_model.modeled_clock import Clock, OpTime

    spec = gpu_model.gpu("T4")
    clock = Clock(spec, 2)
    launch = spec.launch_latency_us * 1e-6
    k = OpTime("k", 0, launch, 0.0, 1e-3, 0, 0)
    clock.kernels((k,), 7)  # GPU 0's stream 7
    assert clock.reached(0, 7) == pytest.approx(launch + k.gpu)
    assert clock.reached(0) == clock.now() == pytest.approx(launch)  # the default: idle
    clock.kernel(k, {0: 7, 1: 3})  # each kernel on its GPU's stream in the mapping
    assert clock.reached(0, 7) == pytest.approx(launch + 2 * k.gpu)
    assert clock.reached(1, 3) == clock.reached(1) == clock.now()  # GPU 1 ran nothing
    clock.kernel(k)  # no streams named: the default stream, behind stream 7 on the compute
    assert clock.reached(0) == pytest.approx(launch + 3 * k.gpu)
    copied = clock.now()
    clock.copy(None, 1, 1 << 20, False, streams={1: 3})
    assert clock.reached(1, 3) > clock.now() > copied and clock.reached(1) == clock.now()
