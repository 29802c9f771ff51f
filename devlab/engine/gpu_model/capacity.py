"""How much of each GPU's memory torch can use: the capacity torch reports, and the CUDA
context a process holds before its first tensor.

A datasheet's "16 GB" is not what a program sees: the driver keeps some of the board's memory
(nvidia-smi shows a T4's 15360 MiB, torch 15102 MiB), and the CUDA context of each process
takes a few hundred MiB more before any tensor exists. Every figure is published from a real
GPU; the sources, with the quoted text, are in docs/gpu-memory-sources.md and
docs/gpu-models.md ("Memory capacity").
"""

from __future__ import annotations

import re

from devlab.engine.gpu_model.specs import GpuSpec


def _gib(gib: float) -> int:
    """The bytes of torch's "X GiB" (two decimals), to a whole MiB."""
    return round(gib * 1024) * 2**20


# `torch.cuda.get_device_properties(i).total_memory` (the same bytes as cudaMemGetInfo's
# total, and CUDA's deviceQuery's "Total amount of global memory"), by the model's key. The
# figure moves by a few MiB with the driver; these are the drivers named in the sources.
TOTAL_MEMORY: dict[str, int] = {
    "T4": 15_835_660_288,  # 15102 MiB, "14.75 GiB" in Colab's out-of-memory errors (driver 12.2)
    "P4": 7_981_694_976,  # 7612 MiB (deviceQuery, driver 10.2)
    "P100": 17_071_734_784,  # 16281 MiB (deviceQuery, driver 11.4); Kaggle's P100
    "V100": 34_089_730_048,  # 32510 MiB, V100 PCIe 32 GB (deviceQuery, driver 10.2)
    "L4": 23_612_293_120,  # 22518 MiB (deviceQuery, driver 12.0)
    "A100-40GB": 42_298_834_944,  # 40339 MiB, "39.39 GiB" (bottlerocket-os/bottlerocket#3873)
    "A100-PCIe-40GB": 42_298_834_944,  # 40339 MiB (deviceQuery, driver 12.2)
    "A100-80GB": 84_987_740_160,  # 81051 MiB, "79.15 GiB" (deviceQuery, driver 12.2)
    "A100-PCIe-80GB": 84_974_239_744,  # 81038 MiB (deviceQuery, driver 12.4)
    "H100": 85_017_755_648,  # 81079 MiB, "79.18 GiB" in out-of-memory errors (driver 13.0)
    # No figure from an H100 PCIe card is published (only "79" GB, rounded): it has the same
    # 80 GB of memory as the SXM5 board, whose figure stands in for it until one is.
    "H100-PCIe": 85_017_755_648,
    # 24220.4375 MiB: `get_device_properties(i).total_memory / 1024 ** 2` printed for two
    # "NVIDIA TITAN RTX" under torch 1.12 (pytorch/pytorch#80876, driver not stated).
    "TITAN-RTX": 25_396_969_472,
    # The boards of issue 40 (docs/gpu-models.md, "Memory capacity"). Where only torch's
    # out-of-memory message is published ("total capacity of X GiB", two decimals), the bytes
    # are round(X x 1024) MiB: within 5 MiB of the board's (`_gib`).
    "RTX-3060": _gib(11.76),  # "11.76 GiB total capacity", RTX 3060 12 GB (PhotoMaker#47)
    "RTX-3090": _gib(23.70),  # "23.70 GiB total capacity", two RTX 3090 (GaoLii/DSP#10)
    # No figure from an RTX 4060 is published: the 8 GB GeForce RTX 3070's "7.78 GiB"
    # (meta-llama/codellama#82) stands in, as the H100 SXM5's does for the H100 PCIe.
    "RTX-4060": _gib(7.78),
    # No RTX 4070 figure either: the 12 GB RTX 3060's.
    "RTX-4070": _gib(11.76),
    "RTX-4090": _gib(23.64),  # "a total capacty of 23.64 GiB" (3DTopia/Phidias-Diffusion#8)
    "RTX-5090": 33_677_180_928,  # 32117 MiB, deviceQuery (aikitoria/open-gpu-kernel-modules#1)
    # No torch figure from an A10G: nvidia-smi shows an A10's 23028 MiB (modal-client#2797);
    # less the 516 MiB the L4 loses between nvidia-smi (23034 MiB, same PR) and torch (22518).
    "A10G": (23028 - 516) * 2**20,
    # No L40S figure: the RTX 6000 Ada's "44.43 GiB" (MTVCrafter#21), the same AD102 chip and
    # 48 GB, whose nvidia-smi total (46068 MiB) is the L40S's (modal-client#2797).
    "L40S": _gib(44.43),
    "V100-SXM2-16GB": _gib(15.78),  # "15.78 GiB total capacity", a 16 GB V100 (Shift-GCN#34)
    # No torch figure from an H200: nvidia-smi's 143771 MiB (NVIDIA/cuda-samples#311) less the
    # 480 MiB the H100 SXM loses between nvidia-smi (81559 MiB, modal-client#2797) and torch.
    "H200": (143771 - 480) * 2**20,
    "B200": _gib(178.35),  # "Total Global Memory: 178.35 GB" (GiB) of a B200 (pytorch/ao#4002)
}

# NVML's total memory (`nvmlDeviceGetMemoryInfo(h).total`, nvidia-smi's "MiB" total), by the
# model's key, in MiB: larger than torch's, since NVML counts memory the driver and firmware keep
# (on the boards with ECC on GDDR, one sixteenth of it stays the ECC's: 16,384 x 15/16 = 15,360
# on a T4). Published nvidia-smi tables, quoted in docs/gpu-memory-sources.md:
NVML_TOTAL_MIB: dict[str, int] = {
    "T4": 15360,  # "3MiB / 15360MiB" (MagicQuill#57); "T4: 15360MiB" (modal-client PR #2797)
    "L4": 23034,  # "L4: 23034MiB" (modal-client PR #2797)
    "A100-40GB": 40960,  # "598MiB / 40960MiB", A100-SXM4-40GB (bottlerocket-core-kit PR #834)
    "A100-80GB": 81920,  # "A100 80GB: 81920MiB" (modal-client PR #2797)
    "H100": 81559,  # "0MiB / 81559MiB", H100 80GB HBM3 (nccl#1264); modal-client PR #2797
    "V100": 32768,  # "Tesla PG500-216, 32768 MiB", a V100 PCIe 32 GB (provider-configs PR #90)
    "TITAN-RTX": 24219,  # "24,219MiB" from nvidia-smi (lambda-tensorflow-benchmark PR #11)
    # "2631MiB / 16160MiB", Tesla V100-SXM2 "with 16GB" (transformers' docs, "Model training
    # anatomy", driver 460.91.03)
    "V100-SXM2-16GB": 16160,
    "P4": 7680,  # "The cluster's Tesla P4 reports 7680 MiB" (a public repository's plan, index
    #              file id 62791967842): 8,192 x 15/16, ECC on GDDR5 as on the T4
    # No published nvidia-smi table found; derived, and said so in docs/gpu-memory-sources.md:
    "P100": 16384,  # HBM2 keeps its ECC outside the 16 GiB: the whole 16 GiB, as the A100's 40960
    "A100-PCIe-40GB": 40960,  # the same 40 GiB of HBM2 as the SXM4 board's 40960
    "A100-PCIe-80GB": 81920,  # the same 80 GiB of HBM2e as the SXM4 board's 81920
    "H100-PCIe": 81920,  # 80 GiB of HBM2e, as the A100 80GB's 81920 (the SXM5's HBM3 says 81559)
}


def nvml_total_memory(spec: GpuSpec) -> int:
    """The bytes NVML (and nvidia-smi) report as the board's total memory."""
    try:
        return NVML_TOTAL_MIB[spec.name] * 1024 * 1024
    except KeyError:
        raise KeyError(f"no NVML total for {spec.name!r}: add it to "
                       "devlab/engine/gpu_model/capacity.py with its source") from None


# The CUDA context with lazy module loading (torch's default since CUDA 11.7): pytorch/pytorch
# PR #86509 measured total - free = 287,047,680 bytes after one 6.4 MB tensor, which the
# caching allocator serves from a 20 MiB segment; the context is the rest. Published figures
# for other GPUs run from 256 MiB (an RTX 3090) to "around 400MB" (pytorch/pytorch#109888), and
# the context grows with the number of SMs; no per-GPU figure for the GPUs modeled here is
# published, so one figure serves them all.
CONTEXT_BYTES = 287_047_680 - 20 * 1024 * 1024


def total_memory(spec: GpuSpec) -> int:
    """The bytes torch reports as the GPU's total memory."""
    try:
        return TOTAL_MEMORY[spec.name]
    except KeyError:
        raise KeyError(f"no published capacity for {spec.name!r}: add it to "
                       "devlab/engine/gpu_model/capacity.py with its source") from None


def context_bytes(spec: GpuSpec) -> int:
    """The device memory the CUDA context holds in a process, before its first tensor."""
    del spec  # one published figure for every GPU (above)
    return CONTEXT_BYTES


# cuBLAS's workspace, which torch allocates through the caching allocator at a GPU's first
# matrix product (per handle and stream) and keeps: CUBLAS_WORKSPACE_CONFIG's default
# ":4096:2:16:8" (2 x 4096 + 8 x 16 KiB), and ":4096:8" (32 MiB) on Hopper (compute capability
# 9.0), as torch's own test_cublas_workspace_explicit_allocation asserts (test/test_cuda.py),
# and on Blackwell (10.x, 12.x): aten/src/ATen/cuda/CublasHandlePool.cpp's
# parseChosenWorkspaceSize, "32MiB for Hopper and Blackwell" (`properties->major == 9 ||
# properties->major == 10 || properties->major == 12`). cuBLASLt shares it by default
# (TORCH_CUBLASLT_UNIFIED_WORKSPACE).
_WORKSPACE_DEFAULT = 4096 * 2 * 1024 + 16 * 8 * 1024
_WORKSPACE_HOPPER = 4096 * 8 * 1024
_WORKSPACE_32MIB_MAJORS = frozenset({"9", "10", "12"})
_WORKSPACE_PAIR = re.compile(r":([0-9]+):([0-9]+)")


def cublas_workspace_bytes(spec: GpuSpec | None, config: str | None = None) -> int:
    """The bytes of cuBLAS's workspace torch allocates on a GPU (`spec`; None: a GPU with no
    model, taken as pre-Hopper), given CUBLAS_WORKSPACE_CONFIG (`config`, ":SIZE:COUNT" pairs
    in KiB, summed as torch sums them; ":0:0" for none)."""
    if config:
        pairs = _WORKSPACE_PAIR.findall(config)
        if pairs:
            return sum(int(size) * int(count) for size, count in pairs) * 1024
    if spec is not None and spec.compute_capability.split(".")[0] in _WORKSPACE_32MIB_MAJORS:
        return _WORKSPACE_HOPPER
    return _WORKSPACE_DEFAULT


# NCCL's buffers, device memory a communicator allocates with cudaMalloc (or cuMem), outside
# torch's caching allocator: memory_allocated() never shows them, mem_get_info() and NVML do.
# NCCL's src/init.cc: per connection, one FIFO per protocol, DEFAULT_BUFFSIZE (Simple) 1 << 22,
# DEFAULT_LL_BUFFSIZE = NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS (512) x NCCL_STEPS
# (8) x sizeof(ncclLLFifoLine) (16), DEFAULT_LL128_BUFFSIZE = NCCL_LL128_ELEMS_PER_THREAD (120)
# x NCCL_LL128_MAX_NTHREADS (640) x NCCL_STEPS x sizeof(uint64_t); NCCL_BUFFSIZE,
# NCCL_LL_BUFFSIZE and NCCL_LL128_BUFFSIZE replace them. "Each channel has its own buffer for
# collective operations" (nccl#1450), and a ring "only has 2 connections regardless of the
# scale" (nccl#986): one connection's buffers per channel land on each GPU.
NCCL_SIMPLE_BUFFSIZE = 1 << 22
NCCL_LL_BUFFSIZE = 8 * 512 * 8 * 16
NCCL_LL128_BUFFSIZE = 120 * 640 * 8 * 8
# Channels: NCCL's topology search picks them (memory "linearly tied to the number of channels",
# nccl#986); the figures below are modeled, not read from a published log: 2 on PCIe (the ring
# twice, NCCL's usual count there), 16 over NVLink/NVSwitch, capped by NCCL_MAX_NCHANNELS (or
# the older NCCL_MAX_NRINGS) and raised by NCCL_MIN_NCHANNELS.
NCCL_CHANNELS = {"PCI": 2, "NVLink": 16}


def nccl_buffer_bytes(ranks: int, hw: str, env: dict[str, str] | None = None) -> int:
    """The device memory (bytes) one NCCL communicator of `ranks` ranks allocates on each GPU
    for its ring's connections (set up at the first collective: NCCL_RUNTIME_CONNECT), over a
    link of kind `hw` ("PCI" or "NVLink"); `env` the NCCL_* variables that change it."""
    if ranks < 2:
        return 0  # no peer, no connection
    env = env or {}
    channels = NCCL_CHANNELS[hw]
    cap = env.get("NCCL_MAX_NCHANNELS") or env.get("NCCL_MAX_NRINGS")
    if cap:
        channels = min(channels, _positive(cap, "NCCL_MAX_NCHANNELS"))
    floor = env.get("NCCL_MIN_NCHANNELS")
    if floor:
        channels = max(channels, _positive(floor, "NCCL_MIN_NCHANNELS"))
    per_connection = sum(
        _positive(env[name], name) if env.get(name) else default
        for name, default in (("NCCL_BUFFSIZE", NCCL_SIMPLE_BUFFSIZE),
                              ("NCCL_LL_BUFFSIZE", NCCL_LL_BUFFSIZE),
                              ("NCCL_LL128_BUFFSIZE", NCCL_LL128_BUFFSIZE)))
    return channels * per_connection


def _positive(value: str, name: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n <= 0:
        raise ValueError(f"{name}={value!r}: expected a positive whole number")
    return n
