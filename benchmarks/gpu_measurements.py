"""NeuSight's measured kernels (`../shared/gpu-measurements/`): read, predicted, fitted.

The measurements are single ops on real GPUs (FP32, torch 2.1, CUDA 12.1), each timed alone
with CUDA events (the mean of the fastest 5 of 25), so the model's `Kernel.alone` is what they
are compared with. The model reads none of this: `fit()` derives the constants that
`devlab/engine/gpu_model/calibration.py` stores, and `table()` scores the stored ones.

Rows give only what a running program knows (op, shapes, dtype, GPU) to the model; the
kernel-name, grid and block columns are never read.
"""

from __future__ import annotations

import csv
import gzip
import itertools
import math
import os
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from devlab.engine.gpu_model import SPECS, Calibration, Kernel, gemm, memory_bound
from devlab.engine.gpu_model.calibration import (
    CALIBRATION,
    MEASURED,
    REREAD,
    WARP_SOFTMAX_ROW,
    DatasheetRule,
    GemmFit,
    bursts,
    flops_per_byte,
    from_datasheet,
)
from devlab.engine.gpu_model.kernels import ELEMENTWISE, LAYER_NORM, SOFTMAX, l2_miss

# The device names in the tables, and the model's key for each board.
DEVICES = {
    "Tesla T4": "T4", "Tesla P4": "P4", "Tesla P100-PCIE-16GB": "P100",
    "Tesla V100-PCIE-32GB": "V100", "NVIDIA L4": "L4",
    "NVIDIA A100-PCIE-40GB": "A100-PCIe-40GB", "NVIDIA A100 80GB PCIe": "A100-PCIe-80GB",
    "NVIDIA H100 80GB HBM3": "H100",
}
FAMILIES = ("bmm", "linear", "element-wise", "softmax", "layer norm")
BINARY = {"add", "mul", "pow", "div"}  # two tensor inputs; the others take a tensor and a scalar
# NeuSight's held-out protocol: fit on these GPUs, report the others.
TRAIN = ("P4", "P100", "V100", "T4", "A100-PCIe-40GB")
HELD_OUT = ("H100", "L4", "A100-PCIe-80GB")
# The tile shapes (rows, columns, tiles per SM at once) a fit may choose from: those of
# cuBLAS's FP32 kernels in the tables' kernel names (128x128, 128x64, 64x64, 128x32, ...).
TILES = ((128, 128, 1), (128, 64, 1), (128, 64, 2), (64, 128, 2), (64, 64, 4), (128, 32, 4),
         (256, 128, 1))


def data_dir() -> Path | None:
    """Where the tables are: $DEVLAB_GPU_MEASUREMENTS, else the copy kept in the repository
    (`benchmarks/data/neusight`, MIT), else `shared/gpu-measurements/neusight` beside this
    checkout or one of its parents."""
    env = os.environ.get("DEVLAB_GPU_MEASUREMENTS")
    if env:
        return Path(env)
    kept = Path(__file__).resolve().parent / "data" / "neusight"
    if kept.is_dir():
        return kept
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "shared" / "gpu-measurements" / "neusight"
        if candidate.is_dir():
            return candidate
    return None


@dataclass(frozen=True)
class Row:
    """One measured op: its GPU, family and shape, and the time measured (seconds)."""

    gpu: str
    family: str
    op: str
    dims: tuple[int, ...]  # bmm/linear: (batch, m, n, k) of (m x k) by (k x n); else (rows, cols)
    measured: float


def _read(path: Path) -> list[dict[str, str]]:
    with gzip.open(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


def load(directory: Path | None = None) -> list[Row]:
    """Every row of the five tables (about 27,000)."""
    directory = directory or data_dir()
    if directory is None:
        raise FileNotFoundError("no gpu-measurements directory: set DEVLAB_GPU_MEASUREMENTS")
    rows = []
    for name in ("bmm", "linear"):
        for r in _read(directory / f"{name}.csv.gz"):
            # NeuSight multiplies (B, M, N) by (N, K) (bmm), or applies Linear(N, K) to
            # (B, M, N): m = M rows, contraction N, K output columns.
            b, m, n, k = (int(r[c]) for c in "BMNK")
            rows.append(Row(DEVICES[r["Device"]], name, name, (b, m, k, n),
                            float(r["Latency"]) * 1e-3))
    for name, family in (("elem", "element-wise"), ("softmax", "softmax"), ("ln", "layer norm")):
        for r in _read(directory / f"{name}.csv.gz"):
            rows.append(Row(DEVICES[r["Device"]], family, r["OPName"], (int(r["B"]), int(r["H"])),
                            float(r["Latency"]) * 1e-3))
    return rows


def predict(row: Row, cal: Calibration | None = None) -> Kernel:
    """The model's kernel for a row's op and shape on its GPU (calibration `cal`, else the
    stored one)."""
    spec = SPECS[row.gpu]
    cal = cal or CALIBRATION[row.gpu]
    if row.family in ("bmm", "linear"):
        b, m, n, k = row.dims
        bias = n * 4 if row.family == "linear" else 0  # nn.Linear(bias=True)
        return gemm(spec, b, m, n, k, "float32", 4, row.family == "bmm", bias, cal)
    rows_, cols = row.dims
    tensors = 3 if row.op in BINARY else 2  # inputs and the output
    family = {"softmax": SOFTMAX, "layer norm": LAYER_NORM}.get(row.family, ELEMENTWISE)
    row = cols if family in (SOFTMAX, LAYER_NORM) else 0
    return memory_bound(spec, family, tensors * rows_ * cols * 4, cal, row)


@dataclass(frozen=True)
class Score:
    """How close the model's alone-timed predictions are to one GPU x family's rows."""

    gpu: str
    family: str
    rows: int
    within_2x: float  # share of rows with model / measured in [0.5, 2]
    within_125: float  # ... in [0.8, 1.25]
    mape: float  # mean of |model - measured| / measured
    median_ratio: float  # median of model / measured

    def meets(self, within: float = 0.9, mape: float = 0.25) -> bool:
        return self.within_2x >= within and self.mape <= mape


def score(gpu: str, family: str, ratios: list[float]) -> Score:
    n = len(ratios)
    return Score(gpu, family, n, sum(0.5 <= r <= 2 for r in ratios) / n,
                 sum(0.8 <= r <= 1.25 for r in ratios) / n,
                 sum(abs(r - 1) for r in ratios) / n, statistics.median(ratios))


def table(rows: list[Row], cal_for: Callable[[str], Calibration] | None = None,
          gpus: Iterable[str] | None = None) -> list[Score]:
    """A score for every GPU x family in `rows` (of `gpus`, in the tables' order)."""
    groups: dict[tuple[str, str], list[float]] = {}
    wanted = set(gpus) if gpus is not None else None
    for row in rows:
        if wanted is not None and row.gpu not in wanted:
            continue
        cal = cal_for(row.gpu) if cal_for else None
        groups.setdefault((row.gpu, row.family), []).append(predict(row, cal).alone / row.measured)
    order = list(DEVICES.values())
    return [score(g, f, groups[(g, f)]) for g in order for f in FAMILIES if (g, f) in groups]


# --- fitting -----------------------------------------------------------------------------------

def _golden(f: Callable[[float], float], lo: float, hi: float, steps: int = 24) -> float:
    """The x in [lo, hi] where f is least (f unimodal), by golden-section search (24 steps
    narrow the interval 100,000-fold: finer than the three decimals the fits keep)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def _mape(rows: list[Row], cal: Calibration) -> float:
    return sum(abs(predict(r, cal).alone / r.measured - 1) for r in rows) / len(rows)


def _line(xs: list[float], ts: list[float]) -> tuple[float, float]:
    """(a, u) of t = a + u x by least squares on the relative error (each row counts alike)."""
    # Minimise sum((a + u x - t) / t)^2: normal equations in (a, u) with weights 1/t^2.
    s11 = sum(1 / t**2 for t in ts)
    s12 = sum(x / t**2 for x, t in zip(xs, ts, strict=True))
    s22 = sum(x**2 / t**2 for x, t in zip(xs, ts, strict=True))
    b1 = sum(1 / t for t in ts)
    b2 = sum(x / t for x, t in zip(xs, ts, strict=True))
    det = s11 * s22 - s12**2
    return (b1 * s22 - b2 * s12) / det, (s11 * b2 - s12 * b1) / det


def _slope(xs: list[float], ts: list[float], a: float) -> float:
    """u of t = a + u x (a fixed) by least squares on the relative error."""
    num = sum(x / t * (1 - a / t) for x, t in zip(xs, ts, strict=True))
    return num / sum((x / t) ** 2 for x, t in zip(xs, ts, strict=True))


def _bytes(row: Row) -> float:
    return predict(row, _PROBE).nbytes


_PROBE = Calibration(GemmFit((128, 128, 1), 1.0), GemmFit((128, 128, 1), 1.0), 1.0, 1.0, 1.0, 0.0)


def fit_memory(rows: list[Row], gpu: str) -> tuple[float, float, float, float] | None:
    """(alone floor µs, element-wise, softmax, layer-norm bandwidth fractions) of one GPU, or
    None without element-wise rows. The floor and the element-wise fraction are the
    intercept and slope of time over bytes; softmax and layer norm share the floor, and their
    fractions are those of their block kernels while the rows fit in the L2 (the bytes of
    longer rows counted with their re-reads, kernels.py's Note [Rows that outgrow the L2];
    softmax's short rows, which run torch's warp kernel, left out)."""
    spec = SPECS[gpu]
    bw = spec.memory_bandwidth_gbs * 1e9
    by = {f: [r for r in rows if r.gpu == gpu and r.family == f]
          for f in ("element-wise", "softmax", "layer norm")}
    if not by["element-wise"]:
        return None
    xs = [_bytes(r) for r in by["element-wise"]]
    a, u = _line(xs, [r.measured for r in by["element-wise"]])
    fractions = []
    for family, kind in (("softmax", SOFTMAX), ("layer norm", LAYER_NORM)):
        group = [r for r in by[family]
                 if kind != SOFTMAX or r.dims[1] > WARP_SOFTMAX_ROW]
        counted = [_bytes(r) * (1 + REREAD[kind] * l2_miss(spec, kind, r.dims[1] * 4))
                   for r in group]
        slope = _slope(counted, [r.measured for r in group], a)
        fractions.append(1 / (slope * bw))
    return a * 1e6, 1 / (u * bw), fractions[0], fractions[1]


# A batched product's fit may take one whole kernel for every shape (`GemmFit.whole`: the
# tables' names show one cuBLAS kernel per board on the Pascal, Ampere and Ada boards) only when
# that fits its rows better by this much mean absolute error than the tiles cut to the shape;
# else the shape-cut tiles are kept (the T4's and V100's rows cannot tell the two apart).
WHOLE_MARGIN = 0.01


def fit_gemm(rows: list[Row], base: Calibration, kind: str,
             tiles: Iterable[tuple[int, int, int]] = TILES,
             wholes: Iterable[bool] = (False,)) -> GemmFit:
    """The tile and FP32 fraction that fit one GPU's rows of one kind ("bmm" or "linear") best
    (least mean absolute percentage error); with `wholes` (False, True) a whole kernel is
    also tried, and taken if it beats the best shape-cut tile by `WHOLE_MARGIN`."""
    group = [r for r in rows if r.family == kind]
    best: dict[bool, tuple[tuple[float, int], GemmFit]] = {}
    for tile, whole in itertools.product(tiles, wholes):
        def cal_with(fraction: float, tile: tuple[int, int, int] = tile,
                     whole: bool = whole) -> Calibration:
            fit = GemmFit(tile, fraction, whole)
            return replace(base, **{"bmm" if kind == "bmm" else "mm": fit})
        fraction = _golden(lambda f: _mape(group, cal_with(f)), 0.05, 1.2)
        fit = GemmFit(tile, round(fraction, 3), whole)
        err = _mape(group, cal_with(fit.fp32))
        # A tie (rows that never tell two tiles apart: the P4's 128 x 128 and 64 x 128) goes
        # to the smaller tile, which wastes less on a narrow product.
        key = (round(err, 4), tile[0] * tile[1])
        if whole not in best or key < best[whole][0]:
            best[whole] = (key, fit)
    if False in best and True in best:
        if best[True][0][0] < best[False][0][0] - WHOLE_MARGIN:
            return replace(best[True][1], cut=best[False][1].fp32)
        return best[False][1]
    return next(iter(best.values()))[1]


def fit_large_operand(rows: list[Row], cal: Calibration) -> Calibration:
    """On Pascal GPUs: the operand size (GB) beyond which products slow down and the most
    they slow down, refitted with the linear fraction (the rows that show it)."""
    group = [r for r in rows if r.family == "linear"]

    def by_size(base: Calibration, slowest: float, log_size: float) -> float:
        return _mape(group, replace(base, large_operand=(math.exp(log_size), slowest)))

    def by_limit(base: Calibration, size: float, slowest: float) -> float:
        return _mape(group, replace(base, large_operand=(size, slowest)))

    def by_fraction(base: Calibration, fraction: float) -> float:
        return _mape(group, replace(base, mm=GemmFit(base.mm.tile, fraction)))

    size, slowest = 1.0, 2.0
    for _ in range(3):
        size = math.exp(_golden(partial(by_size, cal, slowest), math.log(0.01), math.log(100)))
        slowest = _golden(partial(by_limit, cal, size), 1, 6)
        cal = replace(cal, large_operand=(round(size, 3), round(slowest, 2)))
        size, slowest = cal.large_operand
        fraction = _golden(partial(by_fraction, cal), 0.05, 1.2)
        cal = replace(cal, mm=GemmFit(cal.mm.tile, round(fraction, 3)))
    return cal


def fit_burst(rows: list[Row], cal: Calibration) -> Calibration:
    """On a board that `bursts`: how much faster its short batched products run than its
    sustained ones (calibration.py, Note [Short products on slot-powered boards]), fitted with
    the batched fraction again (least mean absolute percentage error)."""
    group = [r for r in rows if r.family == "bmm"]

    def by_burst(base: Calibration, burst: float) -> float:
        return _mape(group, replace(base, bmm=replace(base.bmm, burst=burst)))

    def by_fraction(base: Calibration, fraction: float) -> float:
        return _mape(group, replace(base, bmm=replace(base.bmm, fp32=fraction)))

    for _ in range(2):
        burst = round(_golden(partial(by_burst, cal), 1.0, 1.6), 2)
        cal = replace(cal, bmm=replace(cal.bmm, burst=burst))
        fraction = round(_golden(partial(by_fraction, cal), 0.05, 1.2), 3)
        cal = replace(cal, bmm=replace(cal.bmm, fp32=fraction))
    return cal


PASCAL = ("6.0", "6.1")


def fit_gpu(rows: list[Row], gpu: str, memory: tuple[float, float, float, float],
            tiles: dict[str, GemmFit] | None = None) -> Calibration:
    """One GPU's calibration from its rows (`memory`: its, or the rule's, memory constants).
    With `tiles` ({"bmm": ..., "linear": ...}: fits whose tiles, whole or not, are kept) only
    fractions are fitted."""
    mine = [r for r in rows if r.gpu == gpu]
    floor, bandwidth, softmax, layer_norm = memory
    stored = CALIBRATION.get(gpu)
    cal = Calibration(GemmFit((128, 128, 1), 0.5), GemmFit((128, 128, 1), 0.5),
                      round(bandwidth, 3), round(softmax, 3), round(layer_norm, 3),
                      round(floor, 1), stored.tflops if stored else {})
    for kind in ("linear", "bmm"):
        if not any(r.family == kind for r in mine):
            continue
        if tiles:
            fit = fit_gemm(mine, cal, kind, [tiles[kind].tile], [tiles[kind].whole])
            fit = replace(fit, cut=tiles[kind].cut)  # kept too (it was fitted over every tile)
        else:  # only batched products are tried as one whole kernel
            fit = fit_gemm(mine, cal, kind, TILES, (False, True) if kind == "bmm" else (False,))
        cal = replace(cal, **{"bmm" if kind == "bmm" else "mm": fit})
    if bursts(SPECS[gpu]) and any(r.family == "bmm" for r in mine):
        cal = fit_burst(mine, cal)
    if SPECS[gpu].compute_capability in PASCAL:
        cal = fit_large_operand(mine, cal)
    return cal


# --- the rule for a GPU without rows -----------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """Constants for a GPU from its specifications, fitted on other GPUs' calibrations:
    achieved FP32 fraction = min(ceiling, watts_per_... power cap), memory fractions and the
    alone floor as the mean of theirs, the tiles of the GPU nearest in compute capability."""

    ceiling: dict[str, float]  # "mm"/"bmm": the fraction a GPU with power to spare reaches
    gflops_per_watt: dict[str, float]  # "mm"/"bmm": what a watt of board power sustains
    bandwidth: float
    softmax: float
    layer_norm: float
    alone_floor_us: float
    tiles_from: dict[str, Calibration]  # compute capability -> calibration (its tiles)

    def fraction(self, kind: str, gpu: str) -> float:
        spec = SPECS[gpu]
        cap = self.gflops_per_watt[kind] * spec.board_power_w / (spec.fp32_tflops * 1e3)
        return min(self.ceiling[kind], cap)

    def calibration(self, gpu: str, memory_only: Calibration | None = None) -> Calibration:
        """A full calibration for `gpu` by the rule (or `memory_only`'s products with the
        rule's memory constants)."""
        spec = SPECS[gpu]
        if memory_only is not None:
            return replace(memory_only, bandwidth=self.bandwidth, softmax=self.softmax,
                           layer_norm=self.layer_norm, alone_floor_us=self.alone_floor_us)
        cc = float(spec.compute_capability)
        near = min(self.tiles_from, key=lambda c: (abs(float(c) - cc), -float(c)))
        ref = self.tiles_from[near]
        stored = CALIBRATION.get(gpu)
        return Calibration(GemmFit(ref.mm.tile, round(self.fraction("mm", gpu), 3)),
                           GemmFit(ref.bmm.tile, round(self.fraction("bmm", gpu), 3)),
                           self.bandwidth, self.softmax, self.layer_norm, self.alone_floor_us,
                           stored.tflops if stored else {})


def fit_rule(cals: dict[str, Calibration], measured_memory: Iterable[str]) -> Rule:
    """The rule, fitted on these GPUs' calibrations (least mean |log| error of the FP32
    fractions; means of the memory constants of the GPUs in `measured_memory`)."""
    memory = [cals[g] for g in measured_memory]
    ceiling, per_watt = {}, {}
    for kind in ("mm", "bmm"):
        have = {g: getattr(c, kind).fp32 for g, c in cals.items()}
        best = None
        for ceil_ in [0.5 + 0.01 * i for i in range(56)]:
            for w in [20 + 1.0 * i for i in range(121)]:
                err = 0.0
                for g, f in have.items():
                    spec = SPECS[g]
                    guess = min(ceil_, w * spec.board_power_w / (spec.fp32_tflops * 1e3))
                    err += abs(math.log(guess / f))
                if best is None or err < best[0]:
                    best = (err, ceil_, w)
        assert best is not None
        ceiling[kind], per_watt[kind] = round(best[1], 2), best[2]
    mean = statistics.fmean
    return Rule(ceiling, per_watt, round(mean(c.bandwidth for c in memory), 3),
                round(mean(c.softmax for c in memory), 3),
                round(mean(c.layer_norm for c in memory), 3),
                round(mean(c.alone_floor_us for c in memory), 1),
                {SPECS[g].compute_capability: c for g, c in cals.items()})


def fit(rows: list[Row], gpus: Iterable[str] | None = None, keep_tiles: bool = False
        ) -> tuple[dict[str, Calibration], Rule]:
    """Calibrations of `gpus` (every GPU in the rows by default), each from its own rows
    (memory constants by the rule where it has no memory-bound rows), and the rule fitted on
    them. `keep_tiles` keeps the stored tiles (fast: fractions only)."""
    gpus = [g for g in DEVICES.values() if g in set(gpus or DEVICES.values())]
    memory = {g: fit_memory(rows, g) for g in gpus}
    known = [m for m in memory.values() if m is not None]
    mean = tuple(statistics.fmean(m[i] for m in known) for i in range(4))
    cals = {}
    for g in gpus:
        tiles = None
        if keep_tiles and g in CALIBRATION:
            tiles = {"linear": CALIBRATION[g].mm, "bmm": CALIBRATION[g].bmm}
        cals[g] = fit_gpu(rows, g, memory[g] or mean, tiles)
    rule = fit_rule(cals, [g for g in gpus if memory[g] is not None])
    for g in gpus:
        if memory[g] is None:
            cals[g] = rule.calibration(g, memory_only=cals[g])
    return cals, rule


def held_out(rows: list[Row], keep_tiles: bool = True) -> tuple[list[Score], Rule]:
    """NeuSight's protocol: fit on TRAIN only, score HELD_OUT with the rule's constants."""
    cals, rule = fit([r for r in rows if r.gpu in TRAIN], TRAIN, keep_tiles)
    return table(rows, rule.calibration, HELD_OUT), rule


# --- the datasheet rule, and leaving each measured board out (issue 40) -------------------------

def _grid(lo: float, hi: float, n: int) -> list[float]:
    return [round(lo + (hi - lo) * i / (n - 1), 4) for i in range(n)]


def _least_log(guess: Callable[[str, tuple], float], grids: list[list[float]],
               target: dict[str, float]) -> tuple:
    """The grid point with the least sum of |log(guess / target)| over the target's boards."""
    best: tuple[float, tuple] | None = None
    for point in itertools.product(*grids):
        err = sum(abs(math.log(guess(g, point) / t)) for g, t in target.items())
        if best is None or err < best[0]:
            best = (err, point)
    assert best is not None
    return best[1]


def fit_datasheet_rule(cals: dict[str, Calibration], measured_memory: Iterable[str]
                       ) -> DatasheetRule:
    """The datasheet rule (calibration.py, Note [The datasheet rule]) fitted on these boards'
    own calibrations; memory constants from the boards in `measured_memory`."""
    # A batched fit's whole kernel counts the work its wasted tile does; the estimate reads
    # every board's fraction with tiles cut to the shape, one measure on every board.
    target = {g: math.sqrt(c.mm.fp32 * (c.bmm.cut or c.bmm.fp32)) for g, c in cals.items()}

    def power(g: str, p: tuple) -> float:
        s = SPECS[g]
        wide = s.fp32_lanes_per_scheduler >= 32
        return min(p[1] if wide else p[0], p[2] * (12.0 / s.process_nm) ** p[3]
                   * s.board_power_w / (s.fp32_tflops * 1e3))

    def clock(g: str, p: tuple) -> float:
        s = SPECS[g]
        wide = s.fp32_lanes_per_scheduler >= 32
        return (p[1] if wide else p[0]) * (s.base_clock_mhz / s.boost_clock_mhz) ** (1 - p[2])

    pw = _least_log(power, [_grid(0.5, 1.0, 11), _grid(0.5, 1.0, 11), _grid(40, 80, 21),
                            _grid(0, 2, 21)], target)
    ck = _least_log(clock, [_grid(0.5, 1.1, 13), _grid(0.4, 1.1, 15), _grid(0, 1, 21)], target)
    rule = DatasheetRule((pw[0], pw[1]), pw[2], pw[3], (ck[0], ck[1]), ck[2], 1.0, 1.0, 0.0,
                         0.0, 0.0, 0.0)
    est = {g: rule.fp32_fraction(SPECS[g]) for g in cals}
    mm = math.exp(statistics.fmean(math.log(c.mm.fp32 / est[g]) for g, c in cals.items()))
    bmm = math.exp(statistics.fmean(math.log(c.bmm.fp32 / est[g]) for g, c in cals.items()))
    memory = [g for g in measured_memory if g in cals]

    def ratio(field: str) -> float:
        return round(statistics.fmean(getattr(cals[g], field) / cals[g].bandwidth
                                      for g in memory), 3)

    # Batched products on boards with more bandwidth per FLOP than the median (calibration.py,
    # See Note [Batched products and memory bandwidth]): the exponent through (median, bmm).
    balances = [flops_per_byte(SPECS[g]) for g in cals]
    balance = (round(min(balances), 3), round(statistics.median(balances), 3))
    xs = [min(0.0, math.log(b / balance[1])) for b in balances]
    ys = [math.log(c.bmm.fp32 / est[g] / round(bmm, 3)) for g, c in cals.items()]
    sxx = sum(x * x for x in xs)
    exponent = -sum(x * y for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return replace(rule, mm=round(mm, 3), bmm=round(bmm, 3), balance=balance,
                   balance_exponent=round(exponent, 3),
                   bandwidth=round(statistics.fmean(cals[g].bandwidth for g in memory), 3),
                   softmax=ratio("softmax"), layer_norm=ratio("layer_norm"),
                   alone_floor_us=round(statistics.fmean(cals[g].alone_floor_us
                                                         for g in memory), 1))


# The boards with memory-bound rows (the H100 has products only).
MEMORY_MEASURED = tuple(g for g in MEASURED if g != "H100")


def leave_one_out(rows: list[Row]) -> tuple[list[Score], dict[str, Calibration]]:
    """Each measured board scored with the datasheet rule fitted on the other seven's own
    calibrations (each fitted on that board's rows only), and the calibrations it got."""
    scores, got = [], {}
    for out in MEASURED:
        others = {g: CALIBRATION[g] for g in MEASURED if g != out}
        rule = fit_datasheet_rule(others, [g for g in MEMORY_MEASURED if g != out])
        cal = from_datasheet(SPECS[out], rule, others, CALIBRATION[out].tflops)
        got[out] = cal
        scores += table(rows, lambda _g, cal=cal: cal, [out])
    return scores, got


def loo_ratios(rows: list[Row], got: dict[str, Calibration]) -> list[tuple[Row, float]]:
    """(row, model / measured) of every row of a measured board, with its left-out constants."""
    return [(r, predict(r, got[r.gpu]).alone / r.measured) for r in rows if r.gpu in got]


# --- bands: how far the model is from the measured kernels of a size (issue 40) -----------------

def size_bucket(row: Row, kernel: Kernel) -> tuple[str, int]:
    """(kind, decade) of a row: products by log10 of their FLOPs, the rest by log10 of bytes."""
    if row.family in ("bmm", "linear"):
        return "matrix product", int(math.floor(math.log10(max(kernel.flops, 1))))
    kind = {"softmax": SOFTMAX, "layer norm": LAYER_NORM}.get(row.family, ELEMENTWISE)
    return kind, int(math.floor(math.log10(max(kernel.nbytes, 1))))


def bands(pairs: Iterable[tuple[Row, float]], cal_for: Callable[[str], Calibration],
          share: float = 0.9) -> dict[tuple[str, int], tuple[float, float, int]]:
    """(lo, hi, rows) of model / measured holding the middle `share` of each bucket's rows."""
    groups: dict[tuple[str, int], list[float]] = {}
    for row, ratio in pairs:
        groups.setdefault(size_bucket(row, predict(row, cal_for(row.gpu))), []).append(ratio)
    out = {}
    tail = (1 - share) / 2
    for key, rs in sorted(groups.items()):
        rs.sort()
        lo = rs[int(tail * (len(rs) - 1))]
        hi = rs[int(round((1 - tail) * (len(rs) - 1)))]
        out[key] = (round(lo, 2), round(hi, 2), len(rs))
    return out
