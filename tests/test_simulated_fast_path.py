"""The simulation mode's fast path (Note [The mode's fast path] in
devlab/engine/simulated/mode/routing.py): a plain op on one simulated GPU takes it, every
unusual call falls back to the full path (each reason counted), and random op sequences, with
streams, two GPUs, errors, copies and a modeled clock, give the same values, memory figures,
modeled times and errors with the fast path on and forced off."""

from __future__ import annotations

import collections
import io
import random
import threading
import time
import warnings
from typing import Any

import pytest
import torch
from answers import same
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import devlab
from devlab.core import placement_log
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import hazards as _hazards
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.mode import routing


@pytest.fixture
def counted(no_simulation):
    """The fast path's counter on for the test."""
    routing.fallbacks = collections.Counter()
    yield routing.fallbacks
    routing.fallbacks = None
    routing.fast_path = True


def _taken(counter: collections.Counter, fn: Any) -> collections.Counter:
    """What the fast path counted while fn ran."""
    before = collections.Counter(counter)
    try:
        fn()
    finally:
        after = collections.Counter(counter)
    after.subtract(before)
    return +after


class _Watching(TorchDispatchMode):
    """A dispatch mode that is not the placement log: it runs what it sees."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _OwnLog(placement_log.PlacementLog):
    """A user's log built on devlab's: it may do more than record, so no fast path."""


def test_a_plain_op_on_one_gpu_takes_the_fast_path(counted) -> None:
    devlab.simulated.start(1)
    a = torch.ones(8, 8, device="cuda:0")
    b = torch.full((8, 8), 2.0, device="cuda:0")
    got = _taken(counted, lambda: a + b)
    assert got == {"fast": 1}
    c = a + b
    assert c.device == torch.device("cuda:0") and torch.equal(c.cpu(), torch.full((8, 8), 3.0))
    x = torch.ones(100, 100, device="cuda:0")
    # a product too small to hand off to the worker: async_launch's `plain_when` says so
    assert _taken(counted, lambda: torch.linalg.norm(x @ x)) == {"fast": 2}
    assert _taken(counted, lambda: torch.cat([a, b])) == {"fast": 1}  # a list of tensors


@pytest.mark.filterwarnings("ignore::devlab.engine.simulated.base.hazards.GpuHazardWarning")
def test_each_unusual_call_falls_back_to_the_full_path(counted) -> None:
    devlab.simulated.start(2)
    a = torch.ones(8, 8, device="cuda:0")
    b = torch.ones(8, 8, device="cuda:0")
    on1 = torch.ones(8, 8, device="cuda:1")
    host = torch.ones(8, 8)

    def mixed() -> None:
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            a + on1
    assert _taken(counted, mixed) == {"devices": 1}

    def with_host() -> None:
        with pytest.raises(RuntimeError, match="cuda:0 and cpu"):
            a + host
    assert _taken(counted, with_host) == {"host tensor": 1}
    assert _taken(counted, lambda: torch.ones(3, device="cuda:0")) == {"fast factory": 1}
    assert _taken(counted, lambda: torch.ones(3)) == {"handler": 1}  # the host's: full path
    assert _taken(counted, lambda: torch.zeros_like(a, device="cuda:1")) == {
        "device keyword": 1}
    assert _taken(counted, lambda: host + host) == {"host tensor": 1}  # the host's own work

    class Sub(torch.Tensor):
        pass
    s = a.as_subclass(Sub)
    assert counted["subclass"] == 0
    _taken(counted, lambda: s + b)
    assert counted["subclass"] >= 1

    def hooked() -> None:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            a * b
    assert _taken(counted, hooked) == {"mode or hook": 1}

    # the placement log alone takes the fast path (test_a_logged_op_takes_the_fast_path); the
    # log beside another dispatch mode, or a class that is not the log's own, does not
    def logged_and_watched() -> None:
        with placement_log.capture(io.StringIO()), _Watching():
            a * b
    assert _taken(counted, logged_and_watched)["mode or hook"] == 1

    def watched_and_logged() -> None:
        with _Watching(), placement_log.capture(io.StringIO()):
            a * b
    assert _taken(counted, watched_and_logged)["mode or hook"] == 1

    def by_a_subclass() -> None:
        with _OwnLog():
            a * b
    assert _taken(counted, by_a_subclass)["mode or hook"] == 1

    release = threading.Event()

    def queued() -> None:
        _workers.submit(0, release.wait, [])  # work queued on GPU 0 until the timer's set
        timer = threading.Timer(0.2, release.set)
        timer.start()
        try:
            a * b  # the full path waits for the queue, as any use of the GPU's tensors does
        finally:
            timer.join()
            torch.cuda.synchronize(0)
    assert _taken(counted, queued) == {"queued work": 1}

    side = torch.cuda.Stream()

    def on_a_stream() -> None:
        with torch.cuda.stream(side):
            a * b
    assert _taken(counted, on_a_stream) == {"stream": 1}
    # back on the default stream: the fast path again, noting the op's stream as the full
    # path's note_streams does (the hazards' count of work on the default stream moves)
    queued = _hazards._queued.get((0, 0), 0)
    assert _taken(counted, lambda: a * b) == {"fast": 1}
    assert _hazards._queued[(0, 0)] == queued + 1
    # GPU 1 is on its default stream while GPU 0 is not: its ops take the fast path
    with torch.cuda.stream(side):
        assert _taken(counted, lambda: on1 * on1) == {"fast": 1}
        assert _taken(counted, lambda: a * b) == {"stream": 1}

    def pending_copy() -> None:
        dst = torch.empty(8, 8, pin_memory=True)
        dst.copy_(a, non_blocking=True)  # the host's copy is pending until a sync
        a * b
        torch.cuda.synchronize()
    assert _taken(counted, pending_copy)["hazards"] >= 1


def test_a_factory_given_a_simulated_gpu_takes_the_fast_path(counted) -> None:
    devlab.simulated.start(2, model="T4")
    gpu1 = torch.device("cuda", 1)
    made = {
        "empty": lambda: torch.empty(1000, device="cuda:0"),
        "zeros": lambda: torch.zeros(4, 5, device=gpu1),
        "ones": lambda: torch.ones((3, 3), device="cuda", dtype=torch.float16),
        "full": lambda: torch.full((2, 2), 7.0, device="cuda:1", requires_grad=True),
        "rand": lambda: torch.rand(6, device="cuda:0"),
        "randn": lambda: torch.randn(torch.Size([2, 3]), device="cuda:0"),
    }
    kept = []
    for name, make in made.items():
        before = torch.cuda.memory_allocated(0) + torch.cuda.memory_allocated(1)
        assert _taken(counted, lambda make=make: kept.append(make())) == {"fast factory": 1}, name
        grown = torch.cuda.memory_allocated(0) + torch.cuda.memory_allocated(1) - before
        assert grown == (kept[-1].untyped_storage().nbytes() + 511) // 512 * 512, name
    assert torch.equal(made["empty"]().cpu(), torch.zeros(1000))  # See Note [Why empty ...]
    assert made["zeros"]().device == torch.device("cuda:1")
    assert made["ones"]().dtype == torch.float16 and made["ones"]().cpu().sum() == 9
    assert made["full"]().requires_grad and made["full"]().cpu().eq(7).all()
    with torch.cuda.device(1):  # "cuda" is the current GPU
        assert _taken(counted, lambda: torch.zeros(2, device="cuda").device.index) == {
            "fast factory": 1}
        assert torch.zeros(2, device="cuda").device == torch.device("cuda:1")
    # a stream is the allocator's business: the factory's block is cached on it
    with torch.cuda.stream(torch.cuda.Stream()):
        assert _taken(counted, lambda: torch.empty(10, device="cuda:0")) == {"fast factory": 1}


def test_each_unusual_factory_falls_back_to_the_full_path(counted) -> None:
    devlab.simulated.start(2, model="T4")
    assert _taken(counted, lambda: torch.empty(3)) == {"handler": 1}  # no device: the host's
    assert _taken(counted, lambda: torch.arange(3, device="cuda:0")) == {"handler": 1}
    assert _taken(counted, lambda: torch.empty(3, device="cuda:0", pin_memory=False)) == {
        "handler": 1}
    assert _taken(counted, lambda: torch.empty(3, device="cuda:0",
                                               memory_format=torch.contiguous_format)) == {
        "factory keyword": 1}
    assert _taken(counted, lambda: torch.empty(3, device="cpu")) == {"device keyword": 1}
    assert _taken(counted, lambda: torch.empty(3, device="meta")) == {"device keyword": 1}
    assert _taken(counted, lambda: torch.empty(3, device=1)) == {"device keyword": 1}

    def missing_gpu() -> None:
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.empty(3, device="cuda:2")
    assert _taken(counted, missing_gpu) == {"device keyword": 1}

    def not_a_device() -> None:
        with pytest.raises(RuntimeError):
            torch.empty(3, device="cuda:x")
    assert _taken(counted, not_a_device) == {"device keyword": 1}

    def too_big() -> None:  # the full path's check, in the fast path: CUDA's error
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(2**40, device="cuda:0")
    assert _taken(counted, too_big) == {}  # raised before it was counted as taken

    under: list[torch.Tensor] = []

    def default_device() -> None:  # torch's DeviceContext places it (the full path's place)
        with torch.device("cuda:1"):
            under.append(torch.zeros(3))
    assert "fast factory" not in _taken(counted, default_device)
    assert under[0].device == torch.device("cuda:1")

    def logged_and_watched() -> None:  # the log alone takes it: test_a_logged_op_takes_...
        with placement_log.capture(io.StringIO()), _Watching():
            torch.zeros(3, device="cuda:0")
    assert _taken(counted, logged_and_watched)["mode or hook"] == 1

    settled: list[int] = []  # settings set after the start, read again at the first question
    devlab.simulated.settle_at_first_use(lambda: settled.append(1))
    assert _taken(counted, lambda: torch.empty(3, device="cuda:0")) == {"first use": 1}
    assert settled == [1]


def test_a_capture_and_a_mode_below_fall_back(counted) -> None:
    devlab.simulated.start(1, model="T4")
    x = torch.ones(256, device="cuda")
    g = torch.cuda.CUDAGraph()
    before = collections.Counter(counted)
    with torch.cuda.graph(g):
        x + 1
    assert counted["capture"] > before["capture"]
    g.reset()
    devlab.simulated.stop()

    class Below(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
            return func(*args, **(kwargs or {}))

    with Below():
        devlab.simulated.start(1)
        try:
            a = torch.ones(4, device="cuda:0")
            assert _taken(counted, lambda: a + a) == {"mode or hook": 1}
        finally:
            devlab.simulated.stop()


def test_the_switch_off_sends_every_call_down_the_full_path(counted) -> None:
    devlab.simulated.start(1)
    a = torch.ones(8, device="cuda:0")
    routing.fast_path = False
    assert _taken(counted, lambda: a + a) == {}
    routing.fast_path = True
    assert _taken(counted, lambda: a + a) == {"fast": 1}


def test_the_fast_charge_leaves_the_simulation_once(counted) -> None:
    # On the host's wall clock: the fast path charges its kernel and leaves in one hold of the
    # clock's lock (Charges.call_and_leave); after two fast factories, an op, one that
    # raised, a product (the signature's charge) and a view (no kernel), nothing is held,
    # and the host's time runs at the wall clock's pace outside the simulation again.
    devlab.simulated.start(1, model="T4")
    clock = _session.session.charges.clock
    a = torch.ones(8, 8, device="cuda:0")
    b = torch.ones(7, 7, device="cuda:0")
    assert counted["fast factory"] == 2

    def ops() -> None:
        a + a
        with pytest.raises(RuntimeError, match="must match the size"):
            a + b
        a @ a
        a.t()
    assert _taken(counted, ops) == {"fast": 4}
    assert clock._held == 0
    before = clock.catch_up()
    launched = clock.now()
    a * 2.0
    assert clock.now() > launched  # the kernel's launch moved the host on
    time.sleep(0.05)
    assert clock.catch_up() - before >= 0.05


# --- the same answers ------------------------------------------------------------------------


def _sequence(seed: int, gpus: int) -> list[Any]:
    """A random program on `gpus` simulated GPUs; what it saw at every step."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    seen: list[Any] = []
    live: list[torch.Tensor] = [torch.randn(8, 8, device=f"cuda:{i % gpus}")
                                for i in range(4)]
    streams = [None, torch.cuda.Stream("cuda:0")]

    def pick() -> torch.Tensor:
        return rng.choice(live)

    def same_gpu_pair() -> tuple[torch.Tensor, torch.Tensor]:
        a = pick()
        others = [t for t in live if t.device == a.device and t.shape == a.shape]
        return a, rng.choice(others)

    ops = [
        lambda: live.append(torch.add(*same_gpu_pair())),
        lambda: live.append(torch.mul(*same_gpu_pair())),
        lambda: live.append(pick().relu()),
        lambda: live.append(pick() @ pick().new_ones(8, 8)),
        lambda: live.append(torch.linalg.norm(pick()).reshape(1).expand(8).clone().view(8, 1)
                            * torch.ones(1, 8, device=live[0].device)),
        lambda: pick().add_(1.5),
        lambda: live.append(pick().t()),
        lambda: live.append(torch.cat(list(same_gpu_pair()))[:8]),
        lambda: seen.append(pick().sum().item()),
        lambda: live.append(pick() + torch.tensor(2.0)),  # a host 0-dim scalar
        lambda: live.append(pick() + torch.ones(8, 8)),  # a host tensor: the mixed error
        lambda: live.append(pick() + pick()),  # two GPUs: the mixed error, when they differ
        lambda: live.append(pick().to(f"cuda:{rng.randrange(gpus)}")),
        lambda: live.append(pick().cpu().cuda(rng.randrange(gpus))),
        lambda: live.append(torch.ones(8, 8, device=f"cuda:{rng.randrange(gpus)}")),
        lambda: live.append(torch.empty(rng.randrange(1, 5000), device="cuda:0")[:0].new_zeros(
            8, 8)),
        lambda: live.append(torch.randn(256, 256, device="cuda:0")
                            @ torch.randn(256, 256, device="cuda:0")),  # a queued product
        # factories (the fast path's `_fast_factory`) and their frees
        lambda: live.append(torch.zeros(8, 8, device=f"cuda:{rng.randrange(gpus)}",
                                        dtype=rng.choice([torch.float32, torch.float64]))),
        lambda: live.append(torch.full((8, 8), 3.0, requires_grad=rng.random() < 0.5,
                                       device=torch.device("cuda", rng.randrange(gpus)))
                            .detach()),
        lambda: live.append(_on_current(rng.randrange(gpus),
                                        lambda: torch.randn(8, 8, device="cuda"))),
        lambda: live.append(torch.rand(64, device="cuda:0").view(8, 8)),
        lambda: seen.append(torch.empty(rng.randrange(1, 3000), device="cuda:1").sum().item()),
        lambda: live.append(torch.ones(8, 8, device=f"cuda:{gpus}")),  # no such GPU: an error
        lambda: live.append(torch.empty(2**33, device="cuda:1"))  # 32 GB: out of memory
        if _session.session.devices[1].allocator.total is not None else None,
        lambda: live.pop(rng.randrange(len(live))) if len(live) > 2 else None,
        lambda: live.pop(rng.randrange(len(live))) if len(live) > 2 else None,
        # a forward with gradients and its backward: the kernels its ops left on their nodes
        lambda: live.append(_backward(pick(), rng.choice([1.5, 2.0]))),
    ]
    caught = warnings.catch_warnings(record=True)
    found = caught.__enter__()  # the hazards' findings (a block freed while a stream used it)
    warnings.simplefilter("always")
    try:
        _steps(rng, ops, live, streams, seen, gpus, found)
    finally:
        caught.__exit__(None, None, None)
    return seen


def _backward(t: torch.Tensor, scale: float) -> torch.Tensor:
    w = t.detach().clone().requires_grad_()
    (torch.relu(w * scale) + w).sum().backward()
    return w.grad


def _on_current(index: int, make: Any) -> torch.Tensor:
    with torch.cuda.device(index):
        return make()


def _steps(rng: random.Random, ops: list, live: list, streams: list, seen: list, gpus: int,
           found: list) -> None:
    for step in range(120):
        op = rng.randrange(len(ops))
        use_stream = step > 80 and rng.random() < 0.3  # streams late: the fast path runs first
        try:
            s = streams[1] if use_stream else None
            if s is not None:
                with torch.cuda.stream(s):
                    ops[op]()
            else:
                ops[op]()
            seen.append(("ok", op))
        except Exception as e:  # noqa: BLE001 - the error is what is compared
            seen.append(("error", op, type(e).__name__, str(e)))
        live[:] = [t.reshape(8, 8) for t in live if t.dim() and t.numel() == 64]
        if not live:
            live.append(torch.randn(8, 8, device="cuda:0"))
        seen.append([(str(t.device), t.dtype, tuple(t.shape)) for t in live])
        seen.append([torch.cuda.memory_allocated(i) for i in range(gpus)])
        seen.append([(w.category.__name__, str(w.message)) for w in found])
        found.clear()
    torch.cuda.synchronize()
    seen.append([t.cpu() for t in live])
    seen.append([torch.cuda.memory_stats(i) for i in range(gpus)])
    seen.append([torch.cuda.max_memory_reserved(i) for i in range(gpus)])
    clock = _session.session.charges.clock
    if clock is not None:
        seen.append((clock.host, list(clock.free), list(clock.busy), list(clock.compute),
                     dict(clock.side)))


@pytest.mark.usefixtures("modeled_host")
@pytest.mark.parametrize("model", [None, "T4"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_programs_answer_alike_with_the_fast_path_on_and_off(counted, model, seed):
    fast, full = _on_and_off(_sequence, seed, model)
    assert counted["fast"] > 50  # the fast run took it, and fell back too
    assert counted["fast factory"] > 5
    assert sum(v for k, v in counted.items() if k != "fast") > 0
    _same_steps(fast, full)


def _on_and_off(program: Any, seed: int, model: str | None) -> list[list[Any]]:
    """What `program(seed, 2)` saw on two simulated GPUs with the fast path on, then off."""
    runs = []
    try:
        for fast in (True, False):
            routing.fast_path = fast
            devlab.simulated.start(2, model=model)
            try:
                runs.append(program(seed, 2))
            finally:
                devlab.simulated.stop()
                devlab.runtime.reset()
    finally:
        routing.fast_path = True
    return runs


def _same_steps(fast: list[Any], full: list[Any]) -> None:
    assert len(fast) == len(full)
    for i, (x, y) in enumerate(zip(fast, full, strict=True)):
        assert same(x, y), f"step {i}: {x!r} != {y!r}"


# --- under the placement log ------------------------------------------------------------------


def test_a_logged_op_takes_the_fast_path(counted) -> None:
    # The placement log alone on the dispatch mode stack: a plain op and a sized factory take
    # the fast path (See Note [The fast path under the log]), and the log's lines name the
    # op's GPU, also for the aten ops of a torch function made of several.
    devlab.simulated.start(2)
    a = torch.ones(8, 8, device="cuda:1")
    b = torch.full((8, 8), 2.0, device="cuda:1")
    lines = io.StringIO()
    with placement_log.capture(lines) as log:
        assert _taken(counted, lambda: a + b) == {"fast": 1}
        assert _taken(counted, lambda: torch.zeros(4, device="cuda:1")) == {"fast factory": 1}
        assert _taken(counted, lambda: torch.nn.functional.linear(a, b)) == {"fast": 1}
    gpu1 = "/job:localhost/replica:0/task:0/device:GPU:1"
    assert lines.getvalue().splitlines() == log.lines()
    assert log.lines()[:2] == [f"Executing op aten::add in device {gpu1}",
                               f"Executing op aten::zeros in device {gpu1}"]
    assert log.lines()[-1].startswith("Executing op aten::")
    assert all(line.endswith(gpu1) for line in log.lines()[2:])
    assert len(log.lines()) > 3  # linear: a transpose and a product, each on GPU 1


def _logged_sequence(seed: int, gpus: int) -> list[Any]:
    """`_sequence` under the placement log, streaming its lines: what the program saw, then
    the log's lines as written and as kept, its records and its summary."""
    lines = io.StringIO()
    with placement_log.capture(lines) as log:
        seen = _sequence(seed, gpus)
    # the lines written as the ops ran (the log's shortcut for an op's line) are the lines
    # its events give (`Event.text`)
    assert lines.getvalue().splitlines() == log.lines()
    seen.append(log.lines())
    seen.append(log.records())
    seen.append(log.summary().text())
    return seen


@pytest.mark.usefixtures("modeled_host")
@pytest.mark.parametrize("model", [None, "T4"])
@pytest.mark.parametrize("seed", [4, 5])
def test_random_logged_programs_answer_alike_with_the_fast_path_on_and_off(counted, model,
                                                                            seed):
    fast, full = _on_and_off(_logged_sequence, seed, model)
    assert counted["fast"] > 50  # the logged run took it, and fell back too
    assert counted["fast factory"] > 5
    assert sum(v for k, v in counted.items() if k not in ("fast", "fast factory")) > 0
    assert len(fast[-3]) > 200  # the log saw the program's ops
    _same_steps(fast, full)


# --- the free's thread check -------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork here")
def test_a_forked_childs_free_knows_its_own_main_thread(no_simulation) -> None:
    # A storage's free asks whether it runs on a thread devlab started (whose frees are not the
    # host's time) only off the main thread (storage_marks._main_ident); a child forked from
    # another thread has that thread as its main one, and a thread it starts is not it.
    import os

    from devlab.engine.simulated.base import storage_marks

    assert storage_marks._main_ident == threading.get_ident()
    answers: list[str] = []

    def fork_here() -> None:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running anything else
            try:
                seen: list[int] = []
                t = threading.Thread(target=lambda: seen.append(threading.get_ident()))
                t.start()
                t.join()
                ok = (storage_marks._main_ident == threading.get_ident()
                      and storage_marks._main_ident != seen[0])
                os.write(write, b"yes" if ok else b"no")
            finally:
                os._exit(0)
        os.close(write)
        answers.append(os.read(read, 16).decode())
        os.close(read)
        os.waitpid(pid, 0)

    forker = threading.Thread(target=fork_here)
    forker.start()
    forker.join()
    assert answers == ["yes"]
    assert storage_marks._main_ident == threading.get_ident()  # the parent's is unchanged
