"""The TorchFunctionMode that makes CPU tensors behave as tensors on simulated GPUs.

It sees every torch call made in a routed thread *before* torch runs it, which is where a
`device="cuda:1"` can still become a CPU call. Calls that need more than the device rule go to
their handler (moves, autograd, asynchronous launch); factories given a device, or under a
default device naming a GPU, are placed there (`_factories`); every other op runs where its
tensors are (`_ops.run`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from . import _amp, _autograd, _errors, _factories, _launch, _moves, _ops, _session, _workers
from ._marks import mark_of

Tensor = torch.Tensor
_MethodWrapper = type(Tensor.grad.__get__)  # what torch passes for an attribute getter
_HigherOrder = torch._ops.HigherOrderOperator
_keyset = torch._ops._compute_keyset


def _passthrough(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Calls without tensors: straight through (no device to set, nothing to mark)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    try:
        return func(*args, **kwargs)
    except Exception as e:
        _errors.torch_error(e)
        raise


def _higher_order(func: Any, args: tuple, kwargs: dict) -> Any:
    """A higher-order operator (flex_attention, cond, scan...) is Python code around ops and
    autograd Functions: it runs with the simulation's mode pushed again, as HigherOrderOperator
    runs after its override check, so each op inside is placed and its outputs marked as it
    returns. Marked only after the whole call, an autograd Function's saved outputs read `cpu`
    while it saves them (activation checkpointing records that, and finds `cuda:N` when it
    recomputes). The ops inside charge a modeled clock, so the call itself charges nothing."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    from ._threads import routing  # the thread module builds on this one

    index, host, _ = _ops.placement(func, args, kwargs)
    if index is not None:
        _workers.wait(index)
    key = _keyset(args, kwargs, func.non_fallthrough_keys).highestPriorityTypeId()
    with routing():
        out = _ops.call(index, func.dispatch, (key, *args), kwargs)
    if index is not None:
        _ops.mark_outputs(out, index, host)
    return out


HANDLERS: dict[Callable, Callable] = {
    **_moves.HANDLERS,
    **_autograd.HANDLERS,
    **_amp.HANDLERS,
    **dict.fromkeys(_launch.OPS, _launch.launch),
    # Calls without tensors that every training step makes: straight through.
    torch._C._set_grad_enabled: _passthrough,
}
for _name in ("_record_function_enter_new", "_record_function_exit"):  # profiler ranges
    _op = getattr(torch.ops.profiler, _name, None)
    for _f in (_op, getattr(_op, "_RecordFunction", None), getattr(_op, "default", None)):
        if _f is not None:
            HANDLERS[_f] = _passthrough


class SimulationMode(TorchFunctionMode):
    """Routes simulated-GPU work to the CPU. Each routed thread has one on its stack; it passes
    every call through once the simulation it was made for has stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.session = _session.session

    @property
    def inert(self) -> bool:
        return self.session is None or self.session is not _session.session

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        if kwargs is None:
            kwargs = {}
        if self.session is not _session.session or self.session is None:
            return func(*args, **kwargs)
        try:
            if type(func) is _MethodWrapper:
                # An attribute read (`.shape`, `.grad`: the tensor alone) or write (`p.data =
                # t`, `p.grad = g`): metadata, known even while the tensor's op is queued, and
                # no kernel; a write may name another device, as on CUDA. Only a read's tensor
                # result may need a mark (a gradient the C++ engine made). Inline, as most
                # calls are these (and `func.__name__` would build a string each time).
                try:
                    out = func(*args)
                except Exception as e:
                    _errors.torch_error(e)
                    raise
                if len(args) == 1 and isinstance(out, Tensor) and mark_of(out) is None:
                    owner = mark_of(args[0])
                    if owner is not None:
                        _ops.mark_outputs(out, owner.index)
                return out
            h = HANDLERS.get(func)
            if h is not None:
                return h(func, args, kwargs)
            if kwargs:
                if kwargs.get("pin_memory"):
                    return _moves.pinned_factory(func, args, kwargs)
                d = kwargs.get("device")
                if d is not None:
                    return _factories.place(func, args, kwargs, d)
            if func in _factories.CONSTRUCTORS:
                d = _factories.default_device()
                if d is not None:
                    return _factories.place(func, args, kwargs, d)
            if isinstance(func, _HigherOrder):
                return _higher_order(func, args, kwargs)
            return _ops.run(func, args, kwargs)
        except Exception as e:
            # The user's call entered the simulation here: an error raised in torch's name
            # leaves without the simulation's frames.
            _errors.drop_own_frames(e)
            raise
        except BaseException as e:  # an interrupt: nothing of the call stays alive
            _errors.let_go(e)
            args = kwargs = None  # noqa: F841
            raise
