"""Where the model stops: the band of a modeled kernel, from how far the model was from
measured kernels of its kind and size (issue 40).

`benchmarks/gpu_model.py --fit` computes both tables from NeuSight's measured kernels
(`benchmarks/gpu_measurements.bands`) and prints them; tests/test_gpu_model.py checks these
are what it computes. `LEAVE_ONE_OUT` holds, per kind of kernel and decade of its size
(products: FLOPs; the rest: bytes), the model / measured ratio of the middle 90 % of the
kernels of the eight measured boards, each scored with the datasheet rule fitted on the other
seven (what a board without measured kernels gets); `IN_SAMPLE` the same with each board's own
fitted constants. A kernel on a board with no measured kernels, in a dtype other than FP32 (the
tables' only one), or of a size outside the tables' gets the leave-one-out band, said so.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import floor, log10
from typing import Protocol

from devlab.engine.gpu_model.calibration import MEASURED
from devlab.engine.gpu_model.specs import GpuSpec


class _Kernel(Protocol):
    """What a band reads of a modeled kernel (`kernels.Kernel`, which imports this module
    lazily: the families are its, spelled out here; a test checks they agree)."""

    family: str
    flops: int
    nbytes: int


# --- fitted: `benchmarks/gpu_model.py --fit` prints these from the measurements ---------------
LEAVE_ONE_OUT: dict[tuple[str, int], tuple[float, float, int]] = {
    ("element-wise", 8): (0.89, 1.13, 1522), ("element-wise", 9): (0.89, 1.14, 2623),
    ("element-wise", 10): (0.89, 1.15, 413), ("layer norm", 7): (0.66, 1.1, 21),
    ("layer norm", 8): (0.79, 1.13, 231), ("layer norm", 9): (0.85, 1.15, 242),
    ("layer norm", 10): (0.86, 1.16, 39), ("matrix product", 7): (0.47, 1.5, 72),
    ("matrix product", 8): (0.66, 1.44, 1134), ("matrix product", 9): (0.71, 1.36, 3422),
    ("matrix product", 10): (0.75, 1.32, 6580), ("matrix product", 11): (0.78, 1.2, 7528),
    ("matrix product", 12): (0.72, 1.19, 2811), ("matrix product", 13): (0.55, 1.09, 168),
    ("softmax", 7): (0.56, 1.16, 21), ("softmax", 8): (0.69, 1.24, 231),
    ("softmax", 9): (0.78, 1.27, 242), ("softmax", 10): (0.82, 1.15, 39),
}
IN_SAMPLE: dict[tuple[str, int], tuple[float, float, int]] = {
    ("element-wise", 8): (0.98, 1.03, 1522), ("element-wise", 9): (0.98, 1.03, 2623),
    ("element-wise", 10): (0.98, 1.03, 413), ("layer norm", 7): (0.71, 1.05, 21),
    ("layer norm", 8): (0.84, 1.05, 231), ("layer norm", 9): (0.96, 1.08, 242),
    ("layer norm", 10): (0.97, 1.08, 39), ("matrix product", 7): (0.5, 1.43, 72),
    ("matrix product", 8): (0.64, 1.35, 1134), ("matrix product", 9): (0.71, 1.3, 3422),
    ("matrix product", 10): (0.77, 1.27, 6580), ("matrix product", 11): (0.79, 1.12, 7528),
    ("matrix product", 12): (0.76, 1.12, 2811), ("matrix product", 13): (0.73, 1.02, 168),
    ("softmax", 7): (0.69, 1.19, 21), ("softmax", 8): (0.76, 1.15, 231),
    ("softmax", 9): (0.84, 1.19, 242), ("softmax", 10): (0.88, 1.1, 39),
}
# --- end of the fitted part --------------------------------------------------------------------

# kernels.GEMM, SOFTMAX, LAYER_NORM: the kinds of the tables (every other family moves bytes
# as element-wise ops do).
_KIND = {"matrix product": "matrix product", "softmax": "softmax", "layer norm": "layer norm"}


@dataclass(frozen=True)
class Band:
    """How far the model's time for a kernel like this one was from measured times: the middle
    90 % of model / measured ratios of such kernels (`lo` to `hi`)."""

    lo: float
    hi: float
    kernels: int  # how many measured kernels the band is from
    measured_board: bool  # the board's own kernels were measured (else: its datasheet)
    outside: str  # "" when the kernel is like the measured ones; else what differs

    @property
    def text(self) -> str:
        where = ("fitted on this board's own measured kernels; kernels of this size were"
                 if self.measured_board and not self.outside else
                 "outside what this board's measured kernels cover; kernels of this size "
                 "measured on boards the model was not fitted on were" if self.measured_board
                 else "modeled from the datasheet; kernels of this size measured on boards "
                 "like it were")
        note = f" ({self.outside})" if self.outside else ""
        return (f"{where} within {self.lo:.2f}x to {self.hi:.2f}x of the model "
                f"(90 % of {self.kernels:,}){note}")


def band(kernel: _Kernel, spec: GpuSpec, fp32: bool = True) -> Band:
    """The band of a modeled kernel on `spec` (`fp32`: the kernel is in FP32, the tables' dtype)."""
    kind = _KIND.get(kernel.family, "element-wise")
    size = kernel.flops if kind == "matrix product" else kernel.nbytes
    decade = floor(log10(max(size, 1)))
    measured = spec.name in MEASURED
    decades = sorted(d for k, d in LEAVE_ONE_OUT if k == kind)
    outside = []
    if decade < decades[0] or decade > decades[-1]:
        outside.append(f"a size outside the measured 1e{decades[0]} to 1e{decades[-1] + 1} "
                       f"{'FLOPs' if kind == 'matrix product' else 'bytes'}")
        decade = min(max(decade, decades[0]), decades[-1])
    if not fp32:
        outside.append("a dtype other than the measured FP32: its rate is a published "
                       "torch.mm figure")
    if not measured:
        outside.append(f"no kernels measured on the {spec.name}")
    table = IN_SAMPLE if measured and not outside else LEAVE_ONE_OUT
    lo, hi, count = table[(kind, decade)]
    return Band(lo, hi, count, measured, "; ".join(outside))
