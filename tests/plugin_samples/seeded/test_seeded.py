"""Bugs CPU-only CI lets through, one per test, written as a library's tests are: each picks
"cuda" when it is there and "cpu" otherwise, so on a CPU-only machine every one passes."""

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class Scaler(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))
        self.scale = torch.full((4,), 2.0)  # a plain attribute: .to(device) leaves it behind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight * self.scale


def test_plain_attribute_left_on_cpu():
    m = Scaler().to(DEVICE)
    assert m(torch.ones(4, device=DEVICE)).sum().item() == 8.0


def test_tensor_on_the_wrong_gpu():
    x = torch.ones(3, device=DEVICE)
    if torch.cuda.device_count() > 1:
        x = x.to("cuda:1")  # the input is on the second GPU
    mask = torch.ones(3, device=DEVICE)  # "cuda" is cuda:0
    assert (x * mask).sum().item() == 3.0


def test_non_blocking_copy_read_before_sync():
    loss = torch.tensor([1.5, 2.5], device=DEVICE) * 2
    host = loss.to("cpu", non_blocking=True)
    assert host.tolist() == [3.0, 5.0]  # no synchronize between the copy and the read


def test_freed_while_another_stream_uses_it():
    if DEVICE == "cpu":
        return  # streams exist only on CUDA: the test has nothing to check here
    side = torch.cuda.Stream()
    x = torch.randn(256, device=DEVICE)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x * 2  # side stream reads x ...
    del x  # ... which is freed on the default stream without x.record_stream(side)
    torch.cuda.current_stream().wait_stream(side)
    assert y.shape == (256,)


def offload(t: torch.Tensor) -> torch.Tensor:
    """Activation offloading as libraries write it: the copy to the host runs on a side stream,
    overlapped with the default stream's compute; the host tensor is waited for before use."""
    if not t.is_cuda:
        return t.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        saved = t.to("cpu", non_blocking=True)  # the side stream reads t's block ...
    OFFLOADED.append(side)
    return saved


OFFLOADED: list = []


def test_offloaded_tensor_freed_before_its_copy():
    act = torch.randn(1024, device=DEVICE) * 2
    saved = offload(act)
    expected = act.sum().item()
    del act  # ... freed here without act.record_stream(side): the next tensor may reuse it
    for side in OFFLOADED:
        side.synchronize()
    assert abs(saved.sum().item() - expected) < 1e-3


def halve_until_it_fits(batch: int) -> int:
    """OOM back-off, as training loops write it; the bug: MemoryError is the CPU's exception,
    CUDA raises torch.OutOfMemoryError."""
    while batch > 1:
        try:
            torch.empty(batch, 1024, 1024, device=DEVICE)  # batch MiB of float32 * 4
            return batch
        except MemoryError:
            batch //= 2
    return batch


def test_oom_back_off():
    assert halve_until_it_fits(64) >= 1
