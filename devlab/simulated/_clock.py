"""The modeled clock of simulated GPUs that carry a performance model of a named real GPU.

One timeline for the simulation: the host's time, and for each GPU the time its queue (its one
stream) will be done. Launching a kernel costs the host the launch latency; the kernel starts
on its GPU when both the host has launched it and the GPU is free, and runs for its roofline
time (`_roofline`). So ops queue asynchronously, and two GPUs with two queues work at the same
time. A copy runs over the host link (PCIe) or between GPUs; a blocking copy to or from the host
makes the host wait for it. A host sync (`.item()`, printing, `.cpu()`, `synchronize()`) makes
the host wait until the GPU's queue is done, and pays the round trip of waking up (nothing if
the GPU was already idle). Events read the time at which a GPU's queue reaches them.

The clock is bookkeeping beside the real computation: the CPU still computes every value, and
`time.perf_counter` is untouched. `ClockMode`, a TorchDispatchMode on every routed thread,
charges each aten op that runs on a simulated GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from devlab.aten_ops import COPY_OPS, SYNC_OPS, copy_ends

from . import _session
from ._dispatched import run as run_dispatched
from ._gpu_specs import GpuSpec
from ._roofline import OpTime, launches_kernel, op_time


class Clock:
    """Modeled time, in seconds from the simulation's start: the host's, and when each GPU's
    queue is done."""

    def __init__(self, spec: GpuSpec, count: int) -> None:
        self.spec = spec
        self.lock = threading.Lock()
        self.reset(count)
        # While `explain` watches: every charge, in order.
        self.recording: list[OpTime] | None = None
        self._launch = spec.launch_latency_us * 1e-6
        self._sync = spec.sync_latency_us * 1e-6

    def reset(self, count: int) -> None:
        """Start again at 0 with `count` idle GPUs (reconfigured before first use)."""
        with self.lock:
            self.host = 0.0
            self.free = [0.0] * count
            self.busy = [0.0] * count

    def kernel(self, t: OpTime) -> None:
        with self.lock:
            self.host += t.launch
            start = max(self.free[t.device], self.host)
            self.free[t.device] = start + t.work
            self.busy[t.device] += t.work
            if self.recording is not None:
                self.recording.append(t)

    def copy(self, src: int | None, dst: int | None, nbytes: int, blocking: bool,
             op: str = "copy") -> None:
        """A copy between the host (None) and a GPU, or between two GPUs."""
        spec = self.spec
        if src is not None and dst is not None:
            ends = [src, dst]
            if src == dst:  # within one GPU's memory: read, then write
                seconds = 2 * nbytes / (spec.memory_bandwidth_gbs * 1e9)
            else:
                seconds = nbytes / (spec.peer_link_gbs * 1e9)
        else:
            ends = [src if src is not None else dst]
            seconds = nbytes / (spec.host_link_gbs * 1e9)
        with self.lock:
            self.host += self._launch
            start = max(self.host, *(self.free[e] for e in ends))  # type: ignore[index]
            end = start + seconds
            for e in ends:
                self.free[e] = end  # type: ignore[index]
                self.busy[e] += seconds  # type: ignore[index]
            waited = self._sync if blocking and dst is None else 0.0
            if blocking and (src is None or dst is None):
                # cudaMemcpy from pageable host memory, or to the host: the host waits for it
                # (and wakes up after a copy to the host, as after any sync).
                self.host = end + waited
            if self.recording is not None:
                where = (f"GPU:{src}→GPU:{dst}" if src is not None and dst is not None else
                         f"host→GPU:{dst}" if src is None else f"GPU:{src}→host")
                self.recording.append(OpTime(f"{op} ({where})", ends[0], self._launch, 0.0,  # type: ignore[arg-type]
                                             seconds, 0, nbytes, waited))

    def sync(self, index: int | None = None) -> None:
        """The host waits for GPU `index`'s queue (every GPU's if None). Waking up after the
        GPU finishes costs the sync round trip; a GPU already idle answers at once."""
        with self.lock:
            done = max(self.free if index is None else [self.free[index]])
            if done > self.host:
                self.host = done + self._sync

    def reached(self, index: int) -> float:
        """When GPU `index`'s queue reaches work enqueued now (an Event's time)."""
        with self.lock:
            return max(self.free[index], self.host)

    def now(self) -> float:
        with self.lock:
            return self.host


_SKIP, _KERNEL, _COPY, _SYNC = range(4)
_ITEM = torch.ops.aten._local_scalar_dense.default
_kinds: dict[Any, int] = {}


def _kind(func: Any) -> int:
    kind = _kinds.get(func)
    if kind is None:
        if func in COPY_OPS:
            kind = _COPY
        elif func in SYNC_OPS:
            kind = _SYNC
        elif launches_kernel(func):
            kind = _KERNEL
        else:
            kind = _SKIP
        _kinds[func] = kind
    return kind


def _index(device: torch.device) -> int | None:
    return device.index if device.type == "cuda" else None


class ClockMode(TorchDispatchMode):
    """Charges each aten op that runs on a simulated GPU to the session's clock (the GPU
    `_dispatched.run` gives it)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out, index = run_dispatched(func, args, kwargs)
        kind = _kinds.get(func)
        if kind is None:
            kind = _kind(func)
        if kind == _SKIP:
            return out
        sess = _session.session
        if sess is None or sess.clock is not self.clock:
            return out
        if kind == _COPY:
            src, dst, nbytes, blocking = copy_ends(func, args, kwargs, out, index)
            s, d = _index(src), _index(dst)
            if s is not None or d is not None:
                self.clock.copy(s, d, nbytes, blocking, _name(func))
            return out
        if index is None:
            return out
        if kind == _SYNC:
            if func is _ITEM:  # a copy of one number to the host, which waits for it
                self.clock.copy(index, None, args[0].element_size(), True, _name(func))
            else:  # the kernel, then the host waits to learn the output's size
                self.clock.kernel(op_time(self.clock.spec, index, func, args, kwargs, out))
                self.clock.sync(index)
            return out
        self.clock.kernel(op_time(self.clock.spec, index, func, args, kwargs, out))
        return out


def _name(func: Any) -> str:
    return str(func.overloadpacket).replace("aten.", "aten::")


def charge_sync(index: int | None) -> None:
    """A host sync outside dispatch (`torch.cuda.synchronize`, an Event or a Stream)."""
    sess = _session.session
    if sess is not None and sess.clock is not None:
        sess.clock.sync(index)


def reached(index: int) -> float | None:
    """The modeled time GPU `index`'s queue reaches now (None without a model)."""
    sess = _session.session
    if sess is None or sess.clock is None:
        return None
    return sess.clock.reached(index)


def record(fn: Callable[[], Any]) -> tuple[Any, list[OpTime]]:
    """fn(), with every charge to the clock recorded (for `explain`)."""
    sess = _session.session
    if sess is None or sess.clock is None:
        raise RuntimeError("no modeled GPU: start the simulation with a model, e.g. "
                           "devlab.config.simulate_gpus(2, model='T4')")
    clock = sess.clock
    with clock.lock:
        outer, clock.recording = clock.recording, []
        recorded = clock.recording
    try:
        return fn(), recorded
    finally:
        with clock.lock:
            clock.recording = outer
            if outer is not None:
                outer.extend(recorded)
