"""What the simulation finds a real GPU would get wrong now and then (`base.hazards`): a
non_blocking copy to the host read before the host waited for it, a tensor freed while another
stream's work uses it, a tensor freed while another stream's copy to the host still reads it. In the lab each is a `GpuHazardWarning` at the line that read or freed
too early; a listener (the pytest plugin) takes them instead. Every correctly synchronized
form of the same code finds nothing."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

import devlab
from devlab.engine.simulated.base.hazards import (
    FREED_WHILE_IN_USE,
    READ_BEFORE_SYNC,
    READ_OF_FREED,
    GpuHazardWarning,
)


@pytest.fixture(autouse=True)
def _gpus():
    devlab.config.simulate_gpus(2)
    yield
    devlab.config.reset()


def _line() -> int:
    return sys._getframe(1).f_lineno


def findings(fn) -> list:
    got: list = []
    stop = devlab.simulated.listen_findings(got.append)
    try:
        fn()
    finally:
        stop()
    return got


def test_a_non_blocking_copy_read_early_is_a_warning_at_the_read():
    x = torch.arange(6.0, device="cuda")
    host = x.to("cpu", non_blocking=True)
    queued = _line() - 1
    with pytest.warns(GpuHazardWarning, match="read before the host waited") as caught:
        read = _line() + 1
        values = host.tolist()
    assert values == list(range(6))  # right here; on a GPU they may not be, as the finding says
    (w,) = caught.list
    assert (w.filename, w.lineno) == (__file__, read)
    assert f"queued at: {__file__}:{queued} " in str(w.message)
    assert f"read at:  {__file__}:{read} " in str(w.message)


@pytest.mark.parametrize("wait", [
    "torch.cuda.synchronize()",
    "torch.cuda.current_stream().synchronize()",
    "e = torch.cuda.Event(); e.record(); e.synchronize()",
    "e = torch.cuda.Event(); e.record()\nwhile not e.query(): pass",
    "x.sum().item()",  # .item() waits for the stream
    "x.cpu()",  # a blocking copy on the same stream
])
def test_waiting_for_the_copy_finds_nothing(wait):
    x = torch.arange(6.0, device="cuda")

    def run():
        host = x.to("cpu", non_blocking=True)
        exec(wait, {"torch": torch, "x": x})
        assert host.sum().item() == 15.0
    assert findings(run) == []


def test_synchronize_waits_for_the_current_device_only():
    x = torch.arange(4.0, device="cuda:1")

    def run():
        host = x.to("cpu", non_blocking=True)
        torch.cuda.synchronize()  # the current device, cuda:0: not the copy's
        host.sum()
        host = x.to("cpu", non_blocking=True)
        torch.cuda.synchronize(1)
        host.sum()
    assert [f.kind for f in findings(run)] == [READ_BEFORE_SYNC]


def test_an_event_recorded_before_the_copy_does_not_wait_for_it():
    x = torch.arange(6.0, device="cuda")

    def run():
        e = torch.cuda.Event()
        e.record()
        host = x.to("cpu", non_blocking=True)
        e.synchronize()
        host.sum()
    (f,) = findings(run)
    assert f.kind == READ_BEFORE_SYNC


def test_copy_into_pinned_memory_is_pending_into_pageable_it_is_not():
    x = torch.arange(4.0, device="cuda")

    def pinned():
        dst = torch.empty(4).pin_memory()
        dst.copy_(x, non_blocking=True)
        dst.sum()

    def pageable():
        dst = torch.empty(4)
        dst.copy_(x, non_blocking=True)  # CUDA waits: the destination is not pinned
        dst.sum()
    assert [f.kind for f in findings(pinned)] == [READ_BEFORE_SYNC]
    assert findings(pageable) == []


def test_metadata_is_no_read():
    x = torch.arange(4.0, device="cuda")

    def run():
        host = x.to("cpu", non_blocking=True)
        assert host.shape == (4,) and host.size(0) == 4 and host.dim() == 1
        assert host.is_pinned()
        torch.cuda.synchronize()
        host.sum()
    assert findings(run) == []


def test_a_copy_on_a_side_stream_needs_that_stream_waited_for():
    x = torch.arange(4.0, device="cuda")
    side = torch.cuda.Stream()

    def default_only():
        with torch.cuda.stream(side):
            host = x.to("cpu", non_blocking=True)
        torch.cuda.current_stream().synchronize()  # the default stream: not the copy's
        host.sum()

    def side_waited():
        with torch.cuda.stream(side):
            host = x.to("cpu", non_blocking=True)
        side.synchronize()
        host.sum()
    assert [f.kind for f in findings(default_only)] == [READ_BEFORE_SYNC]
    assert findings(side_waited) == []


def _use_on_side(keep: str) -> list:
    side = torch.cuda.Stream()

    def run():
        x = torch.ones(1024, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = x * 2
            done = torch.cuda.Event()
            done.record()
        if keep == "record_stream":
            x.record_stream(side)
        elif keep == "wait_stream":
            torch.cuda.current_stream().wait_stream(side)
        elif keep == "wait_event":
            torch.cuda.current_stream().wait_event(done)
        elif keep == "synchronize":
            torch.cuda.synchronize()
        del x
        return y
    return findings(run)


def test_a_tensor_freed_while_another_stream_uses_it():
    (f,) = _use_on_side("nothing")
    assert f.kind == FREED_WHILE_IN_USE
    assert "allocated on stream 0 was freed while work queued on stream" in f.message
    assert "y = x * 2" in f.queued_at and "del x" in f.early_at


@pytest.mark.parametrize("keep", ["record_stream", "wait_stream", "wait_event", "synchronize"])
def test_keeping_it_for_the_other_stream_finds_nothing(keep):
    assert _use_on_side(keep) == []


def _offload_on_side(keep: str, copy: str = "to") -> list:
    side = torch.cuda.Stream()

    def run():
        x = torch.ones(1024, device="cuda") * 3
        pinned = torch.empty(1024, pin_memory=True)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            if copy == "to":
                host = x.to("cpu", non_blocking=True)
            else:
                host = pinned.copy_(x, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        if keep == "record_stream":
            x.record_stream(side)
        elif keep == "wait_stream":
            torch.cuda.current_stream().wait_stream(side)
        elif keep == "wait_event":
            torch.cuda.current_stream().wait_event(done)
        elif keep == "synchronize":
            side.synchronize()
        del x
        side.synchronize()
        assert host.sum().item() == 3 * 1024
    return findings(run)


@pytest.mark.parametrize("copy", ["to", "copy_"])
def test_a_tensor_freed_while_a_copy_to_the_host_reads_it(copy):
    (f,) = _offload_on_side("nothing", copy)
    assert f.kind == READ_OF_FREED
    assert ("allocated on stream 0 was freed while a non_blocking copy to the host queued on "
            "stream") in f.message
    assert ("host = x.to(" if copy == "to" else "host = pinned.copy_(") in f.queued_at
    assert "del x" in f.early_at
    assert "freed at:" in str(f)


@pytest.mark.parametrize("keep", ["nothing", "record_stream"])
def test_a_tensor_freed_while_a_copy_within_the_gpu_on_another_stream_reads_it(keep):
    side = torch.cuda.Stream()

    def run():
        x = torch.ones(1024, device="cuda")
        y = torch.empty(1024, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y.copy_(x, non_blocking=True)
        if keep == "record_stream":
            x.record_stream(side)
            y.record_stream(side)
        del x
        torch.cuda.current_stream().wait_stream(side)
        assert y.sum().item() == 1024
    got = findings(run)
    if keep == "nothing":
        (f,) = got
        assert f.kind == FREED_WHILE_IN_USE
        assert "y.copy_(x, non_blocking=True)" in f.queued_at and "del x" in f.early_at
    else:
        assert got == []


@pytest.mark.parametrize("keep", ["record_stream", "wait_stream", "wait_event", "synchronize"])
def test_keeping_it_for_the_copy_finds_nothing(keep):
    assert _offload_on_side(keep) == []


def test_a_copy_to_the_host_on_the_tensors_own_stream_finds_nothing():
    def run():
        x = torch.ones(1024, device="cuda")
        host = x.to("cpu", non_blocking=True)
        del x  # the copy is ahead of the next allocation on the same stream
        torch.cuda.synchronize()
        assert host.sum().item() == 1024
    assert findings(run) == []


def test_a_tensor_made_and_used_on_one_side_stream_finds_nothing():
    side = torch.cuda.Stream()

    def run():
        with torch.cuda.stream(side):
            x = torch.ones(1024, device="cuda")
            y = x * 2
            del x
        return y
    assert findings(run) == []


def test_without_streams_or_copies_nothing_is_tracked():
    from devlab.engine.simulated.base import hazards

    x = torch.ones(8, device="cuda")
    (x @ x.view(8, 1)).sum().item()
    assert not hazards.armed and not hazards.tracking


def test_fresh_start_forgets_pending_work_and_resets_the_gpus():
    host = torch.ones(4, device="cuda").to("cpu", non_blocking=True)
    torch.cuda.set_device(1)
    torch.cuda.set_stream(torch.cuda.Stream())
    keep = torch.ones(256, 1024, device="cuda")  # 1 MiB on cuda:1
    tmp = torch.ones(1024, 1024, device="cuda")  # 4 MiB, freed: its segment stays cached
    cached = tmp.nbytes
    del tmp
    left = devlab.simulated.fresh_start()
    assert left == [0, keep.nbytes]
    assert torch.cuda.current_device() == 0
    assert torch.cuda.current_stream(1) == torch.cuda.default_stream(1)
    assert torch.cuda.max_memory_allocated(1) == keep.nbytes
    assert torch.cuda.memory_reserved(1) < cached  # empty_cache gave its segment back
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        host.sum()  # forgotten: no finding


def test_fresh_start_after_a_fresh_start_still_resets_what_ran_between():
    devlab.simulated.fresh_start()
    devlab.simulated.fresh_start()  # nothing ran between: the GPUs are left as they are
    x = torch.ones(1024, 1024, device="cuda:1")
    del x
    assert torch.cuda.max_memory_allocated(1) > 0 and torch.cuda.memory_reserved(1) > 0
    assert devlab.simulated.fresh_start() == [0, 0]
    assert torch.cuda.max_memory_allocated(1) == 0 and torch.cuda.memory_reserved(1) == 0
    torch.cuda.set_stream(torch.cuda.Stream(device=0))
    devlab.simulated.fresh_start()
    assert torch.cuda.current_stream(0) == torch.cuda.default_stream(0)


def test_passing_a_pending_buffer_on_to_a_gpu_is_no_host_read():
    x = torch.arange(4.0, device="cuda:0")

    def run():
        staging = torch.empty(4).pin_memory()
        staging.copy_(x, non_blocking=True)
        y = staging.to("cuda:1", non_blocking=True)  # queued behind the copy, as on CUDA
        z = torch.empty(4, device="cuda:1")
        z.copy_(staging, non_blocking=True)
        torch.cuda.synchronize()
        return y.sum().item() + z.sum().item()
    assert findings(run) == []


def test_the_placement_log_notes_a_finding_as_a_warning():
    x = torch.arange(4.0, device="cuda")
    with warnings.catch_warnings(record=True) as caught, \
            devlab.placement_log.capture() as log:
        warnings.simplefilter("always")
        host = x.to("cpu", non_blocking=True)
        host.sum()
    assert [w.category for w in caught] == [GpuHazardWarning]
    notes = [e.reason for e in log.events if e.kind == "note"]
    assert len(notes) == 1 and notes[0].startswith("Warning: a non_blocking copy from cuda:0")
