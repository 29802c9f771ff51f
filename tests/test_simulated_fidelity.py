"""Simulated GPUs on the patterns third-party training code reaches within a lesson or two:
evaluation under no_grad, model parallel with optimizers, `model.to(rank)`, AMP, threads, and a
clean interpreter exit. Each test is one of the reproducers the conformance issue reported."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from torch import nn

from devlab.engine import simulated
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import torch_requirements as _requirements
from devlab.engine.simulated.mode import device_queries as _queries

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("no_simulation")


def _launched(monkeypatch) -> list[int]:
    """Record each product queued on a worker (its GPU)."""
    queued: list[int] = []
    submit = _workers.submit

    def spy(index: int, fn, *holds) -> None:
        queued.append(index)
        submit(index, fn, *holds)

    monkeypatch.setattr(_workers, "submit", spy)
    return queued


# --- 1. evaluation under no_grad / inference_mode -----------------------------------------

@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_evaluating_a_large_product_without_grad(two, monkeypatch, context) -> None:
    queued = _launched(monkeypatch)
    W = torch.randn(1024, 1024, device="cuda:0", requires_grad=True)
    h = torch.randn(1024, 1024, device="cuda:0")
    with context():
        y = h @ W
    assert queued == [0]  # still asynchronous: the worker ran under the caller's grad mode
    assert y.device == torch.device("cuda", 0) and not y.requires_grad
    assert y.is_inference() == (context is torch.inference_mode)
    assert torch.equal(y.cpu(), h.detach().cpu() @ W.detach().cpu())


def test_a_product_autograd_records_runs_on_the_calling_thread(two, monkeypatch) -> None:
    queued = _launched(monkeypatch)
    W = torch.randn(1024, 1024, device="cuda:0", requires_grad=True)
    y = torch.randn(1024, 1024, device="cuda:0") @ W
    assert queued == [] and y.requires_grad and y.grad_fn is not None


def test_thread_state_a_worker_lacks_keeps_the_product_on_the_calling_thread(two, monkeypatch) -> None:
    queued = _launched(monkeypatch)
    a = torch.randn(1024, 1024, device="cuda:1")
    expected = a.cpu() @ a.cpu()
    kinds = {
        "plain": contextlib.nullcontext(),
        "no_grad": torch.no_grad(),
        "inference": torch.inference_mode(),
        "autocast": torch.autocast("cpu", dtype=torch.bfloat16),
        "excluded key": torch._C._ExcludeDispatchKeyGuard(
            torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView)),
    }
    launched = {}
    for name, context in kinds.items():
        queued.clear()
        with context:
            out = a @ a
        launched[name] = bool(queued)
        if name != "autocast":
            torch.testing.assert_close(out.cpu(), expected)
    assert launched == {"plain": True, "no_grad": True, "inference": True, "autocast": False,
                        "excluded key": False}
    queued.clear()
    batched = torch.func.vmap(lambda m: m @ a)(torch.stack([a, a]))  # inside a transform
    assert queued == [] and batched.shape == (2, 1024, 1024)


# --- 2. model parallel: optimizers and clipping over two GPUs -----------------------------

def _two_layer_run(device0: str, device1: str, make_opt, clip: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    l1 = nn.Linear(16, 32).to(device0)
    l2 = nn.Linear(32, 4).to(device1)
    opt = make_opt(list(l1.parameters()) + list(l2.parameters()))
    x = torch.randn(64, 16)
    target = torch.randn(64, 4)
    for _ in range(5):
        opt.zero_grad()
        out = l2(torch.relu(l1(x.to(device0))).to(device1))
        loss = nn.functional.mse_loss(out, target.to(device1))
        loss.backward()
        if clip:
            nn.utils.clip_grad_norm_(list(l1.parameters()) + list(l2.parameters()), 0.5)
        opt.step()
    return [p.detach().cpu() for p in (*l1.parameters(), *l2.parameters())]


OPTIMIZERS = {
    "SGD": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "Adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "AdamW": lambda ps: torch.optim.AdamW(ps, lr=0.01),
    "Adam fused": lambda ps: torch.optim.Adam(ps, lr=0.01, fused=True),
    "AdamW fused": lambda ps: torch.optim.AdamW(ps, lr=0.01, fused=True),
    "RMSprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_an_optimizer_over_parameters_on_two_gpus_trains_as_on_the_cpu(name: str) -> None:
    expected = _two_layer_run("cpu", "cpu", OPTIMIZERS[name], clip=True)
    simulated.start(2)
    got = _two_layer_run("cuda:0", "cuda:1", OPTIMIZERS[name], clip=True)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-7)


def test_optimizer_state_and_parameters_stay_on_their_gpus(two) -> None:
    l1, l2 = nn.Linear(4, 4).to("cuda:0"), nn.Linear(4, 1).to(1)
    opt = torch.optim.Adam([*l1.parameters(), *l2.parameters()])
    l2(l1(torch.randn(3, 4, device="cuda:0")).to(1)).sum().backward()
    total = nn.utils.clip_grad_norm_([*l1.parameters(), *l2.parameters()], 1.0)
    opt.step()
    assert total.device == torch.device("cuda", 0)  # the first gradient's device, as torch
    for module, index in ((l1, 0), (l2, 1)):
        for p in module.parameters():
            assert p.device.index == index and p.grad.device.index == index
            assert opt.state[p]["exp_avg"].device.index == index
            assert opt.state[p]["step"].device.type == "cpu"  # Adam's step lives on the host


def test_grouping_by_device_follows_torchs_rules(two) -> None:
    a0, b0 = torch.ones(2, device="cuda:0"), torch.ones(3, device="cuda:0")
    a1, h16 = torch.ones(2, device="cuda:1"), torch.ones(2, device="cuda:1", dtype=torch.float16)
    step = torch.tensor(1.0)  # a host `step`, as Adam keeps
    groups = torch._C._group_tensors_by_device_and_dtype(
        [[a0, a1, b0, h16], [a0, a1, b0, h16], [step] * 4], True)
    assert groups.keys() == {(torch.device("cuda", 0), torch.float32),
                             (torch.device("cuda", 1), torch.float32),
                             (torch.device("cuda", 1), torch.float16)}
    lists, indices = groups[(torch.device("cuda", 0), torch.float32)]
    assert indices == [0, 2] and lists[0][1] is b0 and lists[2] == [step, step]
    # Lists whose i-th tensors live on two GPUs: the foreach op refuses, in PyTorch's words.
    mixed = torch._C._group_tensors_by_device_and_dtype([[a0], [a1]], False)
    ((_, (lists, _)),) = mixed.items()
    with pytest.raises(RuntimeError, match="cuda:0 and cuda:1"):
        torch._foreach_add_(lists[0], lists[1])
    assert torch._C._group_tensors_by_device_and_dtype([[a0], []], False)[
        (torch.device("cuda", 0), torch.float32)][0] == [[a0], []]


# --- 3. integer devices: model.to(rank), torch.device(rank) ---------------------------------

def test_integer_devices_name_gpus_as_on_a_real_machine(two) -> None:
    net = nn.Linear(2, 2).to(1)
    assert {p.device for p in net.parameters()} == {torch.device("cuda", 1)}
    assert nn.Linear(2, 2).cuda(1).weight.device.index == 1
    assert torch.device(1) == torch.device("cuda", 1)
    assert isinstance(torch.device(1), torch.device) and isinstance(torch.device("cpu"), torch.device)
    assert torch.ones(2).to(1).device.index == 1 and torch.ones(2, device=1).device.index == 1
    assert torch.ones(2).to(device=1).device.index == 1
    with torch.device(1):
        assert torch.zeros(3).device == torch.device("cuda", 1)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        nn.Linear(2, 2).to(2)
    import copy
    import pickle

    assert pickle.loads(pickle.dumps(torch.device(1))) == torch.device("cuda", 1)
    assert copy.deepcopy({"d": torch.device(0)})["d"] == torch.device("cuda", 0)


def test_generators_on_simulated_gpus(two) -> None:
    g = torch.Generator(device="cuda:1")
    assert isinstance(g, torch.Generator) and g.device == torch.device("cuda", 1)
    assert torch.Generator(device="cuda").device == torch.device("cuda", 0)
    assert torch.Generator().device.type == "cpu"
    a = torch.randn(4, device="cuda:1", generator=g.manual_seed(7))
    b = torch.randn(4, generator=torch.Generator().manual_seed(7))
    assert a.device.index == 1 and torch.equal(a.cpu(), b)  # drawn as the CPU draws
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.Generator(device="cuda:2")


def test_stop_restores_torch_device_and_generator() -> None:
    # The stand-in is there on every build: a CPU build cannot read a bare int, and a CUDA build
    # wraps an index it cannot hold round (torch.device("cuda", 255) is `cuda`).
    device, generator = torch.device, torch.Generator
    try:
        torch.device(0)
        cpu_build = False  # a CUDA build of torch reads a bare int itself
    except RuntimeError:
        cpu_build = True
    simulated.start(1)
    assert torch.Generator is not generator and torch.device is not device
    assert torch.device(0) == device("cuda", 0)
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
        torch.device("cuda", 255)
    simulated.stop()
    assert torch.device is device and torch.Generator is generator
    if cpu_build:
        with pytest.raises(RuntimeError, match="Cannot access accelerator"):
            torch.device(0)


# --- 4. automatic mixed precision ------------------------------------------------------------

def test_autocast_for_cuda_casts_as_a_gpu_would(two) -> None:
    a = torch.randn(64, 64, device="cuda:0")
    net = nn.Linear(64, 8).to("cuda:0")
    with torch.autocast("cuda", dtype=torch.float16):
        assert (a @ a).dtype == torch.float16 and net(a).dtype == torch.float16
        # CUDA's lists, where CPU autocast's differ: these stay float32 on a GPU ...
        h = a @ a
        assert torch.softmax(h, 1).dtype == torch.float32 and h.sum().dtype == torch.float32
        assert nn.LayerNorm(64).to("cuda:0")(h).dtype == torch.float32
        assert h.exp().dtype == torch.float32 and torch.logsumexp(h, 1).dtype == torch.float32
        # ... einsum runs in the low dtype, and addcmul promotes to the widest input
        assert torch.einsum("ij,jk->ik", a, a).dtype == torch.float16
        assert torch.addcmul(h, a, a).dtype == torch.float32
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            nn.functional.binary_cross_entropy(torch.sigmoid(h), torch.ones_like(h))
        assert torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.float16
        with torch.autocast("cuda", enabled=False):
            assert (a @ a).dtype == torch.float32
        assert (a @ a).dtype == torch.float16
    with torch.autocast("cuda"):
        assert (a @ a).dtype == torch.float16  # CUDA's default, not CPU's bfloat16
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert net(a).dtype == torch.bfloat16
    assert (a @ a).dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("cuda")


def test_mixed_precision_training_with_a_grad_scaler_matches_cpu_autocast() -> None:
    def run(device: str, autocast_device: str) -> list[torch.Tensor]:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        scaler = torch.amp.GradScaler(autocast_device)
        x, y = torch.randn(32, 16).to(device), torch.randn(32, 1).to(device)
        for _ in range(4):
            opt.zero_grad()
            with torch.autocast(autocast_device, dtype=torch.float16):
                loss = nn.functional.mse_loss(net(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return [p.detach().cpu() for p in net.parameters()]

    expected = run("cpu", "cpu")
    simulated.start(1)
    got = run("cuda", "cuda")
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)


# --- 5. threads ------------------------------------------------------------------------------

def test_a_thread_started_while_simulating_places_work_as_the_main_thread_does(two) -> None:
    out: dict[str, object] = {}

    def work() -> None:
        x = torch.ones(3, device="cuda:1")
        out["device"] = (x * 2).device
        out["sum"] = (x * 2).sum().item()
        out["current"] = torch.cuda.current_device()  # per thread, as CUDA's: 0 in a new one

    torch.cuda.set_device(1)
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out == {"device": torch.device("cuda", 1), "sum": 6.0, "current": 0}
    with ThreadPoolExecutor(2) as pool:
        devices = list(pool.map(lambda i: torch.randn(2, 2, device=f"cuda:{i}").mm(
            torch.eye(2, device=f"cuda:{i}")).device, [0, 1]))
    assert devices == [torch.device("cuda", 0), torch.device("cuda", 1)]


def test_a_thread_older_than_the_simulation_fails_in_one_clear_line() -> None:
    go, done = threading.Event(), threading.Event()
    result: dict[str, BaseException | torch.Tensor] = {}

    def old_thread() -> None:
        go.wait(10)
        try:
            result["plain"] = torch.ones(2, device="cuda:0")
        except BaseException as e:
            result["plain"] = e
        with simulated.thread_routing():
            result["routed"] = torch.ones(2, device="cuda:0")
        done.set()

    t = threading.Thread(target=old_thread)
    t.start()  # before the simulation
    simulated.start(2)
    go.set()
    t.join(10)
    err = result["plain"]
    assert isinstance(err, RuntimeError), err
    text = str(err)
    assert len(text.splitlines()) == 1 and "started before the simulation" in text
    assert "thread_routing" in text and "CUDA' backend" not in text
    assert result["routed"].device == torch.device("cuda", 0)


# --- 6. clean exit, in a real interpreter ------------------------------------------------------

def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    full_env.pop("DEVLAB_SIMULATE_GPUS", None)
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("code", [
    # the script: a product still queued on a worker when the interpreter ends
    "import devlab, torch; devlab.config.simulate_gpus(2); "
    "a = torch.randn(1024, 1024, device='cuda:0'); b = a @ a",
    # work on both GPUs, and a thread that made a tensor, then exit without stop()
    "import devlab, torch, threading; devlab.config.simulate_gpus(2)\n"
    "a = [torch.randn(1024, 1024, device=f'cuda:{i}') for i in (0, 1)]\n"
    "b = [x @ x for x in a]\n"
    "t = threading.Thread(target=lambda: torch.ones(3, device='cuda:1') @ torch.ones(3, device='cuda:1'))\n"
    "t.start(); t.join()",
])
def test_the_interpreter_exits_cleanly_with_work_queued(code: str) -> None:
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert "terminate called" not in done.stderr and done.stderr.strip() == ""


def test_a_forked_child_launches_work_on_its_own_workers() -> None:
    # Forked before this process made a simulated tensor (CUDA's rule: a child forked after
    # its parent initialized CUDA may not use it, test_simulated_safety), the child uses the
    # GPUs on workers of its own; the parent's work is its own too.
    code = (
        "import devlab, torch, multiprocessing as mp\n"
        "devlab.config.simulate_gpus(2)\n"
        "def child(q):\n"
        "    x = torch.randn(1024, 1024, device='cuda:1')\n"
        "    q.put(((x @ x).device.index, torch.allclose((x @ x).cpu(), x.cpu() @ x.cpu())))\n"
        "q = mp.get_context('fork').Queue(); p = mp.get_context('fork').Process(target=child, args=(q,))\n"
        "p.start(); print(q.get(timeout=60)); p.join(60); print(p.exitcode)\n"
        "a = torch.randn(1024, 1024, device='cuda:1'); print((a @ a).device.index)\n"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(1,", "True)", "0", "1"]


# --- the torch internals the simulation relies on ---------------------------------------------

def test_a_torch_without_the_internals_is_refused_with_its_version_named(monkeypatch) -> None:
    patched_before = torch.cuda.is_available
    monkeypatch.setattr(_requirements, "REQUIRED",
                        _requirements.REQUIRED + (("torch._C", "_no_such_internal"),))
    with pytest.raises(RuntimeError) as err:
        simulated.start(2)
    text = str(err.value)
    assert f"torch {torch.__version__}" in text and "torch._C._no_such_internal" in text
    assert not simulated.is_active() and torch.cuda.is_available is patched_before


def test_every_required_internal_exists_in_the_tested_torch() -> None:
    assert _requirements.missing() == []


def test_a_torch_outside_the_claimed_range_is_simulated_with_a_warning(monkeypatch) -> None:
    monkeypatch.setattr(_requirements, "claimed_torch", lambda: "torch>=99")
    monkeypatch.setattr(_requirements, "_warned", threading.Event())
    with pytest.warns(UserWarning, match=re.escape(f"untested with torch {torch.__version__}")):
        simulated.start(1)
    assert simulated.is_active()


def test_the_device_stand_in_is_the_real_type_for_pickle_and_isinstance() -> None:
    real = type(torch.device("cpu"))
    stand_in = _queries.stand_in(real, lambda *a: real("cuda", a[0]))
    assert stand_in(3) == real("cuda", 3) and isinstance(real("cpu"), stand_in)
    assert stand_in.__module__ == "torch" and stand_in.__qualname__ == "device"


# --- the same, in a real Jupyter kernel, as a learner meets them ------------------------------

@pytest.mark.notebook
def test_the_reproducers_in_a_notebook_kernel() -> None:
    from nbutil import errors, run_cells, text

    cells = run_cells(
        "%load_ext devlab\n%devices --simulate-gpus 2",
        # 1. evaluation under no_grad
        "import torch\n"
        "W = torch.randn(1024, 1024, device='cuda:0', requires_grad=True)\n"
        "h = torch.randn(1024, 1024, device='cuda:0')\n"
        "with torch.no_grad():\n    y = h @ W\n"
        "print(y.device, y.requires_grad, torch.allclose(y.cpu(), h.cpu() @ W.detach().cpu()))",
        # 2. model parallel with Adam and clipping
        "from torch import nn\n"
        "l1, l2 = nn.Linear(8, 8).to('cuda:0'), nn.Linear(8, 1).to('cuda:1')\n"
        "opt = torch.optim.Adam([*l1.parameters(), *l2.parameters()])\n"
        "loss = l2(l1(torch.randn(4, 8, device='cuda:0')).to('cuda:1')).sum()\n"
        "loss.backward()\n"
        "nn.utils.clip_grad_norm_([*l1.parameters(), *l2.parameters()], 1.0)\n"
        "opt.step()\n"
        "print(l1.weight.device, l2.weight.device)",
        # 3. integer devices
        "print(nn.Linear(2, 2).to(1).weight.device, torch.device(1))",
        # 4. AMP
        "with torch.autocast('cuda', dtype=torch.float16):\n"
        "    print((h @ h).dtype, torch.softmax(h @ h, 1).dtype)",
        # 5. a thread
        "import threading\nout = []\n"
        "t = threading.Thread(target=lambda: out.append((torch.ones(3, device='cuda:1') * 2).device))\n"
        "t.start(); t.join(); print(out)",
    )
    assert not any(errors(c) for c in cells), [text(c) for c in cells]
    shown = [text(c).strip() for c in cells[1:]]
    assert shown == [
        "cuda:0 False True",
        "cuda:0 cuda:1",
        "cuda:1 cuda:1",
        "torch.float16 torch.float32",
        "[device(type='cuda', index=1)]",
    ]


def test_a_model_parallel_backward_is_logged_on_each_gpu(two) -> None:
    from devlab.core import placement_log

    def step(watch: bool) -> tuple[list[str], list[torch.Tensor]]:
        torch.manual_seed(0)
        l1, l2 = nn.Linear(4, 4).to("cuda:0"), nn.Linear(4, 1).to("cuda:1")
        x = torch.randn(3, 4, device="cuda:0")
        with placement_log.capture() if watch else contextlib.nullcontext() as log:
            l2(l1(x).to("cuda:1")).sum().backward()
        lines = [ln.replace("/job:localhost/replica:0/task:0/device:", "") for ln in log.lines()] \
            if watch else []
        return lines, [p.grad for p in (*l1.parameters(), *l2.parameters())]

    lines, watched = step(True)
    _, plain = step(False)
    # The activation crosses forward, its gradient crosses back, and layer 1's weight
    # gradient is computed on GPU 0.
    assert "Copy 48 B from GPU:0 to GPU:1 (aten::_to_copy)" in lines
    assert "Copy 48 B from GPU:1 to GPU:0 (aten::_to_copy)" in lines
    back = lines.index("Copy 48 B from GPU:1 to GPU:0 (aten::_to_copy)")
    assert "Executing op aten::mm in device GPU:0" in lines[back:]
    for w, p in zip(watched, plain, strict=True):
        assert w.device == p.device and torch.equal(w.cpu(), p.cpu())
    assert [g.device.index for g in plain] == [0, 0, 1, 1]
