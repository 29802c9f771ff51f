"""Public specifications of the real GPUs the model knows (datasheet figures, dense peaks).

Every number here is taken from a public document named in docs/gpu-models.md ("Specifications"),
which also says which figure was chosen where the vendor gives several (dense, never "with
sparsity"). Units: TFLOPS = 10^12 floating-point operations per second; GB = 10^9 bytes; GB/s
per direction for links; microseconds for latencies; watts for board power.
"""

from __future__ import annotations

from dataclasses import dataclass


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
         "sms": 108, "compute_capability": "8.0"}
# The A100 PCIe cards can be paired by an NVLink bridge; a server's cards usually are not, so
# two of them talk over PCIe Gen4 ([A100-DS], "NVLink Bridge for 2 GPUs").
_A100_PCIE = {**_GEN4, "peer_link": "PCIe Gen4 x16 (an NVLink bridge can join two cards)"}
_A100_SXM = {"host_link": "PCIe Gen4 x16", "host_link_gbs": 32.0,
             "peer_link": "NVLink 3 (12 links)", "peer_link_gbs": 300.0}

SPECS: dict[str, GpuSpec] = {
    # NVIDIA T4 datasheet: 8.1 FP32, 65 FP16/FP32 mixed precision, 16 GB GDDR6 at 300 GB/s,
    # x16 PCIe Gen3, 70 W, 2,560 CUDA cores (Turing: 64 per SM). No TF32, no BF16, no NVLink.
    "T4": GpuSpec("T4", "NVIDIA T4 (16 GB, PCIe)", 8.1, None, 65.0, None, 16.0, 300.0, **_GEN3,
                  **_HOST, sms=40, board_power_w=70.0, compute_capability="7.5"),
    # NVIDIA Tesla P4 datasheet: 5.5 FP32, 8 GB GDDR5 at 192 GB/s, PCIe Gen3, 75 W, 2,560 CUDA
    # cores (GP104: 128 per SM). No FP16 figure, no tensor cores. In the model for fitting.
    "P4": GpuSpec("P4", "NVIDIA Tesla P4 (8 GB, PCIe)", 5.5, None, None, None, 8.0, 192.0,
                  **_GEN3, **_HOST, sms=20, board_power_w=75.0, compute_capability="6.1"),
    # NVIDIA Tesla P100 datasheet, PCIe 16 GB: 9.3 FP32, 18.7 FP16, 16 GB HBM2 at 732 GB/s,
    # PCIe Gen3, 250 W, 3,584 CUDA cores (GP100: 64 per SM). Kaggle's P100.
    "P100": GpuSpec("P100", "NVIDIA Tesla P100 (16 GB, PCIe)", 9.3, None, 18.7, None, 16.0,
                    732.0, **_GEN3, **_HOST, sms=56, board_power_w=250.0,
                    compute_capability="6.0"),
    # NVIDIA V100 datasheet, "V100 PCIe" column: 14 FP32, 112 tensor (FP16), 32 GB HBM2 at
    # 900 GB/s, PCIe Gen3, 250 W, 5,120 CUDA cores (64 per SM). No TF32, no BF16.
    "V100": GpuSpec("V100", "NVIDIA V100 (32 GB, PCIe)", 14.0, None, 112.0, None, 32.0, 900.0,
                    **_GEN3, **_HOST, sms=80, board_power_w=250.0, compute_capability="7.0"),
    # NVIDIA L4 datasheet / product page: 30.3 FP32; TF32 120*, FP16 242*, BF16 242* ("* Shown
    # with sparsity. Specifications are one-half lower without sparsity"), so the dense values
    # are halves; 24 GB at 300 GB/s; PCIe Gen4 x16; 72 W; 7,424 CUDA cores (Ada: 128 per SM).
    "L4": GpuSpec("L4", "NVIDIA L4 (24 GB, PCIe)", 30.3, 60.0, 121.0, 121.0, 24.0, 300.0,
                  **_GEN4, **_HOST, sms=58, board_power_w=72.0, compute_capability="8.9"),
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
                    board_power_w=700.0, compute_capability="9.0"),
    # NVIDIA H100 PCIe (the first H100 datasheet's "H100 PCIe" column; the Hopper whitepaper's
    # comparison table): 51 FP32; TF32 756*, BF16 1,513*, FP16 1,513* ("* With sparsity"), so
    # the dense values are halves; 80 GB HBM2e at 2 TB/s; PCIe Gen5 128 GB/s two-way; NVLink
    # bridges "600GB/s" two-way between two cards (NCCL measures far less: links.py); 350 W
    # maximum; 114 SMs [H100-WP]. Added for the collective model's measurements (issue 28).
    "H100-PCIe": GpuSpec("H100-PCIe", "NVIDIA H100 PCIe 80 GB", 51.0, 378.0, 756.5, 756.5, 80.0,
                         2000.0, host_link="PCIe Gen5 x16", host_link_gbs=64.0,
                         peer_link="PCIe Gen5 x16 (NVLink bridges can join two cards)",
                         peer_link_gbs=64.0, **_HOST, sms=114, board_power_w=350.0,
                         compute_capability="9.0"),
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
                         compute_capability="7.5"),
}

# Other names a user may type. "A100" is the SXM4 80 GB board, as it was before the variants
# were told apart (the board of 8-GPU servers, joined by NVLink).
ALIASES = {"A100": "A100-80GB"}


def gpu(name: str | GpuSpec) -> GpuSpec:
    """The GPU called `name` (case does not matter; "A100" is "A100-80GB")."""
    if isinstance(name, GpuSpec):
        return name
    wanted = str(name).strip().lower()
    for key in (*SPECS, *ALIASES):
        if key.lower() == wanted:
            return SPECS[ALIASES.get(key, key)]
    raise ValueError(f"no performance model for a GPU named {name!r}; the models are "
                     f"{', '.join(SPECS)} (and {', '.join(f'{a} = {k}' for a, k in ALIASES.items())})")
