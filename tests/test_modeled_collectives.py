"""Collectives on modeled GPUs (issue 28): each is charged NCCL's modeled time on the GPU's
machine (`devlab.engine.gpu_model.collectives`), starts when the slowest rank reaches it, runs on a
communication stream of its own, and DDP's buckets overlap the backward pass as
`gpu_model.data_parallel_step` predicts. Without a model nothing is charged or exchanged."""

from __future__ import annotations

import html
import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

import devlab
from devlab.engine import gpu_model, simulated
from devlab.engine.gpu_model.modeled_clock import Clock
from devlab.engine.simulated.clock.charges import Charges
from devlab.engine.simulated.torch_distributed import nccl

pytestmark = pytest.mark.usefixtures("no_simulation")

MiB = 1024 * 1024


def _rank() -> int:
    return int(os.environ["RANK"])


def _init() -> int:
    rank = _rank()
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    return rank


# --- the clock alone ----------------------------------------------------------------------------

def _charges(gpu: str = "T4") -> Charges:
    return Charges(Clock(gpu_model.gpu(gpu), 2))


@pytest.mark.usefixtures("modeled_host")
def test_a_collective_runs_on_its_own_stream_from_the_latest_ranks_start() -> None:
    c = _charges()
    clock = c.clock
    seconds = gpu_model.collective_time("all_reduce", 64 * MiB, 2, "pcie3-host").seconds
    # A blocking all-reduce: it starts when the host has launched it, and the queue waits.
    end = c.collective("all_reduce", (64 * MiB,), 2, 0, lambda t: t, None, join=True)
    assert end == pytest.approx(clock.now() + seconds)
    assert clock.ready(0) == end
    # Another rank reached it 5 ms later: every rank starts then.
    later = clock.now() + 5e-3
    end2 = c.collective("all_reduce", (64 * MiB,), 2, 0, lambda t: [later], None, join=False)
    assert end2 == pytest.approx(max(later, end) + seconds)
    assert clock.ready(0) == end  # asynchronous: the queue goes on
    c.join(0, end2)  # work.wait()
    assert clock.ready(0) == end2
    c.sync(0)
    assert clock.now() > end2
    # GPU 1 is another GPU, with its own streams.
    assert clock.ready(1) == 0.0


@pytest.mark.usefixtures("modeled_host")
def test_the_topology_is_the_gpus_default_and_a_coalesced_call_is_one_group() -> None:
    c = _charges("A100")
    assert c.topology.key == gpu_model.default_topology("A100").key == "nvswitch-a100"
    sizes = (MiB, 3 * MiB)
    end = c.collective("all_gather", sizes, 4, 0, lambda t: t, None, join=True)
    expected = gpu_model.coalesced_time("all_gather", list(sizes), 4, "nvswitch-a100")
    assert end == pytest.approx(c.clock.now() + expected.seconds)
    # More GPUs than one machine joins are timed as the largest machine.
    c.collective("all_reduce", (MiB,), 16, 0, lambda t: t, None, join=True)


# --- ranks on modeled T4s -----------------------------------------------------------------------

def all_reduce_times() -> dict:
    rank = _init()
    t = torch.ones(64 * MiB, device=rank)  # 256 MiB
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    dist.all_reduce(t)
    end.record()
    torch.cuda.synchronize()
    event_ms = start.elapsed_time(end)
    # A rank that computes longer first makes the other wait for it.
    a = torch.randn(1024, 1024, device=rank)
    torch.cuda.synchronize()
    before = simulated.modeled_time()
    for _ in range(8 if rank == 1 else 0):
        a = a @ a
    torch.cuda.synchronize()
    computed = simulated.modeled_time()
    small = torch.ones(1024, device=rank)
    dist.all_reduce(small)
    torch.cuda.synchronize()
    after = simulated.modeled_time()
    # Asynchronous: the queue goes on beside it until wait().
    work = dist.all_reduce(t, async_op=True)
    free = torch.cuda.Event(enable_timing=True)
    free.record()
    work.wait()
    joined = torch.cuda.Event(enable_timing=True)
    joined.record()
    torch.cuda.synchronize()
    out = {"event_ms": event_ms, "before": before, "computed": computed, "after": after,
           "value": t[0].item(), "work": type(work).__name__,
           "async_ms": free.elapsed_time(joined)}
    dist.destroy_process_group()
    return out


@pytest.mark.usefixtures("modeled_host")
def test_collectives_take_the_models_time_and_wait_for_the_slowest_rank(no_simulation) -> None:
    simulated.start(2, model="T4")
    results = devlab.launch(all_reduce_times, nprocs=2, timeout=300)
    expected = gpu_model.collective_time("all_reduce", 256 * MiB, 2,
                                         gpu_model.default_topology("T4"))
    small = gpu_model.collective_time("all_reduce", 4096, 2, "pcie3-host").seconds
    assert expected.seconds > 0.05  # tens of ms through host memory, not 0
    launch_ms = simulated.model().launch_latency_us * 1e-3  # the host launches it first
    for got in results:
        assert got["event_ms"] == pytest.approx(expected.seconds * 1e3 + launch_ms, rel=1e-9)
        assert got["value"] == 4.0  # (and the bytes moved: twice summed over 2 ranks)
        assert got["work"] == "TimedWork"
        assert got["async_ms"] == pytest.approx(expected.seconds * 1e3, rel=1e-9)
    slow, fast = results[1], results[0]
    assert slow["computed"] - slow["before"] > 10 * small  # rank 1 computed first
    # Both ranks end the small all-reduce together, after the slow rank's work.
    assert fast["after"] == pytest.approx(slow["after"], abs=1e-9)
    assert fast["after"] - fast["before"] > slow["computed"] - slow["before"] + small


WIDTH, LAYERS, BATCH = 1024, 4, 256


def ddp_step() -> dict:
    rank = _init()
    torch.manual_seed(0)
    layers = [m for _ in range(LAYERS) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers).to(rank),
                                                device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, WIDTH, device=rank)  # the same batch per rank: the same compute

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    for _ in range(3):  # the first rebuilds DDP's buckets
        step()
    torch.cuda.synchronize()
    t0 = simulated.modeled_time()
    step()
    torch.cuda.synchronize()
    t1 = simulated.modeled_time()
    with model.no_sync():  # the backward pass alone, bracketed by syncs
        loss = model(x).square().mean()
        torch.cuda.synchronize()
        b0 = simulated.modeled_time()
        loss.backward()
        torch.cuda.synchronize()
        b1 = simulated.modeled_time()
    dist.destroy_process_group()
    return {"step": t1 - t0, "backward": b1 - b0 - simulated.model().sync_latency_us * 1e-6}


@pytest.mark.usefixtures("modeled_host")
def test_ddp_adds_the_communication_its_backward_pass_does_not_hide(no_simulation) -> None:
    simulated.start(2, model="T4")
    (one,) = devlab.launch(ddp_step, nprocs=1, timeout=300)
    two = devlab.launch(ddp_step, nprocs=2, timeout=300)
    assert two[0]["step"] == pytest.approx(two[1]["step"], rel=1e-9)
    added = two[0]["step"] - one["step"]
    # data_parallel_step's prediction: each layer's gradients written after an equal share of
    # the backward pass (its layers are alike), last layer first.
    backward = one["backward"]
    grads = []
    for j in range(LAYERS):
        ready = backward * (j + 1) / LAYERS
        grads += [(ready, WIDTH * 4), (ready, WIDTH * WIDTH * 4)]
    predicted = gpu_model.data_parallel_step(grads, 2, "pcie3-host", forward=0.0,
                                             backward=backward)
    assert len(predicted.buckets) == 2
    assert predicted.exposed > 0.5 * predicted.communication  # the PCIe T4s cannot hide it
    # Within 5 % of all the communication: the equal shares are an estimate (the loss's
    # backward and the kernels' launches come first).
    assert added == pytest.approx(predicted.exposed, abs=0.05 * predicted.communication)
    assert added < predicted.communication


# --- without a model ----------------------------------------------------------------------------

def unmodeled() -> dict:
    rank = _init()
    calls = []
    nccl.ProcessGroupNCCL._latest = lambda self, times: calls.append(times) or times
    t = torch.ones(4, device=rank)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    dist.all_gather_into_tensor(torch.empty(8, device=rank), t)
    dist.barrier()
    out = {"work": type(work).__name__, "exchanges": len(calls), "value": t.tolist()}
    try:
        simulated.modeled_time()
    except RuntimeError as e:
        out["clock"] = str(e)
    dist.destroy_process_group()
    return out


def test_an_unmodeled_simulation_charges_and_exchanges_nothing(two) -> None:
    for got in devlab.launch(unmodeled, nprocs=2, timeout=120):
        assert got["work"] != "TimedWork"
        assert got["exchanges"] == 0
        assert got["value"] == [2.0] * 4
        assert got["clock"].startswith("no modeled GPU")


def test_explain_names_the_machine_its_collectives_are_timed_in(no_simulation) -> None:
    simulated.start(1, model="T4")
    x = torch.ones(8, device="cuda")
    shown = simulated.explain(lambda: x + 1)
    assert shown.machine == ("Collectives: PCIe Gen3 x16 without peer-to-peer (through host "
                             "memory) (pcie3-host, the T4's default; also sold in pcie3-p2p).")
    assert str(shown).splitlines()[-1] == shown.machine
    assert html.escape(shown.machine) in shown._repr_html_()


def late_send() -> dict:
    rank = _init()
    t = torch.ones(MiB, device=rank)  # 4 MiB
    a = torch.randn(1024, 1024, device=rank)
    torch.cuda.synchronize()
    before = simulated.modeled_time()
    if rank == 0:
        for _ in range(8):  # the sender computes first
            a = a @ a
        dist.send(t, 1)
    else:
        dist.recv(t, 0)
    torch.cuda.synchronize()
    out = {"before": before, "after": simulated.modeled_time()}
    dist.destroy_process_group()
    return out


@pytest.mark.usefixtures("modeled_host")
def test_a_receive_starts_no_earlier_than_its_send(no_simulation) -> None:
    simulated.start(2, model="T4")
    sender, receiver = devlab.launch(late_send, nprocs=2, timeout=120)
    transfer = gpu_model.collective_time("send_recv", 4 * MiB, 2, "pcie3-host").seconds
    # The receiver waited for the sender's products, then for the transfer.
    assert receiver["after"] - receiver["before"] > transfer + 8 * 200e-6
    assert receiver["after"] == pytest.approx(sender["after"], abs=20e-6)


def test_another_machine_the_gpu_is_sold_in_can_be_chosen(no_simulation) -> None:
    with pytest.raises(ValueError, match="give a model too"):
        devlab.config.simulate_gpus(2, topology="pcie3-p2p")
    with pytest.raises(ValueError, match="not sold in a nvswitch-a100 machine"):
        devlab.config.simulate_gpus(2, model="T4", topology="nvswitch-a100")
    assert not simulated.is_active()
    devlab.config.simulate_gpus(2, model="T4", topology="pcie3-p2p")
    assert simulated.topology() == "pcie3-p2p"
    x = torch.ones(8, device="cuda")
    assert simulated.explain(lambda: x + 1).machine == (
        "Collectives: PCIe Gen3 x16 with peer-to-peer (pcie3-p2p, chosen; the T4's default is "
        "pcie3-host).")
    with pytest.MonkeyPatch.context() as env:  # as the clock times them, so the line says
        env.setenv("NCCL_P2P_DISABLE", "1")
        assert simulated.explain(lambda: x + 1).machine == (
            "Collectives: PCIe Gen3 x16 without peer-to-peer (through host memory) (pcie3-host: "
            "NCCL_P2P_DISABLE=1 turns the pcie3-p2p machine's peer-to-peer off).")
    # A spawned rank models the same GPU in the same machine.
    namespace: dict = {"__name__": "__main__"}  # as a notebook defines a function
    exec("import devlab\n"
         "def modeled():\n"
         "    return devlab.simulated.model().name, devlab.simulated.topology()\n", namespace)
    assert devlab.launch(namespace["modeled"], nprocs=1, start_method="spawn",
                         timeout=120) == [("T4", "pcie3-p2p")]
    devlab.config.stop_simulation()
    assert simulated.topology() is None


class Spanning(nn.Module):
    def __init__(self, first: int, second: int) -> None:
        super().__init__()
        self.first, self.second = first, second
        self.l1 = nn.Linear(WIDTH, WIDTH).to(first)
        self.l2 = nn.Linear(WIDTH, WIDTH).to(second)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x)).to(self.second))


def spanning_step() -> dict:
    """DDP over a model spanning two GPUs in each rank (a bucket per GPU)."""
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    first, second = 2 * rank, 2 * rank + 1
    torch.cuda.set_device(first)  # where DDP's own buffers (made in C++) are charged
    torch.manual_seed(0)
    net = Spanning(first, second)
    ddp = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(BATCH, WIDTH, device=first) + rank
    times = []
    for _ in range(3):
        torch.cuda.synchronize(first)
        torch.cuda.synchronize(second)
        t0 = simulated.modeled_time()
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        torch.cuda.synchronize(first)
        torch.cuda.synchronize(second)
        times.append(simulated.modeled_time() - t0)
    out = {"times": times, "weight": net.l1.weight[0, :3].tolist()}
    dist.destroy_process_group()
    return out


@pytest.mark.usefixtures("modeled_host")
def test_ddp_over_a_model_spanning_two_modeled_gpus_per_rank(no_simulation) -> None:
    simulated.start(4, model="T4")
    ranks = devlab.launch(spanning_step, nprocs=2, timeout=120)
    assert ranks[0]["times"] == pytest.approx(ranks[1]["times"], abs=1e-9)
    assert ranks[0]["weight"] == ranks[1]["weight"]  # the gradients were all-reduced
    one_layer = gpu_model.collective_time("all_reduce", (WIDTH * WIDTH + WIDTH) * 4, 2,
                                          "pcie3-host").seconds
    # Each step waits for its two buckets (one per GPU, a layer each), one after the other
    # on the communication stream of the GPU DDP's buffers are charged to.
    assert all(t > 2 * one_layer for t in ranks[0]["times"])


def other_collectives() -> dict:
    """gather, scatter, all_gather_object and the functional collectives DTensor and tensor
    parallelism call, each timed with CUDA events from an idle GPU."""
    import torch.distributed._functional_collectives as funcol

    rank = _init()
    t = torch.ones(MiB, device=rank)  # 4 MiB
    parts = [torch.full_like(t, 1.0), torch.full_like(t, 2.0)] if rank == 0 else None
    gathered = [torch.empty_like(t) for _ in range(2)] if rank == 0 else None
    scattered = torch.empty_like(t)
    out: dict = {}

    def timed(name: str, fn) -> None:
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out[name] = start.elapsed_time(end)

    world = dist.group.WORLD
    timed("gather", lambda: dist.gather(t, gathered, dst=0))
    timed("scatter", lambda: dist.scatter(scattered, parts, src=0))
    timed("all_reduce", lambda: funcol.all_reduce(t, "sum", world).wait())
    timed("all_gather", lambda: funcol.all_gather_tensor(t, 0, world).wait())
    timed("reduce_scatter", lambda: funcol.reduce_scatter_tensor(t, "sum", 0, world).wait())
    timed("all_gather_object", lambda: dist.all_gather_object([None, None], {"rank": rank}))
    out["scattered"] = scattered[0].item()
    dist.destroy_process_group()
    return out


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.usefixtures("modeled_host")
def test_gather_scatter_and_functional_collectives_take_the_models_time(no_simulation) -> None:
    simulated.start(2, model="T4")
    root, other = devlab.launch(other_collectives, nprocs=2, timeout=300)
    launch_ms = simulated.model().launch_latency_us * 1e-3

    def model_ms(op: str, nbytes: int) -> float:
        return gpu_model.collective_time(op, nbytes, 2, "pcie3-host").seconds * 1e3 + launch_ms

    # Gather and scatter: the root's whole buffer, half of it crossing the root's link.
    assert root["gather"] == pytest.approx(model_ms("gather", 8 * MiB), rel=1e-9)
    assert other["gather"] >= root["gather"] - 1e-9
    for rank in (root, other):
        assert rank["scatter"] == pytest.approx(model_ms("scatter", 8 * MiB), rel=1e-9)
        # torch.distributed._functional_collectives (DTensor's) as the c10d ones.
        assert rank["all_reduce"] == pytest.approx(model_ms("all_reduce", 4 * MiB), rel=1e-9)
        assert rank["all_gather"] == pytest.approx(model_ms("all_gather", 8 * MiB), rel=1e-9)
        assert rank["reduce_scatter"] == pytest.approx(model_ms("reduce_scatter", 4 * MiB),
                                                       rel=1e-9)
        # all_gather_object: an all-gather of the sizes, then one of the pickled bytes.
        assert rank["all_gather_object"] > 2 * gpu_model.collective_time(
            "all_gather", 16, 2, "pcie3-host").seconds * 1e3
    assert (root["scattered"], other["scattered"]) == (1.0, 2.0)
    # The model itself: gather and scatter are one-way, at the link's full bus bandwidth.
    gather = gpu_model.collective_time("gather", 1 << 30, 2, "pcie3-host")
    assert gather.busbw_gbs == pytest.approx(gpu_model.topology("pcie3-host").bus_gbs, rel=0.01)
    assert gpu_model.bus_factor("scatter", 4) == 0.75


# --- NCCL's own memory --------------------------------------------------------------------------

def nccl_memory() -> dict:
    rank = _init()
    t = torch.ones(1024, device=rank)
    torch.cuda.synchronize()
    free0, total = torch.cuda.mem_get_info(rank)
    allocated0 = torch.cuda.memory_allocated(rank)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info(rank)
    dist.all_reduce(t)  # connected once: a second collective takes nothing more
    free2, _ = torch.cuda.mem_get_info(rank)
    allocated1 = torch.cuda.memory_allocated(rank)
    dist.destroy_process_group()  # the communicator's buffers are freed
    free3, _ = torch.cuda.mem_get_info(rank)
    return {"taken": free0 - free1, "again": free1 - free2, "allocated": allocated1 - allocated0,
            "after_destroy": free3 - free0, "value": t[0].item()}


def test_nccl_buffers_are_device_memory_outside_the_caching_allocator(no_simulation) -> None:
    simulated.start(2, model="T4")  # two T4s over PCIe: 2 channels
    got = devlab.launch(nccl_memory, nprocs=2, timeout=300)
    # Per channel one connection's buffers: Simple 4 MiB, LL 512 KiB, LL128 120*640*8*8 B.
    per_channel = 4 * MiB + 512 * 1024 + 4_915_200
    for rank in got:
        assert rank["value"] == 4.0
        assert rank["taken"] == 2 * per_channel  # mem_get_info sees them...
        assert rank["allocated"] == 0  # ...memory_allocated does not
        assert rank["again"] == 0
        assert rank["after_destroy"] == 0


def test_nccl_buffer_sizes_follow_nccls_variables() -> None:
    from devlab.engine.gpu_model.capacity import nccl_buffer_bytes
    assert nccl_buffer_bytes(1, "PCI") == 0  # a communicator of one rank connects to no peer
    assert nccl_buffer_bytes(8, "NVLink") == 8 * nccl_buffer_bytes(8, "PCI")
    small = {"NCCL_BUFFSIZE": str(MiB), "NCCL_MAX_NCHANNELS": "1"}
    assert nccl_buffer_bytes(2, "NVLink", small) == MiB + 512 * 1024 + 4_915_200
    with pytest.raises(ValueError, match="NCCL_BUFFSIZE='lots'"):
        nccl_buffer_bytes(2, "PCI", {"NCCL_BUFFSIZE": "lots"})


def test_nccl_p2p_disable_times_collectives_through_host_memory(monkeypatch) -> None:
    bridge = gpu_model.topology("nvlink2-bridge")
    monkeypatch.delenv("NCCL_P2P_DISABLE", raising=False)
    on = Charges(Clock(gpu_model.gpu("TITAN-RTX"), 2), bridge)._time("all_reduce", (MiB * 64,), 2)
    assert on.topology == "nvlink2-bridge"
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    off = Charges(Clock(gpu_model.gpu("TITAN-RTX"), 2), bridge)._time("all_reduce", (MiB * 64,), 2)
    # NCCL's SHM transport: the modeled time is the host-staged machine's, not the bridge's.
    assert off.topology == "pcie3-host"
    assert off.seconds == gpu_model.collective_time("all_reduce", MiB * 64, 2, "pcie3-host").seconds
    assert off.seconds > on.seconds
