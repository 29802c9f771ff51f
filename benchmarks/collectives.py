"""The collective model against published NCCL measurements (docs/gpu-models.md, "Collectives").

Run: .venv/bin/python benchmarks/collectives.py [--markdown] [--docs]

Prints, with nothing run on a GPU (every model figure is modeled, not measured), each row of
`benchmarks/data/collectives/measurements.csv` beside the model's figure for the same
collective, size, GPU count and topology: nccl-tests' bus bandwidth for messages of 1 MB and
more (the target: within 20 %), the time for tiny ones (the latency floor: within 2x). The
model never reads the measurements.

`--markdown` prints the tables docs/gpu-models.md shows (between its `collectives-*` markers),
`--docs` writes them there.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devlab.engine.gpu_model import (  # noqa: E402
    SPECS,
    collective_time,
    data_parallel_step,
    topologies,
    topology,
)
from devlab.engine.gpu_model.collectives import CollectiveTime  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "collectives" / "measurements.csv"
TARGET = 0.20  # bus bandwidth within 20 % for 1 MB and more
SMALL_TARGET = 2.0  # the latency floor within 2x
UNSTATED = 1 << 30  # where a source gives only its largest figure, the size it is taken at


@dataclass(frozen=True)
class Measured:
    """One published measurement (a row of measurements.csv)."""

    source: str
    url: str
    setup: str
    hardware: str
    gpu: str
    topology: str
    op: str
    ranks: int
    nbytes: int
    stated: bool  # the source states the size (else the largest, evaluated at 1 GiB)
    busbw_gbs: float | None
    time_us: float | None
    row: str
    role: str


@dataclass(frozen=True)
class Compared:
    measured: Measured
    model: CollectiveTime

    @property
    def error(self) -> float:
        """(model - measured) / measured: of the bus bandwidth, or of the time for `small`
        rows."""
        m = self.measured
        if m.role == "small":
            return self.model.seconds * 1e6 / m.time_us - 1.0  # type: ignore[operator]
        return self.model.busbw_gbs / m.busbw_gbs - 1.0  # type: ignore[operator]

    @property
    def counted(self) -> bool:
        """A row the 20 % target applies to (1 MB or more, NCCL's default settings)."""
        return not self.measured.role.startswith("band") and self.measured.role != "small"

    @property
    def meets(self) -> bool:
        if self.measured.role == "small":
            return 1 / SMALL_TARGET <= 1 + self.error <= SMALL_TARGET
        if self.measured.role.startswith("band"):
            return True
        return abs(self.error) <= TARGET


def _number(text: str) -> float | None:
    return float(text) if text.strip() else None


def load(path: Path = DATA) -> list[Measured]:
    with path.open(newline="", encoding="utf-8") as f:
        return [Measured(r["source"], r["url"], r["setup"], r["hardware"], r["gpu"],
                         r["topology"], r["op"], int(r["ranks"]),
                         int(r["nbytes"] or UNSTATED), bool(r["nbytes"]),
                         _number(r["busbw_gbs"]), _number(r["time_us"]), r["row"], r["role"])
                for r in csv.DictReader(f)]


def compare(rows: list[Measured] | None = None) -> list[Compared]:
    out = []
    for m in rows if rows is not None else load():
        topo = topology(m.topology)
        if m.gpu in SPECS:  # the GPU must be sold in that machine
            assert topo in topologies(m.gpu), (m.gpu, m.topology)
        out.append(Compared(m, collective_time(m.op, m.nbytes, m.ranks, topo)))
    return out


def _who(m: Measured) -> str:
    same = m.hardware.replace(" ", "-").lower() == m.gpu.lower()
    shown = m.hardware if same else f"{m.hardware} (as {m.gpu})"
    return f"{m.ranks} x {shown}, `{m.topology}`"


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def markdown(compared: list[Compared]) -> str:
    """The model beside each measurement of 1 MB and more (docs' `collectives-table`)."""
    lines = ["| source | GPUs, topology | op, size | measured busbw | model busbw | error | "
             "model's choice | row use |", "|---|---|---|---|---|---|---|---|"]
    for c in compared:
        m, t = c.measured, c.model
        if m.role == "small":
            continue
        mark = "" if c.meets else " **misses the target**"
        use = "checked" if m.role == "check" else m.role
        size = _size(m.nbytes) if m.stated else "largest (not stated)"
        lines.append(f"| [{m.source}] | {_who(m)} | {m.op}, "
                     f"{size} | {m.busbw_gbs:g} GB/s | {t.busbw_gbs:.1f} GB/s | "
                     f"{c.error * 100:+.1f} %{mark} | {t.algorithm}/{t.protocol} | {use} |")
    return "\n".join(lines)


def small_markdown(compared: list[Compared]) -> str:
    """Tiny messages: the measured time beside the model's latency (docs' `collectives-small`)."""
    lines = ["| source | GPUs, topology | op, size | measured | model | model / measured |",
             "|---|---|---|---|---|---|"]
    for c in compared:
        m, t = c.measured, c.model
        if m.role != "small":
            continue
        lines.append(f"| [{m.source}] | {_who(m)} | {m.op}, "
                     f"{_size(m.nbytes)} | {m.time_us:g} µs | {t.seconds * 1e6:.1f} µs | "
                     f"{1 + c.error:.2f} |")
    return "\n".join(lines)


def choices_markdown() -> str:
    """What NCCL's tuning model picks by size, per topology (docs' `collectives-choice`)."""
    cases = [("pcie3-host", 2), ("pcie4-p2p", 4), ("nvlink3-4gpu", 4), ("nvswitch-a100", 8),
             ("nvswitch-h100", 8)]
    sizes = [1 << e for e in (3, 10, 16, 20, 22, 24, 26, 30)]
    lines = ["| all_reduce on | " + " | ".join(_size(s) for s in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for key, ranks in cases:
        cells = []
        for s in sizes:
            t = collective_time("all_reduce", s, ranks, key)
            bw = f"{t.busbw_gbs:.3g} GB/s" if t.busbw_gbs >= 0.01 else "~0 GB/s"
            cells.append(f"{t.protocol}, {t.seconds * 1e6:,.0f} µs, {bw}")
        lines.append(f"| {ranks} GPUs, `{key}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- data-parallel steps: ResNet-50 training throughput on 1 to 8 GPUs ------------------------

# [lambda] lambdal/deeplearning-benchmark, pytorch/pytorch-train-throughput-fp32.csv (commit
# 0551cb70ffdc155dc4cb2c10dddebb65651c3883), column resnet50 (images/s), and
# pytorch/pytorch-train-bs-fp32.csv (commit 08d77c41c42f48de5598b48c77f3fbd1b6252348): 640
# images per GPU on the A100 80GB boards. (row name, GPUs, images/s)
LAMBDA_RESNET50 = {
    "A100 80GB SXM4": ("A100-80GB", 640, {1: 1066.0, 2: 2029.0, 4: 4042.0, 8: 7397.0}),
    "A100 80GB PCIe": ("A100-PCIe-80GB", 640, {1: 1014.0, 2: 1957.0}),
}
# [dle-rn50] NVIDIA/DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md
# (commit 291f0d02e815b148fa5c2b81bf07aa3552142895), "Training performance: NVIDIA DGX A100 (8x
# A100 80GB)", pytorch-21.03 container: images/s on 1 and 8 GPUs; 256 images per GPU for both
# precisions (ConvNets/configs.yml, commit 097c7ff917b7c56246590b1246a8f5bd8957c534). Mixed
# precision keeps FP32 parameters, so its gradients are FP32 too (torch.cuda.amp).
NVIDIA_RESNET50 = {
    "DGX A100, TF32": ("A100-80GB", 256, {1: 938.0, 8: 7248.0}),
    "DGX A100, mixed precision": ("A100-80GB", 256, {1: 2470.0, 8: 16621.0}),
}
RESNET50_SOURCES = {"lambda": LAMBDA_RESNET50, "dle-rn50": NVIDIA_RESNET50}
RESNET50_PARAMETERS = 25_557_032  # torchvision's resnet50 (weights' "num_params")
GRADIENT_TENSORS = 161  # its parameter tensors


@dataclass(frozen=True)
class Scaling:
    source: str  # the reference its measurements come from
    board: str
    gpu: str
    ranks: int
    topology: str
    measured: float  # images/s on `ranks` GPUs
    one: float  # images/s on one GPU, measured
    step: object  # the model's StepTime

    @property
    def modeled(self) -> float:
        return self.ranks * self.one * (self.step.forward + self.step.backward) / self.step.seconds


def scaling_rows() -> list[Scaling]:
    """Each multi-GPU row's throughput as the step model predicts it from the one-GPU row: the
    one-GPU step (batch / images per second) is the compute, a third forward and two thirds
    backward, with ResNet-50's FP32 gradients ready evenly through the backward pass and
    all-reduced as DDP does on the board's default machine."""
    out = []
    for source, board, (gpu, batch, measured) in (
            (source, board, row) for source, rows in RESNET50_SOURCES.items()
            for board, row in rows.items()):
        step = batch / measured[1]
        backward = 2 * step / 3
        per = RESNET50_PARAMETERS * 4 // GRADIENT_TENSORS
        grads = [((i + 1) / GRADIENT_TENSORS * backward, per) for i in range(GRADIENT_TENSORS)]
        topo = topologies(gpu)[0].key
        for ranks, value in measured.items():
            if ranks == 1:
                continue
            modeled = data_parallel_step(grads, ranks, topo, forward=step / 3, backward=backward)
            out.append(Scaling(source, board, gpu, ranks, topo, value, measured[1], modeled))
    return out


def scaling_markdown() -> str:
    lines = ["| board | GPUs, topology | measured images/s (scaling) | model images/s "
             "(scaling) | all-reduce time, hidden | model / measured |", "|---|---|---|---|---|---|"]
    for r in scaling_rows():
        n = r.ranks * r.one
        lines.append(f"| {r.board} [{r.source}] | {r.ranks}, `{r.topology}` | {r.measured:,.0f} "
                     f"({r.measured / n:.3f}) | {r.modeled:,.0f} ({r.modeled / n:.3f}) | "
                     f"{r.step.communication * 1e3:.1f} ms, {r.step.hidden:.0%} | "
                     f"{r.modeled / r.measured:.2f} |")
    return "\n".join(lines)


def sections(compared: list[Compared] | None = None) -> dict[str, str]:
    compared = compared if compared is not None else compare()
    return {"collectives-table": markdown(compared),
            "collectives-small": small_markdown(compared),
            "collectives-choice": choices_markdown(),
            "collectives-ddp": scaling_markdown()}


def main() -> None:
    compared = compare()
    found = sections(compared)
    if "--docs" in sys.argv:
        doc = Path(__file__).resolve().parents[1] / "docs" / "gpu-models.md"
        text = doc.read_text(encoding="utf-8")
        for name, table in found.items():
            head, rest = text.split(f"<!-- {name}:start -->")
            _, tail = rest.split(f"<!-- {name}:end -->")
            text = f"{head}<!-- {name}:start -->\n{table}\n<!-- {name}:end -->{tail}"
        doc.write_text(text, encoding="utf-8")
        print(f"wrote {len(found)} tables into {doc}")
        return
    if "--markdown" in sys.argv:
        for name, text in found.items():
            print(f"<!-- {name}:start -->\n{text}\n<!-- {name}:end -->\n")
        return
    for c in compared:
        m, t = c.measured, c.model
        if m.role == "small":
            what = f"time {m.time_us:g} µs, model {t.seconds * 1e6:.1f} µs"
        else:
            what = f"busbw {m.busbw_gbs:g} GB/s, model {t.busbw_gbs:.1f} GB/s"
        print(f"{m.source:15} {m.ranks} x {m.gpu:15} {m.topology:15} {m.op:15} "
              f"{_size(m.nbytes):>8}  {what}  {c.error * 100:+6.1f} %  "
              f"{t.algorithm}/{t.protocol}  [{m.role}]{'' if c.meets else '  MISSES'}")
    counted = [c for c in compared if c.counted]
    print(f"{sum(c.meets for c in counted)} of {len(counted)} rows of 1 MB and more within "
          f"{TARGET:.0%}; worst {max(abs(c.error) for c in counted):.1%}")
    print("Every model figure is modeled (devlab.gpu_model), not measured.")


if __name__ == "__main__":
    main()
