"""Convolutions launched on a simulated GPU's worker, and outputs that take the memory of dropped
ones still queued (mode/async_launch.py: `launch_conv`, Note [A queued output takes a dropped
one's memory]). The random programs of tests/test_simulated_async_elementwise.py run both with
the launch on and off."""

from __future__ import annotations

import random
import resource
import threading

import pytest
import torch

import devlab
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.mode import async_launch as _launch


def _hold(index: int) -> threading.Event:
    """Hold GPU `index`'s queue until the returned gate is set."""
    gate = threading.Event()
    _workers.submit(index, lambda: gate.wait(10))
    return gate


def _pending(index: int = 0) -> int:
    w = _workers._workers.get(index)
    return 0 if w is None else w.pending


def test_convolutions_return_before_the_work_and_a_sync_waits(no_simulation) -> None:
    devlab.simulated.start(1, model="T4")
    x = torch.randn(4, 16, 32, 32, device="cuda")
    w = torch.randn(32, 16, 3, 3, device="cuda")
    conv = torch.nn.Conv2d(16, 8, 5, padding=2).cuda()
    up = torch.randn(16, 4, 2, 2, device="cuda")
    before = torch.cuda.memory_allocated()
    gate = _hold(0)
    a = torch.nn.functional.conv2d(x, w, None, 1, 1)
    with torch.no_grad():
        b = conv(x)  # the module's weight requires grad: queued only without autograd
    c = torch.conv_transpose2d(x, up, stride=2)
    assert _pending() == 4  # the three convolutions wait behind the gate
    assert (a.shape, b.shape, c.shape) == ((4, 32, 32, 32), (4, 8, 32, 32), (4, 4, 64, 64))
    assert a.device == b.device == c.device == torch.device("cuda:0") and a._version == 0
    # the outputs are counted at launch, as a GPU's caching allocator counts them
    assert torch.cuda.memory_allocated() - before == 4 * (a.numel() + b.numel() + c.numel())
    threading.Timer(0.05, gate.set).start()
    torch.cuda.synchronize()
    assert _pending() == 0
    with torch.no_grad():
        assert torch.equal(a.cpu(), torch.conv2d(x.cpu(), w.cpu(), None, 1, 1))
        assert torch.equal(b.cpu(), torch.conv2d(x.cpu(), conv.weight.cpu(), conv.bias.cpu(),
                                                 padding=2))
        assert torch.equal(c.cpu(), torch.conv_transpose2d(x.cpu(), up.cpu(), stride=2))


def test_convolutions_the_launch_leaves_here(no_simulation) -> None:
    devlab.simulated.start(1)
    x = torch.randn(4, 16, 32, 32, device="cuda")
    w = torch.randn(32, 16, 3, 3, device="cuda")
    learned = torch.randn(32, 16, 3, 3, device="cuda", requires_grad=True)
    narrow = torch.randn(32, 8, 3, 3, device="cuda")
    with pytest.raises(RuntimeError, match="to have 8 channels"):
        torch.conv2d(x, narrow)  # torch's error, raised here: nothing queued
    w0 = _workers._workers.get(0)
    assert w0 is None or (w0.pending == 0 and w0.error is None)
    torch.cuda.synchronize()  # nothing left for the sync to raise
    gate = _hold(0)
    threading.Timer(0.05, gate.set).start()
    y = torch.conv2d(x, learned, padding=1)  # autograd records it here, after the queue
    assert y.grad_fn is not None and _pending() == 0
    gate = _hold(0)
    threading.Timer(0.05, gate.set).start()
    z = torch.conv2d(x.contiguous(memory_format=torch.channels_last), w)  # strides: the CPU's
    assert _pending() == 0 and z.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(z.cpu(), torch.conv2d(x.cpu().contiguous(
        memory_format=torch.channels_last), w.cpu()))


@pytest.mark.filterwarnings("ignore:Using padding='same'")
def test_the_output_shape_is_torchs(no_simulation) -> None:
    # conv_shape answers only for calls torch accepts, and then with torch's shape.
    rng = random.Random(0)
    answered = 0
    for _ in range(400):
        func = rng.choice(list(_launch.CONVOLUTIONS))
        transposed, n = _launch.CONVOLUTIONS[func]
        g = rng.choice([1, 1, 2, 3])
        cin, cout = g * rng.randint(1, 3) + (rng.random() < 0.1), g * rng.randint(1, 3)
        k = [rng.randint(1, 4) for _ in range(n)]
        w = torch.empty((cin, cout // g, *k) if transposed else (cout, cin // g, *k))
        a = torch.empty((cin, *[rng.randint(1, 9) for _ in range(n)]) if rng.random() < 0.2
                        else (rng.randint(1, 3), cin, *[rng.randint(1, 9) for _ in range(n)]))

        def sizes(least: int, n: int = n) -> object:
            c = rng.random()
            if c < 0.4:
                return rng.randint(least - (rng.random() < 0.05), 3)
            if c < 0.9:
                return tuple(rng.randint(least, 3) for _ in range(n))
            return [rng.randint(least, 3)] * rng.choice([1, n + 1])

        kw: dict = {"stride": sizes(1), "dilation": sizes(1), "groups": g}
        kw["padding"] = sizes(0) if transposed else rng.choice(["same", "valid", sizes(0)])
        if transposed:
            kw["output_padding"] = sizes(0)
        bias = torch.empty(cout + (rng.random() < 0.1)) if rng.random() < 0.5 else None
        mine = _launch.conv_shape(func, (a, w, bias), kw)
        try:
            real = tuple(func(a, w, bias, **kw).shape)
        except RuntimeError:
            assert mine is None, (func, a.shape, w.shape, kw)
            continue
        assert mine is None or mine == real, (func, a.shape, w.shape, kw)
        answered += mine is not None
    assert answered > 100


@pytest.mark.skipif(_launch._swap is None, reason="this torch has no "
                    "UntypedStorage._swap_data_ptr_: a queued output allocates its own memory")
def test_a_queued_output_takes_a_dropped_ones_memory(no_simulation) -> None:
    devlab.simulated.start(1)
    x = torch.rand(1024, 1024, device="cuda")
    y = torch.rand(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    gate = _hold(0)
    z = x * y
    with torch._C.DisableTorchFunction():  # the memory's address, read without a sync
        first = z.data_ptr()
    s = z.sum()
    del z  # let go of while its product and sum are still queued
    z2 = x * y  # takes its memory once they are done
    with torch._C.DisableTorchFunction():
        assert z2.data_ptr() != first and _pending() == 4  # new memory, at launch
    assert torch.cuda.memory_allocated() == 3 * 1024 * 1024 * 4 + 512
    gate.set()
    ptr = z2.data_ptr()  # a read of the pointer waits for the queue, as any use does
    assert ptr == first and z2._version == 0 and z2.untyped_storage().resizable()
    assert torch.equal(z2.cpu(), x.cpu() * y.cpu()) and s.item() == (x.cpu() * y.cpu()).sum()
    # a loop without a sync reuses that memory: its pages are not faulted in again per step
    x, y = torch.rand(2048, 2048, device="cuda"), torch.rand(2048, 2048, device="cuda")
    for _ in range(2):
        (x * y).sum()
    torch.cuda.synchronize()
    pages = 2048 * 2048 * 4 // resource.getpagesize()
    gate = _hold(0)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    sums = [(x * y).sum() for _ in range(10)]
    gate.set()
    torch.cuda.synchronize()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    assert faults < 3 * pages, faults  # each step's new output: about 10 * pages
    assert all(v.item() == sums[0].item() for v in sums)
    assert ptr != 0 and torch.cuda.memory_allocated() == (
        (1024 * 1024 + 2 * 2048 * 2048) * 4 + 11 * 512)  # z2 and s, x and y, the ten sums
