"""devlab.launch and devlab.distributed without a kernel: ranks, return values, failures,
timeouts, no process left, the process's state kept; collectives in the placement log."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest
import torch
import torch.distributed as dist
from torch import nn

import devlab
from devlab import distributed, placement_log

pytestmark = pytest.mark.usefixtures("no_simulation")


def _ranks_left() -> list[psutil.Process]:
    """Child processes still alive, but multiprocessing's resource tracker (a helper spawn
    starts once per process, not a rank)."""
    return [p for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())]


@pytest.fixture
def state_kept():
    """The test leaves signal handlers, environment and torch.distributed as it found them."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    yield
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"} == env
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
    assert str(err.value) == ("rank 1 of 2 did not finish within 2 s and was stopped: rank 1 was "
                              "at line 86: time.sleep(120)")
    assert [(f.name, str(f.statement).strip()) for f in err.traceback][-1] == ("hang_on_one", "time.sleep(120)")


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
    ({"start_method": "thread"}, "start_method 'thread' is not one of ['fork', 'spawn', "
                                 "'forkserver'] on this machine"),
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
    assert sorted(err) == [f"[rank{r}] {devlab.simulated._nccl.NOTICE}" for r in (0, 1)]
