"""torch.profiler with CUDA activity on simulated GPUs: torch's own profiler, key_averages(),
table(), export_chrome_trace() and tensorboard_trace_handler, with the modeled clock's kernels
where a GPU's CUPTI would put its kernels.

On a CPU build, a profile asked for CUDA activity falls back to CUDA events around every op
(`ProfilerState.KINETO_GPU_FALLBACK`), which fail there with a C++ warning per op. While GPUs
are simulated, `torch.autograd.profiler.profile` (what `torch.profiler.profile` drives, cycle
by cycle under a `schedule`) is patched through the simulation's undo log:

- `__init__`: a profile asked for CUDA activity keeps `use_device="cuda"` (so its tables
  have CUDA columns) but hands the C++ profiler CPU activity only;
- `_start_trace` / `__exit__`: while the profile records, the clock's watched spans
  (`clock.Clock.spans`) are a list that notes, for each kernel, copy and collective, when and
  on which host thread it was launched and on which stream it runs; a convolution call's
  charge notes the op a GPU runs for it (See Note [Which op a GPU runs below
  aten::_convolution]); with `profile_memory`, each GPU's allocator notes its allocations and
  frees;
- `_parse_kineto_results`: torch's FunctionEvents get their kernels (`append_kernel`, so
  Self CUDA and CUDA total hold the modeled times; a convolution's CPU op takes the GPU's
  name), a device event per kernel (the table's
  kernel rows), and the allocator's bytes as CUDA memory;
- `export_chrome_trace`: torch's trace of the CPU side, with the GPU work added as Kineto
  writes it (`kineto_trace`).

Nothing changes per op when no profile records: the clock appends to its spans only while
something watches them. See Note [Which op launched a modeled kernel] and
Note [A modeled kernel's place on the trace's time axis].
"""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.autograd import DeviceType, ProfilerState
from torch.autograd import profiler as _tprof
from torch.autograd.profiler_util import FunctionEvent

from devlab.engine.gpu_model.kernels import GEMM
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.instruments import kineto_trace
from devlab.engine.simulated.instruments.kineto_trace import KERNEL, MEMCPY, Activity

# Kineto's numbers for CUDA's default stream and an NCCL stream on a real trace; a stream a
# program makes gets a track of its own after them.
DEFAULT_STREAM, NCCL_STREAM, SIDE_STREAMS = 7, 13, 100
MODELED = "modeled: "

_profile = _tprof.profile
_time_ns, _native_id = time.time_ns, threading.get_native_id
_recorders: set[_Recorder] = set()  # the profiles recording now (stop() detaches them)


class _Launch(NamedTuple):
    """When and where the host launched one recorded span."""

    wall_ns: int
    thread: int  # the launching thread's native id
    stream: int  # the stream's track
    host: float  # the host's modeled time at the launch
    op: Any  # the clock's OpTime for the span, where it is known


class _Spans(list):
    """`clock.spans` while a profile records: notes, for each span, what its launch needs
    that only the moment of its launch knows (`_Recorder.launches` makes them `_Launch`es
    once the profile is parsed; noted as a tuple, since this runs for every span)."""

    def __init__(self, rec: _Recorder) -> None:
        super().__init__()
        self.rec = rec
        # (wall ns, thread, stream id or -1 for NCCL's, host's modeled time, charges before)
        self.notes: list[tuple[int, int, int, float, int]] = []

    def append(self, span: Any) -> None:
        list.append(self, span)
        rec = self.rec
        self.notes.append((_time_ns(), _native_id(), -1 if span.stream == rec.comm else
                           _session.current_streams().get(span.device, 0),
                           rec.clock.host, len(rec.ops)))

    def extend(self, spans: Any) -> None:
        for s in spans:
            self.append(s)


class _Ops(list):
    """`clock.recording` while a profile records: the clock's charges (a kernel's terms), in
    order; the clock appends them itself, so a charge costs the profile nothing here."""

    def extend(self, ts: Any) -> None:
        """A nested `record()` hands back its charges: they were not this profile's to see
        (their spans come through `_Spans.extend`, with no charge of their own)."""


class _Recorder:
    """What one profile cycle saw on the modeled clock."""

    def __init__(self, clock: Any, spec: Any, memory: bool) -> None:
        from devlab.engine.gpu_model import modeled_clock as _clock  # a model's only

        self.clock, self.spec, self.memory = clock, spec, memory
        self.comm, self.kinds = _clock.COMM, _clock
        self.ops = _Ops()
        self.gpu_names: dict[int, str] = {}  # id(charge) -> the op a GPU runs for it
        self.gpu_backward: dict[int, str] = {}  # id(charge) -> the op its backward runs
        self.renamed: dict[int, str] = {}  # a CPU event's id -> the GPU's name for it
        self.allocations: list[tuple[int, int, int]] = []  # (wall ns, device, +/- bytes)
        self.spans: _Spans | None = None
        self.thread = threading.get_native_id()
        self.activities: list[Activity] = []
        self.parsed: bool | None = None  # the activities were found
        self._undo: Patcher | None = None

    def start(self) -> None:
        clock = self.clock
        self.spans = _Spans(self)
        with clock.lock:
            self._outer = clock.spans, clock.recording
            clock.spans, clock.recording = self.spans, self.ops
        self._undo = Patcher()
        sess = _session.session
        if sess is not None:
            self._watch_charges(sess.charges)
        if self.memory:
            for dev in sess.devices if sess is not None else ():
                self._watch_allocator(dev.index, dev.allocator)
        _recorders.add(self)

    def _watch_charges(self, charges: Any) -> None:
        """Each convolution's and batch norm's call's charges note the op a GPU runs for it
        (`gpu_convolution`, `gpu_batch_norm`): its arguments decide it, and only the call sees
        them."""
        cls = type(charges)  # (its instances have slots: the class's method is watched)
        call, ops, names, backward = cls.call, self.ops, self.gpu_names, self.gpu_backward

        def watched_call(self: Any, func: Any, args: tuple, kwargs: dict, *rest: Any) -> Any:
            if (func not in _CONVOLUTIONS and func not in _BATCH_NORMS) or self is not charges:
                return call(self, func, args, kwargs, *rest)
            n = len(ops)
            got = call(self, func, args, kwargs, *rest)
            if func in _CONVOLUTIONS:
                name, back = gpu_convolution(args, kwargs), None
            else:
                name, back = gpu_batch_norm(func, args, kwargs) or (None, None)
            if name is not None:
                for t in ops[n:]:
                    names[id(t)] = name
                    if back is not None:
                        backward[id(t)] = back
            return got

        call_and_leave = cls.call_and_leave

        def watched_call_and_leave(self: Any, func: Any, args: tuple, kwargs: dict,
                                   *rest: Any) -> Any:
            # The mode's fast path charges through call_and_leave, which is call then leave.
            if (func not in _CONVOLUTIONS and func not in _BATCH_NORMS) or self is not charges:
                return call_and_leave(self, func, args, kwargs, *rest)
            watched_call(self, func, args, kwargs, *rest)
            self.leave()
            return None

        assert self._undo is not None
        self._undo.set(cls, "call", watched_call)
        self._undo.set(cls, "call_and_leave", watched_call_and_leave)

    def _watch_allocator(self, index: int, allocator: Any) -> None:
        allocate, free, seen = allocator.allocate, allocator.free, self.allocations

        def watched_allocate(size: int, stream: int = 0) -> Any:
            got = allocate(size, stream)
            size_ = getattr(got, "size", None)
            if size_ is not None:
                seen.append((time.time_ns(), index, size_))
            return got

        def watched_free(block: Any) -> None:
            size = block.size
            free(block)
            seen.append((time.time_ns(), index, -size))

        assert self._undo is not None
        self._undo.set(allocator, "allocate", watched_allocate)
        self._undo.set(allocator, "free", watched_free)

    def stop(self) -> None:
        _recorders.discard(self)
        clock = self.clock
        with clock.lock:
            if clock.spans is self.spans:
                outer_spans, outer_ops = self._outer
                clock.spans, clock.recording = outer_spans, outer_ops
                if outer_spans is not None and self.spans:
                    outer_spans.extend(self.spans)
        if self._undo is not None:
            self._undo.restore()
            self._undo = None


    @property
    def launches(self) -> list[_Launch]:
        """Each span's launch, from what `_Spans` noted: its stream's track, and the charge it
        ran, where known (the last charge before it, where that names it; a copy's spans come
        before its charge, one per GPU it touches, and get the charge that follows them)."""
        spans, ops = self.spans or [], self.ops
        notes = spans.notes if isinstance(spans, _Spans) else []
        out = []
        for span, (wall, thread, sid, host, n) in zip(spans, notes, strict=True):
            op = ops[n - 1] if n else None
            stream = NCCL_STREAM if sid < 0 else SIDE_STREAMS + sid if sid else DEFAULT_STREAM
            out.append(_Launch(wall, thread, stream, host,
                               op if op is not None and op.op == span.name else None))
        before = [n for *_, n in notes]
        for j, t in enumerate(ops):
            k = bisect_left(before, j + 1) - 1  # the last span noted before charge j
            while k >= 0 and spans[k].name == t.op and out[k].op is None:
                out[k] = out[k]._replace(op=t)
                k -= 1
        return out


def _detach_all() -> None:
    """The simulation stops: profiles still recording stop watching its clock."""
    for rec in list(_recorders):
        rec.stop()


# --- which op launched what --------------------------------------------------------------

# Note [Which op launched a modeled kernel]
# The simulation charges the clock in its routing mode, after the torch call returned, so a
# kernel's launch comes just after the aten ops that call ran (on a GPU the launch is inside
# the op: aten::mm calls cudaLaunchKernel). The profiler's events on the launching thread that
# began after the previous launch and ended before this one are that call's ops: the kernel
# goes to the one named as the call (aten::matmul for `x @ x`; otherwise the longest), then
# down to the child that did the work (aten::mm: the child holding most of its parent's time),
# where a GPU's profile puts it. Launches with no new op before them (a backward pass's
# kernels, charged together at its end) belong to the ops before the first of them: a
# backward kernel goes to the `autograd::engine::evaluate_function: <Node>` of its forward
# op, in order. Allocations and frees go to the op before them the same way.

# Ops that launch no kernel on a GPU (views, allocations, metadata): never a kernel's owner
# below an op that may launch one.
_NO_KERNEL = re.compile(
    r"^(detach|aten::(empty|new_empty|empty_like|empty_strided|as_strided|view|_unsafe_view|"
    r"reshape|_reshape_alias|t|transpose|expand|detach|resolve_conj|resolve_neg|unsqueeze|"
    r"squeeze|permute|alias|slice|select|lift_fresh|set_|resize_|numpy_T|unflatten|flatten|"
    r"split|chunk|narrow|unbind|view_as|expand_as)(\.|$))")
# The ops that run a matrix product's kernel (cuBLAS's, cuDNN's) on a GPU.
_PRODUCTS = re.compile(r"^aten::(mm|bmm|addmm|addmv|mv|dot|vdot|baddbmm|addbmm|_addmm_activation|"
                       r"_scaled_mm|.*convolution.*|_scaled_dot_product_.*)$")
_NODE_SUFFIX = re.compile(r"Backward\d*$")


def _norm(name: str) -> str:
    return name.split(" ")[0].removeprefix("aten::").replace("_", "").lower()


# Note [Which op a GPU runs below aten::_convolution]
# The simulation computes a convolution with the CPU's kernels, so torch's profiler records the
# CPU's op below aten::_convolution (aten::mkldnn_convolution). A GPU's torch picks its backend
# from the call's arguments (aten/src/ATen/native/Convolution.cpp, select_conv_backend): cuDNN
# (aten::cudnn_convolution) while torch.backends.cudnn.enabled, except a depthwise convolution
# (groups == input channels, > 1) of a contiguous float32/float64 4-D input, which runs CUDA's
# own kernel (aten::_conv_depthwise2d; use_cudnn_depthwise takes cuDNN only for channels-last
# or half-precision inputs, under conditions not modeled here). The call's charge notes the
# GPU's op while a profile records, and the CPU's op that owns its kernel takes that name, in
# the table and the trace. Where the arguments do not settle it (cuDNN off, half-precision or
# 3-D/5-D depthwise, another dtype) the CPU's name stays. A GPU's cuDNN path adds the bias
# with an aten::add_ the CPU's fused kernel does not show: not added.
# A batch norm is renamed the same way (See Note [Which op a GPU runs for a batch norm]).
_CONVOLUTIONS = frozenset({torch.conv1d, torch.conv2d, torch.conv3d})
_CPU_CONVOLUTION = "aten::mkldnn_convolution"
_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def gpu_convolution(args: tuple, kwargs: dict) -> str | None:
    """The op a GPU's torch runs below aten::_convolution for `torch.conv{1,2,3}d(*args,
    **kwargs)`, or None where its arguments do not settle it. See Note [Which op a GPU runs
    below aten::_convolution]."""
    if len(args) < 2 or not torch.backends.cudnn.enabled:
        return None
    x, w = args[0], args[1]
    if type(x) not in (torch.Tensor, torch.nn.Parameter) or not isinstance(w, torch.Tensor):
        return None
    if x.dtype not in _FLOATS or x.numel() == 0:
        return None
    groups = kwargs.get("groups", args[6] if len(args) > 6 else 1)
    if not isinstance(groups, int):
        return None
    if groups > 1 and x.dim() in (4, 5) and x.shape[1] == groups and w.shape[0] % groups == 0:
        if (x.dim() == 4 and x.dtype in (torch.float32, torch.float64) and x.is_contiguous()
                and w.is_contiguous()):
            return "aten::_conv_depthwise2d"
        return None
    return "aten::cudnn_convolution"


# Note [Which op a GPU runs for a batch norm]
# aten::batch_norm runs aten::_batch_norm_impl_index, which on a GPU runs cuDNN's
# aten::cudnn_batch_norm where `_select_batch_norm_backend` (aten/src/ATen/native/
# Normalization.cpp) picks cuDNN, and aten::native_batch_norm (CUDA's own kernels) otherwise,
# the op the CPU runs too. It picks cuDNN when torch.backends.cudnn.enabled (the call's own
# cudnn_enabled argument is ignored there), the input is on the GPU, neither the input nor
# the weight is bfloat16, a half-precision input has a float32 weight, the weight and bias
# are both given, the running statistics are both given (or, in training, both absent), the
# input has at least 3 dimensions (BatchNorm1d on (N, C) runs CUDA's own), its batch is at
# most 880,801 in training or 65,535 in evaluation, it has fewer than 2^31 - 1 elements,
# and eps is at least CUDNN_BN_MIN_EPSILON (0 since cuDNN 7). The node autograd records is
# then CudnnBatchNormBackward0, whose backward runs aten::cudnn_batch_norm_backward in
# training and aten::native_batch_norm_backward in evaluation (derivatives.yaml: "CuDNN
# cannot be used to compute backward in evaluation mode"). The forward op is renamed as a
# convolution is, where its kernel is matched to it; its backward node's events (the
# `autograd::engine::evaluate_function:` range, the node, its op) are found by the autograd
# sequence number torch records on the forward op and its node alike, so they are renamed
# whether or not their kernels were matched to them (docs/profiler-validation.md).
_BATCH_NORMS = frozenset({torch.nn.functional.batch_norm, torch.batch_norm})
_CPU_BATCH_NORM = "aten::native_batch_norm"
_CPU_BATCH_NORM_NODE = "NativeBatchNormBackward0"
_CUDNN_BN_MIN_EPSILON = 0.0
_CUDNN_MAX_BATCH = (880801, 65535)  # training, evaluation
_INT32_MAX = 2**31 - 1


def gpu_batch_norm(func: Any, args: tuple, kwargs: dict) -> tuple[str, str] | None:
    """The ops a GPU's torch runs for `func(*args, **kwargs)` (F.batch_norm or
    torch.batch_norm), forward and backward, where cuDNN's differ from the CPU's; None where
    a GPU runs the CPU's (aten::native_batch_norm) or the arguments do not settle it. See
    Note [Which op a GPU runs for a batch norm]."""
    if func is torch.batch_norm:  # (input, weight, bias, running_mean, running_var, training,
        if len(args) < 8:         #  momentum, eps, cudnn_enabled)
            return None
        x, w, b, mean, var, training, _, eps = args[:8]
    else:  # (input, running_mean, running_var, weight=None, bias=None, training=False, ...)
        names = ("input", "running_mean", "running_var", "weight", "bias", "training",
                 "momentum", "eps")
        given = dict(zip(names, args, strict=False)) | kwargs
        if "input" not in given:
            return None
        x, mean, var = given["input"], given.get("running_mean"), given.get("running_var")
        w, b = given.get("weight"), given.get("bias")
        training, eps = given.get("training", False), given.get("eps", 1e-5)
    if not torch.backends.cudnn.enabled or type(x) not in (torch.Tensor, torch.nn.Parameter):
        return None
    if not (isinstance(w, torch.Tensor) and isinstance(b, torch.Tensor)):
        return None
    if not isinstance(training, bool) or not isinstance(eps, (int, float)):
        return None
    stats = (isinstance(mean, torch.Tensor), isinstance(var, torch.Tensor))
    if x.dtype not in _FLOATS or torch.bfloat16 in (x.dtype, w.dtype):
        return None
    if x.dtype == torch.float16 and w.dtype != torch.float32:
        return None
    if not (all(stats) or (training and mean is None and var is None)):
        return None
    if x.dim() < 3 or x.numel() == 0 or x.numel() >= _INT32_MAX:
        return None
    if x.shape[0] > _CUDNN_MAX_BATCH[0 if training else 1] or eps < _CUDNN_BN_MIN_EPSILON:
        return None
    return ("aten::cudnn_batch_norm",
            "aten::cudnn_batch_norm_backward" if training else "aten::native_batch_norm_backward")


class _Tree:
    """The CPU events of a profile, nested per thread as torch nests them."""

    def __init__(self, events: list[FunctionEvent]) -> None:
        cpu = [e for e in events if e.device_type == DeviceType.CPU and not e.is_async
               and e.name != "[memory]"]
        cpu.sort(key=lambda e: (e.time_range.start, -e.time_range.end))
        self.events = cpu
        self.children: dict[int, list[FunctionEvent]] = {}
        self.parent: dict[int, FunctionEvent | None] = {}
        stacks: dict[int, list[FunctionEvent]] = {}
        for e in cpu:
            stack = stacks.setdefault(e.thread, [])
            while stack and stack[-1].time_range.end <= e.time_range.start:
                stack.pop()
            parent = stack[-1] if stack else None
            self.parent[id(e)] = parent
            if parent is not None:
                self.children.setdefault(id(parent), []).append(e)
            stack.append(e)
        self.starts = [e.time_range.start for e in cpu]
        self._nodes: dict[tuple[int, int], list[FunctionEvent]] | None = None

    def backward_of(self, e: FunctionEvent) -> list[FunctionEvent]:
        """The events of the autograd node forward op `e` made (its evaluate_function range
        and the node): torch records the forward op's sequence number on both."""
        if self._nodes is None:
            self._nodes = {}
            for n in self.events:
                if n.sequence_nr >= 0 and n.fwd_thread is not None and (
                        _NODE_SUFFIX.search(n.name)):
                    self._nodes.setdefault((n.sequence_nr, n.fwd_thread), []).append(n)
        if e.sequence_nr < 0:
            return []
        return self._nodes.get((e.sequence_nr, e.thread), [])

    def inside(self, after: float, until: float) -> list[FunctionEvent]:
        """The events that began after `after` and ended by `until`, in order."""
        lo, hi = bisect_right(self.starts, after), bisect_right(self.starts, until)
        return [e for e in self.events[lo:hi] if e.time_range.end <= until]

    def window(self, after: float, until: float) -> list[FunctionEvent]:
        """The outermost events that began after `after` and ended by `until`."""
        inside = self.inside(after, until)
        ids = {id(e) for e in inside}
        return [e for e in inside if id(self.parent[id(e)]) not in ids]

    def worker(self, e: FunctionEvent, product: bool = False) -> FunctionEvent:
        """The descendant that did `e`'s work: down the child holding most of the time, of
        those that may launch a kernel (for a matrix product's kernel, down to the op that
        calls cuBLAS, wherever it is)."""
        while True:
            every = self.children.get(id(e), ())
            if len(every) == 1 and every[0].name == e.name:
                # EventList keeps the inner one of such a pair, and its kernels only.
                e = every[0]
                continue
            kids = [c for c in every if not _NO_KERNEL.match(c.name)]
            if not kids:
                return e
            if product and not _PRODUCTS.match(e.name):
                below = [c for c in kids if _PRODUCTS.match(c.name) or self.children.get(id(c))]
                if below:
                    e = max(below, key=lambda c: (bool(_PRODUCTS.match(c.name)),
                                                  c.cpu_time_total))
                    continue
            big = max(kids, key=lambda c: c.cpu_time_total)
            if big.cpu_time_total * 2 < e.cpu_time_total:
                return e
            e = big

    def ancestors(self, e: FunctionEvent) -> list[FunctionEvent]:
        out = [e]
        p = self.parent.get(id(e))
        while p is not None:
            out.append(p)
            p = self.parent.get(id(p))
        return out


def _pick(window: list[FunctionEvent], name: str) -> FunctionEvent | None:
    if not window:
        return None
    named = [e for e in window if e.name == name]
    return named[-1] if named else max(window, key=lambda e: e.cpu_time_total)


# The autograd nodes a forward call's backward runs as, where the names differ (a call that
# decomposes: `x @ w` is aten::matmul, its node MmBackward0).
_NODES = {"matmul": ("mm", "bmm", "mv", "dot", "unsafeview"), "linear": ("addmm", "mm", "t"),
          "conv2d": ("convolution",), "conv1d": ("convolution",), "conv3d": ("convolution",),
          "crossentropy": ("nllloss", "logsoftmax"), "relu": ("relu", "threshold"),
          "batchnorm": ("nativebatchnorm", "cudnnbatchnorm"),
          "nativebatchnorm": ("cudnnbatchnorm",),  # its node, once named as a GPU's
          "maxpool2d": ("maxpool2dwithindices",), "maxpool1d": ("maxpool2dwithindices",),
          "maxpool3d": ("maxpool3dwithindices",), "adaptiveavgpool2d": ("mean",),
          "adaptiveavgpool1d": ("mean",), "layernorm": ("nativelayernorm",)}


def _backward_target(evaluated: list[FunctionEvent], name: str,
                     cursor: list[int]) -> FunctionEvent | None:
    """The evaluate_function event a backward kernel of forward op `name` belongs to: the
    first of that op's kind from `cursor` on (a node's kernels come together), else the
    next node."""
    op = _norm(name)
    want = {op, *_NODES.get(op, ())}
    for k in range(cursor[0], len(evaluated)):
        node = evaluated[k].name.rsplit(": ", 1)[-1]
        if _norm(_NODE_SUFFIX.sub("", node)) in want:
            cursor[0] = k
            return evaluated[k]
    nxt = min(cursor[0] + 1, len(evaluated) - 1)
    if "AccumulateGrad" in evaluated[nxt].name:
        return None
    cursor[0] = nxt
    return evaluated[nxt]


def _describe(span: Any, op: Any, target: str | None) -> str:
    """A kernel's name: what ran, and that it was modeled ("modeled: aten::mm (matrix
    product, 2 MFLOP)")."""
    owner = target or span.name.split(" ")[0]
    k = getattr(op, "kernel", None)
    if k is None:
        return MODELED + owner
    amount = f"{k.flops / 1e6:.3g} MFLOP" if k.flops else f"{k.nbytes / 1e3:.3g} kB"
    backward = "backward, " if "(backward)" in span.name else ""
    return f"{MODELED}{owner} ({backward}{k.family}, {amount})"


_COPY_WHERE = re.compile(r"\((host→GPU:\d+|GPU:(\d+)→host|GPU:(\d+)→GPU:(\d+))\)$")


def _copy_name(span: Any) -> str:
    m = _COPY_WHERE.search(span.name)
    kind = "DtoD"
    if m is not None:
        where = m.group(1)
        kind = ("HtoD" if where.startswith("host") else "DtoH" if where.endswith("host") else
                "DtoD" if m.group(3) == m.group(4) else "PtoP")
    label = {"HtoD": "(Pageable -> Device)", "DtoH": "(Device -> Pageable)",
             "DtoD": "(Device -> Device)", "PtoP": "(Device -> Device)"}[kind]
    return f"Memcpy {kind} {label} ({MODELED}{span.name})"


# NCCL's kernel for each collective, as CUPTI names it (NCCL 2.19 on: ncclDevKernel_<Op>_<RedOp>_
# <type>_<ALGO>_<PROTO>): Holistic Trace Analysis finds communication by `^nccl.*Kernel`, so a
# modeled collective named otherwise was counted as computation, and its communication and
# overlap analyses found none. The reduction and the type are not in the span: left out.
_NCCL_KERNELS = {"all_reduce": "AllReduce", "broadcast": "Broadcast", "reduce": "Reduce",
                 "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
                 "barrier": "AllReduce"}  # torch's NCCL barrier all-reduces one element
_COLLECTIVE = re.compile(r"^nccl:(\w+) \([^,]*, [^,]*, (\w+)/(\w*)\)")


def _collective_name(span: Any) -> str:
    """A modeled collective's kernel as NCCL names it, with what the model says after it."""
    m = _COLLECTIVE.match(span.name)
    kernel = "ncclDevKernel_SendRecv"  # all_to_all, send_recv, gather, scatter: grouped p2p
    if m is not None:
        op, algorithm, protocol = m.groups()
        if op in _NCCL_KERNELS:
            kernel = f"ncclDevKernel_{_NCCL_KERNELS[op]}_{algorithm.upper()}"
            kernel += f"_{protocol.upper()}" if protocol else ""
    return f"{kernel} ({MODELED}{span.name})"


# Note [A modeled kernel's place on the trace's time axis]
# The trace's CPU events are in wall time; the clock's spans in modeled seconds. A kernel is
# placed as far after its launch, in wall time, as the clock has it start after the host's
# launch (waiting for its stream), and lasts what the clock says: its duration is the modeled
# one exactly. "Its launch" is the `cudaLaunchKernel` event as drawn, inside the op that made
# it, not the moment the simulation charged it: a backward pass's kernels are charged together
# at its end, and placed after that moment they would wait on an idle GPU for as long as the
# CPU took to compute the rest of the backward (HTA read it as launch delays of 100 ms and
# kernels queued on an idle stream). Where the host's modeled time runs slower than the wall clock (the CPU
# computing the values), kernels so placed could overlap on their stream; each starts no
# earlier than the end of the one before it on its track, so gaps, not durations, absorb the
# difference. Where the host's modeled time follows the wall clock, this is the clock's own
# timeline, shifted.


# CUPTI numbers a process's runtime calls from its start, so a real trace's correlation ids
# are large; HTA stores them in the smallest integer type that holds them, and then cannot
# write its (larger) row indices into that column (TypeError with pandas 3). Ids from 2**16
# on are what a GPU process that ran for a while has.
_FIRST_CORRELATION = 1 << 16


class _Groups:
    """Launches (or allocations) in time order, each given the CPU event it belongs to: the
    call's ops since the previous one, or the previous one's when there are none."""

    def __init__(self, tree: _Tree) -> None:
        self.tree = tree
        self.boundary = -1e30
        self.target: FunctionEvent | None = None
        self.evaluated: list[FunctionEvent] = []
        self.cursor = [0]

    def at(self, until_us: float, name: str, product: bool = False) -> FunctionEvent | None:
        tree = self.tree
        found = tree.window(self.boundary, until_us)
        if found:
            self.evaluated = [e for e in tree.inside(self.boundary, until_us)
                              if e.name.startswith("autograd::engine::evaluate_function: ")]
            self.cursor[0] = 0
            picked = _pick(found, name.split(" ")[0])
            self.target = tree.worker(picked, product) if picked is not None else None
            self.boundary = until_us
        if "(backward)" in name and self.evaluated:
            node = _backward_target(self.evaluated, name, self.cursor)
            if node is not None:
                return tree.worker(node, product)
        return self.target


def activities(rec: _Recorder, events: list[FunctionEvent],
               trace_start_ns: int) -> list[tuple[Activity, FunctionEvent | None]]:
    """The recorded spans as trace activities, each with the CPU event that launched it (None:
    launched on a thread the profile does not record); with `profile_memory`, the allocator's
    bytes added to the CUDA memory of the ops that allocated or freed them."""
    kinds = rec.kinds
    tree = _Tree(events)
    spans = list(rec.spans or ())
    launches = rec.launches
    groups = _Groups(tree)
    out: list[tuple[Activity, FunctionEvent | None]] = []
    track_end: dict[tuple[int, int], int] = {}
    launch_default = int(rec.spec.launch_latency_us * 1e3)
    per_owner: dict[int, int] = {}
    waiting: dict[int, float] = {}
    correlation = _FIRST_CORRELATION
    for k in sorted(range(len(spans)), key=lambda k: launches[k].wall_ns):
        span, launch = spans[k], launches[k]
        if span.kind == kinds.WAIT_RANKS:  # NCCL's kernel spins while the others come
            waiting[span.device] = span.start
            continue
        if span.kind not in (kinds.KERNEL, kinds.COPY_SPAN, kinds.COLLECTIVE):
            continue
        owner = None
        if launch.thread == rec.thread:
            kernel = getattr(launch.op, "kernel", None)
            owner = groups.at((launch.wall_ns - trace_start_ns) / 1000.0, span.name,
                              getattr(kernel, "family", None) == GEMM)
        start = span.start
        if span.kind == kinds.COLLECTIVE:
            start = min(start, waiting.pop(span.device, start))
        dur_ns = int(round((span.end - start) * 1e9))
        op = launch.op
        launch_ns = int(op.launch * 1e9) if op is not None and op.launch else launch_default
        if owner is not None:  # the launch: at the end of the op that made it
            n = per_owner.get(id(owner), 0)
            per_owner[id(owner)] = n + 1
            op_start = trace_start_ns + int(owner.time_range.start * 1000)
            op_end = trace_start_ns + int(owner.time_range.end * 1000)
            launch_ns = min(launch_ns, max(1, (op_end - op_start) // 4))
            at_ns = max(op_start, op_end - (n + 1) * launch_ns)
        else:
            at_ns = launch.wall_ns
        # See Note [A modeled kernel's place on the trace's time axis].
        key = (span.device, launch.stream)
        begin = at_ns + int(round((start - launch.host) * 1e9))
        begin = max(begin, track_end.get(key, begin), at_ns + launch_ns)
        track_end[key] = begin + dur_ns
        correlation += 1
        if owner is not None and op is not None and owner.name in (_CPU_CONVOLUTION,
                                                                   _CPU_BATCH_NORM):
            # See Note [Which op a GPU runs below aten::_convolution] and Note [Which op a
            # GPU runs for a batch norm].
            gpu = rec.gpu_names.get(id(op))
            if gpu is not None:
                if owner.name == _CPU_BATCH_NORM:
                    _rename_backward(rec, tree, owner, rec.gpu_backward.get(id(op)))
                _rename(rec, owner, gpu)
        if span.kind == kinds.COPY_SPAN:
            kind, name = MEMCPY, _copy_name(span)
        else:
            kind = KERNEL
            name = (_collective_name(span) if span.kind == kinds.COLLECTIVE else
                    _describe(span, op, owner.name if owner is not None else None))
        nbytes = getattr(op, "nbytes", 0) if op is not None else 0
        out.append((Activity(kind, name, span.device, launch.stream, begin, dur_ns,
                             correlation, launch.thread, at_ns, launch_ns,
                             owner.id if owner is not None else None, nbytes), owner))
    memory = _Groups(tree)
    for t_ns, _device, nbytes in sorted(rec.allocations):
        owner = memory.at((t_ns - trace_start_ns) / 1000.0, "")
        for e in tree.ancestors(owner) if owner is not None else ():
            e.device_memory_usage += nbytes
    return out


def _rename(rec: _Recorder, e: FunctionEvent, name: str) -> None:
    """CPU event `e` is named `name` in the table and the trace."""
    e.name = e.trace_name = name
    rec.renamed[e.id] = name


def _rename_backward(rec: _Recorder, tree: _Tree, forward: FunctionEvent,
                     op: str | None) -> None:
    """The batch norm `forward` ran as cuDNN's: its backward node's events are named as a
    GPU's (CudnnBatchNormBackward0), and the op below the node `op`."""
    for node in tree.backward_of(forward):
        if _CPU_BATCH_NORM_NODE not in node.name:
            continue
        _rename(rec, node, node.name.replace(_CPU_BATCH_NORM_NODE, "CudnnBatchNormBackward0"))
        below = list(tree.children.get(id(node), ()))
        while below and op is not None:  # the op, and the same op nested in it (its kernel)
            child = below.pop()
            if child.name == "aten::native_batch_norm_backward":
                _rename(rec, child, op)
                below.extend(tree.children.get(id(child), ()))


# The ranges torch records around a Python dispatch mode: the simulation's own modes (its
# autograd and graph capture use one), which a GPU's profile does not have.
HIDDEN = frozenset({"PythonDispatchMode", "PythonTLSSnapshot"})


def _attach(rec: _Recorder, events: list[FunctionEvent], trace_start_ns: int,
            use_device: str | None) -> None:
    """torch's events with the modeled GPU work: kernels on the ops that launched them, and
    a device event per kernel and copy (the table's kernel rows); the simulation's own
    dispatch-mode ranges left out (`HIDDEN`)."""
    events[:] = [e for e in events if e.name not in HIDDEN]
    owned = activities(rec, events, trace_start_ns)
    rec.activities = [a for a, _ in owned]
    rec.parsed = True
    next_id = max((e.id for e in events), default=0) + 1
    for k, (a, owner) in enumerate(owned):
        dur_us = a.dur_ns / 1000.0
        if owner is not None:
            owner.append_kernel(a.name, a.device, dur_us)
        start_us = (a.start_ns - trace_start_ns) / 1000.0
        events.append(FunctionEvent(
            id=next_id + k, name=a.name, thread=a.stream, start_us=start_us,
            end_us=start_us + dur_us, overload_name="", trace_name=a.name, input_shapes=[],
            stack=[], use_device=use_device, device_type=DeviceType.CUDA,
            device_index=a.device, is_legacy=False))
    events.sort(key=lambda e: [e.time_range.start, -e.time_range.end])


# --- the patched profile ------------------------------------------------------------------


def _modeled_clock() -> tuple[Any, Any] | None:
    sess = _session.session
    clock = getattr(sess.charges, "clock", None) if sess is not None else None
    return (clock, sess.spec) if clock is not None else None  # type: ignore[union-attr]


def _wrap_init(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        # CUDA activity alone (`activities=[ProfilerActivity.CUDA]`): torch's fallback would
        # refuse it without CPU activity; the host's ops are recorded, to place the launches,
        # and left out of what the profile gives.
        gpu_only = (_session.session is not None and not args
                    and kwargs.get("use_device") == "cuda" and kwargs.get("use_cpu") is False)
        if gpu_only:
            kwargs["use_cpu"] = True
        orig(self, *args, **kwargs)
        self._devlab = None
        self._devlab_gpu_only = False
        if (_session.session is not None and self.use_device == "cuda"
                and self.profiler_kind == ProfilerState.KINETO_GPU_FALLBACK):
            # The C++ profiler gets CPU activity only; the GPU's comes from the clock.
            self.profiler_kind = ProfilerState.KINETO
            self._devlab = False  # asked for CUDA; recorded once a modeled clock runs
            self._devlab_gpu_only = gpu_only

    return __init__


def _wrap_start(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def _start_trace(self: Any) -> None:
        rec = None
        if getattr(self, "_devlab", None) is not None:
            modeled = _modeled_clock()
            if modeled is not None:
                rec = _Recorder(modeled[0], modeled[1], bool(self.profile_memory))
                self._devlab = rec
        orig(self)
        if rec is not None:
            rec.start()

    return _start_trace


def _wrap_exit(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def __exit__(self: Any, *exc: Any) -> Any:
        try:
            return orig(self, *exc)
        finally:
            rec = getattr(self, "_devlab", None)
            if rec:
                rec.stop()

    return __exit__


class _Without:
    """A profile's results without the simulation's own ranges (`HIDDEN`), which torch then
    never turns into events: its post-processing pays for the program's ops only."""

    def __init__(self, result: Any) -> None:
        self._result = result

    def events(self) -> list[Any]:
        return [e for e in self._result.events() if e.name() not in HIDDEN]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)


def _wrap_parse(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def _parse_kineto_results(self: Any, result: Any, *args: Any, **kwargs: Any) -> Any:
        rec = getattr(self, "_devlab", None)
        events = orig(self, _Without(result) if rec else result, *args, **kwargs)
        if rec:
            _attach(rec, events, result.trace_start_ns(), self.use_device)
            if self._devlab_gpu_only:
                events[:] = [e for e in events if e.device_type != DeviceType.CPU]
        return events

    return _parse_kineto_results


def _device_properties(devices: set[int]) -> list[dict[str, Any]]:
    out = []
    for i in sorted(devices):
        p = torch.cuda.get_device_properties(i)
        spec = _session.session.spec if _session.session is not None else None
        entry: dict[str, Any] = {"id": i, "name": p.name, "totalGlobalMem": p.total_memory,
                                 "computeMajor": p.major, "computeMinor": p.minor,
                                 "warpSize": 32, "maxThreadsPerBlock": 1024}
        sms = getattr(spec, "sms", None)
        if sms:
            entry["numSms"] = sms
        out.append(entry)
    return out


def _distributed_info() -> dict[str, Any]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return {"backend": dist.get_backend(), "rank": dist.get_rank(),
                "world_size": dist.get_world_size()}
    return {"backend": "nccl", "rank": 0, "world_size": 1}


def _wrap_export(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def export_chrome_trace(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        rec = getattr(self, "_devlab", None)
        if not rec:
            return orig(self, path, *args, **kwargs)
        if rec.parsed is None:  # the kernels' owners are found among torch's events
            if getattr(self.experimental_config, "trace_only", False):
                self._parse_kineto_results(self.kineto_results)  # what events() refuses
            else:
                self._ensure_function_events()
        fd, tmp = tempfile.mkstemp(suffix=".json", dir=os.path.dirname(os.path.abspath(path)))
        os.close(fd)
        try:
            orig(self, tmp, *args, **kwargs)
            with open(tmp) as f:
                cpu = json.load(f)
        finally:
            os.unlink(tmp)
        if rec.renamed:  # the ops named as on a GPU in the table are so named in the trace
            for e in cpu.get("traceEvents", ()):
                ext = e.get("args", {}).get("External id") if e.get("cat") == "cpu_op" else None
                if ext in rec.renamed:
                    e["name"] = rec.renamed[ext]
        names = {(a.device, a.stream): f"stream {a.stream}" + (" (NCCL)" if a.stream ==
                                                                NCCL_STREAM else "")
                 for a in rec.activities}
        trace = kineto_trace.merge(cpu, rec.activities, os.getpid(),
                                   _device_properties({a.device for a in rec.activities}),
                                   _distributed_info(), names, HIDDEN,
                                   cpu_ops=not self._devlab_gpu_only)
        with open(path, "w") as f:
            json.dump(trace, f)
        return None

    return export_chrome_trace


def install(p: Patcher) -> None:
    """Patch torch's profiler for the simulation (restored, exactly, by `p.restore()`)."""
    cls = _profile
    p.set(cls, "__init__", _wrap_init(cls.__init__))
    p.set(cls, "_start_trace", _wrap_start(cls._start_trace))
    p.set(cls, "__exit__", _wrap_exit(cls.__exit__))
    p.set(cls, "_parse_kineto_results", _wrap_parse(cls._parse_kineto_results))
    p.set(cls, "export_chrome_trace", _wrap_export(cls.export_chrome_trace))
    p.on_restore(_detach_all)
