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

Policy lists: aten/src/ATen/autocast_mode.h (AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32,
AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_PROMOTE) and autocast_mode.cpp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.amp import autocast_mode

from ..core import errors as _errors
from ..core import session as _session
from ..core.marks import index_of
from ..core.patcher import Patcher
from ..mode import ops as _ops

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

_LOWER = ("_convolution", "convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
          "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "prelu",
          "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear",
          "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
          "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
          "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
          "scaled_dot_product_attention")
_FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
         "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
         "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "group_norm",
         "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
         "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
         "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
         "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
         "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits",
         "dist", "pdist", "cdist", "renorm", "logsumexp")
_FP32_SET_OPT_DTYPE = ("prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod",
                       "cumsum", "linalg_vector_norm", "linalg_matrix_norm",
                       "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList")
_PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler",
            "index_put", "tensordot", "scatter_add")

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
            if policy == "lower":
                args, kwargs = _cast_all(args, kwargs, low)
            elif policy == "fp32":
                args, kwargs = _cast_all(args, kwargs, torch.float32)
            elif policy == "promote":
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


def _overload(name: str) -> torch._ops.OpOverload | None:
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    return getattr(packet, overload or "default", None) if packet is not None else None


def _register(p: Patcher) -> None:
    lib = torch.library.Library("aten", "IMPL")
    p.on_restore(lib._destroy)
    for policy, names in (("lower", _LOWER), ("fp32", _FP32), ("set_dtype", _FP32_SET_OPT_DTYPE),
                          ("promote", _PROMOTE)):
        for name in names:
            op = _overload(name)
            if op is None:
                continue
            if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "AutocastCPU"):
                continue  # CPU autocast has its own rule for this op
            lib.impl(name, _kernel(op, policy), "AutocastCPU")


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
