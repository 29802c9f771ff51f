"""Asynchronous launch of heavy matrix products on their simulated GPU's worker.

The product's output is allocated (and counted) at launch and returned at once; the worker
fills it with `out=`. The worker is another thread, and torch keeps much of its state per
thread (grad mode, inference mode, autocast, dispatch keys, functorch transforms), so a launch
carries the state the product depends on: grad mode and inference mode. Any other state that
could change the product's meaning (autocast, a transform, a mode, a subclass, an extra
dispatch key), or a profiler recording the thread's ops, keeps it on the calling thread,
synchronous. Large elementwise ops and reductions launch the same way (`launch_elementwise`).
"""

from __future__ import annotations

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
    _marks.mark_outputs(out, index)
    _ops.take_workspace(func, index)  # as a product run here takes it
    if _hazards.tracking:
        _ops.note_streams(func, index, args, kwargs)
    _session.session.charges.call(func, args, kwargs, out, index, True)  # type: ignore[union-attr]
    # The worker holds tensors of its own on the user's storages, never the user's tensors.
    # See Note [Why queued work's storages are uncounted] in base/session.py.
    with _DisableTF():
        # Aliases with version counters of their own: the output stays at version 0, as a
        # fresh result is, though the worker writes it with out=.
        wa, wb, wout = _alias(a), _alias(b), _alias(out)
        holds = [live_mark(t.untyped_storage()) for t in (wa, wb, wout)]

    def product() -> None:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            impl(wa, wb, out=wout)

    _workers.submit(index, product, [m for m in holds if m is not None])
    return out


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


def _table() -> dict[Callable, tuple[int, Callable]]:
    table: dict[Callable, tuple[int, Callable]] = {}
    binary = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "atan2", "hypot")
    unary = ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "abs", "neg",
             "reciprocal", "erf", "square", "clamp")
    for name in (*binary, *unary, "relu"):
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
    return tensors or None


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
    metas = tuple(_meta(a) if isinstance(a, Tensor) else a for a in args)
    try:
        with _DisableTF():
            shape = impl(*metas, **kwargs)
    except Exception:
        return _ops.run(func, args, kwargs)  # raises torch's error for the real call
    if not isinstance(shape, Tensor):
        return _ops.run(func, args, kwargs)
    if kind == _INPLACE:
        out = args[0]
        if not out.is_inference():  # an inference tensor has no version counter
            torch.autograd.graph.increment_version(out)
    else:
        out = torch.empty_strided(shape.shape, shape.stride(), dtype=shape.dtype)
    fresh = _marks.mark_outputs(out, index)
    if _hazards.tracking:
        _ops.note_streams(func, index, args, kwargs)
    _session.session.charges.call(func, args, kwargs, out, index, fresh)  # type: ignore[union-attr]
    # See Note [Why queued work's storages are uncounted] in base/session.py.
    with _DisableTF():
        wargs = tuple(_alias(a) if isinstance(a, Tensor) else a for a in args)
        wout = wargs[0] if kind == _INPLACE else _alias(out)
        mine = wargs if kind == _INPLACE else (*wargs, wout)  # one hold per tensor
        holds = [live_mark(t.untyped_storage()) for t in mine if isinstance(t, Tensor)]
    threads = torch.get_num_threads()

    def op() -> None:
        own = torch.get_num_threads()
        if own != threads:
            torch.set_num_threads(threads)
        try:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                if kind == _OUT:
                    impl(*wargs, **kwargs, out=wout)
                elif kind == _INPLACE:
                    impl(*wargs, **kwargs)
                else:
                    wout.copy_(impl(*wargs, **kwargs))
        finally:
            if own != threads:
                torch.set_num_threads(own)

    _workers.submit(index, op, [m for m in holds if m is not None])
    return out


launch_elementwise.plain_when = elementwise_runs_here  # type: ignore[attr-defined]



def handlers() -> dict[Callable, Callable]:
    """The mode's handlers for what launches here, as start() reads them: the products, and
    the elementwise ops and reductions unless DEVLAB_ASYNC_ELEMENTWISE=0. Each of those is a
    handler the mode's fast path asks `elementwise_runs_here` of, a few hundred nanoseconds
    per small elementwise op (issue 39 counts them); the switch takes them out whole."""
    table = dict.fromkeys(OPS, launch)
    if os.environ.get("DEVLAB_ASYNC_ELEMENTWISE", "1") != "0":
        table.update(dict.fromkeys(ELEMENTWISE, launch_elementwise))
    return table
