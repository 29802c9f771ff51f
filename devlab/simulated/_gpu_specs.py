"""Public specifications of the real GPUs a simulated GPU can be modeled on.

Every number here is taken from a public document named in docs/gpu-models.md, which also
says which figure was chosen where the vendor gives several (dense, never "with sparsity").
Units: TFLOPS = 10^12 floating-point operations per second; GB = 10^9 bytes; GB/s per
direction for links; microseconds for latencies.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """Public specifications of one GPU (dense peaks, no sparsity), each cited in docs/gpu-models.md."""

    name: str  # "T4", "L4", "A100", "H100"
    full_name: str  # e.g. "NVIDIA A100 SXM4 80 GB"
    fp32_tflops: float  # FP32 on CUDA cores (non-tensor)
    tf32_tflops: float | None  # TF32 tensor cores, dense (None where there are none)
    fp16_tflops: float  # FP16 tensor cores, FP32 accumulate where the datasheet says, dense
    bf16_tflops: float | None  # BF16 tensor cores, dense (None if unsupported)
    memory_gb: float  # device memory
    memory_bandwidth_gbs: float  # GB/s, peak
    host_link: str  # link to the host
    host_link_gbs: float  # GB/s per direction: half the vendor's two-way figure
    peer_link: str  # link between two GPUs of this kind
    peer_link_gbs: float  # GB/s per direction between two GPUs of this kind
    launch_latency_us: float  # one eager PyTorch op as the host sees it (dispatch + launch)
    sync_latency_us: float  # extra round trip of a host sync (.item(), .cpu(), printing)


# Host-side costs, measured on the host and driver rather than the GPU chip, so one value is
# used for all four GPUs (docs/gpu-models.md, "Launch and sync latencies").
_LAUNCH_US = 4.0  # pytorch/pytorch#82793: "4 us per op on CUDA" (A100, PyTorch 1.12)
# Between Torch-FL#27 (A100: an add synced after each op, 17 us = 4 launch + 1.5 kernel + 11.5)
# and pytorch#119202 (an H100 machine's .item(), 33 us = 4 launch + 29): docs/gpu-models.md.
_SYNC_US = 13.0

SPECS: dict[str, GpuSpec] = {
    # NVIDIA T4 datasheet (t4-tensor-core-datasheet-951643.pdf): 8.1 FP32, 65 FP16/FP32
    # mixed precision, 16 GB GDDR6 at 300 GB/s, x16 PCIe Gen3 (32 GB/s both ways). Turing has
    # no TF32 and no BF16 tensor cores; there is no NVLink, two T4s talk over PCIe.
    "T4": GpuSpec(
        name="T4",
        full_name="NVIDIA T4 (16 GB, PCIe)",
        fp32_tflops=8.1,
        tf32_tflops=None,
        fp16_tflops=65.0,
        bf16_tflops=None,
        memory_gb=16.0,
        memory_bandwidth_gbs=300.0,
        host_link="PCIe Gen3 x16",
        host_link_gbs=16.0,
        peer_link="PCIe Gen3 x16 (no NVLink)",
        peer_link_gbs=16.0,
        launch_latency_us=_LAUNCH_US,
        sync_latency_us=_SYNC_US,
    ),
    # NVIDIA L4 datasheet / product page: 30.3 FP32; TF32 120*, FP16 242*, BF16 242*
    # ("* Shown with sparsity. Specifications are one-half lower without sparsity"), so the
    # dense values are halves; 24 GB at 300 GB/s; PCIe Gen4 x16 64 GB/s (both ways); no NVLink.
    "L4": GpuSpec(
        name="L4",
        full_name="NVIDIA L4 (24 GB, PCIe)",
        fp32_tflops=30.3,
        tf32_tflops=60.0,
        fp16_tflops=121.0,
        bf16_tflops=121.0,
        memory_gb=24.0,
        memory_bandwidth_gbs=300.0,
        host_link="PCIe Gen4 x16",
        host_link_gbs=32.0,
        peer_link="PCIe Gen4 x16 (no NVLink)",
        peer_link_gbs=32.0,
        launch_latency_us=_LAUNCH_US,
        sync_latency_us=_SYNC_US,
    ),
    # NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), "A100 80GB
    # SXM" column: 19.5 FP32; TF32 156, BF16 312, FP16 312 (dense; 312/624/624 with sparsity);
    # 80 GB HBM2e at 2,039 GB/s; NVLink 600 GB/s and PCIe Gen4 64 GB/s, both two-way totals.
    "A100": GpuSpec(
        name="A100",
        full_name="NVIDIA A100 SXM4 80 GB",
        fp32_tflops=19.5,
        tf32_tflops=156.0,
        fp16_tflops=312.0,
        bf16_tflops=312.0,
        memory_gb=80.0,
        memory_bandwidth_gbs=2039.0,
        host_link="PCIe Gen4 x16",
        host_link_gbs=32.0,
        peer_link="NVLink 3 (12 links)",
        peer_link_gbs=300.0,
        launch_latency_us=_LAUNCH_US,
        sync_latency_us=_SYNC_US,
    ),
    # NVIDIA H100 datasheet, "H100 SXM" column: 67 FP32; TF32 989*, BF16 1,979*, FP16 1,979*
    # ("* With sparsity"), so the dense values are halves; 80 GB at 3.35 TB/s; NVLink 900 GB/s
    # and PCIe Gen5 128 GB/s, both two-way totals.
    "H100": GpuSpec(
        name="H100",
        full_name="NVIDIA H100 SXM5 80 GB",
        fp32_tflops=67.0,
        tf32_tflops=494.5,
        fp16_tflops=989.5,
        bf16_tflops=989.5,
        memory_gb=80.0,
        memory_bandwidth_gbs=3350.0,
        host_link="PCIe Gen5 x16",
        host_link_gbs=64.0,
        peer_link="NVLink 4 (18 links)",
        peer_link_gbs=450.0,
        launch_latency_us=_LAUNCH_US,
        sync_latency_us=_SYNC_US,
    ),
}
