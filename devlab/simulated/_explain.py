"""`explain(fn)`: where the modeled time of some GPU work goes, op by op.

Each kernel's modeled time is its launch latency plus the longer of compute (FLOPs over the
GPU's peak) and memory traffic (bytes over its bandwidth); copies cost their bytes over the
host link or between GPUs. The breakdown says which of the three limits each op.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from html import escape
from typing import Any

from devlab.sizes import format_bytes

from . import _session
from ._clock import record
from ._roofline import COMPUTE, LAUNCH, MEMORY, OpTime


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.2f} µs"


@dataclasses.dataclass
class Explanation:
    """The modeled kernels and copies of some work on modeled GPUs, with their breakdown."""

    gpu: str  # the full name of the GPU modeled
    ops: list[OpTime]
    result: Any = None

    @property
    def total(self) -> float:
        """Seconds, one op after the other (launch + the longer of compute and memory each)."""
        return sum(op.total for op in self.ops)

    @property
    def bound(self) -> str:
        """What limits the work as a whole: the part with the largest share of the time."""
        if not self.ops:
            return LAUNCH
        parts = self.parts()
        return max(parts, key=parts.__getitem__)

    def parts(self) -> dict[str, float]:
        """Seconds spent launching, and busy computing or moving memory (the longer of the
        two per op)."""
        launch = sum(op.launch + op.sync for op in self.ops)
        compute = sum(op.work for op in self.ops if op.compute >= op.memory and op.work)
        memory = sum(op.work for op in self.ops if op.memory > op.compute)
        return {LAUNCH: launch, COMPUTE: compute, MEMORY: memory}

    @property
    def note(self) -> str:
        return f"Modeled from {self.gpu} specifications, not measured."

    def rows(self) -> list[list[str]]:
        return [[op.op, f"GPU:{op.device}", _us(op.launch + op.sync), _us(op.compute),
                 _us(op.memory), _us(op.total), op.bound, f"{op.flops:,}", format_bytes(op.nbytes)]
                for op in self.ops]

    HEADERS = ("op", "device", "launch (+ host wait)", "compute", "memory or link", "total",
               "limited by", "FLOPs", "bytes")

    def __str__(self) -> str:
        lines = [" | ".join(self.HEADERS)] + [" | ".join(r) for r in self.rows()]
        lines.append(f"total {_us(self.total)}: {self.bound}. {self.note}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{escape(h)}</th>" for h in self.HEADERS)
        body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>"
                       for r in self.rows())
        return (f"<table class='devlab-explain'><thead><tr>{head}</tr></thead><tbody>{body}"
                f"</tbody></table><p>Total {escape(_us(self.total))}, {escape(self.bound)}. "
                f"<i>{escape(self.note)}</i></p>")


def explain(fn: Callable[[], Any]) -> Explanation:
    """Run `fn()` on the modeled GPUs and break its modeled time down, op by op."""
    result, ops = record(fn)
    sess = _session.session
    spec = sess.spec if sess is not None else None
    return Explanation(spec.full_name if spec is not None else "?", ops, result)
