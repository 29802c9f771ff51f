"""Elementwise ops and reductions launched on a simulated GPU's worker (mode/async_launch.py,
Note [What an elementwise launch keeps as it was]): they return before the work is done and a
read waits for it; random programs give the same values, versions, autograd results, memory
figures, modeled times and errors with the asynchronous launch on and off."""

from __future__ import annotations

import collections
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from answers import same

import devlab
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.mode import async_launch as _launch
from devlab.engine.simulated.mode import routing


def _hold(index: int) -> threading.Event:
    """Hold GPU `index`'s queue until the returned gate is set."""
    gate = threading.Event()
    _workers.submit(index, lambda: gate.wait(10))
    return gate


def test_a_large_elementwise_op_and_its_sum_return_before_the_work(no_simulation) -> None:
    devlab.simulated.start(1, model="T4")
    x = torch.rand(1024, 1024, device="cuda")
    y = torch.rand(1024, 1024, device="cuda")
    assert x.numel() >= _launch.MIN_ELEMENTS
    expected = (x.cpu() * y.cpu()).sum()
    gate = _hold(0)
    z = x * y  # queued behind the gate, as the sum of it is
    s = z.sum()
    z.mul_(2)
    assert not _workers.idle(0) and _workers._workers[0].pending == 4
    assert (z.device, z.shape, z.dtype, s.shape, z._version) == (
        torch.device("cuda:0"), (1024, 1024), torch.float32, (), 1)
    # both outputs are counted at launch, as a GPU's caching allocator counts them
    assert torch.cuda.memory_allocated() == 3 * 1024 * 1024 * 4 + 512
    threading.Timer(0.05, gate.set).start()
    assert s.item() == expected.item()  # the read waited for the queue
    assert _workers.idle(0)
    assert torch.equal(z.cpu(), x.cpu() * y.cpu() * 2)


def test_a_small_op_on_an_idle_gpu_runs_here_and_one_behind_queued_work_is_queued(
        no_simulation) -> None:
    routing.fallbacks = collections.Counter()
    try:
        devlab.simulated.start(1)
        a = torch.ones(8, 8, device="cuda")
        a + a
        assert routing.fallbacks["fast"] >= 1 and _workers.idle(0)  # nothing extra to pay
        gate = _hold(0)
        b = a + a  # behind queued work: queued too, not waited for
        assert not _workers.idle(0) and _workers._workers[0].pending == 2
        gate.set()
        assert b.sum().item() == 128.0
    finally:
        routing.fallbacks = None


def test_an_allocation_as_queued_work_ends_finds_the_memory_the_user_let_go(no_simulation) -> None:
    """The worker takes its finished op out of the GPU's queued ops and drops the op's tensors in
    one hold of the session's lock: a product the user let go of in between was neither queued
    work's nor freed, and the next allocation took more memory where a synchronous run reuses
    the product's block."""
    devlab.simulated.start(1)
    x = torch.rand(1024, 1024, device="cuda")
    (x * 2).sum().item()  # the launch's first meta call (seconds) before the window
    gate = _hold(0)
    y = x @ x  # queued behind the gate
    assert not _workers.idle(0)
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    in_window = threading.Event()

    class HeldOpen(dict):
        """The queued ops, with the moment between the pop and the drop held open."""

        def pop(self, *args: Any) -> Any:
            popped = super().pop(*args)
            in_window.set()
            time.sleep(0.3)
            return popped

    dev = _session.session.devices[0]
    dev.queued = HeldOpen(dev.queued)
    gate.set()
    assert in_window.wait(10)
    del y  # as its op ends: its block is free, as without the queue
    z = x * 2  # launched (the worker is busy), y's size: y's block
    assert (torch.cuda.memory_reserved(), torch.cuda.memory_allocated()) == (reserved, allocated)
    del z


def test_launch_errors_are_torch_errors_at_once(no_simulation) -> None:
    devlab.simulated.start(1)
    big = torch.rand(512, 512, device="cuda")
    other = torch.rand(512, 512, device="cuda")
    with pytest.raises(RuntimeError, match="must match the size"):
        big + torch.rand(512, 7, device="cuda")
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        big[:1].add_(other)
    with pytest.raises(RuntimeError, match="single memory location"):
        big[:1].expand(512, 512).mul_(2)
    with pytest.raises(RuntimeError, match="single memory location"):
        big[1:].add_(big[:-1])  # overlap: torch looks at the memory itself
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        big + torch.rand(512, 512)
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
        torch.ones(512, 512, dtype=torch.long, device="cuda").mul_(other)
    w = _workers._workers.get(0)
    assert w is None or (w.pending == 0 and w.error is None)  # nothing was queued
    torch.cuda.synchronize()  # nothing was left for the sync to raise


def test_an_in_place_op_on_a_saved_tensor_is_seen_by_backward(no_simulation) -> None:
    devlab.simulated.start(1)
    w = torch.rand(512, 512, device="cuda", requires_grad=True)
    a = torch.rand(512, 512, device="cuda")
    y = w * a  # autograd records it here: w requires grad
    gate = _hold(0)
    a.mul_(2)  # queued; the version is a's at once
    assert a._version == 1 and not _workers.idle(0)
    gate.set()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


# --- the same answers ------------------------------------------------------------------------


def _program(seed: int, gpus: int) -> list[Any]:
    """A random program of elementwise ops, reductions, views, in-place ops and autograd on
    `gpus` simulated GPUs, its queues held now and then; what it saw at every step."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    seen: list[Any] = []
    dev = [f"cuda:{i}" for i in range(gpus)]
    live: list[torch.Tensor] = [torch.randn(16, 16, device=dev[i % gpus]) for i in range(4)]
    live.append(torch.randn(16, 16, device=dev[0], dtype=torch.float16))
    w = torch.randn(16, 16, device=dev[0], requires_grad=True)
    # convolution weights on each GPU: 3x3, 2x2 transposed, a 1-d one over 16 channels, a bias
    cw = {d: torch.randn(1, 1, 3, 3, device=d) for d in dev}
    tw = {d: torch.randn(1, 1, 2, 2, device=d) for d in dev}
    w1 = {d: torch.randn(16, 16, 3, device=d) for d in dev}
    cb = {d: torch.randn(1, device=d) for d in dev}
    queued = [0]

    def pick() -> torch.Tensor:
        return rng.choice(live)

    def pair() -> tuple[torch.Tensor, torch.Tensor]:
        a = pick()
        return a, rng.choice([t for t in live if t.device == a.device])

    def backward() -> None:
        loss = (w * pick().float()).sum() if live[0].device == w.device else (w * 2).mean()
        loss.backward()
        seen.append(w.grad.clone())

    def step_w() -> None:
        with torch.no_grad():
            w.add_(w.grad if w.grad is not None else torch.ones_like(w), alpha=-0.1)
            w.mul_(0.99)
        seen.append(w._version)

    def conv() -> torch.Tensor:
        a = pick()
        d = str(a.device)
        choice = rng.randrange(8)
        if choice == 0:
            return torch.conv2d(a[None, None], cw[d], cb[d], 1, 1)[0, 0]
        if choice == 1:
            return torch.nn.functional.conv2d(a[None], cw[d], padding="same")[0]
        if choice == 2:  # 16 channels of length 16, sizes as lists
            return torch.conv1d(a[None], w1[d], None, [1], [1])[0]
        if choice == 3:  # an (8, 8) corner, contiguous or not, transposed to (16, 16)
            x = a[:8, :8]
            return torch.conv_transpose2d((x.contiguous() if rng.random() < 0.5 else x)[None, None],
                                          tw[d], stride=2)[0, 0]
        if choice == 4:  # the other GPU's weight, or a weight of another dtype: torch's errors
            return torch.conv2d(a[None, None], cw[rng.choice(dev)].to(rng.choice(
                [torch.float32, torch.float64])), padding=1)[0, 0]
        if choice == 5:  # a weight of the wrong channels: torch's error at once
            return torch.conv2d(a[None, None], w1[d][:, :, None], padding=1)[0, 0]
        if choice == 6:  # channels-last: runs here
            x = a[None, None].expand(1, 2, 16, 16).contiguous(memory_format=torch.channels_last)
            return torch.conv2d(x, cw[d].expand(1, 2, 3, 3).contiguous(), padding=1)[0, 0]
        # the trained weight: autograd records it here while grad is on
        return torch.conv2d(w[None, None], cw[str(w.device)], padding=1)[0, 0] * 1.0

    def chain() -> torch.Tensor:
        # temporaries let go of while still queued: the next outputs of their size take
        # their memory (Note [A queued output takes a dropped one's memory])
        a = pick()
        if rng.random() < 0.5:
            _workers.submit(a.device.index, lambda: time.sleep(0.002))
        return (((a + 1) * 3).exp() - a).abs()

    def stale() -> None:
        a = pick()
        y = w * a.float()
        a.add_(1)  # in place on what backward saved, when it saved a itself
        y.sum().backward()

    ops = [
        lambda: live.append(torch.add(*pair(), alpha=rng.choice([1, 0.5]))),
        lambda: live.append(torch.mul(*pair())),
        lambda: live.append(pick() * rng.choice([2, 0.5, -1.0])),
        lambda: live.append(pick() / pick()),
        lambda: live.append(pick() - pick()[:1]),  # broadcast
        lambda: live.append(pick()[:, :1] + pick()[:1]),  # broadcast both ways
        lambda: live.append(torch.maximum(*pair())),
        lambda: live.append(pick().t() * 3),  # a transposed input: the output's strides
        lambda: live.append(rng.choice([torch.exp, torch.tanh, torch.sigmoid, torch.sqrt,
                                        torch.abs, torch.neg, torch.erf])(pick())),
        lambda: live.append(pick().clamp(min=-0.5, max=0.5)),
        lambda: live.append(-pick()),
        lambda: live.append(pick() ** 2),
        lambda: pick().add_(pick(), alpha=2),
        lambda: pick().mul_(1.5),
        lambda: pick()[2:10].sub_(1),  # in place on a view
        lambda: pick().t().relu_(),
        lambda: live.__setitem__(0, live[0].__iadd__(live[0].new_ones(16, 16))),
        lambda: live.append(pick().sum(dim=rng.choice([0, 1]), keepdim=True).expand(16, 16)),
        lambda: seen.append(pick().sum().item()),
        lambda: seen.append(pick().mean(dtype=torch.float64).item()),
        lambda: seen.append(pick().norm().item()),
        lambda: seen.append(torch.linalg.vector_norm(pick(), ord=rng.choice([1, 2])).item()),
        lambda: live.append(torch.sum(pick(), 1, True) * pick()),
        lambda: live.append(pick() + torch.ones(16, 16)),  # a host tensor: the mixed error
        lambda: live.append(pick() + pick()),  # two GPUs: the mixed error, when they differ
        lambda: live.append(pick() + pick()[:7]),  # a shape error
        lambda: pick()[:1].add_(pick()),  # an in-place shape error
        lambda: live.append(pick().to(rng.choice(dev))),
        lambda: live.append(pick() @ pick().t()),  # a product (queued when large)
        lambda: live.append(conv()),
        lambda: live.append(conv()),
        lambda: live.append(chain()),
        lambda: live.append(chain()),
        lambda: seen.append(conv().sum().item()),
        backward,
        step_w,
        stale,
        lambda: seen.append(pick().cpu()),
        # the GPU busy a while: what follows queues behind it
        lambda: _workers.submit(rng.randrange(gpus), lambda: time.sleep(0.003)),
        lambda: live.pop(rng.randrange(len(live))) if len(live) > 3 else None,
        lambda: live.pop(rng.randrange(len(live))) if len(live) > 3 else None,
    ]
    for _ in range(150):
        op = rng.randrange(len(ops))
        try:
            if rng.random() < 0.2:
                with torch.no_grad():
                    ops[op]()
            else:
                ops[op]()
            seen.append(("ok", op))
        except Exception as e:  # noqa: BLE001 - the error is what is compared
            seen.append(("error", op, type(e).__name__, str(e)))
        queued[0] += sum(not _workers.idle(i) for i in range(gpus))
        live[:] = [t if t.shape == (16, 16) else t.expand(16, 16).contiguous()
                   for t in live if t.dim() == 2][-12:]
        seen.append([(str(t.device), t.dtype, tuple(t.shape), t.stride(), t._version,
                      t.requires_grad) for t in live])
        seen.append([torch.cuda.memory_allocated(i) for i in range(gpus)])
    torch.cuda.synchronize()
    seen.append([t.cpu() for t in live])
    seen.append(w.detach().cpu())
    seen.append([torch.cuda.memory_stats(i) for i in range(gpus)])
    clock = _session.session.charges.clock
    if clock is not None:
        seen.append((clock.host, list(clock.free), list(clock.busy), list(clock.compute)))
    seen.append(("queued", queued[0] > 0))  # some GPU was busy after some step
    return seen


@pytest.mark.usefixtures("modeled_host")
@pytest.mark.parametrize(("model", "seed", "gpus"), [(None, 1, 1), ("T4", 2, 1), ("T4", 3, 2),
                                                     (None, 4, 2)])
def test_random_programs_answer_alike_with_the_launch_on_and_off(no_simulation, monkeypatch,
                                                                 model, seed, gpus) -> None:
    monkeypatch.setattr(_launch, "MIN_ELEMENTS", 1)  # every op the launch takes is queued
    monkeypatch.setattr(_launch, "MIN_MACS", 1)
    monkeypatch.setattr(_launch, "MIN_REUSE_BYTES", 1)  # every output may take dropped memory
    runs = []
    for asynchronous in (True, False):
        devlab.simulated.start(gpus, model=model, asynchronous=asynchronous)
        try:
            runs.append(_program(seed, gpus))
        finally:
            devlab.simulated.stop()
            devlab.runtime.reset()
    on, off = runs
    assert on[-1] == ("queued", True)
    assert len(on) == len(off)
    for i, (x, y) in enumerate(zip(on, off, strict=True)):
        assert same(x, y), f"step {i}: {x!r} != {y!r}"


def test_the_launch_took_the_random_programs_ops(no_simulation, monkeypatch) -> None:
    # The comparison above is only worth something if the launch queued the program's ops.
    monkeypatch.setattr(_launch, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(_launch, "MIN_MACS", 1)
    monkeypatch.setattr(_launch, "MIN_REUSE_BYTES", 1)
    launched = []
    real = _workers.submit
    monkeypatch.setattr(_workers, "submit", lambda i, fn, holds=None: (
        launched.append(fn.__qualname__), real(i, fn, holds))[1])
    swaps = []
    real_swap = _launch._swap  # None in a torch without _swap_data_ptr_ (torch 2.11)
    if real_swap is not None:
        monkeypatch.setattr(_launch, "_swap", lambda a, b: (swaps.append(1), real_swap(a, b)))
    devlab.simulated.start(1)
    try:
        _program(1, 1)
    finally:
        devlab.simulated.stop()
        devlab.runtime.reset()
    assert launched.count("launch_elementwise.<locals>.elementwise") > 50
    assert launched.count("launch_conv.<locals>.convolution") >= 3
    # outputs took the memory of dropped, still queued ones, where this torch can swap it
    assert len(swaps) > 3 or real_swap is None


def test_a_queued_op_waits_when_another_thread_reads_it(no_simulation) -> None:
    devlab.simulated.start(1)
    x = torch.rand(1024, 1024, device="cuda")
    gate = _hold(0)
    y = x * 2
    got = []
    t = threading.Thread(target=lambda: got.append(y.sum().item()))
    t.start()
    time.sleep(0.05)
    assert not got  # the other thread waits for the queue, as the host would
    gate.set()
    t.join(10)
    assert got == [(x.cpu() * 2).sum().item()]


def test_under_the_profiler_and_in_inference_mode(no_simulation) -> None:
    devlab.simulated.start(1)
    x = torch.rand(1024, 1024, device="cuda")
    with torch.profiler.profile() as prof:
        gate = _hold(0)
        threading.Timer(0.05, gate.set).start()
        y = x * 2  # runs here, after the queue: the profiler records it on this thread
        assert _workers.idle(0)
    assert any(e.name == "aten::mul" for e in prof.events())
    with torch.inference_mode():
        gate = _hold(0)
        z = x * y
        z.add_(1)  # queued on an inference tensor: no version counter to bump
        assert not _workers.idle(0)
        gate.set()
    assert z.is_inference() and torch.equal(z.cpu(), x.cpu() * x.cpu() * 2 + 1)
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside"):
        z.mul_(2)  # outside inference mode: torch's error, raised here


def test_the_switch_takes_the_elementwise_launch_out(no_simulation, monkeypatch) -> None:
    monkeypatch.setenv("DEVLAB_ASYNC_ELEMENTWISE", "0")
    devlab.simulated.start(1)
    assert torch.Tensor.__mul__ not in routing.HANDLERS and torch.mm in routing.HANDLERS
    x = torch.rand(1024, 1024, device="cuda")
    gate = _hold(0)
    threading.Timer(0.05, gate.set).start()
    y = x * 2  # waits for the queue and runs here
    assert _workers.idle(0) and torch.equal(y.cpu(), x.cpu() * 2)


def _run(script: str, cwd: Path) -> subprocess.CompletedProcess:
    """`script` in a fresh interpreter with this checkout's devlab."""
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})


def test_the_interpreter_exits_cleanly_with_elementwise_work_queued(tmp_path) -> None:
    script = (
        "import threading, torch, devlab\n"
        "from devlab.engine.simulated.base import gpu_workers as _workers\n"
        "devlab.config.simulate_gpus(1)\n"
        "x = torch.rand(1024, 1024, device='cuda'); k = torch.ones(4, 1, 3, 3, device='cuda')\n"
        "x4 = x[None, None]\n"
        "gate = threading.Event(); _workers.submit(0, lambda: gate.wait(30))\n"
        "c = torch.conv2d(x4, k, padding=1)\n"
        "import sys; imported = 'sympy' in sys.modules\n"
        "y = (x * x).sum(0); x.mul_(2)\n"
        "assert _workers._workers[0].pending == 5\n"
        "threading.Timer(0.3, gate.set).start()\n"
        "print('queued', imported)\n")
    # no sync: exit drains the queue, and the process ends cleanly; a convolution's launch did
    # not import sympy (torch's meta computation of it would have), nor did the elementwise
    # launches (test_an_elementwise_launch_imports_no_compiler)
    done = _run(script, tmp_path)
    assert done.returncode == 0 and done.stdout.split() == ["queued", "False"], done.stderr


def _meta_layout(impl: Any, args: tuple, kwargs: dict) -> tuple | None:
    """(shape, strides, dtype) of `impl` on meta tensors standing for `args`; None if torch
    raises for them."""
    metas = tuple(torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
                  if isinstance(a, torch.Tensor) else a for a in args)
    try:
        out = impl(*metas, **kwargs)
    except Exception:
        return None
    return (out.shape, out.stride(), out.dtype)


def test_a_launch_knows_the_common_layouts_as_meta_tensors_give_them() -> None:
    """`plain_layout` (Note [An elementwise launch's layout without meta tensors]) answers
    what torch's meta computation answers, on random calls, and declines what it cannot
    tell."""
    rng = random.Random(0)
    dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
    shapes = [(), (0,), (1,), (7,), (3, 1), (1, 5), (4, 5), (2, 0, 3), (2, 3, 4)]
    answered = declined = 0
    for _ in range(3000):
        func, (kind, impl) = rng.choice(list(_launch.ELEMENTWISE.items()))
        shape = rng.choice(shapes)
        a = torch.empty(shape, dtype=rng.choice(dtypes))
        if rng.random() < 0.2 and a.dim() >= 2:
            a = a.transpose(0, 1)  # other strides
        pick = rng.random()
        if pick < 0.4:
            other: Any = torch.empty(rng.choice([shape, shape, rng.choice(shapes)]),
                                     dtype=rng.choice(dtypes))
        elif pick < 0.8:
            other = rng.choice([2, 0.5, True, -3, 1j])
        else:
            other = None
        args = (a,) if other is None else (a, other)
        kwargs = {"alpha": 2} if rng.random() < 0.1 else {}
        tensors = [t for t in args if isinstance(t, torch.Tensor)]
        got = _launch.plain_layout(kind, impl, args, kwargs, tensors)
        if got is None:
            declined += 1
            continue
        answered += 1
        want = _meta_layout(impl, args, kwargs)
        assert want is not None, (impl, args, kwargs)  # no error meta would have raised
        if kind == _launch._INPLACE:
            assert want[0] == a.shape
        else:
            assert (tuple(got[0]), got[1], got[2]) == (tuple(want[0]), want[1], want[2]), (
                impl, [getattr(t, "shape", t) for t in args], kwargs)
    assert answered > 800 and declined > 800  # both sides were exercised


def test_an_elementwise_launch_imports_no_compiler(tmp_path) -> None:
    """A lesson's first large elementwise op and sum, launched, leave torch._dynamo (and
    sympy, which it imports: about 2 s and 145 MiB) unimported; a broadcast still asks meta
    tensors."""
    script = (
        "import sys, torch, devlab\n"
        "devlab.config.simulate_gpus(1)\n"
        "x = torch.rand(1024, 1024, device='cuda')\n"
        "y = (x * x + 1).sum(); z = torch.sigmoid(x); x.mul_(x); y.item()\n"
        "print('dynamo', 'torch._dynamo' in sys.modules)\n"
        "w = x * torch.rand(1, 1024, device='cuda'); torch.cuda.synchronize()\n"
        "print('dynamo', 'torch._dynamo' in sys.modules)\n")
    done = _run(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["dynamo", "False", "dynamo", "True"]
