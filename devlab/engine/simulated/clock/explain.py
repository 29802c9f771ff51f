"""`explain(fn)`: where the modeled time of some GPU work goes, op by op.

Each kernel costs the host its launch latency; on the GPU it costs a fixed floor plus the
longer of compute (whole waves of output tiles at the GPU's achieved rate) and memory traffic
(bytes at the achieved bandwidth of its kind of kernel); copies cost their bytes over the host
link or between GPUs (`devlab.gpu_model`). The breakdown says which limits each op, and beside
the queued time the clock charges it shows what the same op would show timed alone with CUDA
events on an idle GPU: the two ways of timing. Each kernel also gets its band
(`devlab.engine.gpu_model.band`): how far the model was from measured kernels of its kind and size,
and whether its board, dtype or size lies outside what the model was fitted on. Where a GPU stood idle until the host launched
its next work (an input stall, a sleep, the host's Python between launches), the wait is
listed before that op when it is a stall (`STALL` or longer) and summed for all.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from html import escape
from typing import Any

from devlab._helpers.sizes import format_bytes
from devlab.engine.gpu_model import ALONE, CALIBRATION, QUEUED
from devlab.engine.gpu_model.band import Band, band
from devlab.engine.gpu_model.kernels import COMPUTE, LAUNCH, MEMORY
from devlab.engine.gpu_model.links import Topology, nccl_topology, topologies
from devlab.engine.gpu_model.modeled_clock import COPY_SPAN, KERNEL, WAIT_HOST, OpTime
from devlab.engine.simulated.clock.charges import Recording, record


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.2f} µs"


def _achieved(op: OpTime) -> str:
    """The rate this op runs at: achieved TFLOPS of a product, or the bandwidth this op gets
    at its size (the bandwidth curve: below the achieved peak for small ones)."""
    k = op.kernel
    if k is None:
        return f"{op.nbytes / op.memory / 1e9:,.1f} GB/s link" if op.memory else ""
    if op.compute >= op.memory and k.achieved_tflops:
        how = ("" if k.clock == 1.0 else
               f" ({'short' if k.clock > 1 else 'sustained'} on a slot-powered board: "
               f"{k.clock:.2f}x its fitted rate)")
        return f"{k.running_tflops:.3g} TFLOPS{how}"
    return f"{k.bandwidth_gbs:,.0f} of {k.achieved_gbs:,.0f} GB/s"


def _waves(op: OpTime) -> str:
    k = op.kernel
    if k is None or not k.waves:
        return ""
    return f"{k.waves} × {k.slots} tiles (last {k.last_wave:.0%} full)"


def _fp32(op: OpTime, spec: Any) -> bool:
    """Whether a product ran at the FP32 rate (the measured tables' dtype); memory-bound
    kernels' bytes are measured alike in every dtype."""
    k = op.kernel
    cal = CALIBRATION.get(getattr(spec, "name", ""))
    if k is None or k.achieved_tflops is None or cal is None:
        return True
    return any(abs(k.achieved_tflops - f.fp32 * spec.fp32_tflops) < 1e-6
               for f in (cal.mm, cal.bmm))


def _band(op: OpTime, spec: Any) -> Band | None:
    if op.kernel is None or spec is None or getattr(spec, "name", None) not in CALIBRATION:
        return None
    return band(op.kernel, spec, _fp32(op, spec))


# A wait for the host this long gets its own row: far longer than any launch (4 µs) or the
# gap a host-bound loop of small ops leaves between kernels, so it is the program's own
# stall (a data loader, a sleep, host work between steps), not the launches'.
STALL = 100e-6


@dataclasses.dataclass
class Explanation:
    """The modeled kernels and copies of some work on modeled GPUs, with their breakdown."""

    gpu: str  # the full name of the GPU modeled
    ops: list[OpTime]
    result: Any = None
    timing: str = QUEUED  # what the times are: ops queued back to back
    machine: str = ""  # the topology the GPUs' collectives are timed on, in one line
    spec: Any = None  # the GpuSpec modeled: each kernel's band (devlab.engine.gpu_model.band)
    # (op position, GPU, seconds): the GPU idle until the host launched ops[position]
    waits: list[tuple[int, int, float]] = dataclasses.field(default_factory=list)

    @property
    def waited_for_host(self) -> float:
        """Seconds the GPUs stood idle waiting for the host's launches (summed over GPUs)."""
        return sum(w for _, _, w in self.waits)

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

    def bands(self) -> list[Band | None]:
        """Each op's band: how far the model was from measured kernels like it."""
        return [_band(op, self.spec) for op in self.ops]

    @property
    def band(self) -> str:
        """Where the model stops, in one line: the widest band of these ops' kernels, and why
        (a board, dtype or size outside what the model was fitted on)."""
        found = [b for b in self.bands() if b is not None]
        if not found:
            return ""
        lo, hi = min(b.lo for b in found), max(b.hi for b in found)
        widest = max(found, key=lambda b: (b.hi / b.lo, bool(b.outside)))
        reasons = sorted({part for b in found if b.outside for part in b.outside.split("; ")})
        where = ("modeled from the datasheet; kernels of these sizes measured on boards like it"
                 if not widest.measured_board else
                 "outside what this board's measured kernels cover; kernels of these sizes "
                 "measured on boards the model was not fitted on" if reasons else
                 "fitted on this board's own measured kernels; kernels of these sizes")
        why = f" ({'; '.join(reasons)})" if reasons else ""
        return (f"Band: {where} were within {lo:.2f}x to {hi:.2f}x of the model (90 % of each "
                f"kind and size){why}.")

    def rows(self) -> list[list[str]]:
        stalls: dict[int, list[tuple[int, float]]] = {}
        for k, device, seconds in self.waits:
            if seconds >= STALL:
                stalls.setdefault(k, []).append((device, seconds))
        rows = []
        for k, (op, b) in enumerate(zip(self.ops, self.bands(), strict=True)):
            rows += [[WAIT_HOST + " (GPU idle)", f"GPU:{device}", "", _us(seconds), "", "",
                      "the host", "", "", "", "", "", ""] for device, seconds in stalls.get(k, ())]
            rows.append([op.op, f"GPU:{op.device}", _us(op.launch + op.sync), _us(op.gpu),
                         _us(op.compute), _us(op.memory), op.bound, _achieved(op), _waves(op),
                         _us(op.alone) if op.alone is not None else "", f"{op.flops:,}",
                         format_bytes(op.nbytes),
                         f"{b.lo:.2f}–{b.hi:.2f}x{'*' if b.outside else ''}"
                         if b is not None else ""])
        return rows

    @property
    def idle_line(self) -> str:
        """One sentence on the GPUs' waits for the host, if they waited."""
        if not self.waits:
            return ""
        stalls = sum(w >= STALL for _, _, w in self.waits)
        return (f"The GPU stood idle {_us(self.waited_for_host)} waiting for the host "
                f"({stalls} stall(s) of {_us(STALL)} or more listed above, "
                f"{len(self.waits) - stalls} shorter gap(s) between launches).")

    HEADERS = ("op", "device", "launch (+ host wait)", "GPU (floor + work)", "compute",
               "memory or link", "limited by", "achieved", "waves", "alone (CUDA events)",
               "FLOPs", "bytes", "band (model / measured)")

    def __str__(self) -> str:
        lines = [" | ".join(self.HEADERS)] + [" | ".join(r) for r in self.rows()]
        lines.append(f"total {_us(self.total)} queued ({_us(self.alone)} if each op were "
                     f"timed alone): {self.bound}. {self.note}")
        if self.band:
            lines.append(self.band)
        if self.waits:
            lines.append(self.idle_line)
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
                + (f"<p>{escape(self.band)}</p>" if self.band else "")
                + (f"<p>{escape(self.idle_line)}</p>" if self.waits else "")
                + (f"<p>{escape(self.machine)}</p>" if self.machine else ""))


def explain(fn: Callable[[], Any]) -> Explanation:
    """Run `fn()` on the modeled GPUs and break its modeled time down, op by op."""
    rec = record(fn)
    return Explanation(rec.spec.full_name, rec.ops, rec.result,
                       machine=machine(rec.spec, rec.topology), spec=rec.spec,
                       waits=host_waits(rec))


def host_waits(rec: Recording) -> list[tuple[int, int, float]]:
    """(op position, GPU, seconds) for each wait for the host in `rec`: the clock records a
    wait span just before the span of the kernel or copy the host then launched, and those
    spans come in the order of the ops they belong to (a copy between two GPUs: one each)."""
    waits: list[tuple[int, int, float]] = []
    spans = rec.spans
    at = 0  # the next span to read
    for k, op in enumerate(rec.ops):
        if op.op.startswith("nccl:"):
            continue  # a collective's spans are on the communication stream
        j = at
        while j < len(spans) and not (spans[j].kind in (KERNEL, COPY_SPAN)
                                      and spans[j].name == op.op and spans[j].device == op.device
                                      or spans[j].kind == COPY_SPAN and spans[j].name == op.op):
            j += 1
        if j == len(spans):
            continue  # not on the timeline (a capture's replay records differently)
        waits += [(k, s.device, s.end - s.start) for s in spans[at:j]
                  if s.kind == WAIT_HOST and s.end > s.start]
        at = j + 1
    return waits


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
