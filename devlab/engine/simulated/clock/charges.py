"""What the simulation charges the modeled clock for, and the clock bound to the session.

The clock itself is pure (`devlab.engine.gpu_model.modeled_clock`: queues, launches, kernels'
ends, the host's time); this module is its torch side. `Charges` charges what the simulation's
routing mode runs on a modeled GPU: each torch call as one kernel (its cost from `roofline`),
each copy and host read, and a backward pass as the backward kernels its forward calls left on
their graph nodes (See Note [Why the clock charges torch calls]); it passes the clock this
thread's current stream on each GPU. `record` watches
the clock for `explain()` and timelines.

The clock is bookkeeping beside the real computation: the CPU still computes every value, and
`time.perf_counter` is untouched.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from devlab.engine.gpu_model import ops_catalog
from devlab.engine.gpu_model.collectives import CollectiveTime, coalesced_time, collective_time
from devlab.engine.gpu_model.links import Topology, default_topology, nccl_topology
from devlab.engine.gpu_model.modeled_clock import (
    COLLECTIVE,
    COMM,
    COMPUTE,
    COPY_SPAN,
    HOST_CLOCK,
    KERNEL,
    TIMING,
    WAIT_COMM,
    WAIT_HOST,
    WAIT_RANKS,
    Clock,
    OpTime,
    Span,
    host_wall_clock,
)
from devlab.engine.gpu_model.specs import GpuSpec
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.session import NoCharges
from devlab.engine.simulated.base.storage_marks import index_of
from devlab.engine.simulated.clock.roofline import (
    backward_costs,
    bytes_bound,
    call_cost,
    call_name,
    memory_cost,
    signature,
    store,
    traffic,
)

# The clock's names, here too: this module is the one the simulation's former
# `clock.modeled_clock` is now (`_helpers/former_names.py`).
__all__ = ["COLLECTIVE", "COMM", "COMPUTE", "COPY_SPAN", "HOST_CLOCK", "KERNEL", "TIMING",
           "WAIT_COMM", "WAIT_HOST", "WAIT_RANKS", "Charges", "Clock", "OpTime", "Recording",
           "Span", "host_wall_clock", "record"]

Tensor = torch.Tensor


# Calls that hand the host a Python value from the device: a copy to the host, and a wait.
_READS = ops_catalog.callables("reads")
# Calls whose output size depends on the values: the kernel, then the host learns the size.
_SIZED_BY_VALUES = ops_catalog.callables("sized_by_values")
# What the clock makes of a call, and where it takes `inplace` (None: it does not), by the
# callable: read once, at its first call, as the same callables come back every op.
_READ, _WRITES, _PURE, _SIZED = range(4)
_facts: dict[Any, tuple[int, int | None]] = {}


def _facts_of(func: Callable) -> tuple[int, int | None]:
    if func in _READS:
        kind = _READ
    elif func in _SIZED_BY_VALUES:
        kind = _SIZED
    elif ops_catalog.in_place(func):
        kind = _WRITES
    else:
        kind = _PURE
    try:
        names = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):  # a builtin without a signature takes no `inplace`
        names = []
    return kind, names.index("inplace") if "inplace" in names else None


# ... and for the fast path's `call_and_leave`, also whether its cost follows from its bytes
# and its inputs needing gradients alone: a kernel's call (not a read, not sized by its
# values) of a memory-bound family (not a product's or a lookup's, which read the shapes).
_fast_facts: dict[Any, tuple[int, int | None, bool]] = {}


def _facts_of_fast(func: Callable) -> tuple[int, int | None, bool]:
    kind, at = _facts.get(func) or _facts_of(func)
    return kind, at, kind in (_PURE, _WRITES) and bytes_bound(func)


def _asked_in_place(at: int | None, args: tuple, kwargs: dict) -> bool:
    """Whether a functional that takes `inplace` at position `at` was asked to write its input
    (F.relu(x, inplace=True); nn.ReLU passes it by keyword, nn.Dropout and nn.Hardtanh by
    position): its name does not say."""
    if "inplace" in kwargs:
        return kwargs["inplace"] is True
    return at is not None and at < len(args) and args[at] is True


_BACKWARD = "devlab_clock"  # a graph node's metadata: the modeled kernels of its backward
BACKWARD_KEY = _BACKWARD  # the same key, for mode/autograd.py (which GPU a node runs on)
_STREAM = "devlab_clock_stream"  # ... and the stream its forward ran on, if not the default


# Note [Why the clock charges torch calls]
# The clock is charged at the level the simulation already sees: each torch call its routing
# mode (a TorchFunctionMode) runs on a modeled GPU is one kernel, and a backward pass is the
# kernels its forward calls left on their graph nodes. A dispatch mode would see every aten op,
# the backward pass's too, but even an empty one costs more per op than the whole model may:
# on torch 2.13's CPU build (one thread, `torch.add` of 4 elements, the best of seven runs of
# the process's CPU time, December 2026) an empty TorchDispatchMode adds 3.1 µs to a 1.1 µs
# op, an empty TorchFunctionMode 1.0 µs (the old manual, on another machine: about 6 µs for
# the dispatch mode). So a call is costed once and its kernel and backward kernels kept by its
# signature (the op, its tensors' shapes, dtypes and gradients, the TF32 switch:
# `roofline.signature`), as a training step's calls come back every step (what the step then
# costs: See Note [What a simulated GPU costs]).


class Charges(NoCharges):
    """What the simulation charges the clock for: the calls, copies and backward passes its
    routing mode runs on modeled GPUs, and the host's syncs; the one way to the clock (without a
    model, the session's `NoCharges` charges nothing)."""

    __slots__ = ("_backward", "_by_traffic", "_costed", "_pending", "_tf32", "_timed", "clock",
                 "enter", "leave", "spec", "topology")

    def __init__(self, clock: Clock, topology: Topology | None = None) -> None:
        self.clock = clock
        # The host enters and leaves the simulation (Note [The host's modeled time]): bound
        # once, as the mode calls them for every call.
        self.enter = clock.enter  # type: ignore[misc]
        self.leave = clock.leave  # type: ignore[misc]
        self.spec = clock.spec
        self._tf32 = bool(clock.spec.tf32_tflops)  # torch's TF32 switch changes its products
        self._costed: dict[tuple, tuple[OpTime, tuple[OpTime, ...]]] = {}
        self._by_traffic: dict[tuple, tuple[OpTime, tuple[OpTime, ...]]] = {}  # call_and_leave
        # The machine the GPUs are in: how their collectives move (`devlab.engine.gpu_model.links`).
        self.topology = topology if topology is not None else default_topology(clock.spec)
        self._timed: dict[tuple, CollectiveTime] = {}
        self._backward = 0  # backward passes running (the engine runs DDP's buckets inside)
        self._pending: list[_Pending] = []  # collectives launched during the backward pass

    def call(self, func: Callable, args: tuple, kwargs: dict, out: Any, index: int,
             fresh: bool) -> None:
        """A torch call that ran on GPU `index`; `fresh`: it made new memory."""
        facts = _facts.get(func)
        if facts is None:
            facts = _facts[func] = _facts_of(func)
        kind, inplace_at = facts
        if kind == _READ:
            target = args[0] if args and isinstance(args[0], Tensor) else None
            nbytes = target.nbytes if target is not None and func is not Tensor.item else 4
            self.clock.copy(index, None, nbytes, True, call_name(func), False,
                            _session.current_streams())
            return
        # A kernel ran if the call made memory or wrote in place; views and metadata reads
        # run none. A functional asked to work in place (F.relu(x, inplace=True), so
        # nn.ReLU(inplace=True)) writes its input.
        if not fresh and kind != _WRITES and not _asked_in_place(inplace_at, args, kwargs):
            return
        key = (func, index, signature(args, kwargs, out),
               self._tf32 and torch.backends.cuda.matmul.allow_tf32)
        costed = self._costed.get(key)
        if costed is None:
            costed = self._cost(key, func, args, kwargs, out, index)
        cost, back = costed
        self.clock.kernels((cost,), 0, _session.current_streams())
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
                stream = _session.current_stream(index)
                if stream:  # its backward runs on the forward's stream, as CUDA's engine does
                    metadata[_STREAM] = stream

    def call_and_leave(self, func: Callable, args: tuple, kwargs: dict, out: Any, index: int,
                       fresh: bool) -> None:
        """`call`, then `leave`: the mode's fast path, whose GPU `index` is on its default
        stream (Note [The mode's fast path] in simulated/mode/routing.py). A memory-bound
        call's kernel and backward kernels are what its bytes and its inputs needing gradients
        make them (`traffic`, `call_cost`), so they are kept by those (`_by_traffic`), not by
        the signature, and charged with the leave in one hold of the clock's lock; other
        calls (products, lookups, reads, calls sized by their values) take `call`."""
        facts = _fast_facts.get(func)
        if facts is None:
            facts = _fast_facts[func] = _facts_of_fast(func)
        kind, inplace_at, bytes_bound = facts
        # An error before the leave propagates to the mode, whose `finally` then leaves.
        if not bytes_bound:
            self.call(func, args, kwargs, out, index, fresh)
            self.leave()
            return
        if not fresh and kind != _WRITES and not _asked_in_place(inplace_at, args, kwargs):
            self.leave()  # no kernel: a view, a metadata read
            return
        nbytes, _, grads = traffic(args, kwargs, out)
        key = (func, index, nbytes, grads)
        costed = self._by_traffic.get(key)
        if costed is None:
            cost, back = call_cost(self.spec, index, func, args, kwargs, out, nbytes,
                                   torch.float32, grads)  # the dtype: a product's alone
            costed = store(key, (cost, tuple(backward_costs(self.spec, back))
                                 if back is not None else ()), self._by_traffic)
        cost, back = costed
        if back:
            node = out.grad_fn if isinstance(out, Tensor) else None
            if node is not None:  # as `call` (on the default stream: no stream to note)
                metadata = node.metadata
                earlier = metadata.get(_BACKWARD)
                metadata[_BACKWARD] = back if earlier is None else earlier + back
        self.clock.kernel_and_leave(cost)

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
            self.clock.copy(None, index, out.nbytes, True, call_name(func), False,
                            _session.current_streams())
            return
        self.clock.kernel(memory_cost(self.spec, index, call_name(func), out.nbytes),
                          _session.current_streams())

    def begin_backward(self) -> None:
        """A backward pass starts: collectives launched inside it (DDP's buckets) wait until
        its kernels are charged, to start when their gradients are ready."""
        self._backward += 1

    def backward_failed(self) -> None:
        """The backward pass raised: its collectives are not charged."""
        self._backward = max(0, self._backward - 1)
        if not self._backward:
            self._pending.clear()

    def backward(self, nodes: list[Any]) -> None:
        """The kernels the backward pass through these graph nodes ran; then the collectives
        launched during it, each when its gradients were ready."""
        on_clock = self.clock.kernels
        self._backward = max(0, self._backward - 1)
        pending = self._pending if not self._backward else None
        if any(_session.current_streams().values()) or any(
                node.metadata.get(_STREAM) for node in nodes):
            kernels = self._on_streams(nodes)
        else:
            def kernels(costs: tuple[OpTime, ...], node: Any) -> None:
                on_clock(costs)
        if not pending:
            for node in nodes:
                costs = node.metadata.get(_BACKWARD)
                if costs:
                    kernels(costs, node)
            return
        # Which gradient (leaf) is written when, on its GPU: after the kernels of the node that
        # feeds it.
        first = pending[0].index
        ready: dict[int, list[tuple[float, int]]] = {}
        for node in nodes:
            costs = node.metadata.get(_BACKWARD)
            if costs:
                kernels(costs, node)
            for fn, _ in node.next_functions:
                if type(fn) is _ACCUMULATE_GRAD:
                    leaf = fn.variable
                    index = index_of(leaf)
                    index = first if index is None else index
                    ready.setdefault(index, []).append((self.clock.ready(index), leaf.numel()))
        self._pending = []
        self._place(pending, ready)

    def _on_streams(self, nodes: list[Any]) -> Callable[..., None]:
        """What charges a backward pass's nodes when streams are in play (forward ops ran on a
        side stream, or backward() was called on one): each node's kernels on its forward's
        stream, after the nodes that feed it its gradients (the first ones after the caller's
        stream, where the initial gradient was made); the caller's streams wait for the others
        at the end (the engine's syncs: PyTorch's "stream semantics of backward passes")."""
        clock = self.clock
        caller = dict(_session.current_streams())
        ready: dict[Any, float] = {}
        used: set[tuple[int, int]] = set()

        def charge(costs: tuple[OpTime, ...], node: Any) -> None:
            index = costs[0].device
            stream = node.metadata.get(_STREAM) or 0
            mine = caller.get(index, 0)
            until = ready.get(node)
            if until is None and stream != mine:  # fed by the caller's initial gradient
                until = clock.reached(index, mine)
            clock.wait_for(index, stream, until or 0.0)
            clock.kernels(costs, stream)
            end = clock.reached(index, stream)
            used.add((index, stream))
            for fn, _ in node.next_functions:
                if fn is not None and ready.get(fn, 0.0) < end:
                    ready[fn] = end

        def charge_and_join(costs: tuple[OpTime, ...], node: Any) -> None:
            charge(costs, node)
            if node is last:
                for index, stream in used:
                    mine = caller.get(index, 0)
                    if stream != mine:
                        clock.wait_for(index, mine, clock.reached(index, stream))

        last = next((n for n in reversed(nodes) if n.metadata.get(_BACKWARD)), None)
        return charge_and_join

    def collective(self, op: str, sizes: tuple[int, ...], ranks: int, index: int,
                   exchange: Callable[[list[float]], list[float]], group: object, *,
                   join: bool, numel: int = 0,
                   now: bool = False) -> float | Callable[[], float] | None:
        """A collective of `sizes` bytes (one per tensor; several: one coalesced call) among
        `ranks` GPUs, launched on GPU `index`. It starts on the GPU's communication stream
        when every rank has reached it (`exchange`: the latest of each rank's times, over the
        group's own transport) and lasts what NCCL's model gives it on this machine's
        topology; `join`: the GPU's queue waits for it (a blocking call). One launched during
        a backward pass (DDP's buckets) is placed when the pass's kernels are charged: it
        starts once gradients of `numel` elements are ready, and the queue waits for it at the
        pass's end, as DDP's reducer makes the stream wait for its buckets (`now`: placed at
        once all the same, a send or receive, whose clock travels ahead of its message).
        Returns when it ends (None: placed later). `exchange` may answer with a function
        that gives the times once they have come (the exchange in flight beside the
        collective's own transfer): then what is returned is a function that places the
        collective when called, and returns its end."""
        timed = self._time(op, sizes, ranks)
        if self._backward and not now:
            self._pending.append(_Pending(index, timed, exchange, group, numel))
            return None
        local = self.clock.launch_collective(index)
        record = self._record(timed, index)
        agreed = exchange([local])
        if callable(agreed):
            def place() -> float:
                (start,) = agreed()
                return self.clock.collective(index, max(start, local), timed.seconds, join,
                                             record, local)

            return place
        (start,) = agreed
        return self.clock.collective(index, max(start, local), timed.seconds, join, record,
                                     local)

    def join(self, index: int, until: float | None = None) -> None:
        """GPU `index`'s queue waits for its collectives (to `until`): `work.wait()`."""
        self.clock.join(index, until)

    def _time(self, op: str, sizes: tuple[int, ...], ranks: int) -> CollectiveTime:
        key = (op, sizes, ranks)
        timed = self._timed.get(key)
        if timed is None:
            # NCCL_P2P_DISABLE=1 turns NVLink and PCIe peer-to-peer off: through host memory.
            topo = nccl_topology(self.topology, self.spec, dict(os.environ))
            n = min(ranks, topo.max_ranks)  # beyond one machine: timed as the largest
            timed = (collective_time(op, sizes[0], n, topo) if len(sizes) == 1 else
                     coalesced_time(op, list(sizes), n, topo))
            timed = store(key, timed, self._timed)
        return timed

    def _record(self, timed: CollectiveTime, index: int) -> OpTime | None:
        if self.clock.recording is None:
            return None
        return OpTime(f"nccl:{timed.op} ({timed.topology}, {timed.ranks} GPUs, "
                      f"{timed.algorithm}/{timed.protocol})", index, self.clock._launch, 0.0,
                      timed.bandwidth, 0, timed.nbytes, floor=timed.latency)

    def _place(self, pending: list[_Pending],
               ready: dict[int, list[tuple[float, int]]]) -> None:
        """Collectives launched during a backward pass, in launch order: each is ready when
        the gradients it carries are (its GPU's, taken in the order they were written, by
        elements), starts when every rank's is and the communication stream is free; then
        each GPU's queue waits for its last one."""
        clock = self.clock
        locals_: list[float] = []
        # Per GPU: gradients taken, their elements beyond what buckets carried, when.
        taken: dict[int, list] = {}
        for p in pending:
            written = ready.get(p.index, [])
            state = taken.get(p.index)
            if state is None:  # the first on its GPU waits for its stream's earlier work
                state = taken[p.index] = [0, 0, clock.comm[clock.queue[p.index]]]
            i, have, at = state
            while have < p.numel and i < len(written):
                at, have = max(at, written[i][0]), have + written[i][1]
                i += 1
            if have < p.numel:  # more than the pass wrote: ready at its end
                at = max(at, clock.ready(p.index))
            state[:] = [i, max(0, have - p.numel), at]
            locals_.append(at)
        agreed: dict[int, list[float]] = {}
        groups: dict[int, tuple[Callable, list[int]]] = {}
        for k, p in enumerate(pending):
            groups.setdefault(id(p.group), (p.exchange, []))[1].append(k)
        for key, (exchange, members) in groups.items():
            got = exchange([locals_[k] for k in members])
            agreed[key] = list(got() if callable(got) else got)
        last: dict[int, float] = {}
        for p, local in zip(pending, locals_, strict=True):
            comm = clock.comm[clock.queue[p.index]]
            start = max(agreed[id(p.group)].pop(0), comm)
            last[p.index] = clock.collective(p.index, start, p.timed.seconds, False,
                                             self._record(p.timed, p.index), max(local, comm))
        for index, end in last.items():
            clock.join(index, end)

    def copy(self, src: int | None, dst: int | None, nbytes: int, blocking: bool,
             op: str = "copy", pinned: bool = False) -> None:
        """A copy between the host (None) and a GPU, or between two GPUs; `pinned`: the host's
        side is pinned memory."""
        self.clock.copy(src, dst, nbytes, blocking, op, pinned, _session.current_streams())

    def sync(self, index: int | None = None) -> None:
        """The host waits for GPU `index`'s queue (every GPU's if None)."""
        self.clock.sync(index)

    def reached(self, index: int, stream: int | None = None) -> float | None:
        """When GPU `index`'s `stream` (None: the current one) reaches work enqueued now."""
        return self.clock.reached(
            index, _session.current_stream(index) if stream is None else stream)

    def wait_for(self, index: int, stream: int, until: float | None) -> None:
        """GPU `index`'s `stream` starts later work no earlier than `until`."""
        if until is not None:
            self.clock.wait_for(index, stream, until)

    def sync_stream(self, index: int, stream: int) -> None:
        """The host waits for one stream of GPU `index`."""
        self.clock.sync_stream(index, stream)

    def host_wait(self, until: float | None) -> None:
        """The host waits until `until`."""
        if until is not None:
            self.clock.host_wait(until)

    def done(self, until: float | None) -> bool:
        """Whether the GPUs have reached `until` by the host's time now."""
        return until is None or self.clock.done(until)

    def poll(self, until: float | None) -> bool:
        """An event's or stream's query of work ending at `until`: done by the host's time
        now? (The host pays the call.)"""
        return until is None or self.clock.poll(until)

    def reset(self, count: int, queues: list[int] | None = None) -> None:
        """Start the clock again at 0 with `count` idle GPUs."""
        self.clock.reset(count, queues)

    def begin_capture(self) -> Any:
        """A CUDA graph's capture starts: what is charged until `end_capture` is recorded."""
        return self.clock.begin_capture()

    def end_capture(self, token: Any) -> tuple[OpTime, ...]:
        """The capture ends: the kernels it recorded; the GPUs' queues as before it."""
        return self.clock.end_capture(token)

    def replay(self, kernels: tuple[OpTime, ...]) -> None:
        """A CUDA graph of `kernels` is replayed: one launch for all of them."""
        self.clock.replay(kernels, _session.current_streams())


_ACCUMULATE_GRAD = torch._C._functions.AccumulateGrad  # a leaf's node in a graph


class _Pending(NamedTuple):
    """A collective launched during a backward pass, placed when the pass is charged."""

    index: int
    timed: CollectiveTime
    exchange: Callable[[list[float]], list[float]]
    group: object
    numel: int


_EMPTY = ops_catalog.callables("empty")
_FROM_HOST_DATA = ops_catalog.callables("from_host_data")


class Recording(NamedTuple):
    """What `record` saw: fn's result, every charge in order, when each stream ran it, the
    host's time at the start, the GPU the clock models and the machine its collectives are
    timed in."""

    result: Any
    ops: list[OpTime]
    spans: list[Span]
    start: float
    spec: GpuSpec
    topology: Topology


def record(fn: Callable[[], Any]) -> Recording:
    """fn(), with every charge to the clock recorded (for `explain` and timelines)."""
    sess = _session.session
    clock = sess.charges.clock if sess is not None else None
    if clock is None:
        raise RuntimeError("no modeled GPU: start the simulation with a model, e.g. "
                           "devlab.config.simulate_gpus(2, model='T4')")
    clock.catch_up()  # the host's time now, the wall clock's since it last left the simulation
    with clock.lock:
        outer, clock.recording = clock.recording, []
        outer_spans, clock.spans = clock.spans, []
        recorded, spans, start = clock.recording, clock.spans, clock.host
    try:
        result = fn()
    finally:
        with clock.lock:
            clock.recording, clock.spans = outer, outer_spans
            # A GPU idle since before the recording waited for the host from its start.
            spans[:] = [sp._replace(start=start) if sp.kind == WAIT_HOST and sp.start < start
                        else sp for sp in spans]
            if outer is not None:
                outer.extend(recorded)
                outer_spans.extend(spans)  # type: ignore[union-attr]
    return Recording(result, recorded, spans, start, clock.spec,
                     sess.charges.topology)  # type: ignore[union-attr]
