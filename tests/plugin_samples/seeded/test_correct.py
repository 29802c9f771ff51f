"""The same code written correctly: passes on CPU and on simulated GPUs alike."""

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class Scaler(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight * self.scale


def test_buffer_moves_with_module():
    m = Scaler().to(DEVICE)
    assert m(torch.ones(4, device=DEVICE)).sum().item() == 8.0


def test_non_blocking_copy_synchronized():
    loss = torch.tensor([1.5, 2.5], device=DEVICE) * 2
    host = loss.to("cpu", non_blocking=True)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    assert host.tolist() == [3.0, 5.0]


def test_non_blocking_copy_waited_by_event():
    loss = torch.arange(4.0, device=DEVICE)
    host = torch.empty(4).pin_memory() if DEVICE == "cuda" else torch.empty(4)
    host.copy_(loss, non_blocking=True)
    if DEVICE == "cuda":
        done = torch.cuda.Event()
        done.record()
        done.synchronize()
    assert host.sum().item() == 6.0


def test_record_stream_keeps_it():
    if DEVICE == "cpu":
        return
    side = torch.cuda.Stream()
    x = torch.randn(256, device=DEVICE)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x * 2
    x.record_stream(side)
    del x
    torch.cuda.current_stream().wait_stream(side)
    assert y.shape == (256,)


def offload(t: torch.Tensor) -> tuple[torch.Tensor, object]:
    if not t.is_cuda:
        return t.clone(), None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        saved = t.to("cpu", non_blocking=True)
    t.record_stream(side)  # the allocator keeps t's block until the side stream's copy is done
    return saved, side


def test_offloaded_tensor_kept_for_its_copy():
    act = torch.randn(1024, device=DEVICE) * 2
    saved, side = offload(act)
    expected = act.sum().item()
    del act
    if side is not None:
        side.synchronize()
    assert abs(saved.sum().item() - expected) < 1e-3


def halve_until_it_fits(batch: int) -> int:
    while batch > 1:
        try:
            torch.empty(batch, 1024, 1024, device=DEVICE)
            return batch
        except torch.OutOfMemoryError:
            batch //= 2
    return batch


def test_oom_back_off_catches_cudas_error():
    assert halve_until_it_fits(64) >= 1
