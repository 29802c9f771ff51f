"""What one kernel costs on a GPU: the per-op-family rules.

A kernel's time on the GPU is a fixed per-kernel floor plus the longer of its compute and its
memory traffic (a roofline), where both use what GPUs achieve rather than their datasheet
peaks (`calibration`):

- **Matrix products** (mm, addmm, bmm, linear, matmul, convolutions as implicit GEMMs) are cut
  into output tiles, one per thread block; the GPU runs `sms x tiles_per_sm` of them at once,
  so a product runs in whole *waves*, and a last wave that is partly full costs a full one.
  Each tile costs its multiply-adds plus a fixed prologue and epilogue (`PROLOGUE_K`) at the
  achieved rate of one SM.
- **Memory-bound ops** (element-wise, reductions, softmax, layer norm, embedding lookups,
  copies) cost their bytes at the achieved bandwidth of their kind of kernel. With the floor,
  the bandwidth a small op achieves is far below the peak: the bandwidth curve over size.

Two ways of timing one op, both modeled: `Kernel.seconds` is the GPU's time when ops run back
to back in a queue (what a modeled clock charges; the host pays its launch latency beside it);
`Kernel.alone` is what one op shows timed alone with CUDA events on an idle GPU, where the
host's own work before the launch is on the clock too (a floor of about 12 to 24 µs on the
GPUs measured).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import ceil

from devlab.engine.gpu_model.calibration import (
    CALIBRATION,
    KERNEL_FLOOR_US,
    LARGE_OPERAND_EXPONENT,
    PROLOGUE_K,
    Calibration,
    GemmFit,
)
from devlab.engine.gpu_model.specs import SPECS, GpuSpec

GEMM, ELEMENTWISE, REDUCTION, SOFTMAX, LAYER_NORM, EMBEDDING, COPY = (
    "matrix product", "element-wise", "reduction", "softmax", "layer norm", "embedding", "copy")
LAUNCH, COMPUTE, MEMORY = "launch-bound", "compute-bound", "memory-bound"
QUEUED = ("queued back to back: each op costs the host its launch latency and the GPU its "
          "kernel time; one op timed alone with CUDA events on an idle GPU shows more (its "
          "floor of about 12 to 24 µs)")
ALONE = "one op timed alone with CUDA events on an idle GPU (the floor included)"


def kernel_seconds(floor: float, compute: float, memory: float) -> float:
    """A kernel's time on its GPU: its fixed floor, then its arithmetic and its memory traffic,
    which overlap, so only the longer of the two counts. The one statement of it: `Kernel`, the
    simulation's `OpTime` and its modeled clock all use this."""
    return floor + (compute if compute > memory else memory)


@dataclass(frozen=True, slots=True)
class Kernel:
    """One kernel's modeled time on one GPU, in seconds, and the terms behind it."""

    family: str
    compute: float  # the arithmetic at the achieved rate, in whole waves of tiles
    memory: float  # the bytes at the achieved bandwidth of this kind of kernel
    floor: float  # the GPU-side fixed cost of any kernel
    alone_floor: float  # what a tiny kernel shows timed alone with CUDA events
    flops: int
    nbytes: int
    achieved_tflops: float | None  # the achieved rate used (matrix products)
    achieved_gbs: float  # the achieved bandwidth of this kind of kernel, large sizes
    tiles: int = 0  # output tiles (thread blocks) of a matrix product
    slots: int = 0  # tiles the GPU runs at once (SMs x tiles per SM)
    waves: int = 0  # ceil(tiles / slots)

    @property
    def work(self) -> float:
        """The longer of compute and memory traffic."""
        return kernel_seconds(0.0, self.compute, self.memory)

    @property
    def seconds(self) -> float:
        """The GPU's time for it when ops run back to back: floor + work."""
        return kernel_seconds(self.floor, self.compute, self.memory)

    @property
    def alone(self) -> float:
        """What one such op shows timed alone with CUDA events: its floor + work."""
        return kernel_seconds(self.alone_floor, self.compute, self.memory)

    @property
    def bound(self) -> str:
        return COMPUTE if self.compute >= self.memory and self.compute else MEMORY

    @property
    def bandwidth_gbs(self) -> float:
        """The bandwidth this op achieves at its size (bytes over floor + time): the curve."""
        return self.nbytes / self.seconds / 1e9 if self.nbytes else 0.0

    @property
    def last_wave(self) -> float:
        """How full the last wave of tiles is (1.0: full; 0 when not a matrix product)."""
        if not self.waves:
            return 0.0
        return (self.tiles - (self.waves - 1) * self.slots) / self.slots


# Tensor-core products run in larger tiles than FP32 ones: CUTLASS's and cuBLAS's large
# Ampere/Hopper kernels use 256 x 128 thread-block tiles, one per SM.
TENSOR_CORE_TILE = (256, 128, 1)
_TENSOR_CORE = {"tf32": "tf32_tflops", "float16": "fp16_tflops", "bfloat16": "bf16_tflops"}


def peak_tflops(spec: GpuSpec, dtype: str) -> float:
    """The datasheet rate of matrix arithmetic in `dtype` ("float32", "tf32", "float16",
    "bfloat16"; any other is taken at the FP32 rate)."""
    value = {"tf32": spec.tf32_tflops, "float16": spec.fp16_tflops,
             "bfloat16": spec.bf16_tflops}.get(dtype)
    return value or spec.fp32_tflops


def achieved_tflops(spec: GpuSpec, cal: Calibration, fit: GemmFit, dtype: str) -> float:
    """The achieved rate of a matrix product in `dtype`: FP32 as fitted; other dtypes as
    published measurements of torch.mm found (scaled by this kind of product's FP32 fit
    relative to mm's), else the FP32 fraction of the datasheet peak."""
    if dtype not in ("tf32", "float16", "bfloat16"):
        return fit.fp32 * spec.fp32_tflops
    cited = cal.tflops.get(dtype)
    if cited is not None:
        return cited * fit.fp32 / cal.mm.fp32
    return fit.fp32 * peak_tflops(spec, dtype)


def gemm(spec: GpuSpec, batch: int, m: int, n: int, k: int, dtype: str, itemsize: int,
         batched: bool = False, extra_bytes: int = 0, cal: Calibration | None = None) -> Kernel:
    """`batch` products of (m x k) by (k x n): tiles over the SMs in waves, each tile's
    multiply-adds at the achieved rate, or the operands' bytes if those take longer.
    `cal`: other constants than the GPU's stored ones (for fitting)."""
    if cal is None and SPECS.get(spec.name) is spec:  # the same shapes come back every step
        return _stored_gemm(spec.name, batch, m, n, k, dtype, itemsize, batched, extra_bytes)
    return _gemm(spec, batch, m, n, k, dtype, itemsize, batched, extra_bytes,
                 cal or CALIBRATION[spec.name])


@lru_cache(maxsize=8192)
def _stored_gemm(name: str, batch: int, m: int, n: int, k: int, dtype: str, itemsize: int,
                 batched: bool, extra_bytes: int) -> Kernel:
    # Keyed by the GPU's name: hashing a whole GpuSpec would cost more than the lookup saves.
    return _gemm(SPECS[name], batch, m, n, k, dtype, itemsize, batched, extra_bytes,
                 CALIBRATION[name])


def _gemm(spec: GpuSpec, batch: int, m: int, n: int, k: int, dtype: str, itemsize: int,
          batched: bool, extra_bytes: int, cal: Calibration) -> Kernel:
    fit = cal.bmm if batched else cal.mm
    rate = achieved_tflops(spec, cal, fit, dtype) * 1e12
    tm, tn, per_sm = fit.tile
    if dtype in _TENSOR_CORE and getattr(spec, _TENSOR_CORE[dtype]):
        tm, tn, per_sm = TENSOR_CORE_TILE
    # A kernel never computes more rows or columns than the product has (to a multiple of 32):
    # for small ones, cuBLAS picks smaller tiles.
    tm, tn = min(tm, -(-m // 32) * 32), min(tn, -(-n // 32) * 32)
    tiles = batch * ceil(m / tm) * ceil(n / tn) if m and n else 0
    slots = spec.sms * per_sm
    waves = -(-tiles // slots)
    per_step = 2 * (k + PROLOGUE_K) / (rate / spec.sms)  # seconds per output of a tile, one SM
    compute = waves * per_sm * tm * tn * per_step if k else 0.0
    if 0 < tiles < slots and k:
        # Less than a wave: cuBLAS spreads a small product over more SMs with smaller tiles,
        # each doing fewer multiply-adds per byte it loads (efficiency ~ rows x cols / (rows +
        # cols), relative to the usual tile).
        usual = tm * tn / (tm + tn)
        rows, cols = tm, tn
        while True:
            count = batch * ceil(m / rows) * ceil(n / cols)
            efficiency = min(1.0, rows * cols / (rows + cols) / usual)
            time = -(-count // spec.sms) * rows * cols * per_step / efficiency
            if time < compute:
                compute, tiles, slots, waves = time, count, spec.sms, -(-count // spec.sms)
            if rows <= 16 and cols <= 16:
                break
            if rows >= cols:
                rows //= 2
            else:
                cols //= 2
    if cal.large_operand is not None:
        # Pascal: a product with an operand beyond a size runs slower, up to a limit.
        size, slowest = cal.large_operand
        operand = max(m * k, k * n) * itemsize
        if operand > size * 1e9:
            compute *= min(slowest, (operand / (size * 1e9)) ** LARGE_OPERAND_EXPONENT)
    nbytes = batch * (m * k + k * n + m * n) * itemsize + extra_bytes
    bandwidth = cal.bandwidth * spec.memory_bandwidth_gbs * 1e9
    return Kernel(GEMM, compute, nbytes / bandwidth, KERNEL_FLOOR_US * 1e-6,
                  cal.alone_floor_us * 1e-6, 2 * batch * m * n * k, nbytes, rate / 1e12,
                  bandwidth / 1e9, tiles, slots, waves)


def memory_bound(spec: GpuSpec, family: str, nbytes: int,
                 cal: Calibration | None = None) -> Kernel:
    """A kernel that moves `nbytes` (read + written) at the achieved bandwidth of its kind."""
    if cal is None and SPECS.get(spec.name) is spec:
        return _stored_memory_bound(spec.name, family, nbytes)
    return _memory_bound(spec, family, nbytes, cal or CALIBRATION[spec.name])


@lru_cache(maxsize=8192)
def _stored_memory_bound(name: str, family: str, nbytes: int) -> Kernel:
    return _memory_bound(SPECS[name], family, nbytes, CALIBRATION[name])


def _memory_bound(spec: GpuSpec, family: str, nbytes: int, cal: Calibration) -> Kernel:
    fraction = (cal.softmax if family == SOFTMAX else
                cal.layer_norm if family == LAYER_NORM else cal.bandwidth)
    bandwidth = fraction * spec.memory_bandwidth_gbs * 1e9
    return Kernel(family, 0.0, nbytes / bandwidth, KERNEL_FLOOR_US * 1e-6,
                  cal.alone_floor_us * 1e-6, 0, nbytes, None, bandwidth / 1e9)
