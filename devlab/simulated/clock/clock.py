"""The modeled clock of simulated GPUs that carry a performance model of a named real GPU.

One timeline for the simulation: the host's time, and for each GPU the time its queue (its one
stream) will be done. Launching a kernel costs the host the launch latency; the kernel starts
on its GPU when both the host has launched it and the GPU is free, and runs for the time the GPU
model gives it (`devlab.gpu_model`, through `_roofline`). So ops queue asynchronously, and two
GPUs with two queues work at the same time. This is the first of the model's two ways of timing
(`TIMING`): ops queued back to back; one op timed alone on an idle GPU shows more (its floor),
which `explain()` lists beside it. A copy runs over the host link (PCIe) or between GPUs; a blocking copy to or from the host
makes the host wait for it. A host sync (`.item()`, printing, `.cpu()`, `synchronize()`) makes
the host wait until the GPU's queue is done, and pays the round trip of waking up (nothing if
the GPU was already idle). Events read the time at which a GPU's queue reaches them.

The clock is bookkeeping beside the real computation: the CPU still computes every value, and
`time.perf_counter` is untouched. `Charges` charges what the simulation's routing mode runs on
a modeled GPU: each torch call as one kernel, each copy and host read, and a backward pass as
the backward kernels its forward calls left on their graph nodes (a dispatch mode would see
each aten op, but costs more per op than the whole simulation may).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from devlab import ops_catalog
from devlab.gpu_model.kernels import COPY, QUEUED, kernel_seconds

from ..core import session as _session
from ..core.session import NoCharges
from .gpu_specs import GpuSpec
from .roofline import (
    OpTime,
    backward_costs,
    call_cost,
    call_name,
    memory_cost,
    signature,
    store,
    traffic,
)

Tensor = torch.Tensor
TIMING = QUEUED  # what the clock's times are: ops queued back to back


class Clock:
    """Modeled time, in seconds from the simulation's start: the host's, and when each GPU's
    queue is done.

    `queues[i]` is the queue simulated GPU i runs on: its own, unless it is one of several
    logical GPUs made of one physical GPU (`set_logical_device_configuration`), which share
    that GPU's one queue, as logical devices of a real GPU share its compute."""

    def __init__(self, spec: GpuSpec, count: int, queues: list[int] | None = None) -> None:
        self.spec = spec
        self.lock = threading.Lock()
        self.reset(count, queues)
        # While `explain` watches: every charge, in order.
        self.recording: list[OpTime] | None = None
        self._launch = spec.launch_latency_us * 1e-6
        self._sync = spec.sync_latency_us * 1e-6

    def reset(self, count: int, queues: list[int] | None = None) -> None:
        """Start again at 0 with `count` idle GPUs (reconfigured before first use)."""
        queue = list(range(count)) if queues is None else list(queues)
        if len(queue) != count:
            raise ValueError(f"queues has {len(queue)} entries for {count} simulated GPUs")
        with self.lock:
            self.host = 0.0
            self.queue = queue
            self.free = [0.0] * (max(queue) + 1)
            self.busy = [0.0] * (max(queue) + 1)

    def kernel(self, t: OpTime) -> None:
        """A kernel of cost `t`, launched after the host's earlier work."""
        self.kernels((t,))

    def kernels(self, ts: tuple[OpTime, ...] | list[OpTime]) -> None:
        """Kernels launched one after the other."""
        with self.lock:
            free, busy, queue, recording = self.free, self.busy, self.queue, self.recording
            host = self.host
            for t in ts:
                device = queue[t.device]
                work = kernel_seconds(t.floor, t.compute, t.memory)
                host += t.launch
                free[device] = (free[device] if free[device] > host else host) + work
                busy[device] += work
                if recording is not None:
                    recording.append(t)
            self.host = host

    def copy(self, src: int | None, dst: int | None, nbytes: int, blocking: bool,
             op: str = "copy") -> None:
        """A copy between the host (None) and a GPU, or between two GPUs."""
        spec = self.spec
        where = (f"GPU:{src}→GPU:{dst}" if src is not None and dst is not None else
                 f"host→GPU:{dst}" if src is None else f"GPU:{src}→host")
        shown = src if src is not None else dst  # the GPU `explain` names
        src = None if src is None else self.queue[src]
        dst = None if dst is None else self.queue[dst]
        within = None
        if src is not None and dst is not None:
            ends = [src, dst] if src != dst else [src]
            if src == dst:  # within one GPU's memory: a copy kernel reads, then writes
                within = memory_cost(spec, shown, op, 2 * nbytes, COPY)
                seconds = within.gpu
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
                name = f"{op} ({where})"
                self.recording.append(within._replace(op=name) if within is not None else
                                      OpTime(name, shown, self._launch, 0.0,  # type: ignore[arg-type]
                                             seconds, 0, nbytes, waited))

    def sync(self, index: int | None = None) -> None:
        """The host waits for GPU `index`'s queue (every GPU's if None). Waking up after the
        GPU finishes costs the sync round trip; a GPU already idle answers at once."""
        with self.lock:
            done = max(self.free if index is None else [self.free[self.queue[index]]])
            if done > self.host:
                self.host = done + self._sync

    def reached(self, index: int) -> float:
        """When GPU `index`'s queue reaches work enqueued now (an Event's time)."""
        with self.lock:
            return max(self.free[self.queue[index]], self.host)

    def now(self) -> float:
        with self.lock:
            return self.host


# Calls that hand the host a Python value from the device: a copy to the host, and a wait.
_READS = ops_catalog.callables("reads")
# Calls whose output size depends on the values: the kernel, then the host learns the size.
_SIZED_BY_VALUES = ops_catalog.callables("sized_by_values")
# What the clock makes of a call, by the callable (looked up once per op, so kept by it).
_READ, _WRITES, _PURE, _SIZED = range(4)
_kinds: dict[Any, int] = {}


def _kind_of(func: Callable) -> int:
    if func in _READS:
        return _READ
    if func in _SIZED_BY_VALUES:
        return _SIZED
    if ops_catalog.in_place(func):
        return _WRITES
    return _PURE


_BACKWARD = "devlab_clock"  # a graph node's metadata: the modeled kernels of its backward


class Charges(NoCharges):
    """What the simulation charges the clock for: the calls, copies and backward passes its
    routing mode runs on modeled GPUs, and the host's syncs; the one way to the clock (without a
    model, the session's `NoCharges` charges nothing)."""

    __slots__ = ("_costed", "_tf32", "clock", "spec")

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.spec = clock.spec
        self._tf32 = bool(clock.spec.tf32_tflops)  # torch's TF32 switch changes its products
        self._costed: dict[tuple, tuple[OpTime, tuple[OpTime, ...]]] = {}

    def call(self, func: Callable, args: tuple, kwargs: dict, out: Any, index: int,
             fresh: bool) -> None:
        """A torch call that ran on GPU `index`; `fresh`: it made new memory."""
        kind = _kinds.get(func)
        if kind is None:
            kind = _kinds[func] = _kind_of(func)
        if kind == _READ:
            target = args[0] if args and isinstance(args[0], Tensor) else None
            nbytes = target.nbytes if target is not None and func is not Tensor.item else 4
            self.clock.copy(index, None, nbytes, True, call_name(func))
            return
        # A kernel ran if the call made memory or wrote in place; views and metadata reads
        # run none.
        if not fresh and kind != _WRITES:
            return
        key = (func, index, signature(args, kwargs, out),
               self._tf32 and torch.backends.cuda.matmul.allow_tf32)
        costed = self._costed.get(key)
        if costed is None:
            costed = self._cost(key, func, args, kwargs, out, index)
        cost, back = costed
        self.clock.kernels((cost,))
        if kind == _SIZED:
            self.clock.sync(index)
        if back:
            node = out.grad_fn if isinstance(out, Tensor) else None
            if node is not None:
                # Its backward: a kernel for each input that needs a gradient (a product's
                # gradient is a product; a memory-bound op's moves about as many bytes).
                metadata = node.metadata
                earlier = metadata.get(_BACKWARD)
                metadata[_BACKWARD] = back if earlier is None else earlier + back

    def _cost(self, key: tuple, func: Callable, args: tuple, kwargs: dict, out: Any,
              index: int) -> tuple[OpTime, tuple[OpTime, ...]]:
        """A call's kernel and its backward kernels, kept for the calls of its signature."""
        nbytes, dtype, grads = traffic(args, kwargs, out)
        cost, back = call_cost(self.spec, index, func, args, kwargs, out, nbytes, dtype, grads)
        costed = cost, tuple(backward_costs(self.spec, back)) if back is not None else ()
        return store(key, costed, self._costed)

    def factory(self, func: Callable, args: tuple, out: Any, index: int) -> None:
        """A factory that made `out` on GPU `index`: data from the host crosses PCIe; other
        factories fill memory (an empty tensor costs nothing)."""
        if not isinstance(out, Tensor) or func in _EMPTY:
            return
        if func in _FROM_HOST_DATA and not (args and isinstance(args[0], Tensor)):
            self.clock.copy(None, index, out.nbytes, True, call_name(func))
            return
        self.clock.kernel(memory_cost(self.spec, index, call_name(func), out.nbytes))

    def backward(self, nodes: list[Any]) -> None:
        """The kernels the backward pass through these graph nodes ran."""
        kernels = self.clock.kernels
        for node in nodes:
            costs = node.metadata.get(_BACKWARD)
            if costs:
                kernels(costs)

    def copy(self, src: int | None, dst: int | None, nbytes: int, blocking: bool,
             op: str = "copy") -> None:
        """A copy between the host (None) and a GPU, or between two GPUs."""
        self.clock.copy(src, dst, nbytes, blocking, op)

    def sync(self, index: int | None = None) -> None:
        """The host waits for GPU `index`'s queue (every GPU's if None)."""
        self.clock.sync(index)

    def reached(self, index: int) -> float | None:
        """When GPU `index`'s queue reaches work enqueued now (an Event's time)."""
        return self.clock.reached(index)

    def reset(self, count: int, queues: list[int] | None = None) -> None:
        """Start the clock again at 0 with `count` idle GPUs."""
        self.clock.reset(count, queues)


_EMPTY = ops_catalog.callables("empty")
_FROM_HOST_DATA = ops_catalog.callables("from_host_data")


def record(fn: Callable[[], Any]) -> tuple[Any, list[OpTime], GpuSpec]:
    """fn(), with every charge to the clock recorded (for `explain`), and the GPU the clock
    models."""
    sess = _session.session
    clock = sess.charges.clock if sess is not None else None
    if clock is None:
        raise RuntimeError("no modeled GPU: start the simulation with a model, e.g. "
                           "devlab.config.simulate_gpus(2, model='T4')")
    with clock.lock:
        outer, clock.recording = clock.recording, []
        recorded = clock.recording
    try:
        return fn(), recorded, clock.spec
    finally:
        with clock.lock:
            clock.recording = outer
            if outer is not None:
                outer.extend(recorded)
