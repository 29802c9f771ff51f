"""What ProcessGroupNCCL charges on modeled GPUs: each collective's modeled time on the clock,
and its communicator's buffers in the GPU's memory (nccl.py holds NCCL's semantics).

A collective method of `ProcessGroupNCCL` calls `_charge` (or `_charge_p2p`) once it has checked
its arguments, with the bytes nccl-tests counts for it; the collective starts on the GPU's
communication stream when every rank of the group has reached it, each rank's clock agreed on
the group's own gloo (`_latest`) while the bytes are on their way. `timed` wraps the method so
that its asynchronous work, on modeled GPUs, makes the GPU's queue wait for the collective's
modeled end (`TimedWork`). Without modeled GPUs (no clock) nothing is charged.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions, ReduceOp

from devlab.engine.gpu_model.capacity import nccl_buffer_bytes
from devlab.engine.gpu_model.links import default_topology, nccl_topology
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.storage_marks import index_of
from devlab.engine.simulated.cuda.cuda_build import NCCL_VERSION

_RED = ReduceOp.RedOpType


def _sizes(tensors: Any) -> tuple[int, ...]:
    return tuple(t.nbytes for t in tensors)


def _total(tensors: Any) -> tuple[int]:
    return (sum(t.nbytes for t in tensors),)


def _blocking(opts: Any) -> bool:
    """A call its caller does not wait on asynchronously (`async_op=False`): the stream that
    launched it waits for it at once. C++ callers (DDP's reducer) leave asyncOp at True."""
    return opts is not None and not getattr(opts, "asyncOp", True)


# `placing`: the collective a call just charged, to place on the clock once its data is on
# its way (its clock exchange in flight meanwhile)
_charged = threading.local()


class TimedWork(dist.Work):
    """The work of an asynchronous collective on modeled GPUs: `wait()` (and
    `block_current_stream`, `synchronize`) makes the GPU's queue wait for the collective's
    modeled end, as NCCL's work makes the current stream wait; the rest is the work's."""

    def __init__(self, work: Any, charges: Any, index: int, end: float) -> None:
        super().__init__()
        self._work, self._charges, self._index, self._end = work, charges, index, end

    def _join(self) -> None:
        self._charges.join(self._index, self._end)

    @_session.inside
    def wait(self, timeout: Any = None) -> bool:
        done = self._work.wait() if timeout is None else self._work.wait(timeout)
        self._join()
        return done

    @_session.inside
    def block_current_stream(self) -> None:
        self._work.wait()
        self._join()

    @_session.inside
    def synchronize(self) -> None:
        self._work.wait()
        self._join()

    def get_future(self) -> Any:
        return self._work.get_future()

    def get_future_result(self) -> Any:
        return self._work.get_future_result()

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> Any:
        return self._work.exception()

    def result(self) -> Any:
        return self._work.result()

    def source_rank(self) -> int:
        return self._work.source_rank()


def timed(method: Callable[..., Any]) -> Callable[..., Any]:
    """A collective method whose asynchronous work, on modeled GPUs, is a `TimedWork`."""

    @functools.wraps(method)
    @_session.inside
    def collective(self: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        outer, _charged.placing = getattr(_charged, "placing", None), None  # a coalesced
        try:                                                                 # call's
            work = method(self, *args, **kwargs)
            placing = _charged.placing
        finally:
            _charged.placing = outer
        if placing is None:
            return work
        placed, charges, index, blocking, host_waits = placing
        end = placed() if callable(placed) else placed
        if host_waits:
            charges.sync(index)
        elif not blocking and work is not None:
            return TimedWork(work, charges, index, end)
        return work

    return collective


class NCCLCharges:
    """ProcessGroupNCCL's charges on modeled GPUs (See the module docstring), a base of the
    group: it uses the group's `size()`, `_inner` (the C++ group over gloo) and
    `bound_device_id`."""

    def _charge(self, op: str, sizes: tuple[int, ...], where: torch.Tensor | None,
                opts: Any, numel: int = 0, host_waits: bool = False) -> None:
        """With modeled GPUs, charge the collective's modeled time on the GPU of `where`: it
        starts when every rank of the group has reached it (NCCL's kernels wait for each
        other), on that GPU's communication stream. A blocking call makes the GPU's queue
        wait for it; an asynchronous one leaves that to its work's `wait()` (`timed`);
        `host_waits`: the host too (a barrier). On a modeled GPU the group's first
        collective there first takes its communicator's buffers (`_connect`)."""
        sess = _session.session
        if sess is None:
            return
        index = index_of(where) if where is not None else None
        if index is None:
            bound = getattr(self, "bound_device_id", None)
            index = bound.index if bound is not None and bound.index is not None else (
                _session.current_device())
        if sess.spec is not None:
            self._connect(sess, index)
        charges = sess.charges
        if charges is None or charges.clock is None:
            return
        blocking = host_waits or _blocking(opts)
        placed = charges.collective(op, sizes, self.size(), index, self._latest, self,
                                    join=blocking, numel=numel)
        if placed is not None:  # (None: in a backward pass, placed at its end)
            _charged.placing = (placed, charges, index, blocking, host_waits)

    # Note [NCCL's own memory]
    # A real NCCL communicator allocates its buffers with cudaMalloc, outside torch's caching
    # allocator, when torch first uses it on a GPU (ProcessGroupNCCL makes the communicator at
    # the first collective on a device, and NCCL connects its ring then: NCCL_RUNTIME_CONNECT).
    # memory_allocated() never shows them; mem_get_info() and nvidia-smi do. On a modeled GPU
    # the group holds capacity.nccl_buffer_bytes of the GPU outside the allocator, as the CUDA
    # context is held, from its first collective there until shutdown.

    def _connect(self, sess: Any, index: int | None) -> None:
        """The communicator's buffers on GPU `index`, at its first collective there
        (See Note [NCCL's own memory])."""
        held = self.__dict__.setdefault("_held_on", set())
        if index is None or index in held or index >= len(sess.devices):
            return
        topology = getattr(sess.charges, "topology", None)
        env = dict(os.environ)
        hw = nccl_topology(topology if topology is not None else default_topology(sess.spec),
                           sess.spec, env).hw
        nbytes = nccl_buffer_bytes(self.size(), hw, env)
        dev = sess.devices[index]
        with _session.lock:
            fits = dev.hold_outside(id(self), nbytes)
        if not fits:
            raise dist.DistBackendError(
                f"NCCL error in: ProcessGroupNCCL, unhandled cuda error (run with "
                f"NCCL_DEBUG=INFO for details), NCCL version {'.'.join(map(str, NCCL_VERSION))}\n"
                f"ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
                f"Failed to CUDA calloc {nbytes} bytes (devlab: NCCL's buffers on simulated "
                f"GPU {index} do not fit in its free memory, "
                f"{dev.allocator.free_memory():,} bytes)")
        held.add(index)

    def _release_buffers(self) -> None:
        """shutdown: the communicator's buffers are freed on every GPU that held them."""
        sess = _session.session
        held = self.__dict__.get("_held_on", set())
        if sess is not None and held:
            with _session.lock:
                for index in held:
                    if index < len(sess.devices):
                        sess.devices[index].release_outside(id(self))
        held.clear()

    def _latest(self, times: list[float]) -> Any:
        """Each of `times` as the latest any rank of the group has: one small all-reduce
        (MAX) on the group's own gloo, outside the simulation's modes and the placement
        log. Answers with a function that waits for it: the collective's own transfer is
        issued meanwhile, so the two round trips overlap."""
        if self.size() == 1:
            return times
        with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
            t = torch.tensor(times, dtype=torch.float64)
            opts = AllreduceOptions()
            opts.reduceOp = ReduceOp(_RED.MAX)
            work = self._inner.allreduce([t], opts)

        def agreed() -> list[float]:
            work.wait()
            with torch._C.DisableTorchFunction():
                return t.tolist()

        return agreed

    def _charge_p2p(self, tensors: list[torch.Tensor], peer: int, tag: int,
                    sending: bool) -> None:
        """A send or receive on modeled GPUs: the sender sends its clock to the receiver
        first, on the same peer and tag (gloo keeps their order), never waiting for it; the
        receiver's transfer starts at the later of the two clocks."""
        charges = _session.session.charges if _session.session is not None else None
        if charges is None or charges.clock is None or not tensors:
            return

        def exchange(times: list[float]) -> Any:
            with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
                t = torch.tensor(times, dtype=torch.float64)
                if sending:
                    work = self._inner.send([t], peer, tag)
                    sent = getattr(self, "_clocks_sent", None)
                    if sent is None:
                        sent = self._clocks_sent = []
                    sent[:] = [(w, x) for w, x in sent if not w.is_completed()]
                    sent.append((work, t))  # alive until gloo has sent it
                    return times
                work = self._inner.recv([t], peer, tag)

            def agreed() -> list[float]:
                work.wait()
                with torch._C.DisableTorchFunction():
                    return [max(a, b) for a, b in zip(times, t.tolist(), strict=True)]

            return agreed

        where = tensors[0]
        index = index_of(where)
        if index is None:
            index = _session.current_device()
        placed = charges.collective("send_recv", _total(tensors), 2, index, exchange, None,
                                    join=False, now=True)
        _charged.placing = (placed, charges, index, False, False)


# Note [Collectives on modeled GPUs]
# Each modeled GPU has, beside its queue (the compute stream), a communication stream, NCCL's
# own. A collective is timed by `gpu_model.collective_time` (`coalesced_time` for a coalesced
# group, charged once as one NCCL group) on the machine the GPUs are in (the GPU's
# `default_topology`, or the one `simulate_gpus(..., topology=)` names). Each rank is a process
# with its own clock, and NCCL's kernels wait for each other: a collective starts when every
# rank has launched it and its stream is free. The ranks agree on that time with one small
# all-reduce (MAX) of their clocks (`_latest`), issued before the collective's own transfer and
# waited for once that is issued, so the two round trips overlap; a send carries the sender's
# clock ahead of its message on the same peer and tag (`_charge_p2p`), so a receive starts no
# earlier than its send. A blocking call makes the GPU's queue wait for its end; an asynchronous
# one returns a `TimedWork`, whose `wait()` does (as NCCL's work makes the current stream wait),
# and the queue runs on beside it meanwhile.
#
# A collective launched during a backward pass (DDP's buckets, launched by its Reducer as their
# gradients are written) cannot be placed then, since the pass's kernels are charged only after
# the engine returns (`Charges.backward`). The clock keeps it, and once the pass's nodes are
# charged each starts when the gradients it carries were written (the next leaves, in order,
# holding as many elements as it: `Charges._place`), the ranks agreeing on all the pass's start
# times in one all-reduce; at the pass's end the queue waits for them, as DDP's Reducer makes the
# stream wait in `finalize_backward`. A DDP step's modeled time is then compute plus the
# communication the backward pass does not hide, which `gpu_model.data_parallel_step` predicts
# (tests/test_modeled_collectives.py compares the two; benchmarks/ddp_modeled.py prints both).
#
# Left out: a collective inside a backward pass that the program never waits for is waited for
# at the pass's end all the same; using an asynchronous collective's output without `wait()`
# does not wait for it (a race on a real GPU too); what C++ sends straight to the gloo backend
# (functional collectives' all-gather and reduce-scatter) and `recv` from any source are not
# charged; compute and communication are taken not to slow each other.
