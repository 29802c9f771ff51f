"""NCCL for simulated GPUs: a process group that behaves as NCCL's, moving its bytes with gloo.

A CPU build of torch has no NCCL, and a simulated GPU's tensor is a CPU tensor in C++, so gloo
can move the bytes of every collective. What a program observes of NCCL is its semantics, and
there gloo differs: its name, the output shapes it accepts (NCCL reads a tensor as a flat buffer
of its elements), uneven all-gathers, `PREMUL_SUM`, a barrier that allocates a tensor on the
bound device. `ProcessGroupNCCL` here has NCCL's semantics and gloo underneath.

It is a Python `ProcessGroup`, the kind torch's own `threaded` test backend is, made where torch
makes NCCL's: for every "nccl" in a backend string, `_new_process_group_helper` builds
`ProcessGroupNCCL(store, rank, size, options)` (when `is_nccl_available()`), and a Python group
returned there becomes the group itself, registered under the backend name "nccl". Its
collectives check what NCCL checks, raise NCCL's errors, and run on `_inner`, a C++ ProcessGroup
over one gloo backend, so each still passes torch's dispatcher as a `c10d` op (the placement log
sees it with its bytes). The same gloo backend is registered in this group for both devices,
which is where C++ callers of the methods a Python group cannot override (functional
collectives' all-gather and reduce-scatter, gather, scatter, send, recv) arrive; C++ gives those
outputs their proper shapes.

On modeled GPUs each collective is charged on the clock, and the communicator's buffers in
memory, by the group's base `NCCLCharges` (nccl_charging.py).
"""

from __future__ import annotations

import copy
import functools
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ProcessGroupGloo,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    _create_work_from_future,
)

from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.notices import Notice
from devlab.engine.simulated.base.storage_marks import index_of
from devlab.engine.simulated.torch_distributed import c10d_futures as _futures
from devlab.engine.simulated.torch_distributed import loopback_stores as _stores
from devlab.engine.simulated.torch_distributed.loopback_stores import LOOPBACK
from devlab.engine.simulated.torch_distributed.nccl_charging import NCCLCharges, _sizes, _total
from devlab.engine.simulated.torch_distributed.nccl_charging import (
    timed as _timed,  # the name its collectives were decorated with
)

NOTICE = ("devlab: simulated GPUs have no NCCL (it needs real GPUs), so "
          "torch.distributed's \"nccl\" backend runs on gloo instead: NCCL's behaviour, "
          "gloo's transport, on the CPU.")
# NCCL's default collective timeout (torch's _DEFAULT_PG_NCCL_TIMEOUT in a CUDA build).
DEFAULT_TIMEOUT = timedelta(minutes=10)
_notice = Notice(NOTICE)
_GLOO = dist.ProcessGroup.BackendType.GLOO
_RED = ReduceOp.RedOpType
_PREMUL_DTYPES = (torch.float16, torch.float32, torch.bfloat16, torch.float64)


def tell_once() -> None:
    """Say once per process, on stderr, that NCCL runs on gloo here."""
    _notice.tell()


class NCCLConfig:
    """`ProcessGroupNCCL.Options().config`: NCCL's communicator settings (kept, not used)."""

    def __init__(self) -> None:
        self.blocking = 1
        self.cga_cluster_size = 0
        self.min_ctas = 0
        self.max_ctas = 0
        self.net_name = ""
        self.cta_policy = 0


class Options:
    """`ProcessGroupNCCL.Options`: what torch and programs set on NCCL's options."""

    def __init__(self, is_high_priority_stream: bool = False) -> None:
        self.is_high_priority_stream = is_high_priority_stream
        self._timeout = DEFAULT_TIMEOUT
        self.split_from: Any = None
        self.split_color = 0
        self.global_ranks_in_group: list[int] = []
        self.group_name = ""
        self.group_desc = ""
        self.config = NCCLConfig()
        self.backend = "nccl"


def _one_by_one(single: Callable[..., Any], outputs: Any, inputs: Any, opts: Any) -> Any:
    """A coalesced collective as its single collectives, in order, each finished before the
    next."""
    work = None
    for out, inp in zip(outputs, inputs, strict=True):
        work = single(out, inp, opts)
        work.wait()
    return _done(outputs) if work is None else work


def _done(result: Any) -> Any:
    """A finished Work whose future holds `result` (NCCL's blocking calls, done by now)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _listed(tensors: Any) -> list[torch.Tensor]:
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


def _called_from_torch_distributed() -> bool:
    """Whether the collective came from torch.distributed's Python API (`dist.all_gather`),
    whose tensors the program made, rather than from C++ (DDP's checks of its parameters,
    its buckets), whose helper tensors a CPU build makes on the host where CUDA's are on the
    GPU."""
    frame = sys._getframe(2)
    while frame is not None and _errors.own_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.endswith(
        os.path.join("distributed", "distributed_c10d.py"))


def _check(tensors: list[torch.Tensor], host_ok: bool = False) -> None:
    """NCCL's check of a collective's tensors: on a GPU (a host tensor reaches no backend in
    a group without a CPU one: the error torch's dispatcher gives it), dense, and contiguous
    in their memory format."""
    if not host_ok and _called_from_torch_distributed():
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and index_of(t) is None:
                raise _errors.user_error(RuntimeError(
                    "No backend type associated with device type cpu"))
    for t in tensors:
        if t.layout is not torch.strided:
            raise ValueError("Tensors must be CUDA and dense")
        if not (t.is_contiguous() or (t.dim() in _FORMATS
                                      and t.is_contiguous(memory_format=_FORMATS[t.dim()]))):
            raise ValueError("Tensors must be contiguous")


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A checked tensor as NCCL reads it: its elements in memory order, one flat view."""
    return t.view(-1) if t.is_contiguous() else t.as_strided((t.numel(),), (1,))


def _reduction(op: Any, dtype: torch.dtype) -> tuple[_RED, Any]:
    """(the reduction gloo runs, the PREMUL_SUM factor or None) for NCCL's `op` on `dtype`,
    raising what NCCL raises for the ops it lacks."""
    kind = op.op if isinstance(op, ReduceOp) else op
    if kind in (_RED.BAND, _RED.BOR, _RED.BXOR):
        raise ValueError(f"Cannot use ReduceOp.{kind.name} with NCCL")
    if dtype == torch.bool:
        if kind == _RED.SUM:
            return _RED.MAX, None  # NCCL's or of booleans
        if kind == _RED.AVG:
            raise TypeError("Cannot use ReduceOp.AVG with boolean inputs")
    if kind == _RED.PREMUL_SUM:
        if dtype not in _PREMUL_DTYPES:
            raise TypeError("PreMulSum Data type must be half, float, bfloat16 or double")
        if not hasattr(op, "factor"):  # torch < 2.13 keeps it in C++ alone
            raise _errors.user_error(NotImplementedError(
                f"ReduceOp.PREMUL_SUM on simulated GPUs needs torch 2.13 or later: torch "
                f"{torch.__version__} does not show the op's factor to Python. Use "
                "ReduceOp.AVG, or multiply the tensor by the factor before a SUM."))
        return _RED.SUM, op.factor
    return kind, None


def _reduce_in_place(tensors: list[torch.Tensor], opts: Any, host_ok: bool = False) -> _RED:
    """Check `tensors` for an in-place reduction and scale them by PREMUL_SUM's factor; the
    reduction gloo is to run."""
    _check(tensors, host_ok)
    kind, factor = _reduction(opts.reduceOp, tensors[0].dtype)
    if factor is not None:
        for t in tensors:
            t.mul_(factor)
    return kind


def _options(kind: type, opts: Any, reduce_op: _RED | None = None, **extra: Any) -> Any:
    """Options of type `kind` for gloo, with `opts`' timeout and async flag."""
    out = kind()
    for name in ("timeout", "asyncOp"):
        if hasattr(opts, name) and hasattr(out, name):
            setattr(out, name, getattr(opts, name))
    if reduce_op is not None:
        out.reduceOp = ReduceOp(reduce_op)
    for name, value in extra.items():
        setattr(out, name, value)
    return out


def _scaled(t: torch.Tensor, factor: Any) -> torch.Tensor:
    return t if factor is None else t * factor


class NCCLBackend:
    """What `group._get_backend(cuda)` answers for our group: NCCL's backend as torch's Python
    code asks about it (its name, options, splitting), gloo's for the rest."""

    def __init__(self, gloo: Any, options: Options) -> None:
        self._gloo = gloo
        self.options = options

    def name(self) -> str:
        return "nccl"

    supports_splitting = True
    supports_coalescing = False

    def supports_tensor_alloc(self, device: Any) -> bool:
        return False

    def perform_nocolor_split(self, device: Any) -> None:
        """A rank outside a new group takes part in NCCL's communicator split; our groups are
        made afresh (new_group) or split from gloo (split_group): nothing to take part in."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gloo, name)


def _gloo(store: Any, rank: int, size: int, timeout: timedelta) -> ProcessGroupGloo:
    """The gloo group that carries ours: on loopback when its peers are all on this machine
    (`_stores.loopback_store`) and GLOO_SOCKET_IFNAME names no interface."""
    if os.environ.get("GLOO_SOCKET_IFNAME") or not _stores.loopback_store(store):
        return ProcessGroupGloo(store, rank, size, timeout=timeout)
    options = ProcessGroupGloo._Options()
    options._devices = [ProcessGroupGloo.create_device(hostname=LOOPBACK)]
    options._timeout = timeout
    return ProcessGroupGloo(store, rank, size, options)


def _bootstrap_store(store: Any) -> Any:
    """The store a new group's transport meets its peers through: under torch elastic, a prefix
    of this attempt's own (See Note [A fresh bootstrap per attempt])."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:
        return store
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return dist.PrefixStore(f"devlab-nccl/{run}/attempt-{attempt}/", store)


# Note [A fresh bootstrap per attempt]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch elastic restarts a failed job's workers against the store of the attempt before:
# torchrun's static rendezvous (its default) keeps one TCPStore for the whole run, and workers
# with TORCHELASTIC_USE_AGENT_STORE use it without a prefix of their attempt
# (`rendezvous._create_c10d_store`), so a group of attempt 1 gets the store prefix of attempt 0
# ("default_pg/0/"). gloo's connectFullMesh publishes each rank's address under the rank's key
# and reads its peers' keys: a rank of attempt 1 can read the address of attempt 0's dead peer
# before the peer has replaced it, and is refused (the job needs another attempt) or waits for
# a connection that never comes (it hangs). Plain torch on gloo does the same
# (docs/upstream-gloo-restart.md). NCCL bootstraps every communicator afresh from a unique id;
# devlab's NCCL group, gloo underneath, bootstraps under a prefix of its attempt instead, which
# no key of an earlier attempt carries. Its splits build on it, so they are fresh too.


class ProcessGroupNCCL(NCCLCharges, dist.ProcessGroup):
    """NCCL's process group on simulated GPUs (see the module docstring)."""

    Options = Options
    NCCL_CTA_POLICY_DEFAULT = 0
    NCCL_CTA_POLICY_EFFICIENCY = 1
    NCCL_CTA_POLICY_ZERO = 2

    def __init__(self, store: Any, rank: int, size: int, options: Options | None = None) -> None:
        options = options if options is not None else Options()
        timeout = getattr(options, "_timeout", None) or DEFAULT_TIMEOUT
        super().__init__(rank, size)  # a Python group takes no store; `_inner` holds it
        store = _bootstrap_store(store)
        gloo = _gloo(store, rank, size, timeout)
        gloo.options.global_ranks_in_group = list(options.global_ranks_in_group)
        gloo.options.group_name = options.group_name
        inner = dist.ProcessGroup(store, rank, size)
        inner._set_default_backend(_GLOO)
        # For the CPU alone: a simulated GPU's tensor reaches `_inner` as a CPU tensor, and C++'s
        # splitGroup (this torch) splits the backend once per device it is registered for, each
        # child meeting its peers under the same store prefix; a rank could then read its peer's
        # address from the other child and wait for a connection that never comes (split_group
        # hung ~1 launch in 3 under load).
        inner._register_backend(torch.device("cpu"), _GLOO, gloo)
        self._adopt(inner, options)
        tell_once()
        _futures.register_quiet_at_exit()

    @classmethod
    def _around(cls, inner: dist.ProcessGroup, options: Any) -> ProcessGroupNCCL:
        """A group over `inner`, a C++ group with a gloo backend (a split of ours)."""
        pg = cls.__new__(cls)
        dist.ProcessGroup.__init__(pg, inner.rank(), inner.size())
        pg._adopt(inner, options)
        pg._set_group_name(inner.group_name)
        return pg

    def _adopt(self, inner: dist.ProcessGroup, options: Any) -> None:
        self._inner = inner
        self._gloo = inner._get_backend(torch.device("cpu"))
        self._nccl_options = options
        self._nccl_backend = NCCLBackend(self._gloo, options)
        for device in ("cpu", "cuda"):
            self._register_backend(torch.device(device), _GLOO, self._gloo)
        self._set_default_backend(_GLOO)

    # What the group says about itself ----------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - the C++ name, which pybind11 calls
        return "nccl"

    # The devices the backend string gave this group a backend for: "nccl" gives CUDA only;
    # "cpu:gloo,cuda:nccl" gives the CPU its gloo too (torch's `_new_process_group_helper`
    # makes that group's gloo backend first, then drops it when a Python group replaces the
    # group; `c10d._binding` says which devices the string named). DCP's `async_save` asks
    # for a CPU backend here, and refuses an NCCL-only group, as on a real GPU.
    _devices: tuple[str, ...] = ("cuda",)

    @property
    def _host_ok(self) -> bool:
        """Whether the backend string gave the CPU a backend too (its tensors go to gloo)."""
        return "cpu" in self._devices

    @property
    def _device_types(self) -> list[torch.device]:
        return [torch.device(d) for d in self._devices]

    def _get_backend(self, device: Any) -> Any:
        if torch.device(device).type == "cuda":
            return self._nccl_backend
        return super()._get_backend(device)

    def shutdown(self) -> None:
        """Shut the gloo backend down once (it is registered here for two devices, and in
        `_inner`), once gloo's threads have let go of the future callbacks they ran: one may
        hold the group's last reference, and gloo's thread cannot tear down its own group (see
        `_futures.settle`)."""
        if not getattr(self, "_shut", False):
            self._shut = True
            self._release_buffers()
            _futures.settle()
            self._inner.shutdown()

    def get_group_store(self) -> Any:
        return self._inner.get_group_store()

    @property
    def options(self) -> Any:
        return self._nccl_options

    def __repr__(self) -> str:
        return (f"ProcessGroupNCCL(rank={self.rank()}, size={self.size()}, simulated on gloo)")

    def split_group(self, ranks: Any, timeout: Any = None, opts: Any = None,
                    group_name: Any = None, group_desc: Any = None,
                    device_types: Any = None) -> ProcessGroupNCCL | None:
        """NCCL's communicator split (`dist.split_group`, DeviceMesh with a bound device)."""
        inner_opts = opts if isinstance(opts, ProcessGroupGloo.Options) else None
        inner = self._inner.split_group(ranks, timeout=timeout, opts=inner_opts,
                                        group_name=group_name, group_desc=group_desc)
        if inner is None:
            return None
        child = type(self)._around(inner, copy.copy(self._nccl_options))
        child._devices = self._devices
        return child

    # Collectives -------------------------------------------------------------------------------

    @_timed
    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        tensors = _listed(tensors)
        opts = opts if opts is not None else AllreduceOptions()
        kind = _reduce_in_place(tensors, opts, self._host_ok)
        self._charge("all_reduce", _total(tensors), tensors[0], opts,
                     sum(t.numel() for t in tensors))
        return self._inner.allreduce(tensors, _options(AllreduceOptions, opts, kind))

    @_timed
    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Any:
        tensors = _listed(tensors)
        opts = opts if opts is not None else AllreduceCoalescedOptions()
        kind = _reduce_in_place(tensors, opts, self._host_ok)
        self._charge("all_reduce", _sizes(tensors), tensors[0], opts,
                     sum(t.numel() for t in tensors))
        return self._inner.allreduce_coalesced(
            tensors, _options(AllreduceCoalescedOptions, opts, kind))

    @_timed
    def reduce(self, tensors: Any, opts: Any = None) -> Any:
        tensors = _listed(tensors)
        opts = opts if opts is not None else ReduceOptions()
        kind = _reduce_in_place(tensors, opts, self._host_ok)
        self._charge("reduce", _total(tensors), tensors[0], opts)
        return self._inner.reduce(tensors, _options(ReduceOptions, opts, kind,
                                                    rootRank=opts.rootRank,
                                                    rootTensor=opts.rootTensor))

    @_timed
    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        tensors = _listed(tensors)
        opts = opts if opts is not None else BroadcastOptions()
        _check(tensors, self._host_ok)
        self._charge("broadcast", _total(tensors), tensors[0], opts)
        return self._inner.broadcast(tensors, opts)

    @_session.inside
    def barrier(self, opts: Any = None) -> Any:
        """NCCL's barrier blocks until every rank has entered it; it needs no tensor on a
        device here (gloo's barrier would allocate one on the bound device)."""
        timeout = getattr(opts, "timeout", None)
        plain = BarrierOptions()
        if timeout is not None:
            plain.timeout = timeout
        self._charge("barrier", (4,), None, plain, host_waits=True)
        self._inner.barrier(plain).wait()
        return _done(None)

    @_timed
    def gather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        """Every rank's tensor to the root's list (NCCL: grouped sends and receives): charged
        as the root's whole output, as nccl-tests counts a gather."""
        opts = opts if opts is not None else GatherOptions()
        ins = _listed(inputs)
        self._charge("gather", (ins[0].nbytes * self.size(),), ins[0], opts)
        return self._inner.gather(outputs, ins, opts)

    @_timed
    def scatter(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        """The root's list, one tensor to each rank (NCCL: grouped sends and receives):
        charged as the root's whole input, as nccl-tests counts a scatter."""
        opts = opts if opts is not None else ScatterOptions()
        outs = _listed(outputs)
        self._charge("scatter", (outs[0].nbytes * self.size(),), outs[0], opts)
        return self._inner.scatter(outs, inputs, opts)

    @_timed
    def allgather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        """NCCL's all-gather into a list: any shapes of the input's size; outputs of other
        sizes (an uneven gather) are a broadcast from each rank, as NCCL runs them."""
        opts = opts if opts is not None else AllgatherOptions()
        (outs,), (inp,) = outputs, _listed(inputs)
        _check([inp, *outs], self._host_ok)
        self._charge("all_gather", _total(outs), inp, opts)
        return self._allgather(outs, inp, opts)

    def _allgather(self, outs: list[torch.Tensor], inp: torch.Tensor, opts: Any) -> Any:
        outputs = [outs]
        if all(o.numel() == inp.numel() for o in outs):
            return self._inner.allgather([[_flat(o) for o in outs]], [_flat(inp)],
                                         _options(AllgatherOptions, opts))
        _flat(outs[self.rank()]).copy_(_flat(inp))
        for root, out in enumerate(outs):
            self._inner.broadcast([out], _options(BroadcastOptions, opts, rootRank=root,
                                                  rootTensor=0)).wait()
        return _done(outputs)

    @_timed
    def allgather_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        opts = opts if opts is not None else AllgatherOptions()
        for outs, inp in zip(outputs, inputs, strict=True):
            _check([inp, *outs], self._host_ok)
        if inputs:
            self._charge("all_gather", tuple(sum(o.nbytes for o in outs) for outs in outputs),
                         inputs[0], opts)
        work = None
        for outs, inp in zip(outputs, inputs, strict=True):
            work = self._allgather(outs, inp, opts)
            work.wait()
        return _done(outputs) if work is None else work

    @_timed
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          opts: Any = None, charge: bool = True) -> Any:
        """`all_gather_into_tensor`: NCCL reads the output as a flat buffer of world size
        times the input's elements, whatever its shape."""
        opts = opts if opts is not None else AllgatherOptions()
        _check([input, output], self._host_ok)
        if input.dtype != output.dtype:
            raise TypeError("output tensor must have the same type as input tensor")
        if input.numel() * self.size() != output.numel():
            raise ValueError("output tensor size must be equal to world_size times input "
                             "tensor size")
        if charge:
            self._charge("all_gather", (output.nbytes,), input, opts)
        # torch's older name, which every version binds (2.11 lacks all_gather_single)
        return self._inner._allgather_base(_flat(output), _flat(input),
                                           _options(AllgatherOptions, opts))

    _allgather_base = all_gather_single

    @_timed
    def allgather_into_tensor_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._coalesced("all_gather", self.all_gather_single, outputs, inputs, opts,
                               outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    @_timed
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                              opts: Any = None, charge: bool = True) -> Any:
        """`reduce_scatter_tensor`: NCCL reads the input as a flat buffer of world size times
        the output's elements, whatever its shape."""
        opts = opts if opts is not None else ReduceScatterOptions()
        _check([input, output], self._host_ok)
        if input.dtype != output.dtype:
            raise TypeError("input tensor must be the same type as the output tensor.")
        if input.numel() != output.numel() * self.size():
            raise ValueError("input tensor must be the same size as output size times world "
                             "size")
        kind, factor = _reduction(opts.reduceOp, input.dtype)
        if charge:
            self._charge("reduce_scatter", (input.nbytes,), input, opts)
        return self._inner._reduce_scatter_base(  # every version's name
            _flat(output), _flat(_scaled(input, factor)),
            _options(ReduceScatterOptions, opts, kind))

    _reduce_scatter_base = reduce_scatter_single

    @_timed
    def reduce_scatter_tensor_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._coalesced("reduce_scatter", self.reduce_scatter_single, outputs, inputs,
                               opts, inputs)

    def _coalesced(self, op: str, single: Callable[..., Any], outputs: Any, inputs: Any,
                   opts: Any, counted: Any) -> Any:
        """A coalesced call: charged once, as one NCCL group of its tensors (`counted`: those
        whose bytes nccl-tests counts), then run as its single collectives."""
        if inputs:
            _check([*outputs, *inputs], self._host_ok)
            self._charge(op, _sizes(counted), inputs[0], opts)
        return _one_by_one(functools.partial(single, charge=False), outputs, inputs, opts)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    @_timed
    def reduce_scatter(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        """`reduce_scatter` of lists: inputs of the output's size in any shape; of other sizes,
        a reduce to each rank, as NCCL runs them."""
        opts = opts if opts is not None else ReduceScatterOptions()
        (out,), (ins,) = _listed(outputs), inputs
        _check([out, *ins], self._host_ok)
        kind, factor = _reduction(opts.reduceOp, out.dtype)
        self._charge("reduce_scatter", _total(ins), out, opts)
        if all(i.numel() == out.numel() for i in ins):
            return self._inner.reduce_scatter(
                [_flat(out)], [[_flat(_scaled(i, factor)) for i in ins]],
                _options(ReduceScatterOptions, opts, kind))
        for root, part in enumerate(ins):
            buffer = _scaled(part, factor).clone()
            self._inner.reduce([buffer], _options(ReduceOptions, opts, kind, rootRank=root,
                                                  rootTensor=0)).wait()
            if root == self.rank():
                _flat(out).copy_(_flat(buffer))
        return _done([out])

    # Point to point --------------------------------------------------------------------------

    @_timed
    def send(self, tensors: Any, dst_rank: int, tag: int = 0) -> Any:
        """`send`/`isend` (C++ callers too): with modeled GPUs, the sender's clock goes with
        the message, so the receive starts no earlier than the send."""
        tensors = _listed(tensors)
        self._charge_p2p(tensors, dst_rank, tag, sending=True)
        return self._inner.send(tensors, dst_rank, tag)

    @_timed
    def recv(self, tensors: Any, src_rank: int, tag: int = 0) -> Any:
        tensors = _listed(tensors)
        self._charge_p2p(tensors, src_rank, tag, sending=False)
        return self._inner.recv(tensors, src_rank, tag)

    @_timed
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          output_split_sizes: Any, input_split_sizes: Any,
                          opts: Any = None) -> Any:
        _check([input, output], self._host_ok)
        self._charge("all_to_all", (input.nbytes,), input, opts)
        return self._inner.alltoall_base(output, input, list(output_split_sizes or []),
                                        list(input_split_sizes or []),
                                        *(() if opts is None else (opts,)))

    alltoall_base = all_to_all_single

    @_timed
    def alltoall(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        _check([*outputs, *inputs], self._host_ok)
        if inputs:
            self._charge("all_to_all", _total(inputs), inputs[0], opts)
        return self._inner.alltoall(outputs, inputs, *(() if opts is None else (opts,)))
