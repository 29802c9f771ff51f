"""The GPU performance model against published measurements (docs/gpu-models.md).

Run: .venv/bin/python benchmarks/gpu_model.py [--markdown]

For each measurement a reader can check (docs/gpu-models.md, "Published measurements"), this
runs the same work through the model's own code (`_roofline.op_time` on meta tensors, queued on
a `_clock.Clock`, timed the way the benchmark timed it) and prints the model's figure beside the
published one, with their ratio (model / published; the target is 0.5 to 2). Nothing runs on a
GPU: every model figure is modeled from specifications, not measured.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devlab.simulated._clock import Clock  # noqa: E402
from devlab.simulated._gpu_specs import SPECS, GpuSpec  # noqa: E402
from devlab.simulated._roofline import op_time  # noqa: E402

aten = torch.ops.aten
DTYPES = {"FP32": torch.float32, "TF32": torch.float32, "FP16": torch.float16,
          "BF16": torch.bfloat16}


def _tf32(on: bool) -> Callable[[], None]:
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    return lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", before)


def matmul_seconds(spec: GpuSpec, m: int, n: int, k: int, dtype: str, calls: int,
                   sync_each: bool) -> float:
    """Seconds per product: `calls` products queued back to back (a sync after each, or one
    at the end), as the benchmark timed them."""
    restore = _tf32(dtype == "TF32")
    try:
        a = torch.empty(m, k, device="meta", dtype=DTYPES[dtype])
        b = torch.empty(k, n, device="meta", dtype=DTYPES[dtype])
        out = torch.empty(m, n, device="meta", dtype=DTYPES[dtype])
        cost = op_time(spec, 0, aten.mm.default, (a, b), {}, out)
    finally:
        restore()
    clock = Clock(spec, 1)
    for _ in range(calls):
        clock.kernel(cost)
        if sync_each:
            clock.sync(0)
    clock.sync(0)
    return clock.now() / calls


def tflops(spec: GpuSpec, sizes: list[tuple[int, int, int]], dtype: str, calls: int,
           sync_each: bool) -> float:
    """The best TFLOPS over the sizes tried."""
    return max(2 * m * n * k / matmul_seconds(spec, m, n, k, dtype, calls, sync_each) / 1e12
               for m, n, k in sizes)


def square(*ns: int) -> list[tuple[int, int, int]]:
    return [(n, n, n) for n in ns]


def device_copy_gbs(spec: GpuSpec, nbytes: int) -> float:
    """bandwidthTest's device-to-device figure: 2 x bytes (read + write) over the time."""
    clock = Clock(spec, 1)
    clock.copy(0, 0, nbytes, blocking=False)
    clock.sync(0)
    return 2 * nbytes / (clock.now() - spec.sync_latency_us * 1e-6) / 1e9


def scale_gbs(spec: GpuSpec, numel: int, calls: int = 100) -> float:
    """`a * 1.2` on float32 vectors, queued, counted as [mli] counts it: 8 bytes per element."""
    x = torch.empty(numel, device="meta")
    cost = op_time(spec, 0, aten.mul.Scalar, (x, 1.2), {}, x)
    clock = Clock(spec, 1)
    for _ in range(calls):
        clock.kernel(cost)
    clock.sync(0)
    return 8 * numel * calls / (clock.now() - spec.sync_latency_us * 1e-6) / 1e9


def elementwise_seconds(spec: GpuSpec, numel: int, calls: int = 100) -> float:
    """Seconds per `a + b` on float32 vectors of `numel`, queued back to back."""
    x = torch.empty(numel, device="meta")
    cost = op_time(spec, 0, aten.add.Tensor, (x, x), {}, x)
    clock = Clock(spec, 1)
    for _ in range(calls):
        clock.kernel(cost)
    clock.sync(0)
    return (clock.now() - spec.sync_latency_us * 1e-6) / calls


def host_copy_gbs(spec: GpuSpec, nbytes: int, to_gpu: bool) -> float:
    clock = Clock(spec, 1)
    if to_gpu:
        clock.copy(None, 0, nbytes, blocking=True)
        seconds = clock.now()
    else:
        clock.copy(0, None, nbytes, blocking=True)
        seconds = clock.now() - spec.sync_latency_us * 1e-6  # bandwidthTest times the copy
    return nbytes / seconds / 1e9


def peer_copy_gbs(spec: GpuSpec, nbytes: int) -> float:
    clock = Clock(spec, 2)
    clock.copy(0, 1, nbytes, blocking=False)
    return nbytes / (clock.free[1] - spec.launch_latency_us * 1e-6) / 1e9


def small_add_us(spec: GpuSpec, n: int, synced: bool, calls: int = 100) -> float:
    x = torch.empty(n, n, device="meta")
    cost = op_time(spec, 0, aten.add.Tensor, (x, x), {}, x)
    clock = Clock(spec, 1)
    for _ in range(calls):
        clock.kernel(cost)
        if synced:
            clock.sync(0)
    if not synced:
        return clock.now() / calls * 1e6  # the host's cost per op, queued
    return clock.now() / calls * 1e6


def item_us(spec: GpuSpec) -> float:
    clock = Clock(spec, 1)
    clock.copy(0, None, 4, blocking=True)
    return clock.now() * 1e6


@dataclass
class Row:
    section: str
    gpu: str
    what: str
    published: float
    unit: str
    model: float

    @property
    def ratio(self) -> float:
        return self.model / self.published


def rows() -> list[Row]:
    t4, a100, h100 = SPECS["T4"], SPECS["A100"], SPECS["H100"]
    zzc = [1024, 2048, 4096, 8192, 10240]
    chs = [256, 512, 1024, 2048, 4096, 6888]
    out: list[Row] = []

    def mm(gpu: str, what: str, published: float, spec: GpuSpec, sizes: list, dtype: str,
           calls: int = 30, sync_each: bool = False) -> None:
        out.append(Row("matmul", gpu, what, published, "TFLOPS",
                       tflops(spec, sizes, dtype, calls, sync_each)))

    mm("T4", "torch.mm, best of n = 1024…10240, FP32 [zzc-db]", 4.17, t4, square(*zzc), "FP32")
    mm("T4", "same, FP16 [zzc-db]", 41.91, t4, square(*zzc), "FP16")
    mm("T4", "same, BF16: no BF16 hardware [zzc-db]", 2.46, t4, square(*zzc), "BF16")
    mm("T4", "torch.matmul, best of n = 256…6888, FP32 [chsasank]", 4.0, t4, square(*chs), "FP32",
       calls=1, sync_each=True)
    mm("A100", "torch.mm, best of n = 1024…10240, FP32 [zzc-db]", 19.18, a100, square(*zzc), "FP32")
    mm("A100", "same, FP16 [zzc-db]", 258.74, a100, square(*zzc), "FP16")
    mm("A100", "same, BF16 [zzc-db]", 264.53, a100, square(*zzc), "BF16")
    mm("A100", "torch.mm BF16, 1024×10240×5120 [MAMF]", 271.2, a100, [(1024, 10240, 5120)],
       "BF16", calls=100)
    for n, fp32, fp16 in ((1024, 8.99, 83.66), (2048, 9.69, 214.73), (4096, 15.52, 241.49),
                          (8192, 17.56, 197.51)):
        mm("A100 PCIe 40GB", f"torch.mm n = {n}, FP32 [zzc#108]", fp32, a100, square(n), "FP32")
        mm("A100 PCIe 40GB", f"torch.mm n = {n}, FP16 [zzc#108]", fp16, a100, square(n), "FP16")
    mm("A100 PCIe 40GB", "torch.mm n = 1024, TF32 [zzc#108]", 61.02, a100, square(1024), "TF32")
    mm("A100 PCIe 40GB", "torch.mm n = 4096, TF32 [zzc#108]", 108.32, a100, square(4096), "TF32")
    mm("A100 80GB", "matmul, best of n = 128…8192, TF32 on [mli]", 116.0, a100,
       square(128, 512, 2048, 8192), "TF32")
    mm("A100 80GB", "same, FP16 [mli]", 230.0, a100, square(128, 512, 2048, 8192), "FP16")
    mm("H100", "torch.mm BF16, 2048×2048×13312 [MAMF]", 794.5, h100, [(2048, 2048, 13312)],
       "BF16", calls=100)
    for n, fp32, tf32, fp16 in ((1024, 37.39, 119.60, 179.13), (2048, 49.58, 334.99, 645.12),
                                (4096, 51.88, 402.15, 760.04), (8192, 51.81, 372.05, 736.19)):
        mm("H100", f"torch.mm n = {n}, FP32 [zzc#79]", fp32, h100, square(n), "FP32")
        mm("H100", f"torch.mm n = {n}, TF32 [zzc#79]", tf32, h100, square(n), "TF32")
        mm("H100", f"torch.mm n = {n}, FP16 [zzc#79]", fp16, h100, square(n), "FP16")

    def mem(gpu: str, what: str, published: float, model: float) -> None:
        out.append(Row("memory", gpu, what, published, "GB/s", model))

    mem("T4", "global memory microbenchmark [Jia19]", 236.0, t4.memory_bandwidth_gbs)
    mem("T4", "bandwidthTest device to device, 32 MB [cuda-demo]", 239.6,
        device_copy_gbs(t4, 32_000_000))
    mem("T4", "a.copy_(b), best of 4…380 MB [chsasank]", 240.0, device_copy_gbs(t4, 380_000_000))
    mem("A100 SXM4 40GB", "bandwidthTest device to device, 32 MB [cuda-demo]", 1157.5,
        device_copy_gbs(a100, 32_000_000))
    mem("A100", "bandwidthTest device to device, 100 MB [della]", 1268.0,
        device_copy_gbs(a100, 100_000_000))
    mem("A100 40GB", "measured memory copy [PTsolvers#7]", 1355.0,
        device_copy_gbs(a100, 1_000_000_000))
    mem("A100 80GB PCIe", "a.copy_(b), best of 4…380 MB [chsasank]", 1490.0,
        device_copy_gbs(a100, 380_000_000))
    mem("A100 80GB", "a * 1.2, 4 Mi float32, 8 bytes per element [mli]", 1616.0,
        scale_gbs(a100, 4 * 2**20))
    out.append(Row("memory", "A100", "add of two 4096×4096, queued [Torch-FL#27]", 149.0, "µs",
                   elementwise_seconds(a100, 4096 * 4096) * 1e6))

    def link(section: str, gpu: str, what: str, published: float, model: float) -> None:
        out.append(Row(section, gpu, what, published, "GB/s", model))

    link("host", "T4", "host → device, pinned, 32 MB [cuda-demo]", 9.7,
         host_copy_gbs(t4, 32_000_000, True))
    link("host", "T4", "device → host, pinned, 32 MB [cuda-demo]", 11.1,
         host_copy_gbs(t4, 32_000_000, False))
    link("host", "A100 SXM4 40GB", "host → device, pinned, 32 MB [cuda-demo]", 12.3,
         host_copy_gbs(a100, 32_000_000, True))
    for size, gbs in ((1_000_000, 18.0), (10_000_000, 19.4), (100_000_000, 24.1),
                      (1_000_000_000, 25.8)):
        link("host", "A100", f"host → device, pinned, {size // 1_000_000} MB [della]", gbs,
             host_copy_gbs(a100, size, True))
    link("host", "A100 SXM4 40GB", "host → device, nvbandwidth, 512 MiB [nvbandwidth#42]", 25.13,
         host_copy_gbs(a100, 512 * 2**20, True))
    link("host", "H100", "host → device, nvbandwidth [nvbandwidth#6]", 57.06,
         host_copy_gbs(h100, 512 * 2**20, True))
    link("host", "H100", "host → device, nvbandwidth SM copy [nvbandwidth#24]", 35.2,
         host_copy_gbs(h100, 512 * 2**20, True))
    link("peer", "H100", "GPU → GPU, one direction, P2P [nccl#1264]", 374.0,
         peer_copy_gbs(h100, 256 * 2**20))
    link("peer", "A100 (4 NVLinks)", "GPU → GPU, osu_bw, 32 MiB [EESSI#716]", 93.13,
         peer_copy_gbs(a100, 32 * 2**20))

    def lat(gpu: str, what: str, published: float, model: float) -> None:
        out.append(Row("latency", gpu, what, published, "µs", model))

    lat("A100", "eager overhead per op on CUDA [pytorch#82793]", 4.0,
        small_add_us(a100, 8, synced=False))
    lat("A100", "add of two 512×512, queued [Torch-FL#27]", 8.0,
        small_add_us(a100, 512, synced=False))
    lat("A100", "add of two 512×512, synced after each [Torch-FL#27]", 17.0,
        small_add_us(a100, 512, synced=True))
    lat("H100 machine", ".item(), 50,000 calls [pytorch#119202]", 33.0, item_us(h100))
    return out


def within(ratio: float) -> bool:
    """The target: the model within a factor of 2 of the measurement, either way (ratios are
    rounded to the two decimals the table shows)."""
    return 0.5 <= round(ratio, 2) <= 2.0


def markdown(table: list[Row]) -> str:
    """The table docs/gpu-models.md shows (between its `model-table` markers)."""
    lines = ["| GPU | measured | published | model | model / published |",
             "|---|---|---|---|---|"]
    for r in table:
        mark = "" if within(r.ratio) else " **outside 2x**"
        lines.append(f"| {r.gpu} | {r.what} | {r.published:.4g} {r.unit} | {r.model:.4g} {r.unit} "
                     f"| {r.ratio:.2f}{mark} |")
    return "\n".join(lines)


def main() -> None:
    table = rows()
    if "--markdown" in sys.argv:
        print(markdown(table))
        return
    print("model / published; the target is 0.5 to 2 (modeled from specifications, not measured)")
    print(f"{'GPU':18s} {'measurement':58s} {'published':>10s} {'model':>10s} {'ratio':>6s}")
    for r in table:
        flag = "" if within(r.ratio) else "  <- outside 2x"
        print(f"{r.gpu:18s} {r.what:58s} {r.published:>10.4g} {r.model:>10.4g} "
              f"{r.ratio:>6.2f} {r.unit}{flag}")
    outside = sum(not within(r.ratio) for r in table)
    print(f"{outside} of {len(table)} rows outside 2x")


if __name__ == "__main__":
    main()
