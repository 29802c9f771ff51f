"""What a collective costs: NCCL's own tuning model, on the links of `links`.

NCCL picks, for every collective and size, the algorithm (ring or tree) and protocol (LL,
LL128, Simple) its tuning model says is fastest: each has a fixed latency (a base plus a
latency per step) and a bandwidth, and the time is latency + bytes / bandwidth
([nccl-tuning], NVIDIA/nccl `src/graph/tuning.cc`, commit
5067397c2676d5aed50042fc39e5c8ee96eb0027: `ncclTopoTuneModel`, `ncclTopoGetAlgoTime`). The
model here is that model, for one machine, with the constants copied from it:

- **Bandwidth.** The link's bus bandwidth (`links.Topology.bus_gbs`: NCCL's figure for the
  link), less for the protocols that spend bytes on flags: LL moves half (capped per GPU
  generation), LL128 0.92 of it (NVLink only; "120/128" in NCCL's comment); a tree all-reduce
  0.92 of it and, in a single machine, LL128 7/9 of that, LL 1/3.8. The bus bandwidth becomes
  the algorithm bandwidth (bytes / time) as nccl-tests defines them ([nccl-tests-perf],
  `doc/PERFORMANCE.md`): a ring all-reduce's is n / (2(n-1)) of it, an all-gather's or
  reduce-scatter's n / (n-1), a broadcast's or reduce's all of it, a tree's half.
- **Latency.** A base per algorithm and protocol, plus a per-step latency of the hardware
  (NVLink or PCI) for each of a ring's steps: 2(n-1) for an all-reduce, n-1 for an all-gather
  or reduce-scatter, one for a broadcast or reduce (pipelined); a tree all-reduce pays 2(n-1)
  steps of its own, smaller, per-step latency.
- **Choice.** The fastest (algorithm, protocol) for the size, as NCCL picks: LL for small
  messages, LL128 (on NVLink) then Simple as they grow, and on 4 to 8 NVLinked GPUs a tree for
  some medium sizes, where its smaller per-step latency pays for its lower bandwidth.

Corrections to NCCL's model, each from measurements: through host memory (PCIe without
peer-to-peer) two-way traffic gets 0.3 of the link (`links.HOST_DUPLEX`); the NVLink
bridge of H100 PCIe cards is taken at what it was measured at (`links.H100_BRIDGE_FRACTION`).

Sizes are as nccl-tests counts them: an all-reduce's, broadcast's or reduce's buffer, an
all-gather's or gather's output (all ranks' parts), a reduce-scatter's or scatter's input, an all-to-all's buffer on
each rank, a send's message. Times are GPU-side, as nccl-tests measures them (operations
queued back to back); the host's launch latency is not in them.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import log2

from devlab.engine.gpu_model.links import NVLINK, Topology, default_topology
from devlab.engine.gpu_model.links import topology as find_topology
from devlab.engine.gpu_model.specs import GpuSpec, gpu

ALL_REDUCE, BROADCAST, REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, SEND_RECV, BARRIER = (
    "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
    "send_recv", "barrier")
# NCCL has no gather or scatter kernel: torch's ProcessGroupNCCL runs them as grouped sends
# and receives to or from the root (ncclGroupStart, one ncclSend/ncclRecv per peer), as
# nccl-tests' gather_perf and scatter_perf do.
GATHER, SCATTER = "gather", "scatter"
OPS = (ALL_REDUCE, BROADCAST, REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, SEND_RECV,
       BARRIER, GATHER, SCATTER)
# torch.distributed's names for the same NCCL operations.
OP_ALIASES = {
    "allreduce": ALL_REDUCE, "all_reduce_coalesced": ALL_REDUCE,
    "allgather": ALL_GATHER, "all_gather_into_tensor": ALL_GATHER,
    "all_gather_coalesced": ALL_GATHER, "all_gather_into_tensor_coalesced": ALL_GATHER,
    "_all_gather_base": ALL_GATHER, "all_gather_object": ALL_GATHER,
    "reducescatter": REDUCE_SCATTER, "reduce_scatter_tensor": REDUCE_SCATTER,
    "reduce_scatter_tensor_coalesced": REDUCE_SCATTER, "_reduce_scatter_base": REDUCE_SCATTER,
    "alltoall": ALL_TO_ALL, "all_to_all_single": ALL_TO_ALL,
    "send": SEND_RECV, "recv": SEND_RECV, "isend": SEND_RECV, "irecv": SEND_RECV,
    "sendrecv": SEND_RECV, "batch_isend_irecv": SEND_RECV,
}
RING, TREE, DIRECT, LOCAL = "ring", "tree", "direct", "none"
LL, LL128, SIMPLE = "LL", "LL128", "Simple"
PROTOCOLS = (LL, LL128, SIMPLE)

# [nccl-tuning] ncclTunerConstantsDefaults, in µs: baseLatencies (LL, LL128, Simple) ...
BASE_US = {TREE: (6.8, 14.0, 8.4), RING: (6.6, 14.0, 8.4)}
# ... and hwLatencies per step, single machine: NVLink and PCI, each (LL, LL128, Simple).
STEP_US = {NVLINK: {TREE: (0.6, 1.25, 4.0), RING: (0.6, 1.9, 3.4)},
           "PCI": {TREE: (1.0, 1.9, 4.0), RING: (1.0, 2.5, 5.7)}}
# llMaxBws, single machine, by GPU generation: Volta (and Turing), Ampere, Hopper (GB/s).
LL_MAX_GBS = {"7": 39.0, "8": 87.7, "9": 141.0}
# treeCorrectionFactor: a tree all-reduce's bandwidth is scaled by these for sizes of 64 B x
# 2^i (i = 0..23), per protocol: "Trees are not perfectly sticking to the model for medium
# sizes".
TREE_CORRECTION = {
    LL: (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
         1.0, 1.0, 1.0, 1.0),
    LL128: (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9,
            .9, 1.0, 1.0, 1.0),
    SIMPLE: (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8,
             .9, .9, .9),
}
# torch's ProcessGroupNCCL::barrier is an all-reduce of a one-element tensor.
BARRIER_BYTES = 4


def bus_factor(op: str, ranks: int) -> float:
    """busbw / algbw for `op` on `ranks` GPUs, as nccl-tests defines it ([nccl-tests-perf]):
    2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter, all-to-all, gather and
    scatter (nccl-tests' gather.cu and scatter.cu), 1 for broadcast, reduce and send/recv."""
    op = canonical(op)
    _check_ranks(ranks)
    if op in (ALL_REDUCE, BARRIER):
        return 2 * (ranks - 1) / ranks
    if op in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, GATHER, SCATTER):
        return (ranks - 1) / ranks
    return 1.0


def algbw_to_busbw(op: str, ranks: int, algbw: float) -> float:
    """The bus bandwidth nccl-tests prints beside an algorithm bandwidth."""
    return algbw * bus_factor(op, ranks)


def busbw_to_algbw(op: str, ranks: int, busbw: float) -> float:
    """The algorithm bandwidth (bytes / time) behind a bus bandwidth."""
    factor = bus_factor(op, ranks)
    return busbw / factor if factor else 0.0


@dataclass(frozen=True, slots=True)
class CollectiveTime:
    """One collective's modeled time on a topology, in seconds, and the terms behind it."""

    op: str
    nbytes: int
    ranks: int
    topology: str
    algorithm: str  # "ring", "tree", "direct" (send/recv, all-to-all) or "none" (one GPU)
    protocol: str  # NCCL's "LL", "LL128" or "Simple" ("" where nothing moves)
    steps: int  # the latency-bearing steps
    latency: float  # base + steps x per-step latency (all the group's, for a coalesced call)
    bandwidth: float  # bytes / algorithm bandwidth
    bus_gbs: float  # the bus bandwidth the choice runs at (GB/s), before the fixed latency
    tensors: int = 1  # tensors in one call (a coalesced call launches once for all of them)

    @property
    def seconds(self) -> float:
        return self.latency + self.bandwidth

    @property
    def algbw_gbs(self) -> float:
        """Bytes / time, as nccl-tests' "algbw" (GB/s)."""
        return self.nbytes / self.seconds / 1e9 if self.seconds else 0.0

    @property
    def busbw_gbs(self) -> float:
        """nccl-tests' "busbw" (GB/s): algbw x the op's factor."""
        return self.algbw_gbs * bus_factor(self.op, self.ranks) if self.ranks > 1 else 0.0

    @property
    def launches(self) -> int:
        """Kernel launches: one per call, however many tensors it carries."""
        return 1 if self.ranks > 1 and self.nbytes else 0

    def __str__(self) -> str:
        return (f"{self.op} of {self.nbytes:,} bytes on {self.ranks} GPUs ({self.topology}): "
                f"{self.seconds * 1e6:,.1f} µs modeled, {self.algorithm}/{self.protocol}, "
                f"busbw {self.busbw_gbs:.1f} GB/s")


def canonical(op: str) -> str:
    """The model's name for a collective (torch's names are accepted)."""
    key = str(op).strip().lower()
    key = OP_ALIASES.get(key, key)
    if key not in OPS:
        raise ValueError(f"no collective named {op!r}; the collectives are {', '.join(OPS)} "
                         f"(and torch's names: {', '.join(OP_ALIASES)})")
    return key


def _check_ranks(ranks: object) -> None:
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be a whole number of GPUs, 1 or more; got {ranks!r}")


def _check_bytes(nbytes: object) -> int:
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be a whole number of bytes, 0 or more; got {nbytes!r}")
    return nbytes


def _generation(topo: Topology, spec: GpuSpec | None) -> str:
    return (spec.compute_capability if spec is not None else topo.compute_capability)[0]


def _two_way(op: str, ranks: int) -> bool:
    """Every GPU sends and receives at once (a ring, or a broadcast/reduce chain of 3+)."""
    if op in (SEND_RECV, GATHER, SCATTER):  # the root only receives (sends); the others
        return False                         # only send (receive)
    if op in (BROADCAST, REDUCE):
        return ranks > 2
    return True


def _candidates(op: str, ranks: int, topo: Topology, generation: str) -> list[tuple]:
    """(algorithm, protocol, steps, latency s, bus GB/s, algbw GB/s) for each NCCL choice."""
    link = topo.bus_gbs * (topo.duplex if _two_way(op, ranks) else 1.0)
    ll_cap = LL_MAX_GBS.get(generation, LL_MAX_GBS["7"])
    protocols = [(0, LL), (2, SIMPLE)] + ([(1, LL128)] if topo.ll128 else [])
    out = []
    if op in (ALL_TO_ALL, SEND_RECV, GATHER, SCATTER):
        # Point-to-point transfers to every peer at once (NCCL runs all-to-all, gather and
        # scatter as grouped sends and receives): one step, Simple protocol, each GPU's link
        # full; a gather's or scatter's (n-1)/n of the buffer crosses the root's link.
        latency = BASE_US[RING][2] + STEP_US[topo.hw][RING][2]
        out.append((DIRECT, SIMPLE, 1, latency * 1e-6, link,
                    busbw_to_algbw(op, ranks, link)))
        return out
    for p, name in protocols:
        # Ring: every op. nsteps as in ncclTopoTuneModel.
        steps = (2 * (ranks - 1) if op == ALL_REDUCE else
                 ranks - 1 if op in (ALL_GATHER, REDUCE_SCATTER) else 1)
        bus = link
        if name == LL:
            bus = min(ll_cap, bus * 0.5)
        elif name == LL128:
            bus = bus * 0.92  # NCCL: 0.92 /*120.0/128.0*/
        latency = BASE_US[RING][p] + steps * STEP_US[topo.hw][RING][p]
        out.append((RING, name, steps, latency * 1e-6, bus, busbw_to_algbw(op, ranks, bus)))
        if op == ALL_REDUCE and ranks > 2:
            tree_bus = link * 0.92
            if name == LL:
                tree_bus = min(tree_bus / 3.8, ll_cap)
            elif name == LL128:
                tree_bus = tree_bus * 7.0 / 9.0  # a single machine
            tree_steps = 2 * (ranks - 1)
            tree_latency = BASE_US[TREE][p] + tree_steps * STEP_US[topo.hw][TREE][p]
            out.append((TREE, name, tree_steps, tree_latency * 1e-6, tree_bus, tree_bus * 0.5))
    return out


def collective_time(op: str, nbytes: int, ranks: int, topology: str | Topology | None = None,
                    *, gpu_name: str | GpuSpec | None = None,
                    algorithm: str | None = None) -> CollectiveTime:
    """The modeled time of one collective of `nbytes` on `ranks` GPUs joined by `topology` (a
    name from `links.TOPOLOGIES`, or the default machine of `gpu_name`). `algorithm` forces
    "ring" or "tree" as NCCL_ALGO does. Pure: runs nothing."""
    op = canonical(op)
    nbytes = _check_bytes(nbytes)
    _check_ranks(ranks)
    spec = gpu(gpu_name) if gpu_name is not None else None
    if topology is None:
        if spec is None:
            raise ValueError("collective_time needs a topology (one of links.TOPOLOGIES) or a "
                             "gpu_name whose default machine to use")
        topo = default_topology(spec)
    else:
        topo = find_topology(topology, spec)
    if ranks > topo.max_ranks:
        raise ValueError(f"a {topo.key} machine ({topo.name}) joins at most {topo.max_ranks} "
                         f"GPUs, not {ranks}; for more, use one that joins more (NVSwitch or "
                         "PCIe machines join 8)")
    if algorithm is not None and algorithm not in (RING, TREE):
        raise ValueError(f"algorithm must be 'ring' or 'tree' (NCCL_ALGO), not {algorithm!r}")
    if op == BARRIER:
        nbytes = BARRIER_BYTES
    if ranks == 1 or nbytes == 0:
        return CollectiveTime(op, nbytes, ranks, topo.key, LOCAL, "", 0, 0.0, 0.0, 0.0)
    reduce_op = ALL_REDUCE if op == BARRIER else op
    best = None
    for alg, proto, steps, latency, bus, algbw in _candidates(reduce_op, ranks, topo,
                                                              _generation(topo, spec)):
        if algorithm is not None and alg not in (algorithm, DIRECT):
            continue
        if alg == TREE:
            index = int(log2(nbytes >> 6)) if nbytes >> 6 else -1
            if 0 <= index < 23:
                algbw *= TREE_CORRECTION[proto][index]
        seconds = latency + nbytes / (algbw * 1e9)
        if best is None or seconds < best[0]:
            best = (seconds, alg, proto, steps, latency, nbytes / (algbw * 1e9), bus)
    if best is None:
        raise ValueError(f"{op} has no {algorithm} algorithm in NCCL; leave algorithm unset")
    _, alg, proto, steps, latency, bandwidth, bus = best
    return CollectiveTime(op, nbytes, ranks, topo.key, alg, proto, steps, latency, bandwidth,
                          bus)


def coalesced_time(op: str, sizes: list[int] | tuple[int, ...], ranks: int,
                   topology: str | Topology | None = None, *,
                   gpu_name: str | GpuSpec | None = None) -> CollectiveTime:
    """One coalesced call (all_reduce_coalesced, all_gather_into_tensor_coalesced, ...,
    or ops grouped in a `_coalescing_manager`): one launch for all the tensors (NCCL groups
    them into one kernel), each tensor tuned and timed as its own operation: NCCL's tuning
    model charges a ring's latency for every operation of a group (ncclTopoGetAlgoTime,
    `latCount = numPipeOps`), so what coalescing saves is the host's launches, not GPU time.
    The algorithm and protocol shown are the largest tensor's."""
    if not sizes:
        raise ValueError("a coalesced call needs at least one tensor's size")
    parts = [collective_time(op, _check_bytes(s), ranks, topology, gpu_name=gpu_name)
             for s in sizes]
    big = max(parts, key=lambda t: t.nbytes)
    return CollectiveTime(big.op, sum(t.nbytes for t in parts), ranks, big.topology,
                          big.algorithm, big.protocol, sum(t.steps for t in parts),
                          sum(t.latency for t in parts), sum(t.bandwidth for t in parts),
                          big.bus_gbs, len(parts))
