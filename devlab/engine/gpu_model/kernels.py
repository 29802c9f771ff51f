"""What one kernel costs on a GPU: the per-op-family rules.

A kernel's time on the GPU is a fixed per-kernel floor plus the longer of its compute and its
memory traffic (a roofline), where both use what GPUs achieve rather than their datasheet
peaks (`calibration`):

- **Matrix products** (mm, addmm, bmm, linear, matmul, convolutions as implicit GEMMs) are cut
  into output tiles, one per thread block; the GPU runs `sms x tiles_per_sm` of them at once,
  so a product runs in whole *waves*, and a last wave that is partly full costs a full one.
  Each tile costs its multiply-adds plus a fixed prologue and epilogue (`PROLOGUE_K`) at the
  achieved rate of one SM. Tiles are cut to a small product's shape, unless a board's batched
  fit runs one whole kernel for every shape (`GemmFit.whole`: a narrow product pays for it).
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
from math import ceil, log

from devlab.engine.gpu_model.calibration import (
    CALIBRATION,
    KERNEL_FLOOR_US,
    L2_MISS_RAMP,
    LARGE_OPERAND_EXPONENT,
    PROLOGUE_K,
    REREAD,
    SUSTAIN_WINDOW,
    WARP_SOFTMAX,
    WARP_SOFTMAX_ROW,
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
    clock: float = 1.0  # a slot-powered board's batched product: its rate over the fitted one
    # (above 1 while short, below once sustained: calibration.py, Note [Short products on
    # slot-powered boards])

    @property
    def running_tflops(self) -> float | None:
        """The rate a product runs at here: the achieved rate, times `clock`."""
        return None if self.achieved_tflops is None else self.achieved_tflops * self.clock

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

    def band(self, gpu: GpuSpec | str, fp32: bool = True):  # -> devlab.engine.gpu_model.band.Band
        """Where the model stops for this kernel on `gpu`: how far the model was from measured
        kernels of its kind and size (`devlab.engine.gpu_model.band`), and whether its board, dtype
        (`fp32`: it is in FP32, the measured dtype) or size lies outside what was fitted."""
        from devlab.engine.gpu_model.band import band  # band reads this module's families
        from devlab.engine.gpu_model.specs import gpu as _gpu

        return band(self, _gpu(gpu), fp32)

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
    if not fit.whole:
        tm, tn = min(tm, -(-m // 32) * 32), min(tn, -(-n // 32) * 32)
    tiles = batch * ceil(m / tm) * ceil(n / tn) if m and n else 0
    slots = spec.sms * per_sm
    waves = -(-tiles // slots)
    per_step = 2 * (k + PROLOGUE_K) / (rate / spec.sms)  # seconds per output of a tile, one SM
    compute = waves * per_sm * tm * tn * per_step if k else 0.0
    if 0 < tiles < slots and k and not fit.whole:
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
    clock = 1.0
    if batched and fit.burst != 1.0 and compute > 0:
        # A slot-powered board: short products near its boost clock, sustained ones at what its
        # power holds (calibration.py, See Note [Short products on slot-powered boards]).
        lo, hi = SUSTAIN_WINDOW
        x = min(1.0, max(0.0, log(hi / compute) / log(hi / lo)))
        clock = fit.burst ** (x - 0.5)
        compute /= clock
    nbytes = batch * (m * k + k * n + m * n) * itemsize + extra_bytes
    bandwidth = cal.bandwidth * spec.memory_bandwidth_gbs * 1e9
    return Kernel(GEMM, compute, nbytes / bandwidth, KERNEL_FLOOR_US * 1e-6,
                  cal.alone_floor_us * 1e-6, 2 * batch * m * n * k, nbytes, rate / 1e12,
                  bandwidth / 1e9, tiles, slots, waves, clock)


def memory_bound(spec: GpuSpec, family: str, nbytes: int,
                 cal: Calibration | None = None, row: int = 0, itemsize: int = 4) -> Kernel:
    """A kernel that moves `nbytes` (read + written) at the achieved bandwidth of its kind.
    `row`: for softmax and layer norm, the length of the rows they reduce (0: not known), in
    elements of `itemsize` bytes (See Note [Rows that outgrow the L2])."""
    if cal is None and SPECS.get(spec.name) is spec:
        return _stored_memory_bound(spec.name, family, nbytes, row, itemsize)
    return _memory_bound(spec, family, nbytes, cal or CALIBRATION[spec.name], row, itemsize)


@lru_cache(maxsize=8192)
def _stored_memory_bound(name: str, family: str, nbytes: int, row: int = 0,
                         itemsize: int = 4) -> Kernel:
    return _memory_bound(SPECS[name], family, nbytes, CALIBRATION[name], row, itemsize)


# Note [Rows that outgrow the L2]
# Softmax and layer norm run one thread block per row (torch's cunn_SoftMaxForward and
# vectorized_layer_norm_kernel) and read the row more than once: softmax three times (its
# maximum, the sum of exponentials, then the output), layer norm twice (its statistics, then
# the output). While the rows all SMs hold at once fit in the L2, the re-reads are L2 hits
# and the kernel streams at its own achieved bandwidth (`Calibration.softmax`, `.layer_norm`);
# once they outgrow it, the re-reads come from DRAM: the kernel moves 2x (softmax) or 1.5x
# (layer norm) the bytes counted (its input and output once). How far the rows outgrow the L2
# is read as row bytes x SMs / L2 bytes (the rows in flight grow with the SMs), with the
# re-reads missing from nothing to all over a ramp in its logarithm (`L2_MISS_RAMP`, fitted on
# the measured boards, which drop from the one regime to the other at 1/40 to 1/3 of it).
# A softmax row of at most 1,024 elements (and 4 KB) runs torch's warp-per-row kernel instead
# (the row held in registers, read once): the element-wise bandwidth times `WARP_SOFTMAX`.
# NeuSight's rows (docs/gpu-models.md): the T4's softmax moves 0.74-0.83 of its datasheet
# bandwidth up to rows of 5,120 and 0.43 at 16,384; the L4's (48 MB of L2) 0.79 at every length.


UNKNOWN_ROW = 1024


def l2_miss(spec: GpuSpec, family: str, row_bytes: int) -> float:
    """The share of a row-wise kernel's re-reads served by DRAM rather than the L2 (0 to 1)."""
    ramp = L2_MISS_RAMP.get(family)
    if ramp is None or row_bytes <= 0 or spec.l2_cache_mb <= 0:
        return 0.0
    lo, hi = ramp
    z = row_bytes * spec.sms / (spec.l2_cache_mb * 1e6)
    if z <= lo:
        return 0.0
    return min(1.0, log(z / lo) / log(hi / lo))


def memory_fraction(spec: GpuSpec, family: str, cal: Calibration, row: int = 0,
                    itemsize: int = 4) -> float:
    """The achieved fraction of the datasheet bandwidth a kernel of `family` moves its counted
    bytes at (rows of `row` elements; See Note [Rows that outgrow the L2]). A row not known
    (0: the simulation's clock sees bytes, not shapes; a backward kernel) is taken as 1,024
    elements, the length of many attention rows and hidden sizes."""
    row = row or UNKNOWN_ROW
    if family == SOFTMAX:
        if 0 < row <= WARP_SOFTMAX_ROW and row * itemsize <= 4 * WARP_SOFTMAX_ROW:
            return cal.bandwidth * WARP_SOFTMAX
        return cal.softmax / (1 + REREAD[SOFTMAX] * l2_miss(spec, SOFTMAX, row * itemsize))
    if family == LAYER_NORM:
        return cal.layer_norm / (1 + REREAD[LAYER_NORM]
                                 * l2_miss(spec, LAYER_NORM, row * itemsize))
    return cal.bandwidth


def _memory_bound(spec: GpuSpec, family: str, nbytes: int, cal: Calibration, row: int = 0,
                  itemsize: int = 4) -> Kernel:
    bandwidth = memory_fraction(spec, family, cal, row, itemsize) * spec.memory_bandwidth_gbs * 1e9
    return Kernel(family, 0.0, nbytes / bandwidth, KERNEL_FLOOR_US * 1e-6,
                  cal.alone_floor_us * 1e-6, 0, nbytes, None, bandwidth / 1e9)
