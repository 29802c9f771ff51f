"""What GPUs achieve, per GPU and dtype: the model's constants, each fitted or cited.

Fitted constants come from NeuSight's measurements of single ops on real GPUs (FP32, torch
2.1, each op timed alone with CUDA events; `../shared/gpu-measurements/`, see
docs/gpu-models.md): `benchmarks/gpu_model.py --fit` fits them again from the tables and
prints this table's numbers, and tests/test_gpu_model.py checks that it still gives these.
The model itself never reads the measurements: it runs on these numbers only.

Cited constants are published measurements of torch.mm in FP16, BF16 and TF32 (the tables are
FP32 only); docs/gpu-models.md names each source.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import prod, sqrt

from devlab.engine.gpu_model.specs import SPECS, GpuSpec

# The GPU-side time of a tiny kernel (an add of 1,024 floats replayed in a CUDA graph, where
# no launch overhead is left): 1.1-1.3 µs, pytorch/pytorch#161104. Every kernel pays it.
KERNEL_FLOOR_US = 1.2
# Fitted across the GPUs (benchmarks/gpu_model.py --fit): each tile of a matrix product costs
# as many extra steps of its contraction loop for its prologue (loading the first tiles) and
# epilogue (writing its outputs).
PROLOGUE_K = 8.0
# On the Pascal GPUs (P4, P100) a product with an operand larger than a size runs slower as
# (operand / size)^exponent, up to a limit (`Calibration.large_operand`); no newer GPU in the
# data does.
LARGE_OPERAND_EXPONENT = 0.5
# Softmax and layer norm over rows that outgrow the L2 (kernels.py, See Note [Rows that outgrow
# the L2]): the extra bytes their re-reads move from DRAM, as a share of the bytes counted
# (input + output once): softmax reads its input twice more, layer norm once more (torch's
# kernels; not fitted).
REREAD = {"softmax": 1.0, "layer norm": 0.5}
# Where the re-reads go from all L2 hits to all DRAM, in row bytes x SMs / L2 bytes: fitted
# once on the seven measured boards' softmax and layer-norm rows (a grid over the ramp's ends
# and each board's own fraction, least mean absolute error; docs/gpu-models.md says what
# refitting them without each left-out board gives). `--fit` does not refit these three.
L2_MISS_RAMP = {"softmax": (0.072, 0.432), "layer norm": (0.027, 0.080)}
# torch runs a softmax row of at most 1,024 elements with a warp per row (its
# dispatch_softmax_forward), read once: the element-wise bandwidth times this (fitted so).
WARP_SOFTMAX_ROW = 1024
WARP_SOFTMAX = 0.95

# Note [Short products on slot-powered boards]
# A card powered by its PCIe slot alone (at most 75 W) whose base clock is under half its boost
# clock (the T4: 70 W, 585 / 1,590 MHz; the L4: 72 W, 795 / 2,040 MHz) runs a short burst of
# work near its boost clock and a sustained one at the clock its power limit holds: NeuSight's
# batched products on both run 1.1 to 1.2x faster than the board's one fitted rate while they
# take under 8 ms and 1.1 to 1.15x slower beyond 16 to 64 ms (docs/gpu-models.md). Such a
# board's batched fit carries `GemmFit.burst`: a product's compute time at the fitted rate, t,
# is multiplied by burst^(1/2 - x), x going from 0 at `SUSTAIN_WINDOW`'s end to 1 at its start
# over log t (so the fitted rate is the middle of the two). It is fitted on the board's own rows;
# a board left out, or without rows, that `bursts` takes the geometric mean of the measured
# such boards' bursts. No other measured board shows it (the P4, 75 W but with base 0.8 of boost,
# does not; the linear rows of the T4 and L4 show a third of it, and are left as they are).
SUSTAIN_WINDOW = (8e-3, 64e-3)


def bursts(spec: GpuSpec) -> bool:
    """Whether a board runs short batched products faster than sustained ones: a slot-powered
    card (at most 75 W) whose base clock is under half its boost clock (its datasheet)."""
    return spec.board_power_w <= 75 and 0 < spec.base_clock_mhz < 0.5 * spec.boost_clock_mhz


@dataclass(frozen=True)
class GemmFit:
    """How one kind of matrix product (mm-like or batched) runs on one GPU in FP32."""

    tile: tuple[int, int, int]  # rows, columns, tiles per SM at once: cuBLAS's usual kernel
    fp32: float  # achieved fraction of the datasheet FP32 peak (fitted)
    whole: bool = False  # cuBLAS runs this one kernel for every shape (no smaller tiles)
    cut: float | None = None  # with `whole`: the fraction the same rows give with tiles cut to
    # the shape, what the datasheet rule reads (every board's estimate fitted on one measure)
    burst: float = 1.0  # batched products on a board that `bursts`: how much faster a short
    # one runs than a sustained one (See Note [Short products on slot-powered boards])


@dataclass(frozen=True)
class Calibration:
    """The achieved rates of one GPU, fitted on its measured rows or derived (`source`)."""

    mm: GemmFit  # mm, addmm, linear, matmul of 2-D operands, convolutions
    bmm: GemmFit  # batched products: bmm, baddbmm, matmul with batch dimensions
    bandwidth: float  # achieved fraction of the datasheet memory bandwidth, element-wise ops
    softmax: float  # the same for softmax's block kernel while its rows fit in the L2
    layer_norm: float  # the same for layer-norm kernels while their rows fit in the L2
    alone_floor_us: float  # a tiny kernel timed alone with CUDA events on an idle GPU
    tflops: dict[str, float] = field(default_factory=dict)  # cited torch.mm TFLOPS by dtype
    large_operand: tuple[float, float] | None = None  # Pascal: (operand GB, slowest factor)
    source: str = ""


# torch.mm's best TFLOPS in FP16, BF16 and TF32 over the square sizes a published benchmark
# tried (docs/gpu-models.md, "Matrix multiplication"): the model's rate for a product in that
# dtype, scaled for batched products as FP32's are. A dtype not listed runs at the GPU's FP32
# fraction of its datasheet peak for that dtype.
CITED_TFLOPS: dict[str, dict[str, float]] = {
    # [zzc-db] "NVIDIA Tesla T4 16GB" (Colab): FP16 41.91; BF16 2.46 (no BF16 hardware).
    "T4": {"float16": 41.91, "bfloat16": 2.46},
    "P4": {},
    # [zzc-db] "NVIDIA Tesla P100 PCIE 16GB" (Kaggle): FP16 8.39, BF16 6.11.
    "P100": {"float16": 8.39, "bfloat16": 6.11},
    # [zzc-db] "NVIDIA Tesla V100-SXM2-16GB": FP16 94.84 of 125, BF16 10.34 (no BF16
    # hardware) beside 15.7 FP32: scaled to the PCIe card's datasheet (112 FP16, 14 FP32).
    "V100": {"float16": 84.98, "bfloat16": 9.22},
    # [zzc-db] "NVIDIA L4": TF32 31.88, FP16 68.83, BF16 70.89.
    "L4": {"tf32": 31.88, "float16": 68.83, "bfloat16": 70.89},
    # [mli] A100 80GB, TF32 116; [zzc-db] "NVIDIA A100 40GB": FP16 247.63, BF16 246.33.
    "A100-40GB": {"tf32": 116.0, "float16": 247.63, "bfloat16": 246.33},
    # [mli] TF32 116; [zzc-db] "NVIDIA A100 SXM4 80GB": FP16 258.74, BF16 264.53.
    "A100-80GB": {"tf32": 116.0, "float16": 258.74, "bfloat16": 264.53},
    # [zzc#108] / [zzc-db] "NVIDIA A100-PCIE-40GB": TF32 108.32, FP16 241.49, BF16 234.14;
    # the 80 GB card (same chip, 300 W rather than 250 W) is given the same.
    "A100-PCIe-40GB": {"tf32": 108.32, "float16": 241.49, "bfloat16": 234.14},
    "A100-PCIe-80GB": {"tf32": 108.32, "float16": 241.49, "bfloat16": 234.14},
    # [zzc#79] "NVIDIA H100 80GB HBM3": TF32 402.15, FP16 760.04, BF16 797.51.
    "H100": {"tf32": 402.15, "float16": 760.04, "bfloat16": 797.51},
    # [chsasank] "Nvidia H100-PCIe 80GB", torch.matmul best of n = 256…6888: FP16 435, BF16 449.
    "H100-PCIe": {"float16": 435.0, "bfloat16": 449.0},
    "TITAN-RTX": {},
    # The boards of issue 40, from [zzc-db] (torch.mm, best of n = 1024...10240, 30 calls):
    # "NVIDIA RTX 3090 24GB" FP16 75.64, BF16 76.34; "NVIDIA GeForce RTX 4060" TF32 15.60,
    # FP16 32.64, BF16 31.21; "NVIDIA RTX 4090 24GB" (PyTorch 2.4.0) FP16 165.08, BF16 170.06;
    # "NVIDIA RTX 5090 32GB" (PyTorch 2.7.1) FP16 237.63, BF16 242.18; "NVIDIA L40S" FP16
    # 264.02, BF16 269.15; "NVIDIA H200" FP16 759.40, BF16 790.29; "NVIDIA B200 180GB" FP16
    # 1627.64, BF16 1696.03; "NVIDIA Tesla V100-SXM2-16GB" FP16 94.84, BF16 10.34 (no BF16
    # hardware). [chsasank] "Nvidia 3060 12 GB": FP16 26, BF16 26. [zzc#126] "NVIDIA A10G":
    # TF32 34.71, FP16 69.47, BF16 69.47. None for the RTX 4070: its tensor-core rates are the
    # FP32 fraction of the datasheet's.
    "RTX-3060": {"float16": 26.0, "bfloat16": 26.0},
    "RTX-3090": {"float16": 75.64, "bfloat16": 76.34},
    "RTX-4060": {"tf32": 15.60, "float16": 32.64, "bfloat16": 31.21},
    "RTX-4070": {},
    "RTX-4090": {"float16": 165.08, "bfloat16": 170.06},
    "RTX-5090": {"float16": 237.63, "bfloat16": 242.18},
    "A10G": {"tf32": 34.71, "float16": 69.47, "bfloat16": 69.47},
    "L40S": {"float16": 264.02, "bfloat16": 269.15},
    "V100-SXM2-16GB": {"float16": 94.84, "bfloat16": 10.34},
    "H200": {"float16": 759.40, "bfloat16": 790.29},
    "B200": {"float16": 1627.64, "bfloat16": 1696.03},
}

# --- fitted: `benchmarks/gpu_model.py --fit` prints this part from the measurements -----------
FITTED = "fitted on its own rows"
RULE = "products fitted on its own rows; memory-bound constants by the rule (no such rows)"
CALIBRATION: dict[str, Calibration] = {
    "T4": Calibration(GemmFit((128, 64, 1), 0.497), GemmFit((64, 64, 4), 0.502, burst=1.29),
        0.802, 0.956, 0.853, 23.9, CITED_TFLOPS["T4"], None, FITTED),
    "P4": Calibration(GemmFit((128, 128, 1), 0.849), GemmFit((64, 128, 2), 0.62, True, 0.62),
        0.752, 0.751, 0.77, 13.9, CITED_TFLOPS["P4"], (0.392, 1.84), FITTED),
    "P100": Calibration(GemmFit((128, 64, 1), 0.77), GemmFit((64, 128, 2), 0.932, True, 0.928),
        0.742, 0.673, 0.685, 21.8, CITED_TFLOPS["P100"], (0.749, 3.11), FITTED),
    "V100": Calibration(GemmFit((128, 64, 1), 0.985), GemmFit((128, 32, 4), 0.88),
        0.917, 0.927, 0.89, 21.2, CITED_TFLOPS["V100"], None, FITTED),
    "L4": Calibration(GemmFit((128, 64, 1), 0.307),
        GemmFit((128, 128, 1), 0.277, True, 0.265, 1.42),
        0.783, 0.794, 0.814, 11.8, CITED_TFLOPS["L4"], None, FITTED),
    "A100-PCIe-40GB": Calibration(GemmFit((128, 64, 1), 0.835),
        GemmFit((128, 128, 1), 0.877, True, 0.866),
        0.887, 0.773, 0.82, 17.0, CITED_TFLOPS["A100-PCIe-40GB"], None, FITTED),
    "A100-PCIe-80GB": Calibration(GemmFit((128, 64, 1), 0.926),
        GemmFit((128, 128, 1), 0.957, True, 0.953),
        0.865, 0.735, 0.768, 17.6, CITED_TFLOPS["A100-PCIe-80GB"], None, FITTED),
    "H100": Calibration(GemmFit((128, 64, 2), 0.768), GemmFit((64, 64, 4), 0.73),
        0.821, 0.801, 0.8, 18.2, CITED_TFLOPS["H100"], None, RULE),
}
# --- end of the fitted part --------------------------------------------------------------------

# The SXM4 A100 boards have no rows: the PCIe card of the same memory has the same chip, so its
# fractions carry over (to the SXM board's own peaks and bandwidth). The SXM board's higher
# power limit lets long products run a little faster than this (7 % in BF16: [MAMF]).
for _sxm, _pcie in (("A100-40GB", "A100-PCIe-40GB"), ("A100-80GB", "A100-PCIe-80GB")):
    CALIBRATION[_sxm] = replace(CALIBRATION[_pcie], tflops=CITED_TFLOPS[_sxm],
                                source=f"the {_pcie} card's fractions (same chip)")
# The H100 PCIe card has no rows either: the SXM board's fractions (the same GH100 chip), to
# its own peaks and bandwidth.
CALIBRATION["H100-PCIe"] = replace(CALIBRATION["H100"], tflops=CITED_TFLOPS["H100-PCIe"],
                                   source="the H100's fractions (same chip)")

# The TITAN RTX has no measured rows: its constants are the rule for GPUs the model was not fitted
# on (NeuSight's protocol; benchmarks/gpu_measurements.Rule, fitted on the P4, P100, V100, T4 and
# A100 PCIe 40 GB, docs/gpu-models.md "On GPUs the model was not fitted on"): FP32 fraction
# min(0.85, 63 GFLOPS/W x 280 W / 16.3 TFLOPS) = 0.85 for products and min(0.88, 58 x 280 / 16.3)
# = 0.88 for batched ones (power to spare at 280 W), the memory fractions and alone floor the
# five GPUs' means, the tiles of the GPU nearest in compute capability (the T4: 7.5, Turing).
CALIBRATION["TITAN-RTX"] = Calibration(
    GemmFit(CALIBRATION["T4"].mm.tile, 0.85), GemmFit(CALIBRATION["T4"].bmm.tile, 0.88),
    0.820, 0.816, 0.804, 19.6, CITED_TFLOPS["TITAN-RTX"], None,
    "the rule for GPUs without rows (NeuSight's protocol); the T4's tiles")


# --- boards without measured kernels: the datasheet rule (issue 40) ---------------------------
# Note [The datasheet rule]
# A board with no measured kernels gets its constants from its datasheet, by a rule fitted on
# the measured boards' own fits (`benchmarks/gpu_measurements.fit_datasheet_rule`, scored by
# leaving each measured board out in turn: docs/gpu-models.md, "On GPUs the model was not
# fitted on"). The achieved FP32 fraction is the geometric mean of two estimates of the clock
# a long product sustains, each from the datasheet:
# - power: the FLOPS a board watt sustains, growing with the process node as
#   (12 nm / node)^exponent, times the board's power, over the FP32 peak (a 70 W card runs
#   far below its boost clock), capped by a ceiling;
# - clock: the base clock (what the board guarantees at its power limit) over the boost clock
#   the peak is counted at, raised to (1 - theta), times a ceiling.
# Each ceiling is per FP32 lanes per warp scheduler: 32 lanes (Pascal, GA10x, Ada, Hopper,
# Blackwell) leave no issue slot beside a full rate of FFMA, 16 (Volta, Turing, GA100) do.
# Products and batched products differ from that mean by a fitted factor each. Element-wise
# ops' bandwidth fraction is the measured boards' mean; softmax's and layer norm's (while their
# rows fit in the L2: kernels.py reads the board's L2 and SMs for longer rows, See Note [Rows
# that outgrow the L2]) are the measured boards' mean ratio to it; so is the alone
# floor (the host's time, which no GPU datasheet gives). Products' tiles, and the Pascal boards'
# large-operand slowdown, are those of the measured board nearest in compute capability;
# batched products' those of the nearest of the same architecture (`tile_source`) where its fit
# runs one whole kernel (its architecture's: ampere_sgemm_128x128 on 8.x), which it keeps.
# Where that board's fit cuts tiles to the shape (cuBLAS picks among kernels by shape) or no
# board of the architecture is measured, the board takes the tile the measured shape-cut fits
# share most (`shape_cut_tile`: 64 x 64, 4 per SM, the T4's and H100's; the V100's is 128 x 32),
# not one board's: on the 36 shapes both measured, the T4's rows fit 64 x 64 best and the
# V100's 128 x 32, so cuBLAS's choice by shape is not the architecture's (a second board of the
# same chip keeps its fit: the V100 SXM2). The power and clock estimates read each board's
# batched fraction with tiles cut to the shape (`GemmFit.cut`), one measure on every board.


# Note [Batched products and memory bandwidth]
# The measured boards' batched fractions over the datasheet estimate fall as their FP32 peak per
# byte of memory bandwidth (the roofline's machine balance, from two datasheet figures) grows:
# 1.18 on the P100 (12.7 FLOPs per byte), 1.11 and 1.07 on the A100s (12.5, 10.1), 0.93 to 0.97
# on the V100, H100 and T4 (15.6 to 27), 0.85 and 0.77 on the P4 and L4 (28.6, 101): a batched
# product's many small operands wait less for memory where the memory keeps up. Below the
# measured boards' median balance a board's batched fraction is the estimate x `bmm` x (median /
# its balance)^exponent, a balance below the lowest measured one read as that (no trend is
# carried past the boards it was fitted on); at or above the median, the estimate x `bmm` alone
# (the boards there, T4, P4, L4, power-limited or not, follow no one trend, and a slope there
# would reach far beyond them: the L4's 101). The exponent is fitted through (median, 0) by
# least squares of log(fraction / (estimate x bmm)); products (mm) show no such trend.


def flops_per_byte(spec: GpuSpec) -> float:
    """The board's FP32 peak over its memory bandwidth (FLOPs per byte, datasheet figures)."""
    return spec.fp32_tflops * 1e3 / spec.memory_bandwidth_gbs


@dataclass(frozen=True)
class DatasheetRule:
    """The rule's constants (See Note [The datasheet rule]), fitted on the measured boards."""

    power_ceiling: tuple[float, float]  # FP32 fraction with power to spare: 16, 32 lanes
    gflops_per_watt: float  # what a board watt sustains on a 12 nm process
    node_exponent: float  # ... times (12 nm / node)^this
    clock_ceiling: tuple[float, float]  # the clock estimate's ceiling: 16, 32 lanes
    clock_exponent: float  # theta: the sustained clock is base x (boost / base)^theta
    mm: float  # products' fraction over the estimate
    bmm: float  # batched products' fraction over the estimate
    bandwidth: float  # element-wise ops' bandwidth fraction
    softmax: float  # softmax's block kernel's fraction over the element-wise one's
    layer_norm: float  # layer norm's, the same
    alone_floor_us: float
    # FP32 FLOPs per byte of memory bandwidth: the measured boards' lowest and median; batched
    # products on a board below the median run x (median / its, at most median / lowest)^exponent
    balance: tuple[float, float] = (1.0, 1.0)
    balance_exponent: float = 0.0

    def fp32_fraction(self, spec: GpuSpec) -> float:
        """The estimate of a long FP32 product's achieved fraction of the datasheet peak."""
        wide = 1 if spec.fp32_lanes_per_scheduler >= 32 else 0
        power = min(self.power_ceiling[wide], self.gflops_per_watt
                    * (12.0 / spec.process_nm) ** self.node_exponent
                    * spec.board_power_w / (spec.fp32_tflops * 1e3))
        clock = (self.clock_ceiling[wide]
                 * (spec.base_clock_mhz / spec.boost_clock_mhz) ** (1 - self.clock_exponent))
        return sqrt(power * clock)

    def bmm_fraction(self, spec: GpuSpec) -> float:
        """Batched products' FP32 fraction: the estimate x `bmm`, and more on a board with more
        memory bandwidth per FLOP than the measured boards' median (See Note [Batched products
        and memory bandwidth])."""
        lowest, median = self.balance
        boost = (median / min(median, max(lowest, flops_per_byte(spec)))) ** self.balance_exponent
        return self.fp32_fraction(spec) * self.bmm * boost

    def memory(self, spec: GpuSpec) -> tuple[float, float, float]:
        """(element-wise, softmax, layer-norm) bandwidth fractions (softmax's and layer norm's
        while their rows fit in the L2: kernels.py reads the L2 by the rows)."""
        return (self.bandwidth, min(1.0, self.bandwidth * self.softmax),
                min(1.0, self.bandwidth * self.layer_norm))


# The boards whose constants are fitted on their own rows (the rest are derived from them).
MEASURED = ("T4", "P4", "P100", "V100", "L4", "A100-PCIe-40GB", "A100-PCIe-80GB", "H100")
# --- fitted: `benchmarks/gpu_model.py --fit` prints this rule from the measurements ----------
RULE_SOURCE = ("the datasheet rule (no measured kernels); tiles of the nearest measured board "
               "(batched products: of its architecture)")
DATASHEET_RULE = DatasheetRule((0.9, 0.75), 64.0, 0.7, (1.1, 0.9), 0.2, 1.016, 0.979, 0.821,
                               0.978, 0.976, 18.2, (10.078, 17.778), 0.277)
# --- end of the fitted rule ---------------------------------------------------------------------


def nearest_measured(spec: GpuSpec, boards: tuple[str, ...] | list[str] = MEASURED) -> str:
    """The measured board nearest `spec` in compute capability (the newer of two as near)."""
    cc = float(spec.compute_capability)
    return min(boards, key=lambda g: (abs(float(SPECS[g].compute_capability) - cc),
                                      -float(SPECS[g].compute_capability)))


def tile_source(spec: GpuSpec, boards: tuple[str, ...] | list[str] = MEASURED
                ) -> tuple[str, bool]:
    """The measured board whose product tiles `spec` takes, and whether it keeps a batched
    fit's one whole kernel: the nearest in compute capability among boards of its major
    version (cuBLAS's FP32 kernels go by architecture: maxwell_sgemm on 6.x, volta_sgemm on
    7.x, ampere_sgemm on 8.x in the tables' names), else the nearest of any, its tiles then
    cut to the shape (a new architecture's kernel choice is not known)."""
    major = spec.compute_capability.split(".")[0]
    same = [g for g in boards if SPECS[g].compute_capability.split(".")[0] == major]
    return nearest_measured(spec, same or list(boards)), bool(same)


def shape_cut_tile(fitted: dict[str, Calibration]) -> tuple[int, int, int]:
    """The batched tile the measured boards whose batched fits cut tiles to the shape share
    most; a tie goes to the tile with the most multiply-adds per operand byte loaded (rows x
    cols / (rows + cols): the squarer of two of one area)."""
    cut = [c.bmm.tile for c in fitted.values() if not c.bmm.whole]
    if not cut:
        return next(iter(fitted.values())).bmm.tile
    return max(set(cut), key=lambda t: (cut.count(t), t[0] * t[1] / (t[0] + t[1]), -t[0]))


def from_datasheet(spec: GpuSpec, rule: DatasheetRule = DATASHEET_RULE,
                   fitted: dict[str, Calibration] | None = None, tflops: dict | None = None,
                   source: str = RULE_SOURCE) -> Calibration:
    """A board's calibration by the datasheet rule; batched products' tiles from the measured
    board `tile_source` picks among `fitted`, products' tiles and a Pascal board's
    large-operand slowdown from the nearest in compute capability."""
    fitted = fitted if fitted is not None else {g: CALIBRATION[g] for g in MEASURED}
    ref = fitted[nearest_measured(spec, list(fitted))]
    board, whole = tile_source(spec, list(fitted))
    tiles = fitted[board]
    gm = rule.fp32_fraction(spec)
    bandwidth, softmax, layer_norm = rule.memory(spec)
    burst = 1.0
    if bursts(spec):
        known = [c.bmm.burst for g, c in fitted.items() if bursts(SPECS[g])]
        burst = round(prod(known) ** (1 / len(known)), 2) if known else 1.0
    same_generation = (SPECS[nearest_measured(spec, list(fitted))].compute_capability[0]
                       == spec.compute_capability[0])
    # The donor's whole kernel is its architecture's; its shape-cut tile is kept only for the
    # same chip (same compute capability and SMs: the V100 SXM2 and PCIe boards), since cuBLAS's
    # choice by shape differs from chip to chip (See Note [The datasheet rule]).
    donor = SPECS[board]
    same_chip = (donor.compute_capability, donor.sms) == (spec.compute_capability, spec.sms)
    keep = tiles.bmm.whole and whole
    return Calibration(GemmFit(ref.mm.tile, round(gm * rule.mm, 3)),
                       GemmFit(tiles.bmm.tile if keep or same_chip else shape_cut_tile(fitted),
                               round(rule.bmm_fraction(spec), 3), keep, None, burst),
                       round(bandwidth, 3), round(softmax, 3), round(layer_norm, 3),
                       rule.alone_floor_us,
                       tflops if tflops is not None else CITED_TFLOPS.get(spec.name, {}),
                       ref.large_operand if same_generation else None, source)


for _name in ("RTX-3060", "RTX-3090", "RTX-4060", "RTX-4070", "RTX-4090", "RTX-5090", "A10G",
              "L40S", "V100-SXM2-16GB", "H200", "B200"):
    CALIBRATION[_name] = from_datasheet(SPECS[_name])
assert set(CALIBRATION) == set(SPECS), "every board needs its calibration"
