"""Mixed precision on simulated GPUs: `torch.autocast("cuda", ...)` casts as CUDA's autocast.

A simulated GPU's ops run on the CPU, where only CPU autocast acts; CUDA autocast's switch alone
would leave every product in float32, silently. So while an autocast region for "cuda" is
active, CPU autocast is switched on with the region's dtype (float16 by default, as on CUDA; CPU
autocast supports float16 and bfloat16) and put back as it was on exit; `torch.is_autocast_
enabled("cuda")` and `torch.get_autocast_dtype("cuda")` answer as on a GPU.

CPU autocast's op lists are not CUDA's: CUDA runs softmax, log_softmax, layer_norm, sum, exp,
pow, logsumexp... in float32, casts einsum and the RNN cells to the low dtype, promotes
addcmul/dot..., and refuses binary_cross_entropy. For the ops CPU autocast leaves alone, the
simulation registers CUDA's policy at the AutocastCPU key (acting on simulated-GPU tensors only,
and only inside a "cuda" region), and refuses binary_cross_entropy with CUDA's words. Where CPU
autocast has a rule of its own for an op (cat, stack, prod, the linalg and fft ops, a few
losses), CPU's rule applies; both put losses in float32.

Which op has which policy is devlab.engine.gpu_model.ops_catalog's (`autocast`, from aten/src/ATen/
autocast_mode.h and autocast_mode.cpp).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.amp import autocast_mode

from devlab.engine.gpu_model import ops_catalog
from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.base.storage_marks import index_of
from devlab.engine.simulated.mode import device_rule as _ops

_autocast = autocast_mode.autocast
_orig_enter = _autocast.__enter__
_orig_exit = _autocast.__exit__
_SAVED = "_devlab_cpu_autocast"


def _enter(self: Any) -> Any:
    out = _orig_enter(self)
    if (getattr(self, "device", None) == "cuda" and _session.session is not None
            and not torch.jit.is_scripting()):
        saved = self.__dict__.setdefault(_SAVED, [])
        saved.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        torch.set_autocast_enabled("cpu", self._enabled)
        torch.set_autocast_dtype("cpu", self.fast_dtype)
    return out


def _exit(self: Any, exc_type: Any, exc_val: Any, exc_tb: Any) -> Any:
    saved = self.__dict__.get(_SAVED)
    if saved:
        enabled, dtype = saved.pop()
        torch.set_autocast_enabled("cpu", enabled)
        torch.set_autocast_dtype("cpu", dtype)
    return _orig_exit(self, exc_type, exc_val, exc_tb)


# --- CUDA's cast policy for the ops CPU autocast passes through -----------------------------

_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def _cuda_region() -> torch.dtype | None:
    """The low dtype of the innermost "cuda" autocast region on this thread (None: none)."""
    if _session.session is not None and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return None


def _eligible(t: Any) -> bool:
    """What CUDA autocast casts: floating tensors on the GPU, except float64."""
    return (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
            and index_of(t) is not None)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    """An argument with its eligible tensors (also inside a list) cast to dtype."""
    if _eligible(value):
        return value.to(dtype)
    if isinstance(value, (list, tuple)) and any(_eligible(v) for v in value):
        return type(value)(v.to(dtype) if _eligible(v) else v for v in value)
    return value


def _cast_all(args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
    return (tuple(_cast(a, dtype) for a in args),
            {k: _cast(v, dtype) for k, v in kwargs.items()})


def _values(args: tuple, kwargs: dict) -> list[Any]:
    flat: list[Any] = []
    for v in (*args, *kwargs.values()):
        flat.extend(v if isinstance(v, (list, tuple)) else (v,))
    return flat


def _kernel(op: torch._ops.OpOverload, policy: str) -> Callable[..., Any]:
    names = [a.name for a in op._schema.arguments]
    dtype_at = names.index("dtype") if "dtype" in names else None

    def cuda_policy(*args: Any, **kwargs: Any) -> Any:
        low = _cuda_region()
        if low is not None:
            if policy == ops_catalog.LOWER:
                args, kwargs = _cast_all(args, kwargs, low)
            elif policy == ops_catalog.FP32:
                args, kwargs = _cast_all(args, kwargs, torch.float32)
            elif policy == ops_catalog.PROMOTE:
                widest = low
                for v in _values(args, kwargs):
                    if _eligible(v):
                        widest = torch.promote_types(widest, v.dtype)
                args, kwargs = _cast_all(args, kwargs, widest)
            elif args and _eligible(args[0]) and dtype_at is not None:  # fp32_set_opt_dtype
                if dtype_at < len(args):
                    if args[dtype_at] is None:
                        args = (*args[:dtype_at], torch.float32, *args[dtype_at + 1:])
                elif kwargs.get("dtype") is None:
                    kwargs = dict(kwargs, dtype=torch.float32)
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            return op(*args, **kwargs)

    return cuda_policy


def _register(p: Patcher) -> None:
    lib = torch.library.Library("aten", "IMPL")
    p.on_restore(lib._destroy)
    for op, entry in ops_catalog.overloads("autocast").items():
        name = op._opname if op._overloadname == "default" else f"{op._opname}.{op._overloadname}"
        if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "AutocastCPU"):
            continue  # CPU autocast has its own rule for this op
        lib.impl(name, _kernel(op, entry.autocast), "AutocastCPU")


def binary_cross_entropy(func: Callable, args: tuple, kwargs: dict) -> Any:
    """CUDA autocast refuses binary_cross_entropy (float16 sigmoid outputs lose too much);
    simulated GPUs refuse it in CUDA's words."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if _cuda_region() is not None and any(index_of(t) is not None for t in args[:2]
                                          if isinstance(t, torch.Tensor)):
        raise _errors.user_error(RuntimeError(
            "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
            "autocast.\nMany models use a sigmoid layer right before the binary cross entropy "
            "layer.\nIn this case, combine the two layers using "
            "torch.nn.functional.binary_cross_entropy_with_logits\nor torch.nn.BCEWithLogitsLoss."
            "  binary_cross_entropy_with_logits and BCEWithLogits are\nsafe to autocast."))
    return _ops.run(func, args, kwargs)


HANDLERS: dict[Callable, Callable] = {
    torch.nn.functional.binary_cross_entropy: binary_cross_entropy,
    torch._C._nn.binary_cross_entropy: binary_cross_entropy,
}


def install(p: Patcher) -> None:
    p.set(_autocast, "__enter__", _enter)
    p.set(_autocast, "__exit__", _exit)
    _register(p)
