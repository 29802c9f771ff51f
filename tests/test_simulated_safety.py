"""Simulated GPUs never show an unfinished value and hold nothing: through a fork, in the memory
count after `del`, after an interrupt; pinned memory; device counts and indices. Each issue
case (issue 16) is written here as the issue wrote it."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import traceback
import weakref

import pytest
import torch

import devlab
from devlab.engine import simulated
from devlab.engine.gpu_model.caching_allocator import AllocatorConfig, round_size
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base import storage_marks as _marks
from devlab.engine.simulated.mode import async_launch as _launch
from devlab.engine.simulated.mode import routing as _routing

MIB = 1024 * 1024
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_FORK_ERROR = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
                   "multiprocessing, you must use the 'spawn' start method")

pytestmark = pytest.mark.usefixtures("no_simulation")


def _python(code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (forking from the test process would fork pytest)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("DEVLAB_SIMULATE_GPUS", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)


def _hold_queue(index: int) -> threading.Event:
    """Hold GPU `index`'s queue until the returned gate is set (work queued after waits)."""
    gate = threading.Event()
    _workers.submit(index, lambda: gate.wait(30))
    return gate


# --- 1. a fork never shows an unfinished value: CUDA's rule ------------------------------------

def test_a_dataloader_worker_reading_a_gpu_product_gets_cudas_error() -> None:
    # The issue: `feats = w @ w` on a simulated GPU, then a DataLoader(num_workers=2) worker's
    # `feats[i, :3].cpu()` gave [0.0, 0.0, 0.0] where num_workers=0 gave the product's values.
    # On CUDA the worker, forked after CUDA was initialized, cannot touch the GPU.
    done = _python(
        "import torch, devlab\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "devlab.config.simulate_gpus(1)\n"
        "w = torch.randn(1024, 1024, device='cuda')\n"
        "feats = w @ w\n"
        "class Rows(Dataset):\n"
        "    def __len__(self): return 4\n"
        "    def __getitem__(self, i): return feats[i, :3].cpu()\n"
        "inline = next(iter(DataLoader(Rows(), batch_size=4, num_workers=0)))\n"
        "print(torch.allclose(inline, (w.cpu() @ w.cpu())[:4, :3]))\n"
        "try:\n"
        "    next(iter(DataLoader(Rows(), batch_size=4, num_workers=2)))\n"
        "except RuntimeError as e:\n"
        "    print(repr(str(e).strip().splitlines()[-1]))\n"
        "else:\n"
        "    print('no error')\n"
        # workers that only load host data run as before
        "cpu = DataLoader(torch.arange(8.0), batch_size=4, num_workers=2)\n"
        "print(torch.cat(list(cpu)).tolist())\n")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == ["True", repr(f"RuntimeError: {CUDA_FORK_ERROR}"),
                     str([float(i) for i in range(8)])]


def test_a_child_forked_after_initialization_follows_cudas_rule() -> None:
    done = _python(
        "import multiprocessing as mp, torch, devlab\n"
        "devlab.config.simulate_gpus(2)\n"
        "feats = torch.randn(1024, 1024, device='cuda:1') @ torch.randn(1024, 1024, device='cuda:1')\n"
        "assert torch.cuda.is_initialized() and not torch.cuda._is_in_bad_fork()\n"
        "def attempt(f):\n"
        "    try:\n"
        "        return repr(f())\n"
        "    except RuntimeError as e:\n"
        "        return 'error' if str(e) == " + repr(CUDA_FORK_ERROR) + " else repr(e)\n"
        "def child(q):\n"
        "    q.put([\n"
        "        torch.cuda.is_available(), torch.cuda.device_count(),\n"
        "        torch.cuda.is_initialized(), torch.cuda._is_in_bad_fork(),\n"
        "        str(feats.device), tuple(feats.shape),  # metadata, as on CUDA\n"
        "        (torch.ones(2) + 1).tolist(),  # host work\n"
        "        attempt(lambda: feats[0, :3].cpu()),\n"
        "        attempt(lambda: print(feats)),\n"
        "        attempt(lambda: feats + 1),\n"
        "        attempt(lambda: torch.ones(2, device='cuda:0')),\n"
        "        attempt(lambda: torch.ones(2).cuda()),\n"
        "        attempt(torch.cuda.synchronize),\n"
        "        attempt(torch.cuda.current_device),\n"
        "        attempt(lambda: devlab.simulated.start(2)),\n"
        "    ])\n"
        "ctx = mp.get_context('fork'); q = ctx.Queue()\n"
        "p = ctx.Process(target=child, args=(q,)); p.start()\n"
        "for item in q.get(timeout=120): print(item)\n"
        "p.join(60); print(p.exitcode)\n"
        "print(torch.allclose(feats.cpu()[0, :3], (feats @ torch.eye(1024, device='cuda:1')).cpu()[0, :3]))\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "True", "2", "False", "True", "cuda:1", "(1024, 1024)", "[2.0, 2.0]",
        *["error"] * 8, "0", "True"]


def test_a_child_forked_before_initialization_may_use_the_gpus() -> None:
    done = _python(
        "import multiprocessing as mp, torch, devlab\n"
        "devlab.config.simulate_gpus(1)\n"
        "torch.cuda.device_count(); torch.cuda.is_available()  # these initialize nothing\n"
        "def child(q):\n"
        "    x = torch.randn(512, 512, device='cuda')\n"
        "    q.put((torch.cuda.is_initialized(), torch.allclose((x @ x).cpu(), x.cpu() @ x.cpu())))\n"
        "ctx = mp.get_context('fork'); q = ctx.Queue()\n"
        "p = ctx.Process(target=child, args=(q,)); p.start(); print(q.get(timeout=120))\n"
        "p.join(60); print(p.exitcode, torch.cuda.is_initialized())\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["(True, True)", "0 False"]


def test_queued_work_is_finished_before_any_fork() -> None:
    # A product (and work behind it) still queued when the process forks: the fork waits for it, so even a child
    # allowed to use the GPUs (devlab's forked ranks: reset_after_fork_for_rank) reads its
    # finished values, never the zeros of an output allocated at launch.
    done = _python(
        "import os, threading, torch, devlab\n"
        "from devlab.engine.simulated.base import gpu_workers as _workers\n"
        "devlab.config.simulate_gpus(1)\n"
        "w = torch.randn(1024, 1024, device='cuda')\n"
        "gate = threading.Event(); _workers.submit(0, lambda: gate.wait(30))\n"
        "feats = w @ w\n"
        "scaled = (w * 3).sum(1)\n"  # an elementwise op and a reduction, queued behind it
        "assert not _workers.idle(0)\n"
        "threading.Timer(0.5, gate.set).start()\n"
        "r, wfd = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    devlab.simulated.reset_after_fork_for_rank()\n"
        "    ok = torch.allclose(feats.cpu(), w.cpu() @ w.cpu())\n"
        "    ok = ok and torch.allclose(scaled.cpu(), (w.cpu() * 3).sum(1))\n"
        "    os.write(wfd, b'1' if ok else b'0'); os._exit(0)\n"
        "os.waitpid(pid, 0); print(os.read(r, 1).decode())\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"]


def test_devlab_forked_ranks_use_the_gpus_they_inherit() -> None:
    done = _python(
        "import torch, devlab\n"
        "devlab.config.simulate_gpus(2)\n"
        "w = torch.randn(512, 512, device='cuda:1')\n"
        "feats = w @ w\n"
        "def rank_job():\n"
        "    return torch.allclose(feats.cpu(), w.cpu() @ w.cpu()) and torch.ones(1, device='cuda:1').device.index == 1\n"
        "print(devlab.launch(rank_job, nprocs=2, start_method='fork'))\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "[True, True]" or "True" in done.stdout.splitlines()[-1]


def _allocated() -> int:
    """memory_allocated() less cuBLAS's workspaces, which a GPU's first product takes and keeps
    (as torch's cuBLAS handles do, the host's and autograd's): what the program's own tensors
    hold."""
    dev = _session.session.devices[0]  # type: ignore[union-attr]
    blocks = (dev.workspace, dev.backward_workspace)
    return torch.cuda.memory_allocated() - sum(b.size for b in blocks if b is not None)


# --- 2. memory after `del`, while the product still runs ---------------------------------------

def test_del_while_the_product_is_queued_frees_at_once_three_of_three(monkeypatch) -> None:
    # The issue: after `del a, b` while `b = a @ a` was still running, memory_allocated stayed
    # at 68.67 MiB and the next allocation raised a false OutOfMemoryError (3 of 3 tries).
    simulated.start(1, [100])
    for _ in range(3):
        a = torch.randn(3000, 3000, device="cuda")  # 34.33 MiB
        gate = _hold_queue(0)  # the product is certainly still queued below
        b = a @ a
        assert _allocated() == 2 * round_size(3000 * 3000 * 4, AllocatorConfig())  # 68.67 MiB
        del a, b
        assert not _workers.idle(0)
        assert _allocated() == 0  # CUDA's allocator frees at once
        # (a factory op waits for the GPU's queue, as the simulation orders work, so the gate
        # opens first rather than let the allocation below wait for the gate's own timeout)
        gate.set()
        c = torch.empty(80 * MIB // 4, device="cuda")  # fits: no false OutOfMemoryError
        assert _allocated() == 80 * MIB
        assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()  # as CUDA would count the peak
        torch.cuda.synchronize()
        assert _allocated() == 80 * MIB  # the finished product took nothing back
        del c
        torch.cuda.reset_peak_memory_stats()
    assert _allocated() == 0


def test_what_the_user_still_holds_stays_counted_while_queued() -> None:
    simulated.start(1)
    a = torch.randn(1024, 1024, device="cuda")
    gate = _hold_queue(0)
    b = a @ a
    held = [a, b]  # other names: taking a view or a storage would wait for the queue
    del a, b
    # both tensors are still the user's: both counted, the product not yet run
    assert not _workers.idle(0)
    assert _allocated() == 2 * 4 * MIB
    del held[0]
    assert _allocated() == 4 * MIB
    gate.set()
    torch.cuda.synchronize()
    assert _allocated() == 4 * MIB
    del held
    assert _allocated() == 0


def test_an_allocation_that_does_not_fit_first_waits_for_the_queue() -> None:
    # Queued work may hold memory the count cannot see freed (here a host callback holding a
    # tensor): as CUDA's allocator synchronizes and frees its cache before it gives up, an
    # allocation that does not fit waits for the queue, then fits.
    simulated.start(1, [64])
    t = torch.empty(40 * MIB // 4, device="cuda")
    gate = threading.Event()
    _workers.submit(0, lambda held=t: gate.wait(30) and held is not None)
    del t
    threading.Timer(0.3, gate.set).start()
    u = torch.empty(40 * MIB // 4, device="cuda")
    assert _workers.idle(0) and torch.cuda.memory_allocated() == 40 * MIB
    del u
    # and what does not fit even then is CUDA's error, after the wait
    keep = torch.empty(40 * MIB // 4, device="cuda")
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 40.00 MiB"):
        torch.empty(40 * MIB // 4, device="cuda")
    assert torch.cuda.memory_allocated() == 40 * MIB
    del keep


# --- 3. an interrupt inside a simulated op keeps nothing alive ---------------------------------

def _state() -> tuple:
    return (list(torch.overrides._get_current_function_mode_stack()),
            torch.get_default_device(), torch.cuda.synchronize, torch.Tensor.device,
            torch.cuda.memory_allocated, {t.ident for t in threading.enumerate()})


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "full path"])
def test_an_interrupt_inside_an_op_keeps_nothing_alive(monkeypatch, fast) -> None:
    # The issue: after an interrupt inside a simulated op, its tensor (25 MB) stayed alive
    # after `del`, gc.collect() and synchronize(): the routing mode's frames held it in the
    # traceback IPython keeps. Here the interrupt lands as a real one does: right after the
    # kernel returns, in the simulation's frames (marking its output, which the mode's fast
    # path and its full path both do through storage_marks.mark_one).
    simulated.start(1)
    monkeypatch.setattr(_routing, "fast_path", fast)
    x = torch.randn(2500, 2500, device="cuda")  # 23.84 MiB
    torch.relu(x)  # the worker thread and the modes exist before
    before = _state()
    outputs = []
    real = _marks.mark_one

    def interrupted(storage, *args):
        real(storage, *args)
        outputs.append(weakref.ref(storage))
        raise KeyboardInterrupt

    monkeypatch.setattr(_marks, "mark_one", interrupted)
    try:
        torch.sin(x)
    except KeyboardInterrupt as e:
        kept = e  # as IPython keeps sys.last_traceback
    monkeypatch.setattr(_marks, "mark_one", real)
    del x
    gc.collect()
    torch.cuda.synchronize()
    assert outputs and outputs[0]() is None
    assert torch.cuda.memory_allocated() == 0
    assert _state() == before
    frames = [f.filename for f in traceback.extract_tb(kept.__traceback__)]
    assert frames and not any(os.path.join("devlab", "simulated") in f for f in frames)


@pytest.mark.parametrize("work", [lambda a: a @ a, lambda a: (a * a).sum(0)],
                         ids=["product", "elementwise and sum"])
def test_an_interrupt_while_waiting_for_the_queue_leaves_it_working(monkeypatch, work) -> None:
    monkeypatch.setattr(_launch, "MIN_MACS", 1)
    monkeypatch.setattr(_launch, "MIN_ELEMENTS", 1)
    simulated.start(1)
    a = torch.randn(256, 256, device="cuda")
    (a @ a).cpu()  # the GPU's worker thread exists before
    before = _state()
    gate = _hold_queue(0)
    b = work(a)
    main = threading.main_thread().ident
    # Ctrl-C as a kernel raises it. In a process that ran torch elastic's launcher in its main
    # thread before (its PContext.start replaces SIGINT's handler for good), it would not be.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    ctrl_c = threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT))  # as Ctrl-C
    try:
        ctrl_c.start()
        with pytest.raises(KeyboardInterrupt):
            b.cpu()  # waits for the held queue, and is interrupted there
        ctrl_c.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not _workers.idle(0)
    gate.set()
    assert torch.allclose(b.cpu(), work(a.cpu()))  # the queue finished its work
    assert _workers.idle(0) and _workers._pending_total == 0
    del a, b
    assert _allocated() == 0 and _state() == before


# --- 4. pinned memory works as on CUDA ------------------------------------------------------------

def test_pinned_memory_works_as_on_cuda() -> None:
    # The issue: `pin_memory=True` raised under simulation though torch.cuda.is_available()
    # was True, and is_pinned() was False.
    simulated.start(1)
    assert torch.cuda.is_available()
    p = torch.empty(4, 4, pin_memory=True)
    assert p.is_pinned() and p.device.type == "cpu"
    assert torch.zeros(3, pin_memory=True).is_pinned()
    t = torch.arange(6.0).view(2, 3)
    assert not t.is_pinned()
    pinned = t.pin_memory()
    assert pinned.is_pinned() and pinned is not t and torch.equal(pinned, t)
    assert pinned.pin_memory() is pinned  # pinned already: itself, as on CUDA
    assert pinned[1].is_pinned() and pinned.untyped_storage().is_pinned()
    g = pinned.to("cuda", non_blocking=True)
    assert g.device == torch.device("cuda", 0) and not g.is_pinned()
    assert torch.equal(g.cpu(), t)
    back = g.to("cpu", non_blocking=True)  # CUDA puts a non-blocking copy home in pinned memory
    assert back.is_pinned() and torch.equal(back, t)
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        g.pin_memory()
    with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
        torch.empty(3, device="cuda", pin_memory=True)


def test_dataloader_pins_its_batches() -> None:
    simulated.start(1)
    ds = torch.utils.data.TensorDataset(torch.arange(8.0).view(4, 2), torch.arange(4))
    for workers in (0, 2):
        dl = torch.utils.data.DataLoader(ds, batch_size=2, pin_memory=True, num_workers=workers)
        batches = list(dl)
        assert all(x.is_pinned() and y.is_pinned() for x, y in batches)
        moved = [x.to("cuda", non_blocking=True) for x, _ in batches]
        assert torch.equal(torch.cat([m.cpu() for m in moved]), torch.arange(8.0).view(4, 2))


def test_a_modeled_copy_from_pinned_memory_does_not_stall_the_host() -> None:
    simulated.start(1, model="T4")
    pageable = torch.randn(4 * MIB)
    pinned = pageable.pin_memory()
    t0 = simulated.modeled_time()
    pageable.to("cuda", non_blocking=True)
    waited_pageable = simulated.modeled_time() - t0
    torch.cuda.synchronize()
    t0 = simulated.modeled_time()
    pinned.to("cuda", non_blocking=True)
    waited_pinned = simulated.modeled_time() - t0
    # 16 MiB over PCIe takes about a millisecond; from pinned memory the host only launches
    assert waited_pinned < waited_pageable / 10


def test_pinning_ends_with_the_simulation() -> None:
    simulated.start(1)
    pinned = torch.ones(3).pin_memory()
    simulated.stop()
    assert not pinned.is_pinned()
    assert torch.Tensor.is_pinned is torch._C.TensorBase.is_pinned


# --- 5. counts and indices: one rule ---------------------------------------------------------

def test_counts_beyond_what_torch_can_address_are_refused_where_given() -> None:
    # The issue: simulate_gpus(100000) was accepted and indices >= 128 wrapped.
    assert simulated.max_count() == 128  # torch keeps a device index in 8 bits: cuda:0..127
    before = torch.cuda.is_available
    for bad in (100000, 129):
        with pytest.raises(ValueError, match="at most 128 GPUs"):
            devlab.config.simulate_gpus(bad)
        with pytest.raises(ValueError, match="at most 128 GPUs"):
            simulated.start(bad)
    for bad in (0, -1, 2.0, True, "2"):
        with pytest.raises(ValueError, match="whole number of at least 1"):
            devlab.config.simulate_gpus(bad)
    assert not simulated.is_active() and torch.cuda.is_available is before
    simulated.start(2)
    with pytest.raises(ValueError, match="at most 128 GPUs"):
        simulated.reconfigure([None] * 10000)
    assert torch.cuda.device_count() == 2
    simulated.stop()
    devlab.config.simulate_gpus(128)
    assert torch.ones(1, device="cuda:127").device == torch.device("cuda", 127)


@pytest.mark.parametrize("device", ["cuda:255", "cuda:256", "cuda:128", "cuda:1000", "cuda:2",
                                    255, 256, 2])
def test_indices_beyond_the_count_are_invalid_ordinals_never_wrapped(device) -> None:
    # The issue: `cuda:255` landed on cuda:0 (torch keeps an index in 8 bits and wraps it).
    simulated.start(2)
    for attempt in (lambda: torch.ones(1, device=device),
                    lambda: torch.ones(1).to(device),
                    lambda: torch.ones(1).cuda(device),
                    lambda: torch.nn.Linear(2, 2).to(device),
                    lambda: torch.cuda.set_device(device)):
        with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
            attempt()
    index = device if isinstance(device, int) else int(device.split(":")[1])
    if index >= simulated.max_count():  # torch.device itself would wrap it: refused at once
        with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
            torch.device("cuda", index)
    else:  # a device that does not exist is a name until it is used, as on CUDA
        assert torch.device("cuda", index).index == index
    # torch.cuda's question about a GPU that is not there: its own error, or, for a name whose
    # index torch cannot even hold, CUDA's invalid ordinal (torch would answer for cuda:0)
    wrapped = isinstance(device, str) and index >= simulated.max_count()
    with pytest.raises((AssertionError, torch.AcceleratorError),
                       match="invalid device ordinal" if wrapped else "Invalid device id"):
        torch.cuda.get_device_name(device)
    assert torch.cuda.current_device() == 0
    assert torch.cuda.memory_allocated(0) == torch.cuda.memory_allocated(1) == 0
