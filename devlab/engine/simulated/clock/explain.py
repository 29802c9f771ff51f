"""`explain(fn)`: where the modeled time of some GPU work goes, op by op.

Each kernel costs the host its launch latency; on the GPU it costs a fixed floor plus the
longer of compute (whole waves of output tiles at the GPU's achieved rate) and memory traffic
(bytes at the achieved bandwidth of its kind of kernel); copies cost their bytes over the host
link or between GPUs (`devlab.gpu_model`). The breakdown says which limits each op, and beside
the queued time the clock charges it shows what the same op would show timed alone with CUDA
events on an idle GPU: the two ways of timing.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from html import escape
from typing import Any

from devlab._helpers.sizes import format_bytes
from devlab.engine.gpu_model import ALONE, QUEUED
from devlab.engine.gpu_model.links import Topology, nccl_topology, topologies
from devlab.engine.simulated.clock.modeled_clock import record
from devlab.engine.simulated.clock.roofline import COMPUTE, LAUNCH, MEMORY, OpTime


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.2f} µs"


def _achieved(op: OpTime) -> str:
    """The rate this op runs at: achieved TFLOPS of a product, or the bandwidth this op gets
    at its size (the bandwidth curve: below the achieved peak for small ones)."""
    k = op.kernel
    if k is None:
        return f"{op.nbytes / op.memory / 1e9:,.1f} GB/s link" if op.memory else ""
    if op.compute >= op.memory and k.achieved_tflops:
        return f"{k.achieved_tflops:.3g} TFLOPS"
    return f"{k.bandwidth_gbs:,.0f} of {k.achieved_gbs:,.0f} GB/s"


def _waves(op: OpTime) -> str:
    k = op.kernel
    if k is None or not k.waves:
        return ""
    return f"{k.waves} × {k.slots} tiles (last {k.last_wave:.0%} full)"


@dataclasses.dataclass
class Explanation:
    """The modeled kernels and copies of some work on modeled GPUs, with their breakdown."""

    gpu: str  # the full name of the GPU modeled
    ops: list[OpTime]
    result: Any = None
    timing: str = QUEUED  # what the times are: ops queued back to back
    machine: str = ""  # the topology the GPUs' collectives are timed on, in one line

    @property
    def total(self) -> float:
        """Seconds, one op after the other (launch + floor + the longer of compute and memory
        each): the queue's time when nothing overlaps."""
        return sum(op.total for op in self.ops)

    @property
    def alone(self) -> float:
        """Seconds if each kernel were timed alone with CUDA events on an idle GPU (its alone
        floor + work), copies as queued: the sum a per-op profile of single ops shows."""
        return sum(op.alone if op.alone is not None else op.total for op in self.ops)

    @property
    def bound(self) -> str:
        """What limits the work as a whole: the part with the largest share of the time."""
        if not self.ops:
            return LAUNCH
        parts = self.parts()
        return max(parts, key=parts.__getitem__)

    def parts(self) -> dict[str, float]:
        """Seconds spent launching (and each kernel's floor), and busy computing or moving
        memory (the longer of the two per op)."""
        launch = sum(op.launch + op.sync + op.floor for op in self.ops)
        compute = sum(op.work for op in self.ops if op.compute >= op.memory and op.work)
        memory = sum(op.work for op in self.ops if op.memory > op.compute)
        return {LAUNCH: launch, COMPUTE: compute, MEMORY: memory}

    @property
    def note(self) -> str:
        return f"Modeled from {self.gpu} specifications, not measured. Times: {self.timing}."

    def rows(self) -> list[list[str]]:
        return [[op.op, f"GPU:{op.device}", _us(op.launch + op.sync), _us(op.gpu),
                 _us(op.compute), _us(op.memory), op.bound, _achieved(op), _waves(op),
                 _us(op.alone) if op.alone is not None else "", f"{op.flops:,}",
                 format_bytes(op.nbytes)]
                for op in self.ops]

    HEADERS = ("op", "device", "launch (+ host wait)", "GPU (floor + work)", "compute",
               "memory or link", "limited by", "achieved", "waves", "alone (CUDA events)",
               "FLOPs", "bytes")

    def __str__(self) -> str:
        lines = [" | ".join(self.HEADERS)] + [" | ".join(r) for r in self.rows()]
        lines.append(f"total {_us(self.total)} queued ({_us(self.alone)} if each op were "
                     f"timed alone): {self.bound}. {self.note}")
        if self.machine:
            lines.append(self.machine)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{escape(h)}</th>" for h in self.HEADERS)
        body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>"
                       for r in self.rows())
        return (f"<table class='devlab-explain'><thead><tr>{head}</tr></thead><tbody>{body}"
                f"</tbody></table><p>Total {escape(_us(self.total))} queued "
                f"({escape(_us(self.alone))} if each op were timed alone: {escape(ALONE)}), "
                f"{escape(self.bound)}. <i>{escape(self.note)}</i></p>"
                + (f"<p>{escape(self.machine)}</p>" if self.machine else ""))


def explain(fn: Callable[[], Any]) -> Explanation:
    """Run `fn()` on the modeled GPUs and break its modeled time down, op by op."""
    rec = record(fn)
    return Explanation(rec.spec.full_name, rec.ops, rec.result,
                       machine=machine(rec.spec, rec.topology))


def machine(spec: Any, topology: Topology) -> str:
    """One line naming the machine the modeled GPUs' collectives are timed in (through host
    memory where this process's NCCL_P2P_DISABLE=1 turns peer-to-peer off, as the clock does)."""
    staged = nccl_topology(topology, spec, dict(os.environ))
    if staged.key != topology.key:
        return (f"Collectives: {staged.name} ({staged.key}: NCCL_P2P_DISABLE=1 turns the "
                f"{topology.key} machine's peer-to-peer off).")
    sold = topologies(spec)
    others = [t.key for t in sold if t.key != topology.key]
    which = (f"the {spec.name}'s default" if topology.key == sold[0].key else
             f"chosen; the {spec.name}'s default is {sold[0].key}")
    return (f"Collectives: {topology.name} ({topology.key}, {which}"
            + (f"; also sold in {', '.join(others)}" if others and topology.key == sold[0].key
               else "") + ").")
