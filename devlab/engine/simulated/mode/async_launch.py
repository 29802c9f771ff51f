"""Asynchronous launch of heavy matrix products on their simulated GPU's worker.

The product's output is allocated (and counted) at launch and returned at once; the worker
fills it with `out=`. The worker is another thread, and torch keeps much of its state per
thread (grad mode, inference mode, autocast, dispatch keys, functorch transforms), so a launch
carries the state the product depends on: grad mode and inference mode. Any other state that
could change the product's meaning (autocast, a transform, a mode, a subclass, an extra
dispatch key), or a profiler recording the thread's ops, keeps it on the calling thread,
synchronous. Large elementwise ops and reductions launch the same way (`launch_elementwise`),
and so do convolutions (`launch_conv`). A large output takes the memory of a dropped one still
queued (Note [A queued output takes a dropped one's memory]).
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable
from typing import Any

import torch

from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import hazards as _hazards
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base import storage_marks as _marks
from devlab.engine.simulated.base.storage_marks import index_of, live_mark
from devlab.engine.simulated.mode import device_rule as _ops

Tensor = torch.Tensor
_DisableTF = torch._C.DisableTorchFunction

enabled = False

# Below this many multiply-adds a product is cheaper than the hand-off to a worker.
MIN_MACS = 1 << 21

# Python entry point -> the function the worker runs with out=.
OPS: dict[Callable, Callable] = {
    torch.mm: torch.mm, Tensor.mm: torch.mm,
    torch.matmul: torch.matmul, Tensor.matmul: torch.matmul, Tensor.__matmul__: torch.matmul,
    torch.bmm: torch.bmm, Tensor.bmm: torch.bmm,
}


def _dispatch_keys() -> tuple[str, str]:
    return (str(torch._C._dispatch_tls_local_include_set()),
            str(torch._C._dispatch_tls_local_exclude_set()))


def _plain_key_sets() -> dict[tuple[str, str], bool]:
    """The thread-local dispatch key sets of a fresh thread, outside and inside inference mode:
    a caller whose sets are one of these has no other per-thread state a worker would lack."""
    sets: dict[tuple[str, str], bool] = {}

    def read() -> None:
        sets[_dispatch_keys()] = False
        with torch.inference_mode():
            sets[_dispatch_keys()] = True

    t = threading.Thread(target=read, name="devlab-dispatch-keys")
    setattr(t, _workers.UNROUTED, True)
    t.start()
    t.join()
    return sets


_PLAIN_SETS: dict[tuple[str, str], bool] | None = None


def carried_state() -> tuple[bool, bool] | None:
    """(grad mode, inference mode) of this thread if that is all a worker needs to compute as
    this thread would; None if the product must run here."""
    global _PLAIN_SETS
    if (torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack()
            or torch._C._is_any_autocast_enabled()
            # torch.profiler records an op on the thread that runs it: the host's, as on a GPU
            or torch._C._autograd._profiler_enabled()
            or torch._C._functorch.peek_interpreter_stack() is not None):
        return None
    if _PLAIN_SETS is None:
        _PLAIN_SETS = _plain_key_sets()
    inference = _PLAIN_SETS.get(_dispatch_keys())
    if inference is None:
        return None
    return torch.is_grad_enabled(), inference


def _meta(t: Tensor) -> Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def runs_here(args: tuple, kwargs: dict) -> bool:
    """Whether `launch` runs this call as any op runs (`_ops.run`) before it asks anything
    else: no asynchronous launch, or not two plain tensors, or a product too small to hand
    off. The mode's fast path asks it too (`launch.plain_when`), so a small product takes
    that path: See Note [The mode's fast path] in routing.py."""
    if not enabled or kwargs or len(args) != 2:
        return True
    a, b = args
    if (type(a) is not Tensor or type(b) is not Tensor or a.dim() < 1 or b.dim() < 1
            or a.dtype is not b.dtype):  # torch's dtype error, which meta tensors do not raise
        return True
    return a.numel() * (b.shape[-1] if b.dim() >= 2 else 1) < MIN_MACS


def launch(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Queue a heavy product on its GPU's worker and return its (allocated) output at once;
    anything else runs here (`_ops.run`)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if runs_here(args, kwargs):
        return _ops.run(func, args, kwargs)
    a, b = args
    state = carried_state()
    if state is None or (state[0] and (a.requires_grad or b.requires_grad)):
        return _ops.run(func, args, kwargs)  # autograd records it here
    grad, inference = state
    index, _, _ = _ops.common_device(func, args, kwargs)  # raises on mixed devices
    if index is None or index_of(a) != index_of(b):
        return _ops.run(func, args, kwargs)
    impl = OPS[func]
    shape = _ops.call(None, impl, (_meta(a), _meta(b)), {})  # shape errors: here, at once
    out = torch.empty(shape.shape, dtype=shape.dtype)
    _count_at_launch(func, args, kwargs, out, index)
    # The worker holds tensors of its own on the user's storages, never the user's tensors.
    # See Note [Why queued work's storages are uncounted] in base/session.py.
    with _DisableTF():
        # Aliases with version counters of their own: the output stays at version 0, as a
        # fresh result is, though the worker writes it with out=.
        wa, wb, wout = _alias(a), _alias(b), _alias(out)
        donor = _donor(out, index)
        holds = [live_mark(t.untyped_storage()) for t in (wa, wb, wout, donor) if t is not None]

    def product() -> None:
        impl(wa, wb, out=wout)

    _workers.submit(index, _on_worker(product, wout, donor, grad, inference),
                    [m for m in holds if m is not None])
    return out


def _count_at_launch(func: Callable, args: tuple, kwargs: dict, out: Tensor, index: int) -> None:
    """What a product's or a convolution's launch does at once, as the call run here would:
    its new output counted, the library's workspace taken, the streams noted, the kernel
    charged."""
    _marks.mark_outputs(out, index)
    _ops.take_workspace(func, index)
    if _hazards.tracking:
        _ops.note_streams(func, index, args, kwargs)
    _session.session.charges.call(func, args, kwargs, out, index, True)  # type: ignore[union-attr]


def _on_worker(body: Callable[[], None], wout: Tensor, donor: Tensor | None, grad: bool,
               inference: bool, threads: int | None = None) -> Callable[[], None]:
    """The op a worker runs for a launch: `body` under the launching thread's autograd state
    (and its thread count, where given), writing an output that first takes the memory of a
    dropped one (`donor`; See Note [A queued output takes a dropped one's memory]). It bears
    `body`'s name (the queue's entries say what each launch was)."""

    @functools.wraps(body)
    def op() -> None:
        if donor is not None:
            _swap(wout.untyped_storage(), donor.untyped_storage())
        own = torch.get_num_threads()
        switch = threads is not None and own != threads
        if switch:
            torch.set_num_threads(threads)
        try:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                body()
        finally:
            if switch:
                torch.set_num_threads(own)

    return op


launch.plain_when = runs_here  # type: ignore[attr-defined]


# Elementwise ops and reductions, launched as the products are: the output is allocated (and
# counted) at launch from the shape, strides and dtype torch computes for the same call on
# meta tensors (its own broadcasting and type promotion, and its errors, raised here at once),
# and the worker fills it. See Note [What an elementwise launch keeps as it was].

# Below this many elements an elementwise op or a reduction costs the CPU less than the
# hand-off (about 100 µs of Python) unless its GPU already has queued work to wait behind.
MIN_ELEMENTS = 1 << 18

_OUT, _INPLACE, _REDUCE = 0, 1, 2
_internal_overlap = torch._debug_has_internal_overlap  # 0: none; 1: some; 2: too hard to say
_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
_REDUCED = frozenset({torch.float16, torch.bfloat16})
# Keywords a launch passes on; any other (out=, a device, a generator) keeps the call here.
_KEYWORDS = frozenset({"alpha", "dim", "keepdim", "dtype", "p", "ord", "min", "max"})

# Note [What an elementwise launch keeps as it was]
# A launched op must give what the same call run here gives, bit for bit, and leave the same
# memory, modeled time and autograd state:
# - The worker computes with the launching thread's intra-op thread count: a reduction's
#   partial sums, and where an elementwise loop's vectorized part ends, follow it.
# - Its tensors are aliases made with `set_` (each with a version counter of its own): an
#   in-place op bumps the user's tensor's version at launch, as the op run here would, and a
#   write into a launched output leaves that output at version 0, as a fresh result is.
# - Only plain floating-point tensors on one simulated GPU, none requiring grad while grad is
#   on, none an inference tensor outside inference mode, and for an in-place op a written
#   tensor without overlapping elements and other tensors not on its storage (torch's overlap
#   errors need the real memory; meta tensors have none): anything else runs here.
# - An error torch raises for the call on meta tensors runs the call here, which raises it in
#   torch's own words; an error only the values can raise surfaces at the next sync.
# - The output's strides are meta's, which are the CPU's but in one case found (a random
#   program did): two half-precision (float16, bfloat16) tensors, one expanded (a zero stride),
#   the other permuted, where the CPU's kernel follows the permuted one's layout and meta
#   writes a contiguous output. A half-precision call with more than one tensor, one of them
#   expanded, runs here.


_BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "atan2", "hypot")
_UNARY = ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "abs", "neg",
          "reciprocal", "erf", "square", "relu")


def _table() -> dict[Callable, tuple[int, Callable]]:
    table: dict[Callable, tuple[int, Callable]] = {}
    for name in (*_BINARY, *_UNARY, "clamp"):
        fn = getattr(torch, name)
        if name != "relu":  # torch.relu has no out=
            table[fn] = table[getattr(Tensor, name)] = (_OUT, fn)
        inplace = getattr(Tensor, name + "_", None)
        if inplace is not None:
            table[inplace] = (_INPLACE, inplace)
    for dunder, name in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"),
                         ("pow", "pow")):
        table[getattr(Tensor, f"__{dunder}__")] = (_OUT, getattr(torch, name))
        table[getattr(Tensor, f"__i{dunder}__")] = (_INPLACE, getattr(Tensor, name + "_"))
    table[Tensor.__neg__] = (_OUT, torch.neg)
    for fn in (torch.sum, Tensor.sum, torch.mean, Tensor.mean, torch.norm, Tensor.norm,
               torch.linalg.vector_norm):
        table[fn] = (_REDUCE, fn)
    return table


ELEMENTWISE = _table()


def elementwise_runs_here(args: tuple, kwargs: dict) -> bool:
    """Whether `launch_elementwise` runs this call as any op runs before it asks anything else:
    no asynchronous launch, or no tensor among its arguments as large as MIN_ELEMENTS. Cheap:
    the fast path asks it of every small elementwise op (See Note [The mode's fast path] in
    routing.py)."""
    if not enabled:
        return True
    for a in args:
        if isinstance(a, Tensor) and a.numel() >= MIN_ELEMENTS:
            return False
    return True


def _alias(t: Tensor) -> Tensor:
    """A tensor of the worker's own on t's memory, with a version counter of its own."""
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(),
                                              t.size(), t.stride())


# Note [A queued output takes a dropped one's memory]
# CUDA's caching allocator is stream-ordered: in `for _ in range(10): (x * y).sum()` each
# product's block is the one the last product's output left, free again as soon as the user
# let go of it, though the sum queued behind it still reads it. On a simulated GPU the block is
# freed as early (Note [Why queued work's storages are uncounted] in base/session.py), but the
# CPU memory under it is the queued work's until that work is done, so each launch allocated
# new CPU memory, which the worker then faulted in page by page (about as long as the product
# itself) and gave back to the system. Now a launch whose output is large (MIN_REUSE_BYTES)
# looks for a storage of the same size that an earlier launch made and that only queued work
# on the same GPU still uses (`DeviceState.donor`, settle's own test: nobody else can reach
# it); the worker, which runs its queue in order, swaps the two storages' memory just before
# the new op (`_swap_data_ptr_`), when the work queued before it is done with the dropped one.
# The output keeps its own storage (version, size, resizability, marks as they were); only
# its data pointer changes, once, before the op writes it, and a `data_ptr()` read waits for
# the queue as any use of the tensor does, so it names the memory the output ends with (only
# a read with torch functions off sees the launch's). The memory allocated at launch, never
# touched, goes to the dropped storage, given back when the op's tensors go (a free of
# untouched pages: no page to tear down). Nothing is cached past the work, so
# a sync leaves no memory behind; values, memory figures and modeled times do not move (the
# simulated allocator's blocks are the storages' marks', not their CPU memory). A torch
# without `_swap_data_ptr_` allocates as before.

MIN_REUSE_BYTES = 1 << 20
_swap = getattr(torch.UntypedStorage, "_swap_data_ptr_", None)


def _donor(out: Tensor, index: int) -> Tensor | None:
    """A tensor of the worker's own on a dropped storage of out's size whose memory the
    worker gives `out` before it computes it (See Note [A queued output takes a dropped
    one's memory]); None if there is none. Marks out's storage as a later output's donor.
    Torch functions must be off."""
    if _swap is None:
        return None
    s = out.untyped_storage()
    nbytes = s.nbytes()
    if nbytes < MIN_REUSE_BYTES:
        return None
    setattr(s, _session.DONOR, True)
    dev = _session.session.devices[index]  # type: ignore[union-attr]
    if not dev.queued:
        return None
    with _session.lock:
        d = dev.donor(nbytes)
        if d is None:
            return None
        return torch.empty(0, dtype=torch.uint8).set_(d, 0, (nbytes,), (1,))


def _plain_args(args: tuple, kwargs: dict, grad: bool, inference: bool
                ) -> list[Tensor] | None:
    """The call's tensors if a worker may compute it (Note [What an elementwise launch keeps
    as it was]), else None."""
    if kwargs and not _KEYWORDS.issuperset(kwargs):
        return None
    tensors = []
    for a in args:
        if isinstance(a, Tensor):
            if type(a) is not Tensor and type(a) is not torch.nn.Parameter:
                return None
            if (a.dtype not in _FLOATS or a.layout is not torch.strided
                    or (grad and a.requires_grad) or (not inference and a.is_inference())):
                return None
            tensors.append(a)
        elif isinstance(a, (list, tuple)):
            return None
    for v in kwargs.values():
        if isinstance(v, Tensor):
            return None
    if (len(tensors) > 1 and tensors[0].dtype in _REDUCED
            and any(0 in t.stride() and t.numel() > 1 for t in tensors)):
        return None  # strides meta tensors do not give: see the Note
    return tensors or None


# Note [An elementwise launch's layout without meta tensors]
# Torch computes an elementwise op's output on meta tensors in Python (its `_refs`), whose
# first call imports torch._dynamo and sympy: 2.2 s and about 145 MiB at a lesson's first large
# elementwise op, against Binder's memory budget. The common case needs none of it: tensors
# of one shape, each contiguous (its strides the contiguous ones exactly), and Python numbers.
# Then TensorIterator's output is contiguous of that shape, of the dtype `torch.result_type`
# gives (torch's own promotion; two at a time, as TensorIterator folds them); a full
# reduction's (no dim, no keyword) is a 0-dim tensor of the input's dtype; and no shape or
# dtype error can arise but an in-place op's result that its float tensor cannot hold, which
# goes to meta. Anything else (broadcasting, other strides, keywords, complex results) goes to
# meta as before. tests/test_simulated_async_elementwise.py compares the two on random calls.


def _arities() -> dict[Callable, int]:
    arity: dict[Callable, int] = {}
    for names, n in ((_BINARY, 2), (_UNARY, 1)):
        for name in names:
            for fn in (getattr(torch, name), getattr(Tensor, name + "_", None)):
                if fn is not None:
                    arity[fn] = n
    return arity


# The calls `plain_layout` knows, by the positional arguments they take (clamp's, which
# may be one or three, are not among them), those that take `alpha`, and those whose second
# argument must be a tensor (torch raises its error for a number; meta tensors tell).
_ARITY = _arities()
_TAKES_ALPHA = frozenset({torch.add, torch.sub, Tensor.add_, Tensor.sub_})
_TENSOR_OTHER = frozenset(f for name in ("maximum", "minimum", "atan2", "hypot")
                          for f in (getattr(torch, name), getattr(Tensor, name + "_", None))
                          if f is not None)


def _contiguous(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def plain_layout(kind: int, impl: Callable, args: tuple, kwargs: dict, tensors: list[Tensor]
                 ) -> tuple[torch.Size, tuple[int, ...], torch.dtype] | None:
    """The output's (shape, strides, dtype) meta tensors would give, for the calls that need
    no meta tensor to tell (See Note [An elementwise launch's layout without meta
    tensors]); None for any other call."""
    shape = tensors[0].shape
    strides = _contiguous(shape)
    for t in tensors:
        if t.shape != shape or t.stride() != strides:
            return None
    if kind == _REDUCE:
        if len(args) != 1 or kwargs:
            return None
        return torch.Size(()), (), tensors[0].dtype
    arity = _ARITY.get(impl)
    if arity is None or len(args) != arity or args[0] is not tensors[0]:
        return None
    if kwargs and (impl not in _TAKES_ALPHA or set(kwargs) != {"alpha"}):
        return None
    dtype = tensors[0].dtype
    if arity == 2:
        other = args[1]
        if not isinstance(other, Tensor) and (impl in _TENSOR_OTHER or not isinstance(
                other, (bool, int, float))):
            return None
        with _DisableTF():
            dtype = torch.result_type(args[0], other)
    if dtype not in _FLOATS:
        return None
    return shape, strides, dtype


def launch_elementwise(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Queue a large elementwise op or reduction on its GPU's worker (or any such op behind
    work already queued there) and return its output at once; anything else runs here."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if not enabled or _session.capture is not None:
        return _ops.run(func, args, kwargs)
    state = carried_state()
    if state is None:
        return _ops.run(func, args, kwargs)
    grad, inference = state
    tensors = _plain_args(args, kwargs, grad, inference)
    if tensors is None:
        return _ops.run(func, args, kwargs)
    index = index_of(tensors[0])
    if index is None or any(index_of(t) != index for t in tensors):
        return _ops.run(func, args, kwargs)  # the host's, or torch's mixed-device error
    if elementwise_runs_here(args, kwargs) and _workers.idle(index):
        return _ops.run(func, args, kwargs)
    kind, impl = ELEMENTWISE[func]
    if kind == _INPLACE:
        # Overlap, which torch checks on the real memory: a written tensor whose elements may
        # share memory (an expanded one), or an input on the written tensor's storage.
        own = tensors[0].untyped_storage().data_ptr()
        if (_internal_overlap(tensors[0]) != 0
                or any(t.untyped_storage().data_ptr() == own for t in tensors[1:])):
            return _ops.run(func, args, kwargs)
    layout = plain_layout(kind, impl, args, kwargs, tensors)
    if layout is None:
        metas = tuple(_meta(a) if isinstance(a, Tensor) else a for a in args)
        try:
            with _DisableTF():
                shape = impl(*metas, **kwargs)
        except Exception:
            return _ops.run(func, args, kwargs)  # raises torch's error for the real call
        if not isinstance(shape, Tensor):
            return _ops.run(func, args, kwargs)
        layout = (shape.shape, shape.stride(), shape.dtype)
    if kind == _INPLACE:
        out = args[0]
        if not out.is_inference():  # an inference tensor has no version counter
            torch.autograd.graph.increment_version(out)
    else:
        out = torch.empty_strided(layout[0], layout[1], dtype=layout[2])
    fresh = _marks.mark_outputs(out, index)
    if _hazards.tracking:
        _ops.note_streams(func, index, args, kwargs)
    _session.session.charges.call(func, args, kwargs, out, index, fresh)  # type: ignore[union-attr]
    # See Note [Why queued work's storages are uncounted] in base/session.py.
    with _DisableTF():
        wargs = tuple(_alias(a) if isinstance(a, Tensor) else a for a in args)
        wout = wargs[0] if kind == _INPLACE else _alias(out)
        donor = None if kind == _INPLACE else _donor(out, index)
        mine = wargs if kind == _INPLACE else (*wargs, wout, donor)  # one hold per tensor
        holds = [live_mark(t.untyped_storage()) for t in mine if isinstance(t, Tensor)]
    threads = torch.get_num_threads()

    def elementwise() -> None:
        if kind == _OUT:
            impl(*wargs, **kwargs, out=wout)
        elif kind == _INPLACE:
            impl(*wargs, **kwargs)
        else:
            wout.copy_(impl(*wargs, **kwargs))

    _workers.submit(index, _on_worker(elementwise, wout, donor, grad, inference, threads),
                    [m for m in holds if m is not None])
    return out


launch_elementwise.plain_when = elementwise_runs_here  # type: ignore[attr-defined]


# Convolutions, launched as the products are, on the CPU's kernels (oneDNN's where torch picks
# them): the output is allocated (and counted) at launch from the shape torch's formulas give
# (`conv_shape`; its meta computation would import sympy at the first call), and the worker
# computes the call and copies its result in (a convolution has no out=). Only where the
# output's strides are known without the values: a CPU convolution of a contiguous input and
# weight writes a contiguous output (torch picks channels-last from a channels-last input or
# weight), so anything else runs here, as do the cases the products keep here (autograd
# recording, a mode, autocast, a profiler, a transform, a subclass) and the elementwise
# launch's (a tensor not floating point, an inference tensor outside inference mode), and any
# call `conv_shape` does not answer for (torch's errors, raised here at once). The worker
# computes with the launching thread's intra-op thread count, as the elementwise launch does:
# oneDNN picks its algorithm, and so its rounding, by it.
CONVOLUTIONS: dict[Callable, tuple[bool, int]] = {  # the call -> (transposed, spatial dims)
    torch.conv1d: (False, 1), torch.conv2d: (False, 2), torch.conv3d: (False, 3),
    torch.conv_transpose1d: (True, 1), torch.conv_transpose2d: (True, 2),
    torch.conv_transpose3d: (True, 3),
}
_CONV_PARAMS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_TRANSPOSED_PARAMS = ("input", "weight", "bias", "stride", "padding", "output_padding", "groups",
                      "dilation")


def _sizes(v: Any, n: int, least: int) -> tuple[int, ...] | None:
    """A convolution's int-or-sizes argument as n ints, each at least `least`; None if it is
    anything torch might read otherwise or refuse."""
    if type(v) is int:
        v = (v,)
    elif not isinstance(v, (tuple, list)) or not all(type(x) is int for x in v):
        return None
    if len(v) == 1:
        v = tuple(v) * n
    if len(v) != n or any(x < least for x in v):
        return None
    return tuple(v)


def conv_shape(func: Callable, args: tuple, kwargs: dict) -> tuple[int, ...] | None:
    """The output shape of a convolution call, by torch's formulas, for calls whose arguments
    are plain (ints or sizes, `padding="same"` or `"valid"`, a bias of the output's channels)
    and consistent; None for any other, which runs here and raises torch's error if it has
    one. Not torch's meta computation: its checks (`torch._check`) import the symbolic-shapes
    machinery and sympy at the first call, seconds and tens of MB of memory."""
    transposed, n = CONVOLUTIONS[func]
    names = _TRANSPOSED_PARAMS if transposed else _CONV_PARAMS
    if len(args) > len(names) or any(k in names[:len(args)] or k not in names for k in kwargs):
        return None
    got = dict(zip(names, args, strict=False))
    got.update(kwargs)
    a, w, bias = got["input"], got["weight"], got.get("bias")
    if w.dim() != n + 2 or a.dim() not in (n + 1, n + 2) or 0 in a.shape or 0 in w.shape:
        return None
    groups = got.get("groups", 1)
    stride = _sizes(got.get("stride", 1), n, 1)
    dilation = _sizes(got.get("dilation", 1), n, 1)
    if type(groups) is not int or groups < 1 or stride is None or dilation is None:
        return None
    padding = got.get("padding", 0)
    kernel = w.shape[2:]
    spatial = a.shape[-n:]
    channels = a.shape[-n - 1]
    if transposed:
        pads = _sizes(padding, n, 0)
        extra = _sizes(got.get("output_padding", 0), n, 0)
        if (pads is None or extra is None or channels != w.shape[0] or w.shape[0] % groups
                or any(e >= max(s, d) for e, s, d in zip(extra, stride, dilation, strict=True))):
            return None
        out_channels = w.shape[1] * groups
        outs = tuple((ln - 1) * s - 2 * p + d * (k - 1) + e + 1 for ln, s, p, d, k, e
                     in zip(spatial, stride, pads, dilation, kernel, extra, strict=True))
    else:
        if channels != w.shape[1] * groups or w.shape[0] % groups:
            return None
        out_channels = w.shape[0]
        if padding == "same" and type(padding) is str:
            if any(s != 1 for s in stride) or any(d * (k - 1) % 2 for d, k
                                                   in zip(dilation, kernel, strict=True)):
                # torch's error ("same" is for stride 1), or its warning that the input is
                # padded unevenly, which the host's thread must give
                return None
            outs = tuple(spatial)
        else:
            pads = (0,) * n if padding == "valid" and type(padding) is str else (
                _sizes(padding, n, 0))
            if pads is None:
                return None
            outs = tuple((ln + 2 * p - d * (k - 1) - 1) // s + 1 for ln, p, d, k, s
                         in zip(spatial, pads, dilation, kernel, stride, strict=True))
    if any(o < 1 for o in outs):
        return None
    if bias is not None and (not isinstance(bias, Tensor) or bias.dim() != 1
                             or bias.shape[0] != out_channels):
        return None
    return (*a.shape[:-n - 1], out_channels, *outs)


def conv_runs_here(args: tuple, kwargs: dict) -> bool:
    """Whether `launch_conv` runs this call as any op runs before it asks anything else: no
    asynchronous launch, or a convolution whose input and weight sizes bound its multiply-adds
    under MIN_MACS (the fast path asks it: See Note [The mode's fast path] in routing.py)."""
    if not enabled or len(args) < 2:
        return True
    a, w = args[0], args[1]
    if type(a) is not Tensor or not isinstance(w, Tensor):
        return True
    return a.numel() * w.numel() < MIN_MACS


def launch_conv(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Queue a convolution on its GPU's worker (a heavy one, or any behind work already queued
    there) and return its output at once; anything else runs here."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if not enabled or _session.capture is not None or len(args) < 2:
        return _ops.run(func, args, kwargs)
    state = carried_state()
    if state is None:
        return _ops.run(func, args, kwargs)
    grad, inference = state
    a, w = args[0], args[1]
    if not isinstance(a, Tensor) or not isinstance(w, Tensor):
        return _ops.run(func, args, kwargs)
    tensors = []
    for t in (*args, *kwargs.values()):
        if isinstance(t, Tensor):
            if ((type(t) is not Tensor and type(t) is not torch.nn.Parameter)
                    or t.dtype not in _FLOATS or t.dtype is not a.dtype
                    or t.layout is not torch.strided or not t.is_contiguous()
                    or (grad and t.requires_grad) or (not inference and t.is_inference())):
                return _ops.run(func, args, kwargs)
            tensors.append(t)
    index = index_of(a)
    if index is None or any(index_of(t) != index for t in tensors):
        return _ops.run(func, args, kwargs)  # the host's, or torch's mixed-device error
    shape = conv_shape(func, args, kwargs)
    if shape is None:
        return _ops.run(func, args, kwargs)  # torch's error, or an unusual call
    per_output = w.numel() // w.shape[0]  # multiply-adds per output (input) element
    macs = (a.numel() if CONVOLUTIONS[func][0] else math.prod(shape)) * per_output
    if macs < MIN_MACS and _workers.idle(index):
        return _ops.run(func, args, kwargs)
    # Lists of sizes become tuples: the worker reads them later, the caller may change a list.
    cargs = tuple(tuple(x) if isinstance(x, list) else x for x in args)
    ckwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
    out = torch.empty(shape, dtype=a.dtype)
    _count_at_launch(func, args, kwargs, out, index)
    # See Note [Why queued work's storages are uncounted] in base/session.py.
    with _DisableTF():
        wargs = tuple(_alias(x) if isinstance(x, Tensor) else x for x in cargs)
        wkwargs = {k: _alias(v) if isinstance(v, Tensor) else v for k, v in ckwargs.items()}
        wout = _alias(out)
        donor = _donor(out, index)
        mine = (*wargs, *wkwargs.values(), wout, donor)  # one hold per tensor
        holds = [live_mark(t.untyped_storage()) for t in mine if isinstance(t, Tensor)]
    threads = torch.get_num_threads()

    def convolution() -> None:
        got = func(*wargs, **wkwargs)
        if got.shape != wout.shape:  # never broadcast into the output
            raise RuntimeError(f"devlab: a queued {func.__name__} gave shape "
                               f"{tuple(got.shape)} where its launch allocated "
                               f"{tuple(wout.shape)}; please report this")
        wout.copy_(got)

    _workers.submit(index, _on_worker(convolution, wout, donor, grad, inference, threads),
                    [m for m in holds if m is not None])
    return out


launch_conv.plain_when = conv_runs_here  # type: ignore[attr-defined]


def handlers() -> dict[Callable, Callable]:
    """The mode's handlers for what launches here, as start() reads them: the products, the
    convolutions, and the elementwise ops and reductions unless DEVLAB_ASYNC_ELEMENTWISE=0.
    Each elementwise one is a handler the mode's fast path asks `elementwise_runs_here` of, a
    few hundred nanoseconds per small elementwise op (issue 39 counts them); the switch takes
    them out whole."""
    table = dict.fromkeys(OPS, launch)
    table.update(dict.fromkeys(CONVOLUTIONS, launch_conv))
    if os.environ.get("DEVLAB_ASYNC_ELEMENTWISE", "1") != "0":
        table.update(dict.fromkeys(ELEMENTWISE, launch_elementwise))
    return table
