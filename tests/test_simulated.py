"""Simulated GPUs: ordinary PyTorch code on N CPU-backed GPUs, and torch exactly as before after."""

from __future__ import annotations

import copy
import importlib
import re
import sys
import threading

import numpy as np
import pytest
import torch
import torch.serialization
import torch.utils._device
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import devlab
from devlab.engine import runtime, simulated
from devlab.engine.gpu_model.capacity import cublas_workspace_bytes
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.mode import async_launch as _launch

MIB = 1024 * 1024


pytestmark = pytest.mark.usefixtures("no_simulation")


# --- what torch.cuda says ----------------------------------------------------------------

def test_torch_cuda_reports_the_simulated_gpus(two) -> None:
    assert torch.cuda.is_available()
    assert torch.cuda.device_count() == 2
    assert not torch.cuda.is_initialized()  # as on CUDA, asking what exists initializes nothing
    assert torch.cuda.current_device() == 0
    assert torch.cuda.is_initialized()  # torch.cuda.current_device() initializes CUDA
    assert not simulated.is_used()  # but devlab's settings are fixed by the first tensor only
    assert torch.cuda.get_device_name(1) == "Simulated GPU (CPU-backed)"
    props = torch.cuda.get_device_properties(0)
    assert props.name == "Simulated GPU (CPU-backed)" and props.total_memory > 0
    torch.cuda.synchronize()
    torch.cuda.synchronize(1)
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.cuda.get_device_name(2)
    torch.ones(1, device="cuda")
    assert torch.cuda.is_initialized() and simulated.is_used()


def test_current_device_follows_set_device_and_the_device_context(two) -> None:
    torch.cuda.set_device(1)
    assert torch.cuda.current_device() == 1
    assert torch.ones(1, device="cuda").device == torch.device("cuda", 1)
    assert torch.ones(1).cuda().device == torch.device("cuda", 1)
    with torch.cuda.device(0):
        assert torch.cuda.current_device() == 0
        assert torch.zeros(1, device="cuda").device == torch.device("cuda", 0)
    assert torch.cuda.current_device() == 1


def test_accelerator_api_answers_for_the_simulated_gpus(two) -> None:
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == 2
    assert torch.accelerator.current_accelerator().type == "cuda"
    dev = torch.accelerator.current_accelerator().type
    assert torch.ones(1, device=dev).device == torch.device("cuda", 0)


def test_the_device_module_follows_the_simulation_whenever_it_was_first_asked(
        no_simulation) -> None:
    """torch.get_device_module() caches its answer: asked before the simulation starts it must
    not stay torch.cpu while GPUs are simulated (transformers' continuous batching makes a
    `get_device_module().Stream(device=...)`), nor stay torch.cuda after."""
    # torch.cpu on a CPU build (CI's); a CUDA build answers torch.cuda without a GPU too.
    built = torch.get_device_module.__wrapped__()
    assert torch.get_device_module() is built
    devlab.simulated.start(1)
    assert torch.get_device_module() is torch.cuda
    stream = torch.get_device_module().Stream(device=torch.device("cuda", 0))
    assert stream.device == torch.device("cuda", 0)
    devlab.simulated.stop()
    assert torch.get_device_module() is built


def test_the_rest_of_the_accelerator_api(two) -> None:
    x = torch.randn(512, 512, device="cuda:1")
    y = x @ x  # queued on GPU 1's worker
    torch.accelerator.synchronize()
    assert _workers.idle(1) and y.device == torch.device("cuda", 1)
    caps = torch.accelerator.get_device_capability("cuda:1")
    assert {torch.float32, torch.int64, torch.bool} <= caps["supported_dtypes"]
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.accelerator.get_device_capability(2)
    torch.accelerator.set_stream(torch.accelerator.current_stream(1))
    assert torch.accelerator.current_device_index() == 1  # as torch: the stream's device
    torch.cuda.set_stream(torch.cuda.current_stream(0))
    assert torch.cuda.current_device() == 0
    with pytest.raises(TypeError, match="simulated GPU"):
        torch.accelerator.set_stream(object())
    torch.accelerator.reset_accumulated_memory_stats(1)
    torch.cuda.reset_accumulated_memory_stats()
    if hasattr(torch.accelerator, "empty_host_cache"):  # torch >= 2.12
        torch.accelerator.empty_host_cache()


def test_benchmark_timer_measures_simulated_gpu_work(two) -> None:
    # torch.utils.benchmark.Timer waits for the device with torch.accelerator.synchronize; if
    # that did not wait for the simulated GPU's worker, Timer would time the launch only
    # (tens of microseconds) instead of the product (milliseconds).
    from torch.utils import benchmark

    from devlab.core import timing

    x = torch.randn(512, 512, device="cuda:0")
    assert x.numel() * x.shape[1] >= _launch.MIN_MACS  # launched asynchronously
    ours = timing.time_on_device(lambda: x @ x, torch.device("cuda", 0), as_default=False,
                                 min_time=0.3).median
    timer = benchmark.Timer("x @ x", globals={"x": x}).blocked_autorange(min_run_time=0.3)
    # Below: the launch alone. Above, loosely: on a machine loaded by other work the two timers
    # measured 3.03x apart once (the compatibility job beside a CI run).
    assert ours / 3 < timer.median < ours * 10, (timer.median, ours)


# --- factories and moves -------------------------------------------------------------------

def test_factories_with_a_device_make_simulated_tensors(two) -> None:
    assert torch.ones(2, 3, device="cuda:1").device == torch.device("cuda", 1)
    assert torch.rand(2, 3, device=torch.device("cuda", 1)).device.index == 1
    assert torch.zeros(2, device="cuda").device == torch.device("cuda", 0)
    assert torch.arange(3, device=1).device == torch.device("cuda", 1)
    assert torch.tensor([1.0, 2.0], device="cuda:1").tolist() == [1.0, 2.0]
    assert torch.full((2,), 7.0, device="cuda:0").sum().item() == 14.0
    x = torch.ones(2, device="cuda:1")
    assert torch.zeros_like(x).device.index == 1
    assert torch.zeros_like(x, device="cpu").device == torch.device("cpu")
    assert torch.zeros_like(x, device="cuda:0").device.index == 0
    assert x.new_zeros(3).device.index == 1
    assert x.new_empty(3, device="cpu").device.type == "cpu"
    assert torch.ones(2).device == torch.device("cpu")


def test_default_device_routes_factories_and_modules(two) -> None:
    with torch.device("cuda:1"):
        assert torch.zeros(2).device == torch.device("cuda", 1)
        assert torch.tensor([1]).device == torch.device("cuda", 1)
        assert nn.Linear(2, 2).weight.device == torch.device("cuda", 1)
    assert torch.zeros(2).device.type == "cpu"
    torch.set_default_device("cuda:0")
    try:
        assert torch.randn(3).device == torch.device("cuda", 0)
        assert torch.get_default_device() == torch.device("cuda", 0)
    finally:
        torch.set_default_device(None)


def test_as_tensor_copies_host_memory_onto_the_gpu(two) -> None:
    a = np.ones(3, dtype=np.float32)
    t = torch.as_tensor(a, device="cuda:0")
    a[0] = 5.0
    assert t.device.index == 0 and t.tolist() == [1.0, 1.0, 1.0]
    assert torch.as_tensor(t, device="cuda:0") is t
    assert torch.as_tensor(t, device="cpu").device.type == "cpu"
    assert torch.as_tensor(t).device.index == 0


def test_moving_between_host_and_gpus(two) -> None:
    h = torch.arange(6.0).reshape(2, 3)
    x = h.cuda(1)
    assert x.device == torch.device("cuda", 1) and x.is_cuda and not x.is_cpu
    assert x.cuda(1) is x and x.to("cuda:1") is x
    y = x.to("cuda:0")
    assert y.device.index == 0 and y is not x
    z = y.to(torch.float64)
    assert z.device.index == 0 and z.dtype == torch.float64
    back = x.cpu()
    assert back.device.type == "cpu" and not back.is_cuda and torch.equal(back, h)
    assert h.cpu() is h
    assert h.to(x).device.index == 1
    assert x.to("cuda:0", copy=True).device.index == 0
    c = x.to("cuda:1", copy=True)
    assert c is not x and c.device.index == 1
    assert x.get_device() == 1 and h.get_device() == -1
    assert x.type() == "torch.cuda.FloatTensor"


def test_copy_between_devices(two) -> None:
    dst = torch.zeros(3, device="cuda:0")
    dst.copy_(torch.ones(3, device="cuda:1"))
    assert dst.device.index == 0 and dst.tolist() == [1.0, 1.0, 1.0]
    host = torch.zeros(3)
    host.copy_(dst)
    assert host.device.type == "cpu" and host.tolist() == [1.0, 1.0, 1.0]


def test_views_data_detach_and_parameters_share_the_device(two) -> None:
    x = torch.randn(4, 4, device="cuda:1")
    for v in (x[1:], x.t(), x.view(16), x.data, x.detach(), nn.Parameter(x)):
        assert v.device == torch.device("cuda", 1)


def test_printing_and_host_reads(two) -> None:
    x = torch.ones(2, 3, device="cuda:1")
    assert repr(x) == "tensor([[1., 1., 1.],\n        [1., 1., 1.]], device='cuda:1')"
    assert "device='cuda:1'" in str(x * 2)
    assert x.sum().item() == 6.0
    assert x.tolist() == [[1.0] * 3] * 2
    assert x.cpu().numpy().sum() == 6.0
    assert repr(x.device) == "device(type='cuda', index=1)"


def test_numpy_of_a_gpu_tensor_fails_as_on_cuda(two) -> None:
    x = torch.ones(2, device="cuda:0")
    msg = ("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
           "tensor to host memory first.")
    with pytest.raises(TypeError) as err:
        x.numpy()
    assert str(err.value) == msg
    with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor"):
        np.asarray(x)


# --- mistakes fail as on real GPUs ---------------------------------------------------------

def test_mixing_two_gpus_fails_with_pytorchs_words(two) -> None:
    x = torch.ones(2, device="cuda:1")
    y = torch.ones(2, device="cuda:0")
    with pytest.raises(RuntimeError) as err:
        x + y
    assert str(err.value) == ("Expected all tensors to be on the same device, but found at "
                              "least two devices, cuda:1 and cuda:0!")
    with pytest.raises(RuntimeError, match="cuda:0 and cuda:1!"):
        torch.cat([y, x])
    with pytest.raises(RuntimeError, match="cuda:1 and cuda:0!"):
        x.mm(y.view(2, 1).t())
    # nothing was computed on the wrong device meanwhile
    assert x.device.index == 1 and y.device.index == 0


def test_mixing_gpu_and_host_fails_but_host_scalars_mix(two) -> None:
    x = torch.ones(2, 2, device="cuda:0")
    with pytest.raises(RuntimeError) as err:
        x + torch.ones(2, 2)
    assert str(err.value) == ("Expected all tensors to be on the same device, but found at "
                              "least two devices, cuda:0 and cpu!")
    with pytest.raises(RuntimeError, match="cuda:0 and cpu!"):
        torch.ones(2, 2) @ x
    scaled = x * torch.tensor(3.0)  # a 0-dim CPU tensor is a scalar, as on CUDA
    assert scaled.device.index == 0 and scaled.sum().item() == 12.0
    idx = torch.tensor([1, 0])  # CPU indices may index a GPU tensor
    assert x[idx].device.index == 0


def test_a_device_that_does_not_exist(two) -> None:
    for make in (lambda: torch.ones(1, device="cuda:2"), lambda: torch.ones(1).cuda(5),
                 lambda: torch.ones(1).to("cuda:2")):
        with pytest.raises(RuntimeError) as err:
            make()
        assert str(err.value).startswith("CUDA error: invalid device ordinal")


# --- modules, autograd, optimizers ---------------------------------------------------------

def test_module_to_keeps_parameter_identity(two) -> None:
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    params = list(net.parameters())
    net.to("cuda:1")
    assert all(a is b for a, b in zip(params, net.parameters(), strict=True))
    assert all(p.device == torch.device("cuda", 1) for p in net.parameters())
    assert net[1].running_mean.device.index == 1
    net.cuda(0)
    assert all(p.device.index == 0 for p in net.parameters())
    net.cpu()
    assert all(p.device.type == "cpu" for p in net.parameters())
    assert all(a is b for a, b in zip(params, net.parameters(), strict=True))


def test_lazy_linear_materializes_on_the_gpu(two) -> None:
    X = torch.ones(2, 3, device="cuda:0")
    net = nn.Sequential(nn.LazyLinear(1)).to(device=torch.device("cuda", 0))
    out = net(X)
    assert out.device == torch.device("cuda", 0) and out.shape == (2, 1)
    assert net[0].weight.data.device == torch.device("cuda", 0)
    assert "device='cuda:0', grad_fn=<AddmmBackward0>" in repr(out)


def _train(device: str, optimizer: str, steps: int = 300) -> tuple[float, torch.device]:
    torch.manual_seed(0)
    X, y = torch.randn(128, 10), torch.randn(128, 1)
    net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    net, X, y = net.to(device), X.to(device), y.to(device)
    opt = (torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9) if optimizer == "sgd"
           else torch.optim.Adam(net.parameters(), lr=1e-3))
    loss = torch.tensor(0.0)
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(X), y)
        loss.backward()
        opt.step()
    return loss.item(), loss.device


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_training_on_a_simulated_gpu_gives_the_cpu_loss(optimizer: str) -> None:
    cpu_loss, cpu_dev = _train("cpu", optimizer)
    simulated.start(1)
    sim_loss, sim_dev = _train("cuda", optimizer)
    assert cpu_dev.type == "cpu" and sim_dev == torch.device("cuda", 0)
    if optimizer == "sgd":  # the same kernels in the same order: bit for bit
        assert sim_loss == cpu_loss
    else:  # Adam takes its multi-tensor path on a GPU, which rounds a little differently
        assert sim_loss == pytest.approx(cpu_loss, rel=1e-5)
    assert cpu_loss < 0.9  # it did train


def test_gradients_live_on_their_tensors_device(two) -> None:
    w = torch.randn(3, device="cuda:1", requires_grad=True)
    seen = []
    w.register_hook(lambda g: seen.append(g.device) or g)
    (w * torch.ones(3, device="cuda:1")).sum().backward()
    assert w.grad.device == torch.device("cuda", 1) and seen == [torch.device("cuda", 1)]
    (g,) = torch.autograd.grad((w ** 2).sum(), w)
    assert g.device.index == 1 and torch.allclose(g.cpu(), 2 * w.detach().cpu())
    h = torch.randn(3, requires_grad=True)
    h.cuda(0).sum().backward()  # the copy's gradient flows back to the host tensor
    assert h.grad.device.type == "cpu"


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        # Python code in a backward pass makes tensors on "the gradient's device"
        return grad * torch.full(grad.shape, 2.0, device=grad.device)


def test_python_code_in_backward_is_routed_too(two) -> None:
    x = torch.ones(3, device="cuda:1", requires_grad=True)
    _Double.apply(x).sum().backward()
    assert x.grad.device.index == 1 and x.grad.tolist() == [2.0] * 3
    y = torch.ones(3, device="cuda:0", requires_grad=True)
    out = torch.utils.checkpoint.checkpoint(lambda t: (t * 3).sin(), y, use_reentrant=False)
    out.sum().backward()  # recomputes the forward during backward, on cuda:0 again
    assert y.grad.device.index == 0
    assert torch.allclose(y.grad.cpu(), 3 * torch.cos(torch.full((3,), 3.0)))
    (g,) = torch.autograd.grad(_Double.apply(x).sum(), x)
    assert g.device.index == 1 and g.tolist() == [2.0] * 3
    z = torch.ones(2, device="cuda:0", requires_grad=True)
    gz, gx = torch.autograd.grad((z * 2).sum(), [z, x], materialize_grads=True)
    assert gz.device.index == 0 and gx.device.index == 1 and gx.tolist() == [0.0] * 3


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        _Square.seen.append(grad.device)
        return 2 * x * grad  # the gradient, made by C++ (sin's backward), meets a GPU tensor


def test_gradients_the_engine_hands_to_python_say_their_gpu(two) -> None:
    """A gradient C++ made (here by sin's backward) reaches an autograd Function's backward and
    a module's backward hooks on its GPU, as on CUDA, where it mixes with that GPU's tensors."""
    _Square.seen = []
    x = torch.randn(4, device="cuda:1", requires_grad=True)
    _Square.apply(x).sin().sum().backward()
    assert _Square.seen == [torch.device("cuda", 1)]
    xc = x.detach().cpu().requires_grad_()
    (xc * xc).sin().sum().backward()
    assert x.grad.device.index == 1 and torch.allclose(x.grad.cpu(), xc.grad)

    m = nn.Linear(4, 4).to("cuda:0")
    w = torch.ones(4, device="cuda:0")
    hooked = []
    m.register_full_backward_pre_hook(lambda mod, go: hooked.append(("pre", go[0].device)))
    m.register_full_backward_hook(
        lambda mod, gi, go: hooked.append(("hook", go[0].device, (go[0] * w).sum().device)))
    m(torch.randn(2, 4, device="cuda:0", requires_grad=True)).sin().sum().backward()
    cuda0 = torch.device("cuda", 0)
    assert hooked == [("pre", cuda0), ("hook", cuda0, cuda0)]


def test_activation_checkpointing_around_flex_attention(two) -> None:
    """flex_attention is a higher-order operator around an autograd Function: what it saves is
    on the GPU while it saves it, so checkpointing (plain and selective) recomputes the same
    metadata, and the gradients are those of the same attention on the CPU."""
    import functools

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )

    def causal(b, h, q, kv):
        return q >= kv

    def policy(ctx, op, *args, **kwargs):
        return (CheckpointPolicy.MUST_SAVE if op is torch.ops.higher_order.flex_attention
                else CheckpointPolicy.PREFER_RECOMPUTE)

    torch.manual_seed(0)
    qh = torch.randn(1, 2, 128, 16)
    ref = qh.clone().requires_grad_()  # flex_attention has no CPU backward: the same attention
    nn.functional.scaled_dot_product_attention(ref, ref, ref, is_causal=True).sin().sum().backward()
    bm = create_block_mask(causal, 1, 1, 128, 128, device="cuda:1")

    def block(q):
        return flex_attention(q, q, q, block_mask=bm).sin()

    for kw in ({}, {"context_fn": functools.partial(create_selective_checkpoint_contexts, policy)}):
        q = qh.to("cuda:1").requires_grad_()
        checkpoint(block, q, use_reentrant=False, **kw).sum().backward()
        assert q.grad.device == torch.device("cuda", 1)
        assert torch.allclose(q.grad.cpu(), ref.grad, atol=1e-5)


def test_checkpointing_reads_what_autograd_saves_inside_an_op_on_its_gpu(two) -> None:
    """Inside one call, autograd saves intermediate results (the CPU attention kernel's output
    and log-sum-exp) and checkpointing's hooks read their device then: the forward and the
    recomputation must both say the GPU. Selective checkpointing keeps them through its own
    dispatch mode."""
    import functools

    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )

    def policy(ctx, op, *args, **kwargs):
        return (CheckpointPolicy.MUST_SAVE if op in (torch.ops.aten.mm.default,) else
                CheckpointPolicy.PREFER_RECOMPUTE)

    torch.manual_seed(0)
    qh, wh = torch.randn(1, 8, 64, 16), torch.randn(16, 16)

    def block(q, w):
        t = q @ w
        return nn.functional.scaled_dot_product_attention(t, t, t, is_causal=True, scale=0.25
                                                          ).sin().sum()

    ref = [t.bfloat16().requires_grad_() for t in (qh, wh)]
    block(*ref).backward()
    for kw in ({}, {"context_fn": functools.partial(create_selective_checkpoint_contexts, policy)}):
        q, w = (t.to("cuda:1", torch.bfloat16).requires_grad_() for t in (qh, wh))
        checkpoint(block, q, w, use_reentrant=False, **kw).backward()
        assert q.grad.device == torch.device("cuda", 1)
        assert torch.equal(q.grad.cpu(), ref[0].grad) and torch.equal(w.grad.cpu(), ref[1].grad)


def test_torch_func_transforms_keep_the_gpu(two) -> None:
    """vmap, grad, jacrev, jacfwd and hessian wrap their tensors (no storage of their own): what
    they compute lives on, and reports, the GPU of their inputs, as on CUDA, with the CPU's
    numbers; inside a transform the device rule holds."""
    from torch.func import functional_call, grad, hessian, jacfwd, jacrev, stack_module_state, vmap

    torch.manual_seed(0)
    xh, wh = torch.randn(5, 4), torch.randn(4)
    x, w = xh.to("cuda:1"), wh.to("cuda:1")
    before = torch.cuda.memory_allocated(1)

    def loss(w, r):
        return (r @ w).sin() ** 2

    per_sample = vmap(grad(loss), in_dims=(None, 0))  # the per-sample-gradients pattern
    results = {
        "vmap": (vmap(lambda r: r.cos() * 2)(x), vmap(lambda r: r.cos() * 2)(xh)),
        "per-sample grad": (per_sample(w, x), per_sample(wh, xh)),
        "jacrev": (jacrev(torch.sin)(x[0]), jacrev(torch.sin)(xh[0])),
        "jacfwd": (jacfwd(torch.sin)(x[0]), jacfwd(torch.sin)(xh[0])),
        "hessian": (hessian(lambda t: t.sin().sum())(w), hessian(lambda t: t.sin().sum())(wh)),
    }
    for name, (got, ref) in results.items():
        assert got.device == torch.device("cuda", 1), name
        assert torch.allclose(got.cpu(), ref), name
    assert torch.cuda.memory_allocated(1) > before  # the results count on their GPU
    del results, got, ref
    # What is left is cuBLAS's workspaces, taken at the GPU's first matrix product and kept:
    # the host's, and autograd's device thread's (grad runs the autograd engine).
    assert torch.cuda.memory_allocated(1) == before + 2 * cublas_workspace_bytes(None)

    models = [nn.Linear(4, 2).to("cuda:0") for _ in range(3)]  # the model-ensembling pattern
    params, buffers = stack_module_state(models)
    base = nn.Linear(4, 2).to("meta")
    x0 = xh.to("cuda:0")
    out = vmap(lambda p, b, d: functional_call(base, (p, b), (d,)), in_dims=(0, 0, None))(
        params, buffers, x0)
    assert out.device == torch.device("cuda", 0)
    assert torch.allclose(out.cpu(), torch.stack([m(x0) for m in models]).cpu())

    w0 = torch.randn(4, device="cuda:0")
    with pytest.raises(RuntimeError, match="found at least two devices, cuda:1 and cuda:0"):
        vmap(lambda r: r * w0)(x)
    with pytest.raises(RuntimeError, match="found at least two devices, cuda:1 and cpu"):
        vmap(lambda r: r * torch.ones(4))(x)


def test_sparse_tensors_are_refused_not_silently_left_on_the_host(two) -> None:
    with pytest.raises(NotImplementedError, match="dense \\(strided\\) tensors only"):
        torch.ones(2, 2).to_sparse().cuda()


def test_nn_parallel_scatter_and_allreduce_as_in_d2l(two) -> None:
    devices = [torch.device("cuda:0"), torch.device("cuda:1")]
    data = torch.arange(20).reshape(4, 5)
    split = nn.parallel.scatter(data, devices)
    assert [s.device for s in split] == devices
    assert [s.tolist() for s in split] == [data[:2].tolist(), data[2:].tolist()]
    grads = [torch.ones((1, 2), device=d) * (i + 1) for i, d in enumerate(devices)]
    for i in range(1, len(grads)):  # d2l's allreduce
        grads[0][:] += grads[i].to(grads[0].device)
    for i in range(1, len(grads)):
        grads[i][:] = grads[0].to(grads[i].device)
    assert [g.device.index for g in grads] == [0, 1] and grads[1].tolist() == [[3.0, 3.0]]
    gathered = nn.parallel.gather(list(split), "cuda:1")
    assert gathered.device.index == 1 and torch.equal(gathered.cpu(), data)


class _WhereAmI(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(10, 1)
        self.seen: list[torch.device] = []

    def forward(self, x):
        self.seen.append(x.device)
        return self.lin(x) + torch.zeros(1, device=x.device)  # a factory inside a replica


def _train_data_parallel(devices: list[int] | None) -> float:
    torch.manual_seed(0)
    net = _WhereAmI()
    X, y = torch.randn(64, 10), torch.randn(64, 1)
    model: nn.Module = net
    if devices:
        model = nn.DataParallel(net, device_ids=devices).to(f"cuda:{devices[0]}")
        X, y = X.to(f"cuda:{devices[0]}"), y.to(f"cuda:{devices[0]}")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(30):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X), y)
        loss.backward()
        opt.step()
    assert loss.device == (torch.device("cuda", devices[0]) if devices else torch.device("cpu"))
    return loss.item()


def test_data_parallel_splits_the_batch_over_the_gpus_and_trains_like_the_cpu() -> None:
    cpu_loss = _train_data_parallel(None)
    simulated.start(2)
    assert _train_data_parallel([0, 1]) == pytest.approx(cpu_loss, rel=1e-5)
    net = _WhereAmI()
    dp = nn.DataParallel(net).cuda()
    out = dp(torch.randn(8, 10, device="cuda:0"))
    assert out.device.index == 0 and out.shape == (8, 1)
    assert sorted(d.index for d in net.seen[-2:]) == [0, 1]


def test_save_and_load_keep_or_map_the_device(two, tmp_path) -> None:
    x = torch.randn(3, device="cuda:1")
    state = nn.Linear(2, 2).cuda(0).state_dict()
    path = tmp_path / "t.pt"
    torch.save({"x": x, "state": state}, path)
    d = torch.load(path)
    assert d["x"].device.index == 1 and d["state"]["weight"].device.index == 0
    assert torch.equal(d["x"].cpu(), x.cpu())
    assert torch.load(path, map_location="cpu")["x"].device.type == "cpu"
    assert torch.load(path, map_location="cuda:0")["x"].device.index == 0
    assert torch.load(path, map_location={"cuda:1": "cuda:0"})["x"].device.index == 0
    assert torch.load(path, map_location=torch.device("cuda", 1))["state"]["bias"].device.index == 1
    simulated.stop()
    simulated.start(1)
    with pytest.raises(RuntimeError, match="CUDA device 1 but torch.cuda.device_count\\(\\) is 1"):
        torch.load(path)


def test_deepcopy_keeps_the_device(two) -> None:
    net = nn.Linear(2, 2).cuda(1)
    assert copy.deepcopy(net).weight.device.index == 1
    assert copy.deepcopy(torch.ones(2, device="cuda:0")).device.index == 0


# --- memory ---------------------------------------------------------------------------------

def test_memory_is_accounted_per_gpu_like_cuda(two) -> None:
    assert torch.cuda.memory_allocated(0) == 0
    x = torch.empty(1024, 256, device="cuda:0")  # 1 MiB
    assert torch.cuda.memory_allocated(0) == MIB
    assert torch.cuda.memory_allocated(1) == 0
    views = [x[1:], x.t(), x.view(-1)]
    assert torch.cuda.memory_allocated(0) == MIB  # views share the storage
    small = torch.ones(1, device="cuda:0")  # CUDA rounds blocks up to 512 bytes
    assert torch.cuda.memory_allocated(0) == MIB + 512
    del x, views, small
    assert torch.cuda.memory_allocated(0) == 0
    assert torch.cuda.max_memory_allocated(0) == MIB + 512
    torch.cuda.reset_peak_memory_stats(0)
    assert torch.cuda.max_memory_allocated(0) == 0
    y = torch.ones(2, device="cuda:1")  # a small block: the allocator takes a 2 MiB segment
    assert simulated.memory_stats(1) == {"allocated": 512, "peak": 512, "limit": None,
                                         "reserved": 2 * MIB}
    simulated.reset_peak(1)
    del y
    assert simulated.memory_stats(1)["peak"] == 512
    free, total = torch.cuda.mem_get_info(1)
    assert free == total - 2 * MIB  # the segment stays cached after del, as on a GPU
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved(1) == 0
    assert torch.cuda.mem_get_info(1) == (total, total)


def test_gradients_count_on_their_gpu_once_backward_made_them(two) -> None:
    w = torch.zeros(256, 256, device="cuda:1", requires_grad=True)  # 256 KiB
    x = torch.ones(256, device="cuda:1")
    # The GPU's first product takes cuBLAS's workspace, and the first backward with one
    # autograd's thread's: both stay.
    (w @ x).sum().backward()
    w.grad = None
    before = torch.cuda.memory_allocated(1)
    (w @ x).sum().backward()
    assert torch.cuda.memory_allocated(1) == before + 256 * 256 * 4  # w.grad
    w.grad = None
    assert torch.cuda.memory_allocated(1) == before


def test_out_of_memory_in_cudas_words_and_nothing_left_allocated() -> None:
    simulated.start(2, [None, 100])
    keep = torch.empty(22 * MIB // 4, device="cuda:1")  # 22 MiB of float32
    with pytest.raises(torch.OutOfMemoryError) as err:
        torch.empty(100 * MIB // 4, device="cuda:1")
    assert re.match(
        r"CUDA out of memory\. Tried to allocate 100\.00 MiB\. GPU 1 has a total capacity of "
        r"100\.00 MiB of which 78\.00 MiB is free\. Including non-PyTorch memory, this process has 22\.00 MiB "
        r"memory in use\. "
        r"Of the allocated memory 22\.00 MiB is allocated by PyTorch", str(err.value))
    assert "(This GPU is simulated on the CPU; its memory limit comes from devlab.config.simulate_gpus" in str(err.value)
    assert torch.cuda.memory_allocated(1) == 22 * MIB
    big = torch.ones(64 * MIB // 4, device="cuda:1")
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 64.00 MiB. GPU 1 .* of "
                                                     "which 14.00 MiB is free"):
        big + 1  # an op's output is refused after the fact, and dropped
    with pytest.raises(torch.OutOfMemoryError):
        torch.ones(64 * MIB // 4).to("cuda:1")
    assert torch.cuda.memory_allocated(1) == 86 * MIB
    del keep, big
    assert torch.cuda.memory_allocated(1) == 0
    torch.empty(100 * MIB // 4, device="cuda:1")  # exactly the capacity fits
    torch.empty(200 * MIB // 4, device="cuda:0")  # GPU 0 is unlimited


# --- what the placement log relies on ------------------------------------------------------

class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int | None, list[int | None]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        src = [simulated.index_of(a) for a in args if isinstance(a, torch.Tensor)]
        self.events.append((str(func), simulated.current_index(), src))
        return func(*args, **(kwargs or {}))


def test_current_index_names_the_device_of_factories_and_copies(two) -> None:
    host = torch.ones(4)
    with _Recorder() as rec:
        f = torch.zeros(2, device="cuda:1")
        g = host.cuda(0)
        back = g.cpu()
        across = g.to("cuda:1")
        g + g
    assert ("aten.zeros.default", 1, []) in rec.events
    assert ("aten._to_copy.default", 0, [None]) in rec.events  # host to GPU 0
    assert ("aten._to_copy.default", None, [0]) in rec.events  # GPU 0 to host
    assert ("aten._to_copy.default", 1, [0]) in rec.events  # GPU 0 to GPU 1
    assert ("aten.add.Tensor", 0, [0, 0]) in rec.events
    assert simulated.current_index() is None
    assert (f.device.index, back.device.type, across.device.index) == (1, "cpu", 1)
    assert simulated.index_of(g) == 0 and simulated.index_of(host) is None


def test_first_simulated_tensor_initializes_the_runtime(two) -> None:
    assert not runtime.is_initialized() and not simulated.is_used()
    torch.ones(2)
    assert not runtime.is_initialized()
    torch.ones(2, device="cuda:0")
    assert runtime.is_initialized() and simulated.is_used()


def test_a_gpu_without_memory_growth_reserves_its_free_memory_at_first_use(two) -> None:
    # TensorFlow's default: a GPU's memory is mapped up front. As devlab does on a real GPU,
    # GPU 0 (64 MiB) reserves nine tenths of its free memory in the allocator when first used:
    # one cached segment of 57.6 MiB, rounded up to CUDA's 2 MiB (58 MiB); GPU 1 has no limit
    # (nothing of its own to reserve), GPU 2 grows on demand.
    simulated.reconfigure([64, None, 32], [False, False, True])
    assert simulated.memory_stats(0) == {"allocated": 0, "peak": 0, "limit": 64 * MIB,
                                         "reserved": 0}
    x = torch.empty(4 * MIB, dtype=torch.uint8, device="cuda:0")  # split from that segment
    y = torch.empty(MIB, dtype=torch.uint8, device="cuda:1")
    z = torch.empty(MIB, dtype=torch.uint8, device="cuda:2")
    assert [torch.cuda.memory_allocated(i) for i in range(3)] == [4 * MIB, MIB, MIB]
    assert [torch.cuda.memory_reserved(i) for i in range(3)] == [58 * MIB, 2 * MIB, 2 * MIB]
    assert [torch.cuda.max_memory_reserved(i) for i in range(3)] == [58 * MIB, 2 * MIB, 2 * MIB]
    assert [simulated.memory_stats(i)["reserved"] for i in range(3)] == [58 * MIB, 2 * MIB,
                                                                        2 * MIB]
    assert torch.accelerator.memory_reserved(0) == 58 * MIB
    stats = torch.cuda.memory_stats(0)
    assert (stats["reserved_bytes.all.current"], stats["allocated_bytes.all.current"]) == (
        58 * MIB, 4 * MIB)
    assert (stats["segment.large_pool.current"], stats["inactive_split.all.current"]) == (1, 1)
    assert torch.cuda.mem_get_info(0) == (6 * MIB, 64 * MIB)  # reserved is not free
    assert torch.cuda.mem_get_info(2) == (30 * MIB, 32 * MIB)
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(61 * MIB, dtype=torch.uint8, device="cuda:0")
    assert ("Tried to allocate 62.00 MiB. GPU 0 has a total capacity of 64.00 MiB of which "
            "6.00 MiB is free. Including non-PyTorch memory, this process has ") in str(info.value)
    assert ("Of the allocated memory 4.00 MiB is allocated by PyTorch, and 54.00 MiB is "
            "reserved by PyTorch but unallocated.") in str(info.value)
    del x, y, z
    assert [torch.cuda.memory_reserved(i) for i in range(3)] == [58 * MIB, 2 * MIB, 2 * MIB]
    torch.cuda.empty_cache()
    assert [torch.cuda.memory_reserved(i) for i in range(3)] == [0, 0, 0]


def test_reconfigure_without_growth_flags_grows_on_demand(two) -> None:
    with pytest.raises(ValueError, match="memory_growth has 1 entries for 2"):
        simulated.reconfigure([64, 64], [False])
    simulated.reconfigure([64, 64])  # the older call: every GPU grows on demand
    assert [simulated.memory_stats(i)["reserved"] for i in range(2)] == [0, 0]
    x = torch.ones(1, device="cuda:1")
    assert torch.cuda.memory_allocated(1) == 512
    assert torch.cuda.memory_reserved(1) == torch.cuda.max_memory_reserved(1) == 2 * MIB
    del x


def test_reconfigure_only_before_first_use(two) -> None:
    simulated.reconfigure([None, 50, 50])
    assert torch.cuda.device_count() == 3
    assert simulated.memory_stats(2)["limit"] == 50 * MIB
    torch.ones(1, device="cuda:2")
    with pytest.raises(RuntimeError, match="cannot be modified after being initialized"):
        simulated.reconfigure([None])
    with pytest.raises(RuntimeError, match="cannot be modified after being initialized"):
        simulated.start(1)


def test_start_from_environment(monkeypatch) -> None:
    monkeypatch.delenv("DEVLAB_SIMULATE_GPUS", raising=False)
    assert not devlab.config.simulate_from_environment()
    monkeypatch.setenv("DEVLAB_SIMULATE_GPUS", "3")
    monkeypatch.setenv("DEVLAB_SIMULATE_GPU_MEMORY_MB", "64")
    assert devlab.config.simulate_from_environment()
    assert simulated.device_count() == 3 and simulated.memory_stats(2)["limit"] == 64 * MIB
    assert len(devlab.config.list_physical_devices("GPU")) == 3
    assert not devlab.config.simulate_from_environment()  # already running
    devlab.config.stop_simulation()
    monkeypatch.setenv("DEVLAB_SIMULATE_GPUS", "two")
    with pytest.warns(UserWarning, match="devlab ignored DEVLAB_SIMULATE_GPUS='two'.*DEVLAB_SIMULATE_GPUS=2"):
        assert not devlab.config.simulate_from_environment()
    assert not simulated.is_active()


def test_environment_switch_at_import() -> None:
    import os
    import subprocess
    import sys

    code = "import devlab, torch; print(torch.cuda.device_count(), torch.ones(1, device='cuda:1').device)"
    env = {**os.environ, "DEVLAB_SIMULATE_GPUS": "2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2 cuda:1"


def test_other_threads_read_the_device_of_simulated_tensors(two) -> None:
    x = torch.ones(2, device="cuda:1")
    seen = []
    t = threading.Thread(target=lambda: seen.append((x.device, (x + 1).device)))
    t.start()
    t.join()
    # Reading works anywhere; routing of new work happens in the starting thread only.
    assert seen[0][0] == torch.device("cuda", 1)


def test_thread_routing_lets_another_thread_place_work(two) -> None:
    out = []

    def work() -> None:
        with simulated.thread_routing():
            out.append(torch.ones(2, device="cuda:1") * 2)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out[0].device.index == 1 and out[0].tolist() == [2.0, 2.0]


def test_dataloader_pins_batches_in_its_own_thread(two) -> None:
    ds = torch.utils.data.TensorDataset(torch.arange(8.0).view(8, 1))
    dl = torch.utils.data.DataLoader(ds, batch_size=4, pin_memory=True, num_workers=1)
    batches = [b.to("cuda", non_blocking=True) for (b,) in dl]
    assert [b.device.index for b in batches] == [0, 0]
    assert torch.cat([b.cpu() for b in batches]).view(-1).tolist() == list(range(8))


# --- asynchronous launch --------------------------------------------------------------------

def test_heavy_products_launch_asynchronously_and_host_reads_wait(two, monkeypatch) -> None:
    monkeypatch.setattr(_launch, "MIN_MACS", 1)
    a = torch.randn(64, 64, device="cuda:0")
    expected = (a.cpu() @ a.cpu()).sum().item()
    gate = threading.Event()
    _workers.submit(0, lambda: gate.wait(10))  # hold GPU 0's queue
    out = a.mm(a)  # returns at once: the product waits in the queue
    assert out.device.index == 0 and out.shape == (64, 64)
    assert not _workers.idle(0)
    # The input, the output allocated at launch, and cuBLAS's workspace the GPU's first
    # product takes (launched or not).
    workspace = cublas_workspace_bytes(None)
    assert torch.cuda.memory_allocated(0) == 2 * 64 * 64 * 4 + workspace
    threading.Timer(0.05, gate.set).start()
    assert out.sum().item() == pytest.approx(expected, rel=1e-5)  # waited for the queue
    assert _workers.idle(0)
    del out
    assert torch.cuda.memory_allocated(0) == 64 * 64 * 4 + workspace  # the output is let go


def test_two_gpus_work_at_the_same_time(two) -> None:
    # GPU 0's work can only finish once GPU 1's has started: that needs two workers at once.
    started = threading.Event()
    done = threading.Event()
    _workers.submit(0, lambda: done.set() if started.wait(10) else None)
    _workers.submit(1, started.set)
    torch.cuda.synchronize()
    assert done.is_set()
    names = {w.thread.name for w in _workers._workers.values()}
    assert names == {"devlab-simulated-gpu0", "devlab-simulated-gpu1"}


def test_async_products_equal_synchronous_ones(two) -> None:
    x = torch.randn(300, 300, device="cuda:1")
    b = torch.randn(4, 50, 60, device="cuda:1")
    c = torch.randn(4, 60, 70, device="cuda:1")
    outs = [x.mm(x), x @ x, torch.matmul(x, x), torch.bmm(b, c)]
    torch.cuda.synchronize()
    ref = [x.cpu().mm(x.cpu()), x.cpu() @ x.cpu(), x.cpu() @ x.cpu(), torch.bmm(b.cpu(), c.cpu())]
    for o, r in zip(outs, ref, strict=True):
        assert o.device.index == 1 and torch.allclose(o.cpu(), r)
    with pytest.raises(RuntimeError):
        x.mm(torch.randn(7, 7, device="cuda:1"))  # shape errors stay synchronous


def test_events_time_simulated_work(two) -> None:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    x = torch.randn(200, 200, device="cuda:0")
    start.record()
    for _ in range(3):
        x = x.mm(x) / 200
    end.record()
    torch.cuda.synchronize()
    assert end.elapsed_time(start) <= 0 <= start.elapsed_time(end)



def test_device_generic_events_and_streams_wait_for_simulated_work(two) -> None:
    # torch.accelerator's docs time with torch.Event: it must wait for the GPU's queue.
    start, end = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
    assert isinstance(start, torch.cuda.Event) and isinstance(torch.Stream(), torch.cuda.Stream)
    gate = threading.Event()
    start.record()
    _workers.submit(0, lambda: gate.wait(10))  # simulated work on GPU 0 until the gate opens
    end.record()
    assert not end.query()
    threading.Timer(0.2, gate.set).start()
    torch.accelerator.synchronize()
    assert end.query() and start.elapsed_time(end) >= 150
    stream = torch.Stream("cuda:1")  # a new stream of GPU 1's pool, as on CUDA
    assert stream.device_index == 1 and stream != torch.cuda.current_stream(1)
    # what a GPU's default stream says of itself, as FSDP2 (torch 2.15) passes it to its ops
    cuda_type = int(torch._C._autograd.DeviceType.CUDA)
    default = torch.cuda.current_stream(1)
    assert (default.stream_id, default.device_type, default.cuda_stream) == (0, cuda_type, 0)
    gate.clear()
    _workers.submit(1, lambda: gate.wait(10))
    assert not stream.query()
    gate.set()
    stream.synchronize()
    assert stream.query()
    # another device still gets torch's own objects
    assert type(torch.Event(device="cpu")) is torch._C.Event
    assert type(torch.Stream("cpu")) is torch._C.Stream


@pytest.mark.skipif(sys.version_info < (3, 11), reason="a bare raise keeps an edited "
                    "traceback from Python 3.11 on")
def test_errors_raised_in_torchs_name_leave_without_the_simulations_frames() -> None:
    import os
    import traceback

    simulated.start(2, [1, None])
    ours = os.path.join("devlab", "simulated")

    def user_code() -> torch.Tensor:
        return torch.ones(2**20, device="cuda:0")  # 4 MiB on a 1 MiB GPU

    for call, error in ((user_code, torch.OutOfMemoryError),
                        (lambda: torch.ones(3, device="cuda:0") + torch.ones(3, device="cuda:1"),
                         RuntimeError),
                        (lambda: torch.ones(3, device="cuda:9"), RuntimeError),
                        (lambda: torch.ones(3, device="cuda:1").numpy(), TypeError),
                        # torch's own errors while the simulation runs the op
                        (lambda: torch.ones(2, 3, device="cuda:0") @ torch.ones(2, 3,
                                                                                device="cuda:0"),
                         RuntimeError),
                        (lambda: torch.ones(2, 3, device="cuda:0").view(4), RuntimeError)):
        with pytest.raises(error) as info:
            call()
        frames = traceback.extract_tb(info.value.__traceback__)
        assert not [f for f in frames if ours in f.filename], frames
        assert frames[-1].filename == __file__  # it ends in this file, the caller's
    with pytest.raises(torch.OutOfMemoryError) as info:
        user_code()
    assert traceback.extract_tb(info.value.__traceback__)[-1].name == "user_code"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="a bare raise keeps an edited "
                    "traceback from Python 3.11 on")
def test_patched_torch_cuda_errors_leave_without_the_simulations_frames() -> None:
    import os
    import traceback

    simulated.start(2)
    ours = os.path.join("devlab", "simulated")
    ordinal = getattr(torch, "AcceleratorError", RuntimeError)

    def enter_device() -> None:
        with torch.cuda.device(9):
            pass

    untimed = torch.cuda.Event()
    calls = [
        (lambda: torch.cuda.set_device(7), ordinal, "CUDA error: invalid device ordinal"),
        (lambda: torch.accelerator.set_device_index(7), ordinal,
         "CUDA error: invalid device ordinal"),
        (lambda: torch.cuda.get_device_properties(7), AssertionError, "Invalid device id"),
        (lambda: torch.cuda.memory_allocated("cpu"), ValueError,
         "Expected a cuda device, but got: cpu"),
        (lambda: torch.cuda.Stream(5), AssertionError, "Invalid device id"),
        (enter_device, ordinal, "CUDA error: invalid device ordinal"),
        (lambda: untimed.elapsed_time(untimed), RuntimeError,
         "Both events must be created with argument 'enable_timing=True'."),
    ]
    for call, error, text in calls:
        with pytest.raises(error) as info:
            call()
        assert str(info.value).startswith(text)
        frames = traceback.extract_tb(info.value.__traceback__)
        assert not [f for f in frames if ours in f.filename], frames
        assert frames[-1].filename == __file__  # it ends in this file, the caller's


# --- stop() puts torch back exactly ------------------------------------------------------

def _snapshot() -> dict[str, object]:
    mods = [torch.Tensor, torch.cuda, torch.accelerator, torch.utils._device.DeviceContext,
            torch.backends.cudnn]
    # imported here, so that one the simulation imports on start is in `before` too
    mods += [importlib.import_module(n) for n in (
        "torch.cuda.memory", "torch.cuda.random", "torch.cuda.comm", "torch.accelerator.memory",
        "torch.nn.parallel", "torch.nn.parallel._functions", "torch.nn.parallel.comm",
        "torch.nn.parallel.data_parallel", "torch.nn.parallel.parallel_apply",
        "torch.nn.parallel.scatter_gather", "torch.utils.data._utils.pin_memory")]
    snap: dict[str, object] = {f"{m.__name__}.{k}": v for m in mods for k, v in vars(m).items()}
    snap["torch.Event"], snap["torch.Stream"] = torch.Event, torch.Stream
    snap["torch.device"], snap["torch.Generator"] = torch.device, torch.Generator
    snap["torch._C._group_tensors_by_device_and_dtype"] = torch._C._group_tensors_by_device_and_dtype
    snap["threading.Thread._bootstrap_inner"] = vars(threading.Thread)["_bootstrap_inner"]
    autocast = torch.amp.autocast_mode.autocast
    snap["autocast.__enter__"], snap["autocast.__exit__"] = autocast.__enter__, autocast.__exit__
    snap["AutocastCPU kernels"] = tuple(
        torch._C._dispatch_has_kernel_for_dispatch_key(op, "AutocastCPU")
        for op in ("aten::softmax.int", "aten::einsum", "aten::exp", "aten::mm"))
    snap["TCPStore"] = (torch.distributed.TCPStore,
                        importlib.import_module("torch.distributed.rendezvous").TCPStore)
    snap["registry"] = list(torch.serialization._package_registry)
    return snap


def _assert_torch_is_normal(before: dict[str, object]) -> None:
    after = _snapshot()
    assert after.keys() == before.keys()
    changed = [k for k in before if after[k] is not before[k] and after[k] != before[k]
               and k != "registry"]
    assert changed == []
    assert all(a is b for a, b in zip(after["registry"], before["registry"], strict=True))
    assert torch._C._len_torch_function_stack() == 0
    assert not torch.cuda.is_available() and torch.cuda.device_count() == 0
    assert torch.Tensor.device is torch._C.TensorBase.device
    with _no_cuda():
        torch.ones(1, device="cuda")
    with _no_cuda():
        torch.ones(1).cuda()
    assert torch.get_default_device() == torch.device("cpu")


def _has_accelerator() -> bool:
    try:
        torch.device(0)
    except RuntimeError:
        return False
    return True


def _no_cuda() -> pytest.RaisesContext:
    """What asking a torch without GPUs for CUDA raises: a CPU build says it has no CUDA, a
    CUDA build on a machine without GPUs that it found no driver."""
    return pytest.raises((AssertionError, RuntimeError),
                         match="Torch not compiled with CUDA enabled|Found no NVIDIA driver")


# What start() must replace (and stop() put back): among them what torch.utils.benchmark.Timer
# and device-generic code call.
_MUST_PATCH = {
    "torch.accelerator.is_available", "torch.accelerator.synchronize",
    "torch.accelerator.get_device_capability", "torch.accelerator.set_stream",
    "torch.accelerator.current_stream", "torch.accelerator.empty_host_cache",
    "torch.accelerator.reset_accumulated_memory_stats", "torch.accelerator.memory_reserved",
    "torch.accelerator.memory.reset_accumulated_memory_stats",
    "torch.accelerator.memory.empty_host_cache", "torch.accelerator.memory.memory_reserved",
    "torch.cuda.synchronize", "torch.cuda.set_stream", "torch.cuda.memory_reserved",
    "torch.cuda.reset_accumulated_memory_stats", "torch.cuda.memory.memory_reserved",
    "torch.cuda.memory.reset_accumulated_memory_stats", "torch.Event", "torch.Stream",
    # where torch asks C++ about devices, threads, autocast
    "torch.device", "torch.Generator", "torch._C._group_tensors_by_device_and_dtype",
    "torch.cuda._lazy_init", "threading.Thread._bootstrap_inner", "autocast.__enter__",
    "AutocastCPU kernels",
}


def test_stop_returns_torch_to_exactly_its_normal_behaviour() -> None:
    before = _snapshot()
    simulated.start(2, [None, 10])
    during = _snapshot()
    patched = {k for k in before if k != "registry" and during[k] is not before[k]
               and during[k] != before[k]}
    # Names an older torch lacks (torch.accelerator grew over releases) cannot be patched.
    must = {k for k in _MUST_PATCH if k in before and before[k] is not None}
    if _has_accelerator():  # a CUDA build reads torch.device(0) itself: no stand-in needed
        must.discard("torch.device")
    assert must <= patched, sorted(must - patched)
    x = torch.ones(3, device="cuda:1")
    y = x.cuda(0) @ torch.ones(3, device="cuda:0")
    torch.set_default_device("cuda:1")
    simulated.stop()
    _assert_torch_is_normal(before)
    # tensors made while simulating are plain CPU tensors afterwards
    assert x.device.type == "cpu" and y.device.type == "cpu" and x.tolist() == [1.0] * 3
    assert simulated.index_of(x) is None
    simulated.start(1)  # and a new simulation does not see them as its own
    assert x.device.type == "cpu"
    simulated.stop()
    _assert_torch_is_normal(before)


def test_the_config_switches_start_and_stop_the_simulation() -> None:
    import devlab

    before = _snapshot()
    devlab.config.simulate_gpus(2, memory_limit=64)
    assert simulated.is_active() and torch.cuda.device_count() == 2
    assert simulated.memory_stats(1)["limit"] == 64 * MIB
    x = torch.ones(2, device="cuda:1")
    with pytest.raises(RuntimeError, match="cannot be modified after being initialized"):
        devlab.config.simulate_gpus(3)
    devlab.config.stop_simulation()
    assert not simulated.is_active() and x.device.type == "cpu"
    _assert_torch_is_normal(before)


def test_stop_after_errors_and_a_failed_start(monkeypatch) -> None:
    before = _snapshot()
    simulated.start(2)
    for bad in (lambda: torch.ones(1, device="cuda:0") + torch.ones(1, device="cuda:1"),
                lambda: torch.ones(1, device="cuda:9"), lambda: torch.ones(1, device="cuda:0").numpy()):
        with pytest.raises((RuntimeError, TypeError)):
            bad()
    simulated.stop()
    simulated.stop()  # twice is fine
    _assert_torch_is_normal(before)

    def broken(p) -> None:
        raise RuntimeError("injected")

    from devlab.engine.simulated.mode import factories as _factories

    monkeypatch.setattr(_factories, "install", broken)
    with pytest.raises(RuntimeError, match="injected"):
        simulated.start(2)
    assert not simulated.is_active()
    _assert_torch_is_normal(before)


def test_stop_removes_only_its_own_mode() -> None:
    from torch.overrides import TorchFunctionMode

    simulated.start(1)
    with TorchFunctionMode() as other:
        simulated.stop()
        assert torch._C._len_torch_function_stack() == 1
        assert torch.overrides._get_current_function_mode_stack() == [other]
    assert torch._C._len_torch_function_stack() == 0


def test_stop_from_another_thread_disarms_the_mode() -> None:
    simulated.start(1)
    x = torch.ones(2, device="cuda:0")
    t = threading.Thread(target=simulated.stop)
    t.start()
    t.join()
    assert not simulated.is_active() and not torch.cuda.is_available()
    assert x.device.type == "cpu" and (x + 1).device.type == "cpu"
    with _no_cuda():
        torch.ones(1, device="cuda")
    simulated.start(1)  # removes the disarmed mode of this thread
    assert torch._C._len_torch_function_stack() == 1
    simulated.stop()
    assert torch._C._len_torch_function_stack() == 0


def test_start_rejects_bad_arguments() -> None:
    for args in ((0,), (True,), (2, [10]), (1, [0])):
        with pytest.raises(ValueError):
            simulated.start(*args)
    assert not simulated.is_active()


def test_memory_a_gpu_hands_out_reads_as_zeros(two) -> None:
    """torch.empty and to_empty on a simulated GPU: zeros, as a GPU's fresh memory usually reads,
    not what the host process freed there last (a model that forgets to initialize a layer
    trained on NaNs)."""
    for _ in range(20):
        old = torch.full((64, 64), float("nan"), device="cuda:1")
        del old
        assert int(torch.empty(64, 64, device="cuda:1").count_nonzero()) == 0
        with torch.device("meta"):
            layer = nn.Linear(64, 64)
        layer.to_empty(device="cuda:0")
        assert int(layer.weight.count_nonzero()) == 0 and layer.weight.device.type == "cuda"


def test_the_zeros_of_empty_memory_are_no_op_of_the_program(two) -> None:
    """The simulation's zeros (Note [Why empty memory reads as zeros]) are not an op the program
    ran: under the placement log and under torch.profiler, `torch.empty(..., device="cuda")`
    is `aten::empty` alone, as on a GPU (it had shown an `aten::zero_` on CPU:0 after it), on
    the fast path and the full path, and its memory still reads as zeros."""
    import io

    from torch.profiler import profile

    from devlab.core import placement_log
    from devlab.engine.simulated.mode import routing

    for fast in (True, False):
        routing.fast_path = fast
        try:
            for _ in range(5):
                old = torch.full((64, 64), float("nan"), device="cuda:1")
                del old
                out = io.StringIO()
                with placement_log.capture(out):
                    x = torch.empty(64, 64, device="cuda:1")
                    y = torch.empty(3, dtype=torch.int64, device="cuda:0")
                lines = out.getvalue().splitlines()
                assert len(lines) == 2 and all("aten::empty in device" in ln for ln in lines), lines
                assert lines[0].endswith("GPU:1") and lines[1].endswith("GPU:0"), lines
                assert int(x.count_nonzero()) == 0 and int(y.count_nonzero()) == 0
                del x
                with profile() as prof:
                    x = torch.empty(64, 64, device="cuda:1")
                names = {e.key for e in prof.key_averages()}
                assert "aten::empty" in names and "aten::zero_" not in names, names
                assert int(x.count_nonzero()) == 0
                del x
        finally:
            routing.fast_path = True


def test_torch_compile_runs_uncompiled_with_right_values_and_says_so(two, capfd) -> None:
    """Compiled code is CUDA code, and dynamo traced through the simulation's mode to wrong
    values (x * 2 + 1 gave 2 for 1 with the eager and aot_eager backends): while simulating,
    torch.compile runs the code as written, once saying so."""
    from devlab.engine.simulated.mode import compile_stance as _compile

    _compile._notice.told.clear()
    for backend in ("inductor", "eager", "aot_eager"):
        f = torch.compile(lambda x: x * 2 + 1, backend=backend)
        for device in ("cpu", "cuda:1"):
            y = f(torch.ones(2, device=device))
            assert y.tolist() == [3.0, 3.0] and str(y.device) == device
    layer = torch.compile(nn.Linear(2, 2).to("cuda:0"))
    assert layer(torch.ones(1, 2, device="cuda:0")).device.type == "cuda"
    assert capfd.readouterr().err.count("torch.compile runs the code uncompiled") == 1
    simulated.stop()
    import torch._dynamo.eval_frame as eval_frame

    assert eval_frame._stance.stance == "default"


def test_torch_compile_stays_uncompiled_in_other_threads_and_after_a_stop_from_one(
        no_simulation) -> None:
    """Uncompiled for the whole process: in another thread too; and a stop() from another
    thread makes torch.compile compile again in this one (dynamo's config values are each
    thread's: a setting made in one thread was not undone from another)."""
    compiled: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        compiled.append(len(example_inputs))
        return gm.forward

    simulated.start(1)
    seen: list = []
    f = torch.compile(lambda x: x * 2 + 1, backend=backend)
    t = threading.Thread(target=lambda: seen.append(f(torch.ones(2)).tolist()))
    t.start()
    t.join()
    assert seen == [[3.0, 3.0]] and compiled == []
    t = threading.Thread(target=simulated.stop)
    t.start()
    t.join()
    assert not simulated.is_active()
    g = torch.compile(lambda x: x * 3 + 1, backend=backend)
    assert g(torch.ones(2)).tolist() == [4.0, 4.0] and compiled == [1]
    simulated.start(1)  # removes the mode the other thread's stop() disarmed here
    simulated.stop()


def test_a_meta_tensor_converts_where_it_is(two) -> None:
    # accelerate's set_module_tensor_to_device: .to(dtype) of a meta tensor stays on meta
    # (once routed to the CPU: "Cannot copy out of meta tensor").
    m = torch.empty(3, device="meta")
    assert m.to(torch.float16).device.type == "meta"
    assert m.to(torch.float16).dtype == torch.float16
    h = torch.ones(2).to(torch.float64)
    assert h.dtype == torch.float64 and h.device.type == "cpu"
