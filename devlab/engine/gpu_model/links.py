"""How GPUs are joined: the links between them and the machines each GPU is sold in.

A `Topology` is one way of joining GPUs in one machine: PCIe without peer-to-peer (every byte
staged through host memory, NCCL's SHM transport: Kaggle's two T4s, most cloud PCIe boxes),
PCIe with peer-to-peer, an NVLink bridge between two cards, or NVSwitch (8-GPU A100 and H100
servers). Each carries what NCCL itself assumes of that link (its bus bandwidth per GPU and per
direction, and whether it is NVLink or PCI for NCCL's per-step latencies), from NCCL's source,
NVIDIA/nccl at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027 ([nccl-topo]: `src/graph/topo.h`,
`src/graph/topo.cc`; [nccl-tuning]: `src/graph/tuning.cc`), and the few corrections that
published measurements need, each cited (docs/gpu-models.md, "Collectives").

Units: GB/s = 10^9 bytes per second, per direction, per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from devlab.engine.gpu_model.specs import SPECS, GpuSpec, gpu

NVLINK, PCI = "NVLink", "PCI"  # NCCL's two intra-node hardware classes for per-step latencies

# [nccl-topo] topo.h: what NCCL counts one NVLink as moving, per direction, from SM copies
# (a 25 GB/s line "converts to ~20GB/s effective bandwidth with a 128B payload size", nccl-tests
# issue #149, sjeaugey).
SM70_NVLINK_GBS = 20.0  # SM70_NVLINK_BW: Volta and Turing (NVLink 2; ncclTopoNVLinkBw: 7.x)
SM80_NVLINK_GBS = 20.0  # SM80_NVLINK_BW: A100 (NVLink 3)
SM90_NVLINK_GBS = 20.6  # SM90_NVLINK_BW: H100 (NVLink 4)
SM86_NVLINK_GBS = 12.0  # SM86_NVLINK_BW: GA102 boards (the RTX 3090's NVLink bridge)
SM100_NVLINK_GBS = 40.1  # SM100_NVLINK_BW: Blackwell (NVLink 5); NCCL 2.23's topo.h
# [nccl-topo] topo.cc: a PCIe link is width x speed / 80 GB/s, speed in 100 Mb/s per lane
# ("8.0 GT/s PCIe" = 60, "16.0 GT/s PCIe" = 120, "32.0 GT/s PCIe" = 240): 12 GB/s for Gen3 x16
# (topo.h's PCI_BW, "PCI Gen3 x16"), 24 for Gen4 x16, 48 for Gen5 x16.
PCIE_GBS = {3: 16 * 60 / 80.0, 4: 16 * 120 / 80.0, 5: 16 * 240 / 80.0}
# Staged through host memory, an op whose GPUs send and receive at once (a ring: all-reduce,
# all-gather, reduce-scatter, all-to-all) gets under a third of what a one-way op (a broadcast
# or reduce between two GPUs) gets: two RTX 2080 Ti on PCIe Gen3 without P2P [autodl] measure
# all_reduce at 3.99-4.00 GB/s busbw and all_gather at 3.18-3.79 against broadcast at 11.09
# and reduce at 11.14; nccl#384 (Gen3 x16, P2P disabled, one channel) 3.9 and 3.17 against
# 10.31, and NCCL's author answers there that "some CPUs do not handle bidirectional traffic
# well". Fitted on [autodl]'s two-way rows, the least largest error: between the all-gather's
# 3.18 (16 MiB) and the all-reduce's 4.00 (1 GiB), 3.54 GB/s = 0.295 x NCCL's 12.
HOST_DUPLEX = 0.295
# Two H100 PCIe cards joined by NVLink bridges reach 115.4 GB/s busbw on all_reduce of 1 to
# 4 GiB (nccl-tests#194, the only published measurement found), not the 247 GB/s that NCCL's
# per-link figure gives for the 12 links of the datasheet's 600 GB/s (both ways): the model
# takes the measured case (fitted: 115.37 / 247.2); the cause is not published.
H100_BRIDGE_FRACTION = 0.467


@dataclass(frozen=True)
class Topology:
    """One way of joining GPUs in one machine, as NCCL sees it."""

    key: str  # "pcie3-host", "nvswitch-a100", ...
    name: str  # what it is, in words
    hw: str  # NVLINK or PCI: which of NCCL's per-step latencies apply
    bus_gbs: float  # what NCCL moves per GPU and direction over it (its bus bandwidth)
    max_ranks: int  # GPUs it joins at most
    p2p: bool  # GPUs read and write each other's memory (False: staged through host memory)
    duplex: float = 1.0  # share of bus_gbs left when every GPU sends and receives at once
    ll128: bool = False  # NCCL enables its LL128 protocol (NVLink paths only, [nccl-tuning])
    compute_capability: str = "8.0"  # the GPUs' generation, for NCCL's LL bandwidth cap
    source: str = ""

    def __str__(self) -> str:
        return self.name


def _pcie(gen: int, p2p: bool, cc: str) -> Topology:
    gbs = PCIE_GBS[gen]
    if p2p:
        return Topology(f"pcie{gen}-p2p", f"PCIe Gen{gen} x16 with peer-to-peer", PCI, gbs, 8,
                        True, compute_capability=cc,
                        source=f"NCCL's PCIe Gen{gen} x16 bandwidth, {gbs:g} GB/s [nccl-topo]")
    return Topology(f"pcie{gen}-host", f"PCIe Gen{gen} x16 without peer-to-peer (through host "
                    "memory)", PCI, gbs, 8, False, HOST_DUPLEX, compute_capability=cc,
                    source=f"NCCL's PCIe Gen{gen} x16 bandwidth, {gbs:g} GB/s [nccl-topo]; 0.295 "
                    "of it for two-way traffic through host memory [autodl], [nccl#384]")


TOPOLOGIES: dict[str, Topology] = {
    "pcie3-host": _pcie(3, False, "7.5"),
    "pcie3-p2p": _pcie(3, True, "7.5"),
    "pcie4-host": _pcie(4, False, "8.0"),
    "pcie4-p2p": _pcie(4, True, "8.0"),
    "pcie5-host": _pcie(5, False, "9.0"),
    "pcie5-p2p": _pcie(5, True, "9.0"),
    # A100 PCIe cards joined in pairs by three NVLink bridges: 12 NVLink 3 links ("NVIDIA
    # NVLink Bridge for 2 GPUs: 600 GB/s" both ways, [A100-DS]), 20 GB/s each to NCCL.
    "nvlink3-bridge": Topology("nvlink3-bridge", "NVLink bridge between two A100 PCIe cards "
                               "(12 NVLink 3 links)", NVLINK, 12 * SM80_NVLINK_GBS, 2, True,
                               ll128=True, compute_capability="8.0",
                               source="12 links x NCCL's 20 GB/s [A100-DS], [nccl-topo]"),
    # 4-GPU HGX A100 boards join each pair of GPUs by 4 NVLinks, no NVSwitch.
    "nvlink3-4gpu": Topology("nvlink3-4gpu", "4-GPU HGX A100 board (4 NVLink 3 links per "
                             "pair)", NVLINK, 4 * SM80_NVLINK_GBS, 4, True, ll128=True,
                             compute_capability="8.0",
                             source="4 links x NCCL's 20 GB/s [nccl-topo]"),
    # 8-GPU HGX/DGX A100: every GPU's 12 NVLinks go to the NVSwitches, so any pair gets all
    # 12 ("the total effective bandwidth should therefore be 240GB/s on A100", nccl-tests#149).
    "nvswitch-a100": Topology("nvswitch-a100", "NVSwitch, 8-GPU A100 server (12 NVLink 3 "
                              "links per GPU)", NVLINK, 12 * SM80_NVLINK_GBS, 8, True,
                              ll128=True, compute_capability="8.0",
                              source="12 links x NCCL's 20 GB/s [nccl-topo], [nccl-tests#149]"),
    # 8-GPU HGX H100: 18 NVLink 4 links per GPU to the NVSwitches; NCCL's ring gets "an
    # effective NVLink bandwidth of 370GB/s" (nccl-tests#212). NCCL's NVLink SHARP all-reduce
    # (NVLS, faster still) is not modeled: the model is NCCL with NCCL_ALGO=Ring,Tree.
    "nvswitch-h100": Topology("nvswitch-h100", "NVSwitch, 8-GPU H100 server (18 NVLink 4 "
                              "links per GPU)", NVLINK, 18 * SM90_NVLINK_GBS, 8, True,
                              ll128=True, compute_capability="9.0",
                              source="18 links x NCCL's 20.6 GB/s [nccl-topo], "
                              "[nccl-tests#212]"),
    "nvlink4-bridge": Topology("nvlink4-bridge", "NVLink bridge between two H100 PCIe cards",
                               NVLINK, round(12 * SM90_NVLINK_GBS * H100_BRIDGE_FRACTION, 1), 2,
                               True, ll128=True, compute_capability="9.0",
                               source="fitted on the one published measurement "
                               "[nccl-tests#194]; NCCL's 12 x 20.6 GB/s would be 247"),
    # Two TITAN RTX (TU102) joined by an NVLink bridge: 2 second-generation links ("NV2" in
    # `nvidia-smi topo -m`), 25 GB/s per direction each ("100 GB/s" both ways), which NCCL
    # counts at SM70_NVLINK_BW (20 GB/s) each. NCCL enables LL128 by default on compute
    # capability 7.0, 8.0, 9.0 and 10.0 only, so not on Turing (7.5) ([nccl-tuning]).
    "nvlink2-bridge": Topology("nvlink2-bridge", "NVLink bridge between two TITAN RTX cards "
                               "(2 NVLink 2 links, NV2)", NVLINK, 2 * SM70_NVLINK_GBS, 2, True,
                               ll128=False, compute_capability="7.5",
                               source="2 links x NCCL's 20 GB/s [TITAN-RTX], [nccl-topo]"),
    # Two RTX 3090s joined by their NVLink bridge: 4 third-generation links, "112.5 GB/s"
    # both ways [Ampere-GA102-WP], which NCCL counts at SM86_NVLINK_BW (12 GB/s) each; no
    # LL128 (NCCL enables it on compute capability 7.0, 8.0, 9.0 and 10.0 only). The RTX 4090
    # and 5090 have no NVLink: PCIe only.
    "nvlink3-3090-bridge": Topology("nvlink3-3090-bridge", "NVLink bridge between two RTX 3090 "
                                    "cards (4 NVLink 3 links)", NVLINK, 4 * SM86_NVLINK_GBS, 2,
                                    True, ll128=False, compute_capability="8.6",
                                    source="4 links x NCCL's 12 GB/s [Ampere-GA102-WP], "
                                    "[nccl-topo]"),
    # DGX-1 with V100 SXM2: 6 NVLink 2 links per GPU in a hybrid cube-mesh, no NVSwitch; a
    # ring over it uses every GPU's 6 links at NCCL's 20 GB/s.
    "nvlink2-dgx1": Topology("nvlink2-dgx1", "DGX-1, 8 V100 SXM2 in a hybrid cube-mesh (6 "
                             "NVLink 2 links per GPU)", NVLINK, 6 * SM70_NVLINK_GBS, 8, True,
                             ll128=True, compute_capability="7.0",
                             source="6 links x NCCL's 20 GB/s [V100-DS], [nccl-topo]"),
    # 8-GPU HGX B200: 18 NVLink 5 links per GPU to the NVSwitches (1.8 TB/s both ways).
    "nvswitch-b200": Topology("nvswitch-b200", "NVSwitch, 8-GPU B200 server (18 NVLink 5 "
                              "links per GPU)", NVLINK, 18 * SM100_NVLINK_GBS, 8, True,
                              ll128=True, compute_capability="10.0",
                              source="18 links x NCCL's 40.1 GB/s [B200-DS], [nccl-topo]"),
}

# The machines each GPU is sold in, the first one its default (what `explain()` names).
# PCIe cards default to PCIe without peer-to-peer: Kaggle's "T4 x2" and most cloud PCIe
# machines stage GPU-to-GPU traffic through host memory. The SXM boards are sold on NVSwitch
# baseboards (8 GPUs) and, for the A100, on 4-GPU boards.
GPU_TOPOLOGIES: dict[str, tuple[str, ...]] = {
    "T4": ("pcie3-host", "pcie3-p2p"),
    "P4": ("pcie3-host", "pcie3-p2p"),
    "P100": ("pcie3-host", "pcie3-p2p"),
    "V100": ("pcie3-host", "pcie3-p2p"),
    "L4": ("pcie4-host", "pcie4-p2p"),
    "A100-PCIe-40GB": ("pcie4-host", "pcie4-p2p", "nvlink3-bridge"),
    "A100-PCIe-80GB": ("pcie4-host", "pcie4-p2p", "nvlink3-bridge"),
    "A100-40GB": ("nvswitch-a100", "nvlink3-4gpu"),
    "A100-80GB": ("nvswitch-a100", "nvlink3-4gpu"),
    "H100": ("nvswitch-h100",),
    "H100-PCIe": ("pcie5-host", "pcie5-p2p", "nvlink4-bridge"),
    "TITAN-RTX": ("pcie3-host", "pcie3-p2p", "nvlink2-bridge"),
    # GeForce cards: NVIDIA's driver turns PCIe peer-to-peer off on them, so two talk through
    # host memory; the RTX 3090 pair may have its NVLink bridge.
    "RTX-3060": ("pcie4-host",),
    "RTX-3090": ("pcie4-host", "nvlink3-3090-bridge"),
    "RTX-4060": ("pcie4-host",),
    "RTX-4070": ("pcie4-host",),
    "RTX-4090": ("pcie4-host",),
    "RTX-5090": ("pcie5-host", "pcie5-p2p"),
    "A10G": ("pcie4-host", "pcie4-p2p"),
    "L40S": ("pcie4-host", "pcie4-p2p"),
    "V100-SXM2-16GB": ("nvlink2-dgx1",),
    "H200": ("nvswitch-h100",),
    "B200": ("nvswitch-b200",),
}


def topologies(name: str | GpuSpec) -> tuple[Topology, ...]:
    """The machines GPU `name` is sold in, its default first."""
    key = (name.name if isinstance(name, GpuSpec) else
           name if name in GPU_TOPOLOGIES else gpu(name).name)
    if key not in GPU_TOPOLOGIES:
        raise ValueError(f"no topologies are known for the GPU {key!r}; they are known for "
                         f"{', '.join(GPU_TOPOLOGIES)}")
    return tuple(TOPOLOGIES[t] for t in GPU_TOPOLOGIES[key])


def default_topology(name: str | GpuSpec) -> Topology:
    """The machine a GPU is modeled in unless told otherwise (named in `explain()`)."""
    return topologies(name)[0]


def topology(name: str | Topology, gpu_name: str | GpuSpec | None = None) -> Topology:
    """The topology called `name` (or `name` itself); with `gpu_name`, one that GPU is sold
    in."""
    if isinstance(name, Topology):
        found = name
    else:
        key = str(name).strip().lower()
        if key not in TOPOLOGIES:
            raise ValueError(f"no topology named {name!r}; the topologies are "
                             f"{', '.join(TOPOLOGIES)}")
        found = TOPOLOGIES[key]
    if gpu_name is not None:
        sold = topologies(gpu_name)
        if found not in sold:
            label = gpu_name.name if isinstance(gpu_name, GpuSpec) else gpu_name
            raise ValueError(f"the {label} is not sold in a {found.key} machine ({found.name});"
                             f" its topologies are {', '.join(t.key for t in sold)}")
    return found


def without_p2p(topo: Topology, gpu_name: str | GpuSpec) -> Topology:
    """The machine `topo` becomes with NCCL's peer-to-peer transport off (NCCL_P2P_DISABLE=1):
    neither NVLink nor PCIe peer-to-peer carries the bytes, NCCL's SHM transport stages them
    through host memory over each GPU's own PCIe link (the host-staged topology of its PCIe
    generation). A topology without peer-to-peer is itself."""
    if not topo.p2p:
        return topo
    spec = gpu(gpu_name)
    gen = next((g for g in PCIE_GBS if f"PCIe Gen{g}" in spec.host_link), None)
    if gen is None:
        raise ValueError(f"the {spec.name}'s host link {spec.host_link!r} names no PCIe "
                         f"generation ({', '.join(f'Gen{g}' for g in PCIE_GBS)})")
    return TOPOLOGIES[f"pcie{gen}-host"]


def nccl_topology(topo: Topology, gpu_name: str | GpuSpec, env: dict[str, str]) -> Topology:
    """The machine NCCL runs on given its environment `env`: `topo`, or `without_p2p(topo)`
    where NCCL_P2P_DISABLE is 1. NCCL reads an integer (unset or 0: peer-to-peer on)."""
    raw = env.get("NCCL_P2P_DISABLE", "").strip()
    if not raw:
        return topo
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"NCCL_P2P_DISABLE={raw!r} is not a number: set it to 1 to turn "
                         "NCCL's peer-to-peer transport off, or 0 (or unset) to keep it") from None
    return without_p2p(topo, gpu_name) if value == 1 else topo


assert set(GPU_TOPOLOGIES) >= set(SPECS), "every GPU needs its topologies"


# Copies between host memory and a GPU. A pinned (page-locked) buffer is read or written by the
# GPU's copy engine directly, at the host link's rate (`GpuSpec.host_link_gbs`). A pageable one
# cannot be: CUDA stages it through a pinned buffer of its own, a CPU copy before (or after) the
# DMA, page by page ("How to Optimize Data Transfers in CUDA C/C++", NVIDIA's developer blog),
# so it moves at a fraction of the pinned rate that depends on the host's memory and CPU.
# bandwidthTest, 32 MB, on a DGX A100 (A100-SXM4-80GB; gengwg/gpu, nvda_gpu_benchmark.md,
# "Host-to-Device Transfer Speeds Test"): host to device 25.7 GB/s pinned, 10.0 pageable
# (0.39); device to host 25.8 and 10.8 (0.42). On a Dell server's A100 80GB PCIe, the same
# file: 17.3 and 3.3 (0.19), 24.6 and 8.5 (0.35). The model takes the DGX's, the better host
# of the two and the one closest to "about half": 0.4 of the pinned rate, both directions.
PAGEABLE_FRACTION = 0.4


def host_copy_gbs(spec: GpuSpec, pinned: bool) -> float:
    """GB/s of a copy between host memory and a GPU of `spec`, per direction: the host link's
    rate from (or to) pinned memory, `PAGEABLE_FRACTION` of it from (or to) pageable memory."""
    return spec.host_link_gbs * (1.0 if pinned else PAGEABLE_FRACTION)


# Note [A small copy's fixed time on the GPU]
# Bandwidth alone gives a 4-byte copy (`.item()`) about a nanosecond on the GPU. A copy engine
# takes one to three microseconds for any copy, however small: the GPU-side `Memcpy DtoH` /
# `Memcpy HtoD` durations CUPTI records in real torch.profiler traces of copies of 1 to 1024
# bytes (Holistic Trace Analysis's test traces [hta-traces]: microsecond timestamps, so a mean
# over many copies is the estimate) are 1.65 us (48 copies device to pageable memory, an A100),
# 1.81 us (42, a V100-SXM2-16GB), 2.67 and 1.82 us (30 to pageable memory and 45 from it, an
# A100-SXM4-80GB), and between 1.0 and 3.14 us in rows of 1 to 7 copies; nvprof shows an 8-byte
# copy to the host on a V100-SXM2 at 3.2 us ([pytorch#15568]). The model takes 1.8 us for both
# directions and every board: the least largest error over all nine rows (1.0 to 3.2 us: their
# geometric midpoint is 1.79), and the median of the four rows of 30 copies or more (1.815);
# the rows show no trend with the board or the direction beyond their spread. Every row, with
# the model beside it: benchmarks/gpu_model.py (`SMALL_COPIES`), docs/gpu-models.md, "Copies
# between host and GPU". The host's side of a synchronous copy (its launch, its wait for the
# GPU and the wake-up: `GpuSpec.launch_latency_us`, `sync_latency_us`) is the clock's, not
# this. A copy of no bytes runs nothing: aten's copy_impl returns before any CUDA call when its
# iterator is empty (`iter.numel() == 0`, aten/src/ATen/native/Copy.cpp).
HOST_COPY_LATENCY_US = 1.8


class HostCopy(NamedTuple):
    """One copy between host memory and a GPU as the GPU's copy engine spends it, in seconds."""

    fixed: float  # the copy engine's fixed time per copy (`HOST_COPY_LATENCY_US`)
    link: float  # the bytes over the host link (`host_copy_gbs`)

    @property
    def seconds(self) -> float:
        return self.fixed + self.link


def host_copy(spec: GpuSpec, nbytes: int, pinned: bool) -> HostCopy:
    """The GPU's time for one copy of `nbytes` between host memory and a GPU of `spec`
    (`pinned`: the host's side is page-locked): a fixed time per copy, then the bytes at
    `host_copy_gbs` (See Note [A small copy's fixed time on the GPU])."""
    if nbytes < 0:
        raise ValueError(f"a copy of {nbytes} bytes: expected 0 or more bytes")
    fixed = HOST_COPY_LATENCY_US * 1e-6 if nbytes else 0.0
    return HostCopy(fixed, nbytes / (host_copy_gbs(spec, pinned) * 1e9))
