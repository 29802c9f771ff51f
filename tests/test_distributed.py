"""devlab.launch and devlab.distributed without a kernel: ranks, return values, failures,
timeouts, no process left, the process's state kept; collectives in the placement log."""

from __future__ import annotations

import gc
import os
import re
import signal
import sys
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist
from torch import nn

import devlab
from devlab.core import placement_log
from devlab.core import ranks as distributed
from devlab.core.ranks import launch_options as options
from devlab.core.ranks import rank_reports as reports

pytestmark = pytest.mark.usefixtures("no_simulation")


def _ranks_left() -> list[psutil.Process]:
    """Child processes still alive, but multiprocessing's resource tracker (a helper spawn
    starts once per process, not a rank) and the watcher of this process's entry in the
    simulated machine's register (it lives as long as the simulation, which a fixture ends)."""
    return [p for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())
            and "devlab-gpus-" not in " ".join(p.cmdline())]


def _environment() -> dict[str, str]:
    """The environment, but what a running simulation keeps there until it stops: its
    machine's group (inherited by children) and the nvidia-smi launcher first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_CURRENT_TEST", "DEVLAB_SIMULATED_MACHINE")}
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if "devlab-nvidia-smi-" not in d)
    return env


@pytest.fixture
def state_kept():
    """The test leaves signal handlers, environment and torch.distributed as it found them."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    env = _environment()
    yield
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert _environment() == env
    assert not dist.is_initialized()
    assert _ranks_left() == []


def rank_and_world(offset: int) -> tuple[int, int, str]:
    dist.init_process_group("gloo")
    t = torch.ones(2) * (dist.get_rank() + offset)
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), f"{t.tolist()}"


def test_launch_returns_each_ranks_value_in_rank_order(state_kept, capfd) -> None:
    assert devlab.launch(rank_and_world, 10, nprocs=3) == [
        (0, 3, "[33.0, 33.0]"), (1, 3, "[33.0, 33.0]"), (2, 3, "[33.0, 33.0]")]


def shout(word: str) -> None:
    print(f"{word} from rank {os.environ['RANK']}")
    print(f"and to stderr from {os.environ['RANK']}", file=sys.stderr)


def test_each_ranks_output_is_labelled_with_its_rank(state_kept, capfd) -> None:
    devlab.launch(shout, "hello")
    out, err = capfd.readouterr()
    assert sorted(out.splitlines()) == ["[rank0] hello from rank 0", "[rank1] hello from rank 1"]
    assert sorted(err.splitlines()) == ["[rank0] and to stderr from 0", "[rank1] and to stderr from 1"]


def fail_on_one(message: str) -> int:
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise KeyError(message)
    dist.barrier()  # rank 0 waits for rank 1, which never comes
    return 0


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_failing_rank_raises_its_own_error_here(state_kept, method: str) -> None:
    with pytest.raises(KeyError) as err:
        devlab.launch(fail_on_one, "no such key", start_method=method, timeout=60)
    assert err.value.args == ("no such key",)
    assert "(raised on rank 1 of 2)" in err.value.__notes__
    frames = [(f.name, str(f.statement).strip()) for f in err.traceback]
    assert frames[-1] == ("fail_on_one", "raise KeyError(message)")  # the rank's own line


def hang_on_one() -> str:
    if os.environ["RANK"] == "1":
        time.sleep(120)
    return "done"


def test_a_hung_rank_is_stopped_after_the_timeout_and_says_where(state_kept) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError) as err:
        devlab.launch(hang_on_one, timeout=2)
    assert time.monotonic() - start < 15
    line = hang_on_one.__code__.co_firstlineno + 2  # its time.sleep(120)
    assert str(err.value) == ("rank 1 of 2 did not finish within 2 s and was stopped: rank 1 was "
                              f"at line {line}: time.sleep(120)")
    assert [(f.name, str(f.statement).strip()) for f in err.traceback][-1] == ("hang_on_one", "time.sleep(120)")


def hang_on_both() -> str:
    if os.environ["RANK"] == "0":
        time.sleep(120)
    else:
        time.sleep(121)
    return "done"


def test_every_hung_rank_says_where_it_was(state_kept) -> None:
    # The first rank its watchdog stopped no longer gets the others stopped before their own
    # watchdogs say where they were.
    with pytest.raises(TimeoutError) as err:
        devlab.launch(hang_on_both, timeout=2)
    first = hang_on_both.__code__.co_firstlineno + 2
    assert str(err.value) == (
        f"ranks 0, 1 of 2 did not finish within 2 s and were stopped: rank 0 was at line "
        f"{first}: time.sleep(120); rank 1 was at line {first + 2}: time.sleep(121)")


def test_a_hang_outside_the_users_code_says_where_in_the_launcher() -> None:
    # (Freeing what the function left, as it returns: the rank's frames are all the launcher's.)
    frames = [(distributed.rank_process.__file__, 1, "_call")]
    assert reports._where(frames).startswith("devlab's launcher (_call, line 1")


def test_forked_ranks_see_the_simulated_gpus_and_return_tensors_on_them(two, state_kept) -> None:
    def where() -> torch.Tensor:  # a local function: forked ranks need no pickling
        rank = int(os.environ["RANK"])
        return torch.full((2,), float(rank), device=rank)

    assert distributed.default_start_method() == "fork"
    out = devlab.launch(where)
    assert [t.device for t in out] == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert [t.tolist() for t in out] == [[0.0, 0.0], [1.0, 1.0]]


def test_spawned_ranks_get_the_function_by_value_and_the_gpus_by_environment(two, state_kept) -> None:
    namespace: dict = {"__name__": "__main__"}  # as a notebook defines a function
    exec("import os, torch\n"
         "def gpus():\n"
         "    return int(os.environ['RANK']), torch.cuda.device_count(), "
         "torch.cuda.memory_stats(0) is not None\n", namespace)
    assert devlab.launch(namespace["gpus"], start_method="spawn") == [(0, 2, True), (1, 2, True)]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"nprocs": 0}, "nprocs is the number of ranks, a whole number of at least 1; got 0"),
    ({"nprocs": 2.0}, "nprocs is the number of ranks, a whole number of at least 1; got 2.0"),
    ({"timeout": -1}, "timeout is a number of seconds greater than 0 (or None), got -1"),
    ({"start_method": "thread"}, "start_method 'thread' is not one of ['fork', 'spawn'] on "
                                 "this machine"),
])
def test_bad_options_say_what_would_be_right(kwargs, message) -> None:
    with pytest.raises(ValueError) as err:
        devlab.launch(print, **kwargs)
    assert str(err.value) == message


def test_launch_refuses_what_is_not_a_function() -> None:
    with pytest.raises(TypeError, match="fn must be a function to run on every rank, got int"):
        devlab.launch(3)


# --- a model that spans two GPUs inside each rank ----------------------------------------------

class TwoGPUModel(nn.Module):
    def __init__(self, first: int, second: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = first, second
        self.l1 = nn.Linear(4, 8).to(first)
        self.l2 = nn.Linear(8, 1).to(second)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x.to(self.first))).to(self.second))


def train_spanning(steps: int) -> tuple[list[list[float]], list[tuple[str, str]], int]:
    """Each rank's model spans two GPUs (rank 0: cuda:0 and cuda:1, rank 1: cuda:2 and cuda:3);
    DDP takes it without device_ids, as on a real machine."""
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    net = TwoGPUModel(2 * rank, 2 * rank + 1)
    ddp = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(ddp(X.chunk(2)[rank]), y.chunk(2)[rank].to(net.second)).backward()
        opt.step()
    devices = [(str(p.device), str(p.grad.device)) for p in net.parameters()]
    buckets = len(ddp._get_ddp_logging_data()["bucket_sizes"].split(","))
    return [p.detach().cpu().flatten().tolist() for p in net.parameters()], devices, buckets


@pytest.fixture(scope="module")
def one_process_weights() -> list[torch.Tensor]:
    """The same model trained on the whole batch in one process, on the CPU (module-scoped:
    Adam's first use sets an environment variable, which state_kept must not see)."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
    for _ in range(5):
        opt.zero_grad()
        nn.functional.mse_loss(ref(X), y).backward()
        opt.step()
    return [p.detach().flatten() for p in ref.parameters()]


def test_ddp_over_a_model_spanning_two_gpus_in_each_rank(one_process_weights, state_kept) -> None:
    devlab.simulated.start(4)
    results = devlab.launch(train_spanning, 5)
    expected = one_process_weights
    for rank, (weights, devices, buckets) in enumerate(results):
        gpus = [f"cuda:{2 * rank}"] * 2 + [f"cuda:{2 * rank + 1}"] * 2
        assert devices == [(d, d) for d in gpus]  # parameters and gradients where they live
        assert buckets == 2  # one bucket per GPU, as C++ makes them on a real machine
        for w, e in zip(weights, expected, strict=True):
            torch.testing.assert_close(torch.tensor(w), e)


# --- collectives in the placement log ----------------------------------------------------------

def ddp_step() -> list[str]:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2).to(rank), device_ids=[rank])
    with placement_log.capture() as log:
        model(torch.randn(3, 4, device=rank)).sum().backward()
    return [line for line in log.lines() if "c10d" in line] + [log.summary().text()]


def test_the_placement_log_shows_ddps_all_reduce_on_each_ranks_gpu(two, state_kept) -> None:
    gpu = "/job:localhost/replica:0/task:0/device:GPU:{}"
    logs = devlab.launch(ddp_step)
    for rank, lines in enumerate(logs):
        # 4x2 weights and 2 biases: 40 bytes of gradients, one bucket
        assert lines[:-1] == [f"All-reduce 40 B on {gpu.format(rank)} (c10d::allreduce_)"]
        assert lines[-1].endswith("· 1 collective (40 B)")


def test_nccl_runs_on_gloo_and_says_so_once(two, capfd, state_kept) -> None:
    def init_twice() -> str:
        dist.init_process_group("cuda:nccl,cpu:gloo")
        group = dist.new_group(backend="nccl")
        return f"{dist.get_backend()} {dist.get_backend(group)}"

    assert devlab.launch(init_twice) == ["cuda:nccl,cpu:gloo nccl"] * 2
    err = [line for line in capfd.readouterr().err.splitlines() if "NCCL" in line]
    assert sorted(err) == [f"[rank{r}] {devlab.engine.simulated.torch_distributed.nccl.NOTICE}" for r in (0, 1)]


# --- any function, any sequence (issue 16) -----------------------------------------------------

LOCK = threading.Lock()


def forty_two() -> int:
    return 42


def touch_lock() -> int:
    with LOCK:
        return 1


def return_lock() -> threading.Lock:
    return LOCK


class Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("carries a lock")
        self.lock = threading.Lock()


def raise_unpicklable() -> None:
    raise Unpicklable()


def exit_five() -> None:
    sys.exit(5)


@pytest.mark.parametrize("simulating", [True, False], ids=["simulated GPUs", "CPU"])
def test_the_issues_sequence_ends_in_clear_errors_without_a_segfault(state_kept, capfd,
                                                                     simulating: bool) -> None:
    """As issue 16 wrote it: a function returning 42, one touching a threading.Lock, one
    returning a lock, one raising an exception that cannot be pickled, one calling
    sys.exit(5) (the ranks segfaulted "... Garbage-collecting", 2 of 2 runs with simulation,
    1 of 1 without, and the last launch raised torchelastic's ChildFailedError)."""
    if simulating:
        devlab.simulated.start(2)
    assert devlab.launch(forty_two) == [42, 42]
    assert devlab.launch(touch_lock) == [1, 1]
    with pytest.raises(distributed.RankError) as err:
        devlab.launch(return_lock)
    assert str(err.value) in [f"rank {r} returned a lock, which cannot be pickled to send it "
                              "back: TypeError: cannot pickle '_thread.lock' object"
                              for r in (0, 1)]  # (the rank that failed first)
    with pytest.raises(distributed.RankError) as err:
        devlab.launch(raise_unpicklable)
    assert str(err.value) == "test_distributed.Unpicklable: carries a lock"
    assert re.match(r"\(raised on rank [01] of 2; the exception itself could not be sent back: "
                    r"TypeError: cannot pickle", err.value.__notes__[0])  # (the first to fail)
    assert [(f.name, str(f.statement).strip()) for f in err.traceback][-1] == (
        "raise_unpicklable", "raise Unpicklable()")
    with pytest.raises(SystemExit) as err:
        devlab.launch(exit_five)
    assert err.value.code == 5
    assert {"(raised on rank 0 of 2)", "(raised on rank 1 of 2)"} & set(err.value.__notes__)
    out, errors = capfd.readouterr()
    assert "Fatal Python error" not in out + errors
    assert "ChildFailedError" not in out + errors


class Tattletale:
    """Garbage in a reference cycle that says which process collected it."""

    def __init__(self, path: str) -> None:
        self.path, self.me = path, self

    def __del__(self) -> None:
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


def collect_garbage() -> int:
    gc.collect()
    return os.getpid()


def test_a_forked_rank_never_collects_the_parents_garbage(state_kept, tmp_path) -> None:
    """The segfault's cause: a rank's cycle collector destroyed objects it inherited, among
    them a TCPStore server left in a cycle by an earlier failed launch, whose destructor joined
    a thread that exists only in the parent. Forked ranks must leave the parent's garbage to
    the parent: here a finalizer says who ran it."""
    told = tmp_path / "collected"
    told.write_text("")
    gc.disable()
    try:
        Tattletale(str(told))  # unreachable at once; only the collector can free it
        ranks = devlab.launch(collect_garbage)
    finally:
        gc.enable()
    gc.collect()
    assert told.read_text().split() == [str(os.getpid())]
    assert len(set(ranks) | {os.getpid()}) == 3


def test_no_thread_of_the_launch_runs_while_its_ranks_are_forked(state_kept, monkeypatch) -> None:
    """A rank forked while a thread of this process holds a lock inherits the lock held, with
    nobody to release it: ranks forked while the store's server accepted a peer hung in
    getnameinfo (glibc's resolver lock), about 1 launch of 3 ranks in 60. The server starts
    after the last fork, so no thread of the launch exists when one happens."""
    before = set(os.listdir("/proc/self/task"))
    started = []
    fork = os.fork

    def counting_fork() -> int:
        started.append(set(os.listdir("/proc/self/task")) - before)
        return fork()

    monkeypatch.setattr(os, "fork", counting_fork)
    assert devlab.launch(forty_two, nprocs=3) == [42, 42, 42]
    assert started == [set(), set(), set()]


def exit_silently(code: int) -> None:
    if os.environ["RANK"] == "1":
        os._exit(code)
    time.sleep(30)  # stopped once rank 1 has ended


def killed(sig: int) -> None:
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), sig)
    time.sleep(30)


def crash() -> None:
    import ctypes

    if os.environ["RANK"] == "0":
        faulthandler_off()
        ctypes.string_at(0)  # a segfault in C


def faulthandler_off() -> None:
    import faulthandler

    faulthandler.disable()


@pytest.mark.parametrize(("fn", "arg", "message"), [
    (exit_silently, 7, "rank 1 of 2 ended with exit code 7 without returning or raising "
                       "(os._exit(7) ends a process at once; so does a crash in C code, shown in "
                       "the rank's stderr)"),
    (exit_silently, 0, "rank 1 of 2 ended with exit code 0 without returning or raising "
                       "(os._exit(0) ends a process at once; so does a crash in C code, shown in "
                       "the rank's stderr)"),
    (killed, signal.SIGKILL, "rank 1 of 2 was killed by SIGKILL (signal 9)"),
    (killed, signal.SIGTERM, "rank 1 of 2 was killed by SIGTERM (signal 15)"),
    (crash, None, "rank 0 of 2 was killed by SIGSEGV (signal 11)"),
], ids=["os._exit(7)", "os._exit(0)", "SIGKILL", "SIGTERM", "segfault"])
def test_a_rank_that_ends_without_a_word_is_named_with_its_exit(state_kept, fn, arg,
                                                               message) -> None:
    start = time.monotonic()
    with pytest.raises(distributed.RankError) as err:
        devlab.launch(fn, *([] if arg is None else [arg]))
    assert str(err.value) == message
    assert time.monotonic() - start < 20  # the other rank was stopped, not waited for


def exit_zero() -> None:
    sys.exit(0)


def test_sys_exit_zero_ends_a_rank_as_a_success(state_kept) -> None:
    assert devlab.launch(exit_zero) == [None, None]


class NeedsArguments(Exception):
    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a} and {b}")


def raise_needs_arguments() -> None:
    raise NeedsArguments(1, 2)


class BadMessage(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


def raise_bad_message() -> None:
    raise BadMessage()


def test_exceptions_that_cannot_travel_arrive_as_text_naming_the_rank(state_kept) -> None:
    with pytest.raises(distributed.RankError) as err:
        devlab.launch(raise_needs_arguments)
    assert str(err.value) == "test_distributed.NeedsArguments: 1 and 2"
    assert re.match(r"\(raised on rank [01] of 2; the exception itself could not be sent back: "
                    r"TypeError", err.value.__notes__[0])
    with pytest.raises(BaseException) as err:  # noqa: PT011 - whichever way it can travel
        devlab.launch(raise_bad_message)
    assert isinstance(err.value, (BadMessage, distributed.RankError))
    assert re.match(r"\(raised on rank [01] of 2", err.value.__notes__[0])


def test_an_unpicklable_function_for_spawned_ranks_is_refused_before_they_start(state_kept) -> None:
    lock = threading.Lock()

    def uses_lock() -> bool:
        return lock.locked()

    with pytest.raises(TypeError) as err:
        devlab.launch(uses_lock, start_method="spawn")
    assert str(err.value).startswith("spawned ranks cannot be sent the function and its "
                                     "arguments: TypeError: cannot pickle '_thread.lock' object")


def test_forkserver_is_refused_saying_why() -> None:
    with pytest.raises(ValueError) as err:
        devlab.launch(forty_two, start_method="forkserver")
    assert str(err.value) == ("start_method 'forkserver' is not offered: its server process "
                              "would outlive the launch; use one of ['fork', 'spawn']")


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 0, True])
def test_a_timeout_must_be_a_finite_number_of_seconds(timeout) -> None:
    with pytest.raises(ValueError, match="timeout is a number of seconds greater than 0"):
        devlab.launch(forty_two, timeout=timeout)


def test_too_many_ranks_are_refused_before_any_starts_naming_the_limit(state_kept) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        used = len(os.listdir("/proc/self/fd")) - 1
        with pytest.raises(ValueError) as err:
            devlab.launch(forty_two, nprocs=10000)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    room = (256 - used - options._FDS_SPARE) // options._FDS_PER_RANK
    assert str(err.value) == (
        f"nprocs=10000 is more ranks than this machine can run here: each rank needs about "
        f"{options._FDS_PER_RANK} open files in this process (its output and its "
        f"connections to the store), and this process may open 256 (ulimit -n), {used} of them "
        f"open now; at most {room} ranks")
    assert devlab.launch(forty_two, nprocs=min(room, 3)) == [42] * min(room, 3)


def test_memory_bounds_the_rank_count_too(state_kept, monkeypatch) -> None:
    monkeypatch.setattr(options, "memory_available", lambda: 100 * 2**20)
    with pytest.raises(ValueError) as err:
        distributed.check_options(30, "fork", None)
    assert str(err.value) == ("nprocs=30 is more ranks than this machine can run here: a forked "
                              "rank takes at least 4 MB of memory of its own, and 100 MB are "
                              "available; at most 25 ranks")
    assert distributed.check_options(25, "fork", None) == "fork"
