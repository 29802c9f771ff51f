from __future__ import annotations

import io

import pytest
import torch

import devlab
from devlab.core import debugging, placement_log

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"


def test_every_op_gets_a_tensorflow_style_line() -> None:
    with placement_log.capture() as log:
        a = torch.ones(3, 3)
        a @ a
    assert log.lines() == [
        f"Executing op aten::ones in device {CPU0}",
        f"Executing op aten::mm in device {CPU0}",
    ]


def test_backward_ops_are_logged_too() -> None:
    w = torch.ones(3, requires_grad=True)
    with placement_log.capture() as log:
        loss = (w * 2).sum()
        loss.backward()
    ops = [e.op for e in log.events]
    forward = ops.index("aten::sum")
    assert "aten::mul" in ops[forward + 1:], "the backward pass's mul is missing"
    assert w.grad is not None


def test_copies_between_devices_are_their_own_line_with_bytes() -> None:
    x = torch.ones(4, 2)  # 32 bytes
    with placement_log.capture() as log:
        x.to("meta")
    (copy,) = [e for e in log.events if e.kind == "copy"]
    assert copy.nbytes == 32
    assert copy.text() == f"Copy 32 B from {CPU0} to meta (aten::_to_copy)"
    summary = log.summary()
    assert (summary.copies, summary.copied_bytes, summary.syncs) == (1, 32, 0)


def test_summary_counts_ops_per_device() -> None:
    with placement_log.capture() as log:
        x = torch.ones(2)
        (x + x).sum().item()
    s = log.summary()
    assert s.ops_per_device == {CPU0: 4}
    assert s.text() == "Placement summary: 4 ops (CPU:0 4) · 0 copies between devices (0 B) · 0 host syncs"


def test_host_reads_on_the_cpu_are_not_syncs() -> None:
    with placement_log.capture() as log:
        x = torch.arange(4.0)
        x.sum().item()
        x.tolist()
        print(x)
    assert log.summary().syncs == 0


def test_long_logs_collapse_with_a_count_and_save_in_full(tmp_path) -> None:
    with placement_log.capture() as log:
        x = torch.ones(2)
        for _ in range(500):
            x = x + 1
    text = log.render_text(limit=10)
    lines = text.splitlines()
    assert len(lines) == 12
    assert lines[10].startswith("… 491 more lines not shown")
    html = log.render_html(limit=10)
    assert html.count("Executing op") == 10
    saved = log.save(tmp_path / "log.txt").read_text().splitlines()
    assert len(saved) == 502 and saved[-1].startswith("Placement summary: 501 ops")
    with pytest.raises(ValueError, match="limit is the number of log lines"):
        log.render_text(limit=-1)


def test_switch_streams_lines_outside_a_notebook(monkeypatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    debugging.set_log_device_placement(True)
    assert debugging.get_log_device_placement()
    torch.zeros(1) + 1
    debugging.set_log_device_placement(False)
    torch.zeros(1)
    assert out.getvalue().splitlines() == [
        f"Executing op aten::zeros in device {CPU0}",
        f"Executing op aten::add in device {CPU0}",
    ]


def test_a_per_cell_log_is_kept_to_be_shown_and_a_streamed_one_is_not(monkeypatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    debugging.start_log(per_cell=True)  # what the notebook extension does at a cell's start
    torch.zeros(1)
    finished = debugging.finish_log()
    assert out.getvalue() == "", "a per-cell log waits for the cell's end"
    assert debugging.take_finished() == [finished]
    assert finished is not None and finished.lines() == [f"Executing op aten::zeros in device {CPU0}"]
    debugging.start_log()
    torch.zeros(1)
    debugging.finish_log()
    assert out.getvalue() == f"Executing op aten::zeros in device {CPU0}\n"
    assert debugging.take_finished() == [], "streamed lines are shown already; the log is not kept"


def test_logging_leaves_no_mode_or_patch_behind_after_an_error() -> None:
    original = torch._tensor_str._str
    with pytest.raises(ZeroDivisionError):
        with placement_log.capture():
            assert torch._tensor_str._str is not original
            raise ZeroDivisionError("inside a logged block")
    assert torch._tensor_str._str is original
    assert torch._C._len_torch_dispatch_stack() == 0
    assert placement_log.active_logs() == []


def test_log_is_empty_when_off() -> None:
    assert torch._C._len_torch_dispatch_stack() == 0
    assert not devlab.debugging.get_log_device_placement()


GPU0 = "/job:localhost/replica:0/task:0/device:GPU:0"
GPU1 = "/job:localhost/replica:0/task:0/device:GPU:1"


@pytest.fixture
def two_gpus():
    devlab.config.simulate_gpus(2)
    yield
    devlab.config.stop_simulation()


def test_each_host_read_of_a_gpu_tensor_is_a_sync(two_gpus) -> None:
    x = torch.arange(6.0, device="cuda:0")
    cases = {
        "item": lambda: x.sum().item(),
        "float": lambda: float(x[0]),
        "cpu": lambda: x.cpu(),
        "tolist": lambda: x.tolist(),
        "numpy": lambda: x.cpu().numpy(),
        "print": lambda: print(x),
        "bool": lambda: bool(x[1] > 0),
    }
    for name, read in cases.items():
        with placement_log.capture() as log:
            read()
        syncs = [e for e in log.events if e.kind == "sync"]
        assert len(syncs) == 1, f"{name}: {log.lines()}"
        assert syncs[0].device == torch.device("cuda", 0)
        assert syncs[0].text().startswith(f"Host sync: the host waited for {GPU0} (")


def test_ops_on_a_gpu_and_copies_between_gpus(two_gpus) -> None:
    with placement_log.capture() as log:
        x = torch.ones(2, 3, device="cuda:0")
        z = x.cuda(1)
        y = torch.rand(2, 3, device="cuda:1")
        y + z
    lines = log.lines()
    assert lines[0] == f"Executing op aten::ones in device {GPU0}"
    assert f"Copy 24 B from {GPU0} to {GPU1} (aten::_to_copy)" in lines
    assert lines[-1] == f"Executing op aten::add in device {GPU1}"
    s = log.summary()
    assert (s.copies, s.copied_bytes, s.syncs) == (1, 24, 0)
    assert s.ops_per_device == {GPU0: 1, GPU1: 2}


def test_backward_on_a_gpu_is_logged_on_the_gpu(two_gpus) -> None:
    w = torch.ones(3, device="cuda:1", requires_grad=True)
    with placement_log.capture() as log:
        (w * w).sum().backward()
    devices = {e.device for e in log.events if e.kind == "op"}
    assert devices == {torch.device("cuda", 1)}
    assert len(log) >= 4


def test_a_higher_order_operator_is_one_line_on_its_device(two_gpus) -> None:
    """torch.cond runs whole below the log, one line named for it, on the GPU of its operands
    (a dispatch mode that did not take higher-order operators made them raise)."""
    x = torch.arange(3.0, device="cuda:1")
    with placement_log.capture() as log:
        y = torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))
    assert f"Executing op higher_order::cond in device {GPU1}" in log.lines()
    assert y.device == torch.device("cuda", 1) and torch.allclose(y.cpu(), torch.arange(3.0).sin())
