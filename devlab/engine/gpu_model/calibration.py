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


@dataclass(frozen=True)
class GemmFit:
    """How one kind of matrix product (mm-like or batched) runs on one GPU in FP32."""

    tile: tuple[int, int, int]  # rows, columns, tiles per SM at once: cuBLAS's usual kernel
    fp32: float  # achieved fraction of the datasheet FP32 peak (fitted)


@dataclass(frozen=True)
class Calibration:
    """The achieved rates of one GPU, fitted on its measured rows or derived (`source`)."""

    mm: GemmFit  # mm, addmm, linear, matmul of 2-D operands, convolutions
    bmm: GemmFit  # batched products: bmm, baddbmm, matmul with batch dimensions
    bandwidth: float  # achieved fraction of the datasheet memory bandwidth, element-wise ops
    softmax: float  # the same for softmax kernels
    layer_norm: float  # the same for layer-norm kernels
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
}

# --- fitted: `benchmarks/gpu_model.py --fit` prints this part from the measurements -----------
FITTED = "fitted on its own rows"
RULE = "products fitted on its own rows; memory-bound constants by the rule (no such rows)"
CALIBRATION: dict[str, Calibration] = {
    "T4": Calibration(GemmFit((128, 64, 1), 0.497), GemmFit((64, 64, 4), 0.498),
        0.802, 0.709, 0.615, 23.9, CITED_TFLOPS["T4"], None, FITTED),
    "P4": Calibration(GemmFit((128, 128, 1), 0.849), GemmFit((128, 64, 2), 0.62),
        0.752, 0.605, 0.553, 13.9, CITED_TFLOPS["P4"], (0.392, 1.84), FITTED),
    "P100": Calibration(GemmFit((128, 64, 1), 0.77), GemmFit((64, 64, 4), 0.928),
        0.742, 0.487, 0.468, 21.8, CITED_TFLOPS["P100"], (0.749, 3.11), FITTED),
    "V100": Calibration(GemmFit((128, 64, 1), 0.985), GemmFit((128, 32, 4), 0.88),
        0.917, 0.675, 0.609, 21.2, CITED_TFLOPS["V100"], None, FITTED),
    "L4": Calibration(GemmFit((128, 64, 1), 0.307), GemmFit((64, 64, 4), 0.265),
        0.783, 0.825, 0.769, 11.8, CITED_TFLOPS["L4"], None, FITTED),
    "A100-PCIe-40GB": Calibration(GemmFit((128, 64, 1), 0.835), GemmFit((64, 64, 4), 0.866),
        0.887, 0.753, 0.718, 17.0, CITED_TFLOPS["A100-PCIe-40GB"], None, FITTED),
    "A100-PCIe-80GB": Calibration(GemmFit((128, 64, 1), 0.926), GemmFit((64, 64, 4), 0.953),
        0.865, 0.715, 0.67, 17.6, CITED_TFLOPS["A100-PCIe-80GB"], None, FITTED),
    "H100": Calibration(GemmFit((128, 64, 2), 0.768), GemmFit((64, 64, 4), 0.73),
        0.821, 0.681, 0.629, 18.2, CITED_TFLOPS["H100"], None, RULE),
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
    0.820, 0.646, 0.593, 19.6, CITED_TFLOPS["TITAN-RTX"], None,
    "the rule for GPUs without rows (NeuSight's protocol); the T4's tiles")
