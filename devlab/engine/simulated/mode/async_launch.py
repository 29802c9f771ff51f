"""Asynchronous launch of heavy matrix products on their simulated GPU's worker.

The product's output is allocated (and counted) at launch and returned at once; the worker
fills it with `out=`. The worker is another thread, and torch keeps much of its state per
thread (grad mode, inference mode, autocast, dispatch keys, functorch transforms), so a launch
carries the state the product depends on: grad mode and inference mode. Any other state that
could change the product's meaning (autocast, a transform, a mode, a subclass, an extra
dispatch key) keeps it on the calling thread, synchronous.
"""

from __future__ import annotations

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
    if type(a) is not Tensor or type(b) is not Tensor or a.dim() < 1 or b.dim() < 1:
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
        wa, wb, wout = a.detach(), b.detach(), out.detach()
        holds = [live_mark(t.untyped_storage()) for t in (wa, wb, wout)]

    def product() -> None:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            impl(wa, wb, out=wout)

    _workers.submit(index, product, [m for m in holds if m is not None])
    return out


launch.plain_when = runs_here  # type: ignore[attr-defined]
