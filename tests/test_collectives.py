"""The collective model (devlab.engine.gpu_model.collectives, .links): its rules, and the published
NCCL measurements of benchmarks/data/collectives/ (docs/gpu-models.md, "Collectives").

Pure: nothing runs on a GPU, nothing of the simulation is imported.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from devlab.engine import gpu_model
from devlab.engine.gpu_model import (
    OPS,
    SPECS,
    TOPOLOGIES,
    algbw_to_busbw,
    bucket_sizes,
    bus_factor,
    busbw_to_algbw,
    coalesced_time,
    collective_time,
    data_parallel,
    data_parallel_step,
    default_topology,
    links,
    topologies,
    topology,
)
from devlab.engine.gpu_model import collectives as coll

ROOT = Path(__file__).resolve().parents[1]
MiB, GiB = 1 << 20, 1 << 30


def _bench():
    spec = importlib.util.spec_from_file_location("bench_collectives",
                                                  ROOT / "benchmarks" / "collectives.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _bench()


# --- the rules ---------------------------------------------------------------------------------

def test_time_is_a_latency_plus_bytes_over_the_bandwidth() -> None:
    t = collective_time("all_reduce", GiB, 8, "nvswitch-a100")
    assert t.seconds == pytest.approx(t.latency + t.bandwidth)
    # A ring all-reduce: 2(n-1) steps, each NCCL's NVLink per-step latency for Simple, after
    # its base ([nccl-tuning]), and the bytes at n / (2(n-1)) of the bus bandwidth.
    assert (t.algorithm, t.protocol, t.steps) == ("ring", "Simple", 14)
    assert t.latency == pytest.approx((8.4 + 14 * 3.4) * 1e-6)
    assert t.bus_gbs == pytest.approx(12 * 20.0)
    assert t.bandwidth == pytest.approx(GiB / (240e9 * 8 / 14))
    assert t.busbw_gbs == pytest.approx(t.algbw_gbs * 2 * 7 / 8)


@pytest.mark.parametrize("key", list(TOPOLOGIES))
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                "reduce", "all_to_all", "send_recv"])
def test_time_grows_with_bytes_and_busbw_approaches_the_link(key: str, op: str) -> None:
    topo = TOPOLOGIES[key]
    ranks = min(topo.max_ranks, 4)
    sizes = [1 << e for e in range(0, 35)]
    times = [collective_time(op, s, ranks, key).seconds for s in sizes]
    assert all(b >= a for a, b in zip(times, times[1:], strict=False)), (key, op)
    big = collective_time(op, 16 * GiB, ranks, key)
    two_way = op not in ("broadcast", "reduce", "send_recv") or ranks > 2
    link = topo.bus_gbs * (topo.duplex if two_way and op != "send_recv" else 1.0)
    assert big.busbw_gbs == pytest.approx(link, rel=0.01)
    assert big.busbw_gbs <= link


def test_tiny_messages_cost_the_latency_floor() -> None:
    for key in TOPOLOGIES:
        ranks = min(TOPOLOGIES[key].max_ranks, 8)
        one, kib = (collective_time("all_reduce", n, ranks, key) for n in (8, 1024))
        assert one.protocol == "LL" and one.bandwidth < 0.01 * one.latency
        assert kib.seconds == pytest.approx(one.seconds, rel=0.05)
        # The floor: NCCL's LL base (6.6 µs) plus 2(n-1) per-step latencies of the link.
        step = 0.6 if TOPOLOGIES[key].hw == links.NVLINK else 1.0
        assert one.latency == pytest.approx((6.6 + 2 * (ranks - 1) * step) * 1e-6)


def test_protocols_cross_over_by_size_as_nccl_picks() -> None:
    # NVLink: LL for small messages, LL128 for medium ones, Simple for large ones.
    picks = [collective_time("all_reduce", 1 << e, 8, "nvswitch-a100").protocol
             for e in range(3, 34)]
    assert picks[0] == "LL" and picks[-1] == "Simple" and "LL128" in picks
    first = {p: picks.index(p) for p in ("LL", "LL128", "Simple")}
    assert first["LL"] < first["LL128"] < first["Simple"]
    assert picks == sorted(picks, key=["LL", "LL128", "Simple"].index)  # never back
    # PCIe has no LL128 (NCCL enables it on NVLink paths only): LL, then Simple.
    pcie = {collective_time("all_reduce", 1 << e, 4, "pcie4-p2p").protocol
            for e in range(3, 34)}
    assert pcie == {"LL", "Simple"}


def _tree_vs_ring(nbytes: int, ranks: int, key: str) -> tuple[float, float]:
    ring = collective_time("all_reduce", nbytes, ranks, key, algorithm="ring").seconds
    tree = collective_time("all_reduce", nbytes, ranks, key, algorithm="tree").seconds
    return ring, tree


def test_ring_or_tree_whichever_nccls_model_makes_faster() -> None:
    # The choice is the faster of the two under NCCL's formulas, at every size.
    for key, ranks in (("nvswitch-a100", 8), ("nvswitch-h100", 8), ("nvlink3-4gpu", 4),
                       ("pcie4-p2p", 8)):
        for e in range(3, 34):
            ring, tree = _tree_vs_ring(1 << e, ranks, key)
            chosen = collective_time("all_reduce", 1 << e, ranks, key)
            assert chosen.seconds == pytest.approx(min(ring, tree))
            assert chosen.algorithm == ("tree" if tree < ring else "ring")
    # Within one machine the tree never wins under NCCL's model: its LL and Simple steps are
    # no cheaper than the ring's, its bandwidth is half the bus bandwidth (ring: n/(2(n-1)))
    # and NCCL scales it down by up to 0.4 for medium sizes. Its LL128 steps are cheaper
    # (1.25 µs against 1.9 on NVLink), so forced trees are closest to the ring there.
    ring, tree = _tree_vs_ring(2 * MiB, 8, "nvswitch-a100")
    assert ring < tree < 1.6 * ring
    ring, tree = _tree_vs_ring(GiB, 8, "nvswitch-a100")
    assert tree / ring == pytest.approx((8 / 14) / (0.92 * 0.5), rel=0.01)  # no correction
    # The tree exists for all-reduce only, as in NCCL: forcing it on another op is an error.
    with pytest.raises(ValueError, match="all_gather has no tree algorithm in NCCL"):
        collective_time("all_gather", GiB, 8, "nvswitch-a100", algorithm="tree")
    with pytest.raises(ValueError, match="NCCL_ALGO"):
        collective_time("all_reduce", GiB, 8, "nvswitch-a100", algorithm="nvls")


def test_busbw_conversions_follow_nccl_tests() -> None:
    # [nccl-tests-perf] doc/PERFORMANCE.md: 2(n-1)/n, (n-1)/n, (n-1)/n, 1, 1, (n-1)/n.
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == 0.875
    assert bus_factor("all_to_all", 4) == 0.75
    assert bus_factor("broadcast", 8) == bus_factor("reduce", 8) == 1.0
    assert bus_factor("send_recv", 2) == 1.0
    assert bus_factor("all_reduce", 2) == 1.0
    assert algbw_to_busbw("all_reduce", 8, 131.87) == pytest.approx(230.77, abs=0.01)
    assert busbw_to_algbw("all_reduce", 8, 230.77) == pytest.approx(131.87, abs=0.01)
    assert busbw_to_algbw("all_gather", 2, 3.79) == pytest.approx(7.58)
    # torch's names are NCCL's.
    assert bus_factor("all_gather_into_tensor", 4) == bus_factor("all_gather", 4)
    assert bus_factor("reduce_scatter_tensor", 4) == bus_factor("reduce_scatter", 4)


def test_a_barrier_is_an_all_reduce_of_one_element() -> None:
    b = collective_time("barrier", 0, 8, "nvswitch-a100")
    assert b.nbytes == 4 and b.seconds > 0
    assert b.seconds == pytest.approx(collective_time("all_reduce", 4, 8, "nvswitch-a100").seconds)
    assert b.protocol == "LL"


def test_send_recv_is_one_step_at_the_full_link() -> None:
    t = collective_time("send", 64 * MiB, 2, "pcie3-host")
    assert t.op == "send_recv" and (t.algorithm, t.steps) == ("direct", 1)
    # One way: no duplex penalty even through host memory; the latency is one Simple step.
    assert t.bus_gbs == pytest.approx(12.0)
    assert t.latency == pytest.approx((8.4 + 5.7) * 1e-6)
    assert collective_time("recv", 64 * MiB, 2, "pcie3-host") == t


def test_two_way_traffic_through_host_memory_gets_a_share_of_the_link() -> None:
    host, p2p = (collective_time("all_reduce", GiB, 2, k) for k in ("pcie3-host", "pcie3-p2p"))
    assert host.bus_gbs == pytest.approx(12.0 * links.HOST_DUPLEX)
    assert p2p.bus_gbs == pytest.approx(12.0)
    # A broadcast between two GPUs is one way: the full link either way.
    assert collective_time("broadcast", GiB, 2, "pcie3-host").bus_gbs == pytest.approx(12.0)
    # Through three or more GPUs a broadcast is a chain: each GPU receives and sends.
    assert collective_time("broadcast", GiB, 4, "pcie3-host").bus_gbs == \
        pytest.approx(12.0 * links.HOST_DUPLEX)


def test_a_coalesced_call_is_one_launch_for_several_tensors() -> None:
    sizes = [4 * MiB, 1 * MiB, 16 * MiB]
    one = coalesced_time("all_reduce", sizes, 8, "nvswitch-a100")
    apart = [collective_time("all_reduce", s, 8, "nvswitch-a100") for s in sizes]
    assert one.launches == 1 and one.tensors == 3 and sum(a.launches for a in apart) == 3
    assert one.nbytes == sum(sizes)
    # Each tensor is its own NCCL operation in the group, tuned and timed as such (NCCL's
    # tuning model charges a ring's latency per operation): one launch, the same GPU time.
    assert one.seconds == pytest.approx(sum(a.seconds for a in apart))
    assert one.latency == pytest.approx(sum(a.latency for a in apart))
    assert (one.algorithm, one.protocol) == (apart[2].algorithm, apart[2].protocol)
    assert coalesced_time("all_gather_into_tensor_coalesced", sizes, 8, "nvswitch-a100").op \
        == "all_gather"


def test_one_gpu_or_no_bytes_cost_nothing() -> None:
    for t in (collective_time("all_reduce", GiB, 1, "nvswitch-a100"),
              collective_time("all_reduce", 0, 8, "nvswitch-a100")):
        assert t.seconds == 0 and t.algorithm == "none" and t.launches == 0


def test_every_op_and_torch_name_is_known() -> None:
    for op in OPS:
        assert collective_time(op, MiB, 2, "pcie4-p2p").seconds > 0
    for name in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
                 "all_reduce_coalesced", "isend", "irecv", "batch_isend_irecv"):
        assert collective_time(name, MiB, 2, "pcie4-p2p").op in OPS


# --- topologies --------------------------------------------------------------------------------

def test_every_gpu_is_sold_in_topologies_with_a_default() -> None:
    for name in SPECS:
        sold = topologies(name)
        assert sold and default_topology(name) is sold[0]
    assert default_topology("T4").key == "pcie3-host"  # Kaggle's T4 x2: through host memory
    assert default_topology("A100").key == "nvswitch-a100"
    assert default_topology("H100").key == "nvswitch-h100"
    assert "nvlink3-bridge" in {t.key for t in topologies("A100-PCIe-80GB")}
    assert {t.key for t in topologies("L4")} == {"pcie4-host", "pcie4-p2p"}
    t = collective_time("all_reduce", GiB, 2, gpu_name="T4")
    assert t.topology == "pcie3-host"


def test_link_bandwidths_are_nccls_own() -> None:
    # [nccl-topo]: 20 GB/s per NVLink 3, 20.6 per NVLink 4, PCIe width x speed / 80.
    assert TOPOLOGIES["nvswitch-a100"].bus_gbs == 240.0
    assert TOPOLOGIES["nvswitch-h100"].bus_gbs == pytest.approx(370.8)
    assert TOPOLOGIES["nvlink3-4gpu"].bus_gbs == 80.0
    assert [TOPOLOGIES[f"pcie{g}-p2p"].bus_gbs for g in (3, 4, 5)] == [12.0, 24.0, 48.0]
    assert not TOPOLOGIES["pcie3-host"].p2p and TOPOLOGIES["pcie3-p2p"].p2p
    # NCCL enables LL128 by default on NVLink paths of compute capability 7.0, 8.0, 9.0 and
    # 10.0 only ([nccl-tuning]: "default: pEnable &= 0"), so not on Turing's NVLink bridge.
    assert all(t.ll128 == (t.hw == links.NVLINK and t.compute_capability in
                           ("7.0", "8.0", "9.0", "10.0")) for t in TOPOLOGIES.values())


def test_two_titan_rtx_on_an_nvlink_bridge_or_through_host_memory() -> None:
    # TU102's bridge: 2 NVLink 2 links (NV2), each NCCL's SM70 figure (Volta and Turing).
    bridge = TOPOLOGIES["nvlink2-bridge"]
    spec = SPECS["TITAN-RTX"]
    assert bridge.bus_gbs == 2 * links.SM70_NVLINK_GBS and bridge.max_ranks == 2
    assert bridge.compute_capability == spec.compute_capability and not bridge.ll128
    # The datasheet's link is 25 GB/s per link and direction: NCCL counts 80 % of it.
    assert bridge.bus_gbs == pytest.approx(0.8 * spec.peer_link_gbs)
    assert [t.key for t in topologies("TITAN-RTX")] == ["pcie3-host", "pcie3-p2p",
                                                        "nvlink2-bridge"]
    # A large all-reduce runs at the link's bus bandwidth, LL128 never chosen on Turing.
    for size in (MiB, 16 * MiB, GiB):
        t = collective_time("all_reduce", size, 2, bridge)
        assert t.protocol != "LL128"
    big = collective_time("all_reduce", GiB, 2, bridge)
    host = collective_time("all_reduce", GiB, 2, "pcie3-host", gpu_name="TITAN-RTX")
    assert big.busbw_gbs == pytest.approx(bridge.bus_gbs, rel=0.01)
    assert host.busbw_gbs == pytest.approx(links.PCIE_GBS[3] * links.HOST_DUPLEX, rel=0.01)
    assert host.seconds / big.seconds == pytest.approx(big.busbw_gbs / host.busbw_gbs)


def test_nccl_p2p_disable_stages_every_byte_through_host_memory() -> None:
    for name, spec in SPECS.items():
        gen = next(g for g in links.PCIE_GBS if f"PCIe Gen{g}" in spec.host_link)
        for topo in topologies(name):
            off = links.nccl_topology(topo, name, {"NCCL_P2P_DISABLE": "1"})
            # P2P (NVLink, PCIe peer-to-peer) off: NCCL's SHM transport over the GPU's PCIe
            assert off is (topo if not topo.p2p else TOPOLOGIES[f"pcie{gen}-host"])
            assert not off.p2p and off.hw == links.PCI
            for env in ({}, {"NCCL_P2P_DISABLE": "0"}, {"NCCL_P2P_DISABLE": " "}):
                assert links.nccl_topology(topo, name, env) is topo
    with pytest.raises(ValueError, match=r"NCCL_P2P_DISABLE='yes' is not a number.*set it to 1"):
        links.nccl_topology(TOPOLOGIES["nvlink2-bridge"], "TITAN-RTX",
                            {"NCCL_P2P_DISABLE": "yes"})


# --- bad input ---------------------------------------------------------------------------------

def test_bad_input_says_what_is_wrong_and_what_would_be_right() -> None:
    with pytest.raises(ValueError, match=r"no collective named 'allreduse'.*all_reduce"):
        collective_time("allreduse", MiB, 2, "pcie4-p2p")
    with pytest.raises(ValueError, match=r"nbytes must be a whole number of bytes.*-1"):
        collective_time("all_reduce", -1, 2, "pcie4-p2p")
    with pytest.raises(ValueError, match="nbytes must be a whole number"):
        collective_time("all_reduce", 1.5, 2, "pcie4-p2p")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ranks must be a whole number of GPUs, 1 or more; got 0"):
        collective_time("all_reduce", MiB, 0, "pcie4-p2p")
    with pytest.raises(ValueError, match=r"no topology named 'nvlink'.*nvswitch-a100"):
        collective_time("all_reduce", MiB, 2, "nvlink")
    with pytest.raises(ValueError, match=r"joins at most 2 GPUs, not 4.*NVSwitch"):
        collective_time("all_reduce", MiB, 4, "nvlink3-bridge")
    with pytest.raises(ValueError, match=r"the T4 is not sold in a nvswitch-a100 machine.*"
                                         r"pcie3-host, pcie3-p2p"):
        collective_time("all_reduce", MiB, 2, "nvswitch-a100", gpu_name="T4")
    with pytest.raises(ValueError, match="needs a topology"):
        collective_time("all_reduce", MiB, 2)
    with pytest.raises(ValueError, match="at least one tensor"):
        coalesced_time("all_reduce", [], 2, "pcie4-p2p")
    with pytest.raises(ValueError, match="no performance model for a GPU named 'T5'"):
        topologies("T5")
    with pytest.raises(ValueError, match="nbytes must be a whole number"):
        coalesced_time("all_reduce", [MiB, -2], 2, "pcie4-p2p")


def test_the_model_is_pure() -> None:
    # It imports nothing of the simulation and nothing of torch.
    for module in (coll, links, data_parallel):
        text = Path(module.__file__).read_text(encoding="utf-8")
        assert not re.search(r"^\s*(from|import)\s+(torch|devlab\.simulated)", text, re.M)
    assert gpu_model.collective_time is collective_time and gpu_model.topology is topology


# --- the published measurements ----------------------------------------------------------------

def test_published_bus_bandwidths_within_20_percent(bench) -> None:
    compared = bench.compare()
    counted = [c for c in compared if c.counted]
    assert len(counted) >= 12
    # The rows the issue names, and both kinds of PCIe.
    sources = {c.measured.source for c in counted}
    assert {"nccl#527", "nccl-tests#178", "nccl-tests#194", "autodl", "rtx6kpro"} <= sources
    kinds = {TOPOLOGIES[c.measured.topology].p2p for c in counted
             if TOPOLOGIES[c.measured.topology].hw == links.PCI}
    assert kinds == {True, False}  # PCIe with and without peer-to-peer
    for c in counted:
        m = c.measured
        assert m.nbytes >= 1_000_000 and m.busbw_gbs and m.stated
        error = c.model.busbw_gbs / m.busbw_gbs - 1
        assert abs(error) <= 0.20, (m.source, m.op, m.nbytes, m.busbw_gbs, c.model.busbw_gbs)
    # Every row cites where it was published and the row itself.
    for c in compared:
        assert c.measured.url.startswith("https://") and c.measured.row and c.measured.setup


def test_tiny_messages_within_2x_of_the_measured_latency(bench) -> None:
    small = [c for c in bench.compare() if c.measured.role == "small"]
    assert small
    for c in small:
        ratio = c.model.seconds * 1e6 / c.measured.time_us
        assert 0.5 <= ratio <= 2.0, (c.measured.source, c.measured.op, ratio)


def test_the_docs_show_what_the_benchmark_prints(bench) -> None:
    doc = (ROOT / "docs" / "gpu-models.md").read_text(encoding="utf-8")
    for name, table in bench.sections().items():
        shown = doc.split(f"<!-- {name}:start -->\n")[1].split(f"\n<!-- {name}:end -->")[0]
        assert shown == table, f"docs/gpu-models.md's {name} is stale: run " \
                               "benchmarks/collectives.py --docs"


# --- a data-parallel step (DDP) ----------------------------------------------------------------

def _grads(count: int, nbytes: int, backward: float) -> list[tuple[float, int]]:
    """`count` gradients of `nbytes`, ready evenly through a backward pass of `backward` s."""
    return [((i + 1) / count * backward, nbytes) for i in range(count)]


def test_ddp_buckets_are_1_mib_then_25_mib_in_order_of_readiness() -> None:
    assert [len(b) for b in bucket_sizes([MiB] * 100)] == [1, 25, 25, 25, 24]
    assert [len(b) for b in bucket_sizes([MiB // 2] * 6)] == [2, 4]
    assert bucket_sizes([]) == []
    assert data_parallel.FIRST_BUCKET_BYTES == 1 << 20  # dist._DEFAULT_FIRST_BUCKET_BYTES
    # Buckets follow readiness, not the order the gradients are listed in.
    grads = _grads(60, MiB, 0.05)
    step = data_parallel_step(grads, 8, "nvswitch-a100", forward=0.02, backward=0.05)
    shuffled = data_parallel_step(grads[::-1], 8, "nvswitch-a100", forward=0.02,
                                  backward=0.05)
    assert step == shuffled
    assert [b.gradients for b in step.buckets] == [1, 25, 25, 9]


def test_ddp_all_reduces_run_in_order_on_their_own_stream() -> None:
    step = data_parallel_step(_grads(100, MiB, 0.08), 4, "pcie4-p2p", forward=0.03,
                              backward=0.08, optimizer=0.004)
    previous_end = 0.0
    for b in step.buckets:
        assert b.collective == collective_time("all_reduce", b.nbytes, 4, "pcie4-p2p")
        assert b.start == pytest.approx(max(b.ready, previous_end))
        previous_end = b.end
    assert step.communication == pytest.approx(sum(b.collective.seconds for b in step.buckets))
    assert step.seconds == pytest.approx(0.03 + max(0.08, previous_end) + 0.004)


def test_ddp_overlaps_communication_with_the_backward_pass() -> None:
    # Fast links: only the last bucket's all-reduce is left after the backward pass.
    fast = data_parallel_step(_grads(100, MiB, 0.1), 8, "nvswitch-a100", forward=0.05,
                              backward=0.1)
    assert fast.exposed == pytest.approx(fast.buckets[-1].collective.seconds)
    assert fast.hidden > 0.7
    # Through host memory the all-reduces outlast the backward pass: most is exposed, and the
    # step is at least the communication.
    slow = data_parallel_step(_grads(100, MiB, 0.01), 2, "pcie3-host", forward=0.005,
                              backward=0.01)
    assert slow.exposed > 0.5 * slow.communication
    assert slow.seconds >= slow.forward + slow.communication
    # The first iteration's single bucket starts when the backward pass ends: nothing hidden.
    first = data_parallel_step(_grads(100, MiB, 0.1), 8, "nvswitch-a100", forward=0.05,
                               backward=0.1, first_iteration=True)
    assert len(first.buckets) == 1 and first.hidden == pytest.approx(0.0)
    assert first.seconds == pytest.approx(0.15 + first.buckets[0].collective.seconds)
    # One GPU: no communication at all.
    alone = data_parallel_step(_grads(100, MiB, 0.1), 1, "nvswitch-a100", forward=0.05,
                               backward=0.1, optimizer=0.01)
    assert alone.communication == 0 and alone.seconds == pytest.approx(0.16)


def test_ddp_bad_input_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"forward must be a time in seconds, 0 or more; got -1"):
        data_parallel_step([], 2, "pcie4-p2p", forward=-1, backward=0.1)
    with pytest.raises(ValueError, match=r"gradient 0 is ready at 0.5 s: it must be within the "
                                         r"backward pass, 0 to 0.1 s"):
        data_parallel_step([(0.5, MiB)], 2, "pcie4-p2p", forward=0.1, backward=0.1)
    with pytest.raises(ValueError, match=r"gradient 1 must be \(ready seconds, bytes\)"):
        data_parallel_step([(0.05, MiB), 3], 2, "pcie4-p2p", forward=0.1, backward=0.1)
    with pytest.raises(ValueError, match=r"gradient 0 has -3 bytes"):
        data_parallel_step([(0.05, -3)], 2, "pcie4-p2p", forward=0.1, backward=0.1)
    with pytest.raises(ValueError, match="bucket_cap_bytes must be a whole number of bytes"):
        bucket_sizes([MiB], bucket_cap_bytes=0)


def test_published_resnet50_scaling_is_not_limited_by_communication(bench) -> None:
    # [lambda], [dle-rn50]: the model, from the measured one-GPU step, predicts at least the measured
    # multi-GPU throughput (what it leaves out only slows the GPUs), within 20 %.
    rows = bench.scaling_rows()
    assert {(r.board, r.ranks) for r in rows} >= {("A100 80GB SXM4", 8), ("A100 80GB PCIe", 2),
                                                  ("DGX A100, TF32", 8),
                                                  ("DGX A100, mixed precision", 8)}
    for r in rows:
        assert 1.0 <= r.modeled / r.measured <= 1.2, (r.board, r.ranks)
        assert r.step.communication < 0.05 * r.step.seconds
