"""CUDA streams and events on simulated GPUs, read through torch's own API: a simulated stream
is a `torch.Stream` (torch's C++ argument parser takes it), with CUDA's stream ids, the current
stream kept per thread and per GPU, and `record_stream` reaching the caching allocator."""

from __future__ import annotations

import threading

import pytest
import torch

import devlab

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
