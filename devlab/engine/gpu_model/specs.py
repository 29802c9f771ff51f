"""Public specifications of the real GPUs the model knows (datasheet figures, dense peaks).

Every number here is taken from a public document named in docs/gpu-models.md ("Specifications"),
which also says which figure was chosen where the vendor gives several (dense, never "with
sparsity"). Units: TFLOPS = 10^12 floating-point operations per second; GB = 10^9 bytes; GB/s
per direction for links; microseconds for latencies; watts for board power.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GpuSpec:
    """Public specifications of one GPU board (dense peaks, no sparsity), each cited in
    docs/gpu-models.md."""

    name: str  # the model's key: "T4", "A100-40GB", ...
    full_name: str  # e.g. "NVIDIA A100 SXM4 80 GB"
    fp32_tflops: float  # FP32 on CUDA cores (non-tensor)
    tf32_tflops: float | None  # TF32 tensor cores, dense (None where there are none)
    fp16_tflops: float | None  # FP16 (tensor cores where there are), dense (None: not listed)
    bf16_tflops: float | None  # BF16 tensor cores, dense (None if unsupported)
    memory_gb: float  # device memory
    memory_bandwidth_gbs: float  # GB/s, peak
    host_link: str  # link to the host
    host_link_gbs: float  # GB/s per direction: half the vendor's two-way figure
    peer_link: str  # link between two GPUs of this kind
    peer_link_gbs: float  # GB/s per direction between two GPUs of this kind
    launch_latency_us: float  # one eager PyTorch op as the host sees it (dispatch + launch)
    sync_latency_us: float  # extra round trip of a host sync (.item(), .cpu(), printing)
    sms: int  # streaming multiprocessors: the datasheet's CUDA cores / cores per SM
    board_power_w: float  # maximum board power (TDP)
    compute_capability: str  # "7.5" (Turing) ... "9.0" (Hopper): which kernels cuBLAS has
    # Datasheet figures the rule for boards without measured kernels reads (issue 40), each
    # cited in docs/gpu-models.md ("Clocks, process and caches"); set below, per board.
    base_clock_mhz: float = 0.0  # the clock the board sustains at its power limit
    boost_clock_mhz: float = 0.0  # the clock its FP32 peak is counted at
    process_nm: float = 0.0  # the process node's class (TSMC 4N/4NP: 5)
    l2_cache_mb: float = 0.0  # L2 cache, MB as the vendor prints it
    fp32_lanes_per_scheduler: int = 0  # FP32 lanes per warp scheduler: 16 or 32
    tensor_dtypes: tuple[str, ...] = ()  # the dtypes its tensor cores multiply
    pcie_gen: int = 0  # PCIe generation of its host link
    pcie_lanes: int = 16  # PCIe lanes of its host link
    memory_bus_bits: int = 0  # the memory interface's width


# Host-side costs, spent on the host and driver rather than the GPU chip, so one value is used
# for every GPU (docs/gpu-models.md, "Launch and sync latencies").
_LAUNCH_US = 4.0  # pytorch/pytorch#82793: "4 us per op on CUDA" (A100, PyTorch 1.12)
# Between Torch-FL#27 (A100: an add synced after each op, 17 us = 4 launch + 1.5 kernel + 11.5)
# and pytorch#119202 (an H100 machine's .item(), 33 us = 4 launch + 29): docs/gpu-models.md.
_SYNC_US = 13.0
_HOST = {"launch_latency_us": _LAUNCH_US, "sync_latency_us": _SYNC_US}
_GEN3 = {"host_link": "PCIe Gen3 x16", "host_link_gbs": 16.0,
         "peer_link": "PCIe Gen3 x16 (no NVLink)", "peer_link_gbs": 16.0}
_GEN4 = {"host_link": "PCIe Gen4 x16", "host_link_gbs": 32.0,
         "peer_link": "PCIe Gen4 x16 (no NVLink)", "peer_link_gbs": 32.0}
_A100 = {"fp32_tflops": 19.5, "tf32_tflops": 156.0, "fp16_tflops": 312.0, "bf16_tflops": 312.0,
         "sms": 108, "compute_capability": "8.0", "l2_cache_mb": 40.0, "memory_bus_bits": 5120}
# The A100 PCIe cards can be paired by an NVLink bridge; a server's cards usually are not, so
# two of them talk over PCIe Gen4 ([A100-DS], "NVLink Bridge for 2 GPUs").
_A100_PCIE = {**_GEN4, "peer_link": "PCIe Gen4 x16 (an NVLink bridge can join two cards)"}
_A100_SXM = {"host_link": "PCIe Gen4 x16", "host_link_gbs": 32.0,
             "peer_link": "NVLink 3 (12 links)", "peer_link_gbs": 300.0}

# The L2 caches and memory buses (`l2_cache_mb`, `memory_bus_bits`), from NVIDIA's architecture
# whitepapers, chip by chip (docs/gpu-models.md, "What a board says about itself"): TU104 (T4)
# 4 MB, 256-bit GDDR6; TU102 (TITAN RTX) 6 MB, 384-bit; GP104 (P4) 2 MB, 256-bit GDDR5; GP100
# (P100) 4 MB and GV100 (V100) 6 MB, both 4,096-bit HBM2; AD104 (L4) 48 MB, 192-bit; GA100
# (A100) 40 MB and GH100 (H100 SXM5 and PCIe) 50 MB, both 5,120-bit HBM.

# What CUDA's device properties hold by compute capability (the CUDA C++ Programming Guide's
# "Technical Specifications per Compute Capability"): CUDA cores per SM (the datasheets' cores /
# SMs), resident threads per SM, shared memory per SM in KiB (what an SM can give its blocks).
# Every capability here has 64 Ki 32-bit registers per SM, 48 KiB of shared memory per block
# without opting in, and warps of 32.
ARCH: dict[str, dict[str, int]] = {
    "6.0": {"cores_per_sm": 64, "threads_per_sm": 2048, "shared_kib_per_sm": 64},
    "6.1": {"cores_per_sm": 128, "threads_per_sm": 2048, "shared_kib_per_sm": 96},
    "7.0": {"cores_per_sm": 64, "threads_per_sm": 2048, "shared_kib_per_sm": 96},
    "7.5": {"cores_per_sm": 64, "threads_per_sm": 1024, "shared_kib_per_sm": 64},
    "8.0": {"cores_per_sm": 64, "threads_per_sm": 2048, "shared_kib_per_sm": 164},
    "8.9": {"cores_per_sm": 128, "threads_per_sm": 1536, "shared_kib_per_sm": 100},
    "9.0": {"cores_per_sm": 128, "threads_per_sm": 2048, "shared_kib_per_sm": 228},
    # The boards of issue 40: 8.6 as the guide's table gives it; 10.0 (B200) and 12.0 (RTX
    # 5090) as NVIDIA's libcu++ gives them (NVIDIA/cccl, cuda/__device/arch_traits.h: sm_100
    # 228 KiB and 2,048 threads per SM, as sm_90; sm_120 100 KiB and 1,536, as sm_86/sm_89).
    "8.6": {"cores_per_sm": 128, "threads_per_sm": 1536, "shared_kib_per_sm": 100},
    "10.0": {"cores_per_sm": 128, "threads_per_sm": 2048, "shared_kib_per_sm": 228},
    "12.0": {"cores_per_sm": 128, "threads_per_sm": 1536, "shared_kib_per_sm": 100},
}


def boost_clock_mhz(spec: GpuSpec) -> int:
    """The SM clock the FP32 peak is quoted at: peak = 2 FLOPs x CUDA cores x clock, so the
    clock is the peak over both (the T4's 8.1 TFLOPS on 2,560 cores: 1,582 MHz, its datasheet's
    1,590 boost clock within the peak's rounding)."""
    cores = spec.sms * ARCH[spec.compute_capability]["cores_per_sm"]
    return round(spec.fp32_tflops * 1e12 / (2 * cores) / 1e6)


def memory_clock_mhz(spec: GpuSpec) -> int:
    """The memory clock CUDA reports (`memoryClockRate`): peak bandwidth = 2 (double data
    rate) x clock x bus width, so the clock is the datasheet's bandwidth over both (an A100
    40 GB: 1,555 GB/s on 5,120 bits, 1,215 MHz)."""
    if not spec.memory_bus_bits:
        return 0  # a board whose bus width is not in the tables: CUDA's field stays 0
    return round(spec.memory_bandwidth_gbs * 1e9 / (2 * spec.memory_bus_bits / 8) / 1e6)


SPECS: dict[str, GpuSpec] = {
    # NVIDIA T4 datasheet: 8.1 FP32, 65 FP16/FP32 mixed precision, 16 GB GDDR6 at 300 GB/s,
    # x16 PCIe Gen3, 70 W, 2,560 CUDA cores (Turing: 64 per SM). No TF32, no BF16, no NVLink.
    "T4": GpuSpec("T4", "NVIDIA T4 (16 GB, PCIe)", 8.1, None, 65.0, None, 16.0, 300.0, **_GEN3,
                  **_HOST, sms=40, board_power_w=70.0, compute_capability="7.5",
                  l2_cache_mb=4.0, memory_bus_bits=256),
    # NVIDIA Tesla P4 datasheet: 5.5 FP32, 8 GB GDDR5 at 192 GB/s, PCIe Gen3, 75 W, 2,560 CUDA
    # cores (GP104: 128 per SM). No FP16 figure, no tensor cores. In the model for fitting.
    "P4": GpuSpec("P4", "NVIDIA Tesla P4 (8 GB, PCIe)", 5.5, None, None, None, 8.0, 192.0,
                  **_GEN3, **_HOST, sms=20, board_power_w=75.0, compute_capability="6.1",
                  l2_cache_mb=2.0, memory_bus_bits=256),
    # NVIDIA Tesla P100 datasheet, PCIe 16 GB: 9.3 FP32, 18.7 FP16, 16 GB HBM2 at 732 GB/s,
    # PCIe Gen3, 250 W, 3,584 CUDA cores (GP100: 64 per SM). Kaggle's P100.
    "P100": GpuSpec("P100", "NVIDIA Tesla P100 (16 GB, PCIe)", 9.3, None, 18.7, None, 16.0,
                    732.0, **_GEN3, **_HOST, sms=56, board_power_w=250.0,
                    compute_capability="6.0", l2_cache_mb=4.0, memory_bus_bits=4096),
    # NVIDIA V100 datasheet, "V100 PCIe" column: 14 FP32, 112 tensor (FP16), 32 GB HBM2 at
    # 900 GB/s, PCIe Gen3, 250 W, 5,120 CUDA cores (64 per SM). No TF32, no BF16.
    "V100": GpuSpec("V100", "NVIDIA V100 (32 GB, PCIe)", 14.0, None, 112.0, None, 32.0, 900.0,
                    **_GEN3, **_HOST, sms=80, board_power_w=250.0, compute_capability="7.0",
                    l2_cache_mb=6.0, memory_bus_bits=4096),
    # NVIDIA L4 datasheet / product page: 30.3 FP32; TF32 120*, FP16 242*, BF16 242* ("* Shown
    # with sparsity. Specifications are one-half lower without sparsity"), so the dense values
    # are halves; 24 GB at 300 GB/s; PCIe Gen4 x16; 72 W; 7,424 CUDA cores (Ada: 128 per SM).
    "L4": GpuSpec("L4", "NVIDIA L4 (24 GB, PCIe)", 30.3, 60.0, 121.0, 121.0, 24.0, 300.0,
                  **_GEN4, **_HOST, sms=58, board_power_w=72.0, compute_capability="8.9",
                  l2_cache_mb=48.0, memory_bus_bits=192),
    # NVIDIA A100 datasheet: 19.5 FP32; TF32 156, BF16 312, FP16 312 (dense); 6,912 CUDA cores
    # (108 SMs [A100-WP]). The SXM4 boards (400 W, NVLink 600 GB/s both ways): 40 GB at
    # 1,555 GB/s (Google Cloud's A2 machines, behind Colab's A100) and 80 GB at 2,039 GB/s
    # (8-GPU HGX servers). The PCIe cards: 40 GB at 1,555 GB/s, 250 W; 80 GB at 1,935, 300 W.
    "A100-40GB": GpuSpec("A100-40GB", "NVIDIA A100 SXM4 40 GB", **_A100, memory_gb=40.0,
                         memory_bandwidth_gbs=1555.0, **_A100_SXM, **_HOST, board_power_w=400.0),
    "A100-80GB": GpuSpec("A100-80GB", "NVIDIA A100 SXM4 80 GB", **_A100, memory_gb=80.0,
                         memory_bandwidth_gbs=2039.0, **_A100_SXM, **_HOST, board_power_w=400.0),
    "A100-PCIe-40GB": GpuSpec("A100-PCIe-40GB", "NVIDIA A100 PCIe 40 GB", **_A100,
                              memory_gb=40.0, memory_bandwidth_gbs=1555.0, **_A100_PCIE, **_HOST,
                              board_power_w=250.0),
    "A100-PCIe-80GB": GpuSpec("A100-PCIe-80GB", "NVIDIA A100 PCIe 80 GB", **_A100,
                              memory_gb=80.0, memory_bandwidth_gbs=1935.0, **_A100_PCIE, **_HOST,
                              board_power_w=300.0),
    # NVIDIA H100 datasheet, "H100 SXM" column: 67 FP32; TF32 989*, BF16 1,979*, FP16 1,979*
    # ("* With sparsity"), so the dense values are halves; 80 GB at 3.35 TB/s; NVLink 900 GB/s
    # and PCIe Gen5 128 GB/s, both two-way totals; up to 700 W; 132 SMs [H100-WP].
    "H100": GpuSpec("H100", "NVIDIA H100 SXM5 80 GB", 67.0, 494.5, 989.5, 989.5, 80.0, 3350.0,
                    host_link="PCIe Gen5 x16", host_link_gbs=64.0,
                    peer_link="NVLink 4 (18 links)", peer_link_gbs=450.0, **_HOST, sms=132,
                    board_power_w=700.0, compute_capability="9.0", l2_cache_mb=50.0,
                    memory_bus_bits=5120),
    # NVIDIA H100 PCIe (the first H100 datasheet's "H100 PCIe" column; the Hopper whitepaper's
    # comparison table): 51 FP32; TF32 756*, BF16 1,513*, FP16 1,513* ("* With sparsity"), so
    # the dense values are halves; 80 GB HBM2e at 2 TB/s; PCIe Gen5 128 GB/s two-way; NVLink
    # bridges "600GB/s" two-way between two cards (NCCL measures far less: links.py); 350 W
    # maximum; 114 SMs [H100-WP]. Added for the collective model's measurements (issue 28).
    "H100-PCIe": GpuSpec("H100-PCIe", "NVIDIA H100 PCIe 80 GB", 51.0, 378.0, 756.5, 756.5, 80.0,
                         2000.0, host_link="PCIe Gen5 x16", host_link_gbs=64.0,
                         peer_link="PCIe Gen5 x16 (NVLink bridges can join two cards)",
                         peer_link_gbs=64.0, **_HOST, sms=114, board_power_w=350.0,
                         compute_capability="9.0", l2_cache_mb=50.0, memory_bus_bits=5120),
    # NVIDIA TITAN RTX (the full TU102 chip): 16.3 FP32 TFLOPS at the 1,770 MHz boost clock,
    # "130 Tensor TFLOPS" (FP16 inputs; the TITAN, unlike GeForce cards, accumulates in FP32
    # at full rate), 24 GB GDDR6 at 672 GB/s (14 Gbps on 384 bits), PCIe Gen3 x16, 280 W,
    # 4,608 CUDA cores (Turing: 64 per SM, so 72 SMs); NVLink "100 GB/s" both ways: two
    # second-generation links of 25 GB/s per direction between two cards joined by a bridge.
    # Turing has no TF32 and no BF16 hardware. Added for the communication-bound published
    # whole-step measurement (Hugging Face's GPT-2 DDP runs, issue 28).
    "TITAN-RTX": GpuSpec("TITAN-RTX", "NVIDIA TITAN RTX (24 GB, PCIe)", 16.3, None, 130.0,
                         None, 24.0, 672.0, host_link="PCIe Gen3 x16", host_link_gbs=16.0,
                         peer_link="NVLink 2 bridge (2 links) or PCIe Gen3 x16",
                         peer_link_gbs=50.0, **_HOST, sms=72, board_power_w=280.0,
                         compute_capability="7.5", l2_cache_mb=6.0, memory_bus_bits=384),
    # --- the boards learners own and the newer clusters' (issue 40): no measured kernels,
    # their constants are the datasheet rule's (calibration.py). Each figure is cited in
    # docs/gpu-models.md ("The boards added without measured kernels"). GeForce cards run
    # FP16/BF16 products with FP32 accumulation (what torch asks for) at half their FP16-
    # accumulate rate ([Ampere-GA102-WP], [Ada-WP], [Blackwell-WP]); those are the rates here.
    "RTX-3060": GpuSpec("RTX-3060", "NVIDIA GeForce RTX 3060 (12 GB)", 12.74, 12.7, 25.5,
                        25.5, 12.0, 360.0, **_GEN4, **_HOST, sms=28, board_power_w=170.0,
                        compute_capability="8.6"),
    "RTX-3090": GpuSpec("RTX-3090", "NVIDIA GeForce RTX 3090 (24 GB)", 35.6, 35.6, 71.0, 71.0,
                        24.0, 936.0, host_link="PCIe Gen4 x16", host_link_gbs=32.0,
                        peer_link="NVLink 3 bridge (4 links) or PCIe Gen4 x16",
                        peer_link_gbs=56.25, **_HOST, sms=82, board_power_w=350.0,
                        compute_capability="8.6"),
    "RTX-4060": GpuSpec("RTX-4060", "NVIDIA GeForce RTX 4060 (8 GB)", 15.11, 15.1, 30.2, 30.2,
                        8.0, 272.0, host_link="PCIe Gen4 x8", host_link_gbs=16.0,
                        peer_link="PCIe Gen4 x8 (no NVLink)", peer_link_gbs=16.0, **_HOST,
                        sms=24, board_power_w=115.0, compute_capability="8.9"),
    "RTX-4070": GpuSpec("RTX-4070", "NVIDIA GeForce RTX 4070 (12 GB)", 29.15, 29.1, 58.3, 58.3,
                        12.0, 504.0, **_GEN4, **_HOST, sms=46, board_power_w=200.0,
                        compute_capability="8.9"),
    "RTX-4090": GpuSpec("RTX-4090", "NVIDIA GeForce RTX 4090 (24 GB)", 82.58, 82.6, 165.2,
                        165.2, 24.0, 1008.0, **_GEN4, **_HOST, sms=128, board_power_w=450.0,
                        compute_capability="8.9"),
    "RTX-5090": GpuSpec("RTX-5090", "NVIDIA GeForce RTX 5090 (32 GB)", 104.8, 104.8, 209.5,
                        209.5, 32.0, 1792.0, host_link="PCIe Gen5 x16", host_link_gbs=64.0,
                        peer_link="PCIe Gen5 x16 (no NVLink)", peer_link_gbs=64.0, **_HOST,
                        sms=170, board_power_w=575.0, compute_capability="12.0"),
    "A10G": GpuSpec("A10G", "NVIDIA A10G (24 GB, PCIe; AWS G5)", 31.52, 62.5, 125.0, 125.0,
                    24.0, 600.0, **_GEN4, **_HOST, sms=72, board_power_w=300.0,
                    compute_capability="8.6"),
    "L40S": GpuSpec("L40S", "NVIDIA L40S (48 GB, PCIe)", 91.6, 183.0, 366.0, 366.0, 48.0,
                    864.0, **_GEN4, **_HOST, sms=142, board_power_w=350.0,
                    compute_capability="8.9"),
    "V100-SXM2-16GB": GpuSpec("V100-SXM2-16GB", "NVIDIA V100 SXM2 16 GB", 15.7, None, 125.0,
                              None, 16.0, 900.0, host_link="PCIe Gen3 x16", host_link_gbs=16.0,
                              peer_link="NVLink 2 (6 links)", peer_link_gbs=150.0, **_HOST,
                              sms=80, board_power_w=300.0, compute_capability="7.0"),
    "H200": GpuSpec("H200", "NVIDIA H200 SXM 141 GB", 67.0, 494.5, 989.5, 989.5, 141.0, 4800.0,
                    host_link="PCIe Gen5 x16", host_link_gbs=64.0,
                    peer_link="NVLink 4 (18 links)", peer_link_gbs=450.0, **_HOST, sms=132,
                    board_power_w=700.0, compute_capability="9.0"),
    "B200": GpuSpec("B200", "NVIDIA B200 (HGX, 180 GB)", 75.0, 1125.0, 2250.0, 2250.0, 180.0,
                    8000.0, host_link="PCIe Gen5 x16", host_link_gbs=64.0,
                    peer_link="NVLink 5 (18 links)", peer_link_gbs=900.0, **_HOST, sms=148,
                    board_power_w=1000.0, compute_capability="10.0"),
}

# The datasheet figures the rule for boards without rows reads (GpuSpec's last fields), one
# board a line: (base MHz, boost MHz, process nm, L2 MB, FP32 lanes per scheduler, PCIe gen,
# PCIe lanes), from the boards' datasheets, their architectures' whitepapers and the
# TechPowerUp GPU database [TPU] (docs/gpu-models.md, "Clocks, process and caches").
_VOLTA = ("float16",)
_TURING = ("float16", "int8", "int4")
_AMPERE = ("tf32", "float16", "bfloat16", "int8", "int4")
_ADA = (*_AMPERE, "float8_e4m3fn", "float8_e5m2")
_HOPPER = ("tf32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "float64")
_BLACKWELL = (*_HOPPER, "float4_e2m1fn_x2")
# GeForce Blackwell (GB202, compute capability 12.0) has Hopper's and the B200's tensor-core
# dtypes but FP64: its FP64 runs on CUDA cores, 1.64 TFLOPS beside 104.8 FP32 ([TPU]).
_BLACKWELL_GEFORCE = tuple(d for d in _BLACKWELL if d != "float64")
DATASHEET: dict[str, tuple[tuple[float, float, float, float, int, int, int], tuple[str, ...]]] = {
    "T4": ((585, 1590, 12, 4, 16, 3, 16), _TURING),
    "P4": ((886, 1114, 16, 2, 32, 3, 16), ()),
    "P100": ((1190, 1329, 16, 4, 32, 3, 16), ()),
    "V100": ((1230, 1380, 12, 6, 16, 3, 16), _VOLTA),
    "L4": ((795, 2040, 5, 48, 32, 4, 16), _ADA),
    "A100-40GB": ((1095, 1410, 7, 40, 16, 4, 16), (*_AMPERE, "float64")),
    "A100-80GB": ((1275, 1410, 7, 40, 16, 4, 16), (*_AMPERE, "float64")),
    "A100-PCIe-40GB": ((765, 1410, 7, 40, 16, 4, 16), (*_AMPERE, "float64")),
    "A100-PCIe-80GB": ((1065, 1410, 7, 40, 16, 4, 16), (*_AMPERE, "float64")),
    "H100": ((1590, 1980, 5, 50, 32, 5, 16), _HOPPER),
    "H100-PCIe": ((1125, 1755, 5, 50, 32, 5, 16), _HOPPER),
    "TITAN-RTX": ((1350, 1770, 12, 6, 16, 3, 16), _TURING),
    "RTX-3060": ((1320, 1777, 8, 3, 32, 4, 16), _AMPERE),
    "RTX-3090": ((1395, 1695, 8, 6, 32, 4, 16), _AMPERE),
    "RTX-4060": ((1830, 2460, 5, 24, 32, 4, 8), _ADA),
    "RTX-4070": ((1920, 2475, 5, 36, 32, 4, 16), _ADA),
    "RTX-4090": ((2235, 2520, 5, 72, 32, 4, 16), _ADA),
    "RTX-5090": ((2017, 2407, 5, 96, 32, 5, 16), _BLACKWELL_GEFORCE),
    "A10G": ((885, 1710, 8, 6, 32, 4, 16), _AMPERE),
    "L40S": ((1110, 2520, 5, 96, 32, 4, 16), _ADA),
    "V100-SXM2-16GB": ((1312, 1530, 12, 6, 16, 3, 16), _VOLTA),
    # The H200 is the H100 SXM's GH100 chip at the same 700 W: its clocks are taken as the
    # H100 SXM's. The B200's boost clock is what its 75 FP32 TFLOPS on 148 SMs of 128 lanes
    # imply; no base clock is published, so the H100 SXM's ratio (0.80) is taken.
    "H200": ((1590, 1980, 5, 50, 32, 5, 16), _HOPPER),
    "B200": ((1584, 1980, 5, 126.5, 32, 5, 16), _BLACKWELL),
}
for _key, ((_base, _boost, _nm, _l2, _lanes, _gen, _width), _dtypes) in DATASHEET.items():
    SPECS[_key] = replace(SPECS[_key], base_clock_mhz=float(_base), boost_clock_mhz=float(_boost),
                          process_nm=float(_nm), l2_cache_mb=float(_l2),
                          fp32_lanes_per_scheduler=_lanes, tensor_dtypes=_dtypes,
                          pcie_gen=_gen, pcie_lanes=_width)
assert set(DATASHEET) == set(SPECS), "every board needs its datasheet figures"

# The memory buses of the boards of issue 40, from the same datasheets ([TPU] in
# docs/gpu-models.md): GDDR boards by their bus, HBM boards by their stacks (1,024 bits each).
_BUS_BITS = {"RTX-3060": 192, "RTX-3090": 384, "RTX-4060": 128, "RTX-4070": 192, "RTX-4090": 384,
             "RTX-5090": 512, "A10G": 384, "L40S": 384, "V100-SXM2-16GB": 4096, "H200": 6144,
             "B200": 8192}
for _key, _bits in _BUS_BITS.items():
    SPECS[_key] = replace(SPECS[_key], memory_bus_bits=_bits)

# Other names a user may type. "A100" is the SXM4 80 GB board, as it was before the variants
# were told apart (the board of 8-GPU servers, joined by NVLink). A GeForce card is also its
# bare number ("4090"); `gpu()` ignores case, spaces, dashes and the words NVIDIA, GeForce and
# Tesla, so "RTX 4090", "GeForce RTX 4090" and "rtx-4090" are one board.
ALIASES = {"A100": "A100-80GB", "3060": "RTX-3060", "RTX-3060-12GB": "RTX-3060",
           "3090": "RTX-3090", "4060": "RTX-4060", "4070": "RTX-4070", "4090": "RTX-4090",
           "5090": "RTX-5090", "V100-16GB": "V100-SXM2-16GB", "V100-SXM2": "V100-SXM2-16GB",
           "H200-SXM": "H200", "H200-141GB": "H200", "B200-180GB": "B200"}
_NOISE = ("nvidia", "geforce", "tesla", " ", "-", "_")


def _normal(name: str) -> str:
    """A board's name as `gpu()` compares it: lower case, without spaces, dashes, underscores
    and the words NVIDIA, GeForce and Tesla."""
    text = name.strip().lower()
    for word in _NOISE:
        text = text.replace(word, "")
    return text


_BY_NAME = {_normal(key): key for key in SPECS} | {_normal(a): k for a, k in ALIASES.items()}
assert len(_BY_NAME) == len(SPECS) + len(ALIASES), "two names of boards read alike"
_BY_NAME |= {key: key for key in SPECS}  # a key as stored: no normalizing (called per op)


def gpu(name: str | GpuSpec) -> GpuSpec:
    """The GPU called `name` ("A100" is "A100-80GB"; case, spaces, dashes and the words NVIDIA,
    GeForce and Tesla do not matter: "RTX 4090", "4090" and "rtx-4090" are one board)."""
    if isinstance(name, GpuSpec):
        return name
    key = _BY_NAME.get(name) if name in SPECS else _BY_NAME.get(_normal(str(name)))
    if key is not None:
        return SPECS[key]
    raise ValueError(f"no performance model for a GPU named {name!r}; the models are "
                     f"{', '.join(SPECS)} (and {', '.join(f'{a} = {k}' for a, k in ALIASES.items())})")
