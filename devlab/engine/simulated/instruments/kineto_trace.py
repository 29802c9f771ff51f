"""A Kineto trace of a profile on simulated GPUs: torch's own trace of the CPU side (what
`kineto_results.save` writes), with the modeled GPU work added as Kineto writes a GPU's.

A pure function of what was recorded (`merge`): no torch, no clock. The format is the one
Kineto's `ChromeTraceLogger` writes for a CUDA run, which Perfetto, chrome://tracing,
TensorBoard's profiler plugin and Holistic Trace Analysis read:

- each launch as a `cuda_runtime` event (`cudaLaunchKernel`, `cudaMemcpyAsync`) on the host
  thread that made it, inside the CPU op that launched it;
- each kernel (`kernel`), copy (`gpu_memcpy`) and fill (`gpu_memset`) on its GPU's track:
  pid = the device index, tid = the stream, with `device`, `stream` and `correlation` in its
  args (the correlation id is the launch's);
- a flow arrow (`ac2g`, "activity to GPU") from each launch to its kernel;
- each `record_function` range on the tracks of the work launched inside it
  (`gpu_user_annotation`);
- `deviceProperties` (one entry per GPU) and `distributedInfo` (rank, world size, backend)
  at the top level.

Times in a Kineto trace are microseconds after `baseTimeNanoseconds`; the activities here
carry Unix nanoseconds, as torch's CPU events do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

KERNEL, MEMCPY, MEMSET = "kernel", "gpu_memcpy", "gpu_memset"
RUNTIME = "cuda_runtime"
FLOW = "ac2g"

# The runtime call that launches each kind, and CUPTI's callback id for it (Kineto writes it
# as `cbid`): cudaLaunchKernel_v7000, cudaMemcpyAsync_v3020, cudaMemsetAsync_v3020.
LAUNCHES = {KERNEL: ("cudaLaunchKernel", 211), MEMCPY: ("cudaMemcpyAsync", 41),
            MEMSET: ("cudaMemsetAsync", 51)}

# Kineto sorts a device's process after the host's by this index (0x1000000 + the device's id,
# for the first eight: `ChromeTraceLogger::handleDeviceInfo`).
_GPU_SORT = 0x1000000


class Activity(NamedTuple):
    """One piece of modeled GPU work, as it goes into the trace (times in Unix ns)."""

    kind: str  # KERNEL, MEMCPY or MEMSET
    name: str
    device: int
    stream: int  # the stream's track (Kineto's tid on the GPU's pid)
    start_ns: int
    dur_ns: int
    correlation: int  # shared by the launch and the activity
    launch_tid: int  # the host thread that launched it (its native id)
    launch_ns: int  # the launch's start on the host
    launch_dur_ns: int
    external_id: int | None = None  # the CPU op that launched it (its "External id")
    nbytes: int = 0  # a copy's or fill's bytes


def _us(ns: int, base: int) -> float:
    return (ns - base) / 1000.0


def events(activities: Iterable[Activity], pid: int, base_ns: int) -> list[dict[str, Any]]:
    """The trace events for `activities`: each one's launch on host process `pid`, the
    activity on its GPU's track, and the flow arrow between them."""
    out: list[dict[str, Any]] = []
    for a in activities:
        ext = {} if a.external_id is None else {"External id": a.external_id}
        runtime, cbid = LAUNCHES[a.kind]
        launch_ts = _us(a.launch_ns, base_ns)
        out.append({"ph": "X", "cat": RUNTIME, "name": runtime, "pid": pid,
                    "tid": a.launch_tid, "ts": launch_ts, "dur": a.launch_dur_ns / 1000.0,
                    "args": {**ext, "cbid": cbid, "correlation": a.correlation}})
        args: dict[str, Any] = {**ext, "queued": 0, "device": a.device, "context": 1,
                                "stream": a.stream, "correlation": a.correlation}
        if a.kind != KERNEL:
            args["bytes"] = a.nbytes
            if a.dur_ns > 0:
                args["memory bandwidth (GB/s)"] = a.nbytes / a.dur_ns  # bytes/ns = GB/s
        ts = _us(a.start_ns, base_ns)
        out.append({"ph": "X", "cat": a.kind, "name": a.name, "pid": a.device,
                    "tid": a.stream, "ts": ts, "dur": a.dur_ns / 1000.0, "args": args})
        if a.kind == KERNEL:  # Kineto draws arrows to kernels (and, as here, not to copies)
            out.append({"ph": "s", "id": a.correlation, "pid": pid, "tid": a.launch_tid,
                        "ts": launch_ts, "cat": FLOW, "name": FLOW, "bp": "e"})
            out.append({"ph": "f", "id": a.correlation, "pid": a.device, "tid": a.stream,
                        "ts": ts, "cat": FLOW, "name": FLOW, "bp": "e"})
    return out


def tracks(activities: Sequence[Activity], names: dict[tuple[int, int], str],
           base_ns: int) -> list[dict[str, Any]]:
    """The metadata naming each GPU's process and each stream's thread, as Kineto writes
    them (`names`: a label per (device, stream), e.g. "stream 7")."""
    ts = _us(min((a.start_ns for a in activities), default=base_ns), base_ns)
    out: list[dict[str, Any]] = []
    for device in sorted({a.device for a in activities}):
        out += [
            {"ph": "M", "name": "process_name", "ts": ts, "pid": device, "tid": 0,
             "args": {"name": "python"}},
            {"ph": "M", "name": "process_labels", "ts": ts, "pid": device, "tid": 0,
             "args": {"labels": f"GPU {device}"}},
            {"ph": "M", "name": "process_sort_index", "ts": ts, "pid": device, "tid": 0,
             "args": {"sort_index": _GPU_SORT + device if device < 8 else device}},
        ]
    for device, stream in sorted({(a.device, a.stream) for a in activities}):
        out += [
            {"ph": "M", "name": "thread_name", "ts": ts, "pid": device, "tid": stream,
             "args": {"name": names.get((device, stream), f"stream {stream}")}},
            {"ph": "M", "name": "thread_sort_index", "ts": ts, "pid": device, "tid": stream,
             "args": {"sort_index": stream}},
        ]
    return out


def annotations(cpu_events: Iterable[dict[str, Any]], activities: Sequence[Activity],
                base_ns: int) -> list[dict[str, Any]]:
    """Each `record_function` range (`user_annotation`) drawn on the GPU's tracks as Kineto
    draws it (`gpu_user_annotation`): on each stream, from the start of the first activity
    launched inside it to the end of the last."""
    out: list[dict[str, Any]] = []
    for e in cpu_events:
        if e.get("ph") != "X" or e.get("cat") != "user_annotation":
            continue
        begin, end, tid = e["ts"], e["ts"] + e.get("dur", 0.0), e.get("tid")
        spans: dict[tuple[int, int], list[float]] = {}
        for a in activities:
            if a.launch_tid == tid and begin <= _us(a.launch_ns, base_ns) <= end:
                s, f = _us(a.start_ns, base_ns), _us(a.start_ns + a.dur_ns, base_ns)
                got = spans.setdefault((a.device, a.stream), [s, f])
                got[0], got[1] = min(got[0], s), max(got[1], f)
        ext = e.get("args", {}).get("External id")
        for (device, stream), (s, f) in sorted(spans.items()):
            out.append({"ph": "X", "cat": "gpu_user_annotation", "name": e["name"],
                        "pid": device, "tid": stream, "ts": s, "dur": f - s,
                        "args": {} if ext is None else {"External id": ext}})
    return out


def merge(cpu_trace: dict[str, Any], activities: Sequence[Activity], pid: int,
          device_properties: list[dict[str, Any]], distributed_info: dict[str, Any],
          stream_names: dict[tuple[int, int], str] | None = None,
          hidden: frozenset[str] = frozenset(), cpu_ops: bool = True) -> dict[str, Any]:
    """`cpu_trace` (torch's trace of the host side, as loaded from its JSON) with the GPU work
    added, and its CPU ops named in `hidden` (all of them, without `cpu_ops`: a profile of
    CUDA activity alone) left out: a new dict, the input left as it was. `distributedInfo`
    already in the trace (torch writes it where torch.distributed is initialized) is kept,
    with what it lacks added."""
    base = int(cpu_trace.get("baseTimeNanoseconds", 0))
    cpu = cpu_trace.get("traceEvents", ())
    trace = dict(cpu_trace)
    trace["deviceProperties"] = list(device_properties)
    trace["distributedInfo"] = {**distributed_info, **cpu_trace.get("distributedInfo", {})}
    trace["traceEvents"] = ([e for e in cpu
                             if e.get("ph") != "X" or (cpu_ops and e.get("name") not in hidden)]
                            + tracks(activities, stream_names or {}, base)
                            + events(activities, pid, base)
                            + annotations(cpu, activities, base))
    return trace
