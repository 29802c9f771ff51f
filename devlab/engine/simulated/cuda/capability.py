"""The compute capability's rules, as torch's CUDA build applies them on the GPU it runs on.

A CPU build computes a simulated GPU's ops with the CPU's kernels, which know no compute
capability: `torch._scaled_mm` runs on any board, and `scaled_dot_product_attention` picks
among the CPU's backends (flash and math only). On a real GPU both depend on the board:

- fp8 matmuls: `torch._scaled_mm` raises torch's own error below compute capability 8.9
  (a T4, a V100, an A100), as ATen's `_scaled_mm_out_cuda` checks first;
- SDPA's backends (`aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`): flash attention
  needs sm80 to sm121 and float16 or bfloat16 (bfloat16 only from sm80), no `attn_mask`; the
  memory-efficient kernel takes float16 and float32 (bfloat16 from sm80) with the head
  dimension a multiple of the GEMM alignment; cuDNN's needs sm80 and float16 or bfloat16. With
  the math backend disabled (`sdpa_kernel(SDPBackend.FLASH_ATTENTION)`) and none of the enabled
  ones able to run, torch warns why each was not used and raises "No available kernel.
  Aborting execution.". With one able, the call runs, and here it runs on the CPU with the
  math backend let in for that call (the CPU has no memory-efficient or cuDNN kernel, so
  `sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)` would otherwise fail on every board).

bfloat16 needs nothing here: `torch.cuda.is_bf16_supported()` reads the board's
`major` (`get_device_properties`), and with `including_emulation` tries a bfloat16 tensor,
which CUDA makes on every board, as the simulation does. A GPU simulated without a model has
no compute capability (`get_device_capability()` is (0, 0)): no board's rules apply to it,
and SDPA runs with any enabled backend. The checks torch makes on a tensor's layout and
lengths (nested tensors, strides, zero-length sequences, cuDNN's version limits) are not
repeated: a call they refuse on a GPU runs here (docs/pytest-plugin.md lists it).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.storage_marks import index_of
from devlab.engine.simulated.mode import device_rule as _ops

_SCALED_MM = ("torch._scaled_mm is only supported on CUDA devices with compute capability >= 9.0 "
              "or 8.9, or ROCm MI300+")
NO_KERNEL = "No available kernel. Aborting execution."
NO_BACKEND = ("No viable backend for scaled_dot_product_attention was found. This is likely due "
              "to turning off both the math kernel and the fused kernels.")
# How c10 prints a dtype (TypeMeta's name) in torch's SDPA warnings.
_DTYPE_NAMES = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
                torch.bfloat16: "c10::BFloat16"}
_SCALAR_NAMES = {torch.float16: "Half", torch.float32: "Float", torch.bfloat16: "BFloat16"}


def board_capability() -> tuple[int, int] | None:
    """The modeled board's compute capability, or None (no model: no board's rules)."""
    sess = _session.session
    spec = sess.spec if sess is not None else None
    if spec is None:
        return None
    major, minor = (int(x) for x in spec.compute_capability.split("."))
    return major, minor


def _warn(text: str) -> None:
    """A UserWarning at the caller's line, as TORCH_WARN's is (past the simulation's frames)."""
    frame, level = sys._getframe(1), 2
    while frame is not None and _errors.own_file(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(text, UserWarning, stacklevel=level)


def _on_gpu(*tensors: Any) -> bool:
    return any(isinstance(t, torch.Tensor) and index_of(t) is not None for t in tensors)


def scaled_mm(func: Callable, args: tuple, kwargs: dict) -> Any:
    """`torch._scaled_mm` on a board under compute capability 8.9 raises torch's error."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    cc = board_capability()
    if cc is not None and _on_gpu(*args[:2], kwargs.get("mat2")) and not (
            cc >= (9, 0) or cc == (8, 9)):
        raise _errors.user_error(RuntimeError(_SCALED_MM))
    return _ops.run(func, args, kwargs)


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _dtype_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  allowed: tuple[torch.dtype, ...]) -> str | None:
    if q.dtype == k.dtype == v.dtype and q.dtype in allowed:
        return None
    names = ", ".join(_SCALAR_NAMES[d] for d in allowed)

    def name(t: torch.Tensor) -> str:
        return _DTYPE_NAMES.get(t.dtype, str(t.dtype).removeprefix("torch."))

    return (f"Expected query, key and value to all be of dtype: {{{names}}}. Got Query dtype: "
            f"{name(q)}, Key dtype: {name(k)}, and Value dtype: {name(v)} instead.")


def _sm_reason(what: str, low: tuple[int, int], cc: tuple[int, int]) -> str | None:
    if low <= cc <= (12, 1):
        return None
    return (f"{what} only supports gpu architectures in the range [sm{low[0]}{low[1]}, sm121]. "
            f"Attempting to run on a sm {cc[0]}.{cc[1]} gpu.")


def _sizes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    return (f"Got Query.size(-1): {q.size(-1)}, Key.size(-1): {k.size(-1)}, Value.size(-1): "
            f"{v.size(-1)} instead.")


def _flash(cc: tuple[int, int], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           mask: Any, causal: bool) -> str | None:
    """Why flash attention would not run (can_use_flash_attention's filters, in its order)."""
    if not torch.backends.cuda.flash_sdp_enabled():
        return "Flash attention has been runtime disabled."
    if mask is not None:
        return "Flash Attention does not support non-null attn_mask."
    if not (q.size(-1) == k.size(-1) == v.size(-1) and q.size(-1) <= 256):
        return ("Flash attention requires q,k,v to have the same last dimension and to be less "
                "than or equal to 256. " + _sizes(q, k, v))
    why = _sm_reason("Flash attention", (8, 0), cc)
    if why:
        return why
    if causal and q.dim() >= 2 and q.size(-2) != k.size(-2):
        return (f"Flash attention does not support the is_causal flag when seqlen_q != seqlen_k. "
                f"Got seqlen_q: {q.size(-2)} seqlen_k: {k.size(-2)}. If you would like to use "
                "causal attention with non-square masks, please see CausalAttnMask.")
    return _dtype_reason(q, k, v, (torch.float16, torch.bfloat16) if cc >= (8, 0)
                         else (torch.float16,))


def _mem_efficient(cc: tuple[int, int], q: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor) -> str | None:
    """Why the memory-efficient kernel would not run (can_use_mem_efficient_attention's)."""
    if not torch.backends.cuda.mem_efficient_sdp_enabled():
        return "Memory Efficient attention has been runtime disabled."
    why = _sm_reason("Mem Efficient Attention", (5, 0), cc)
    if why:
        return why
    half = q.dtype in (torch.float16, torch.bfloat16)
    tensor_cores = cc >= (8, 0) or (cc >= (7, 0) and half)
    alignment = 4 if cc >= (8, 0) else 1
    if tensor_cores:
        alignment = max(alignment, 128 // (16 if half else 32))
    if not (q.size(-1) == k.size(-1) and q.size(-1) % alignment == 0 and q.size(-1) > 0
            and v.size(-1) % alignment == 0 and v.size(-1) > 0):
        return (f"Mem efficient attention requires last dimension of inputs to be divisible by "
                f"{alignment}. " + _sizes(q, k, v))
    return _dtype_reason(q, k, v, (torch.float16, torch.float32, torch.bfloat16)
                         if cc >= (8, 0) else (torch.float16, torch.float32))


def _cudnn(cc: tuple[int, int], q: torch.Tensor, k: torch.Tensor,
           v: torch.Tensor) -> str | None:
    """Why cuDNN's attention would not run (can_use_cudnn_attention's, a cuDNN 9 build)."""
    if not torch.backends.cuda.cudnn_sdp_enabled():
        return "cuDNN attention has been runtime disabled."
    if (torch.are_deterministic_algorithms_enabled()
            and not torch.is_deterministic_algorithms_warn_only_enabled()):
        return "cuDNN SDPA is not deterministic."
    why = _dtype_reason(q, k, v, (torch.float16, torch.bfloat16) if cc >= (8, 0)
                        else (torch.float16,))
    if why:
        return why
    why = _sm_reason("cuDNN MHA", (8, 0), cc)
    if why:
        return why
    limit = 256 if cc == (9, 0) else 128
    if q.size(-1) > limit or v.size(-1) > limit:
        return f"head_dim should be no more than {limit}"
    if q.size(-1) % 8 or v.size(-1) % 8:
        return "head_dim should be a multiple of 8"
    return None


def scaled_dot_product_attention(func: Callable, args: tuple, kwargs: dict) -> Any:
    """SDPA on a simulated GPU: refused as select_sdp_backend refuses it on that board, and
    otherwise run on the CPU, with the math backend let in if the CPU needs it."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    q, k, v = (_arg(args, kwargs, i, n, None) for i, n in enumerate(("query", "key", "value")))
    if not _on_gpu(q, k, v) or not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return _ops.run(func, args, kwargs)
    backends = torch.backends.cuda
    if backends.math_sdp_enabled():
        return _ops.run(func, args, kwargs)  # math takes whatever the others refuse, on CUDA too
    if not (backends.flash_sdp_enabled() or backends.mem_efficient_sdp_enabled()
            or backends.cudnn_sdp_enabled()):
        raise _errors.user_error(RuntimeError(NO_BACKEND))
    cc = board_capability()
    if cc is not None:
        mask = _arg(args, kwargs, 3, "attn_mask", None)
        causal = bool(_arg(args, kwargs, 5, "is_causal", False))
        reasons = {"Memory efficient": _mem_efficient(cc, q, k, v),
                   "Flash attention": _flash(cc, q, k, v, mask, causal),
                   "cuDNN attention": _cudnn(cc, q, k, v)}
        if all(reasons.values()):  # each one refused: torch says why, in this order
            for kernel, why in reasons.items():
                _warn(f"{kernel} kernel not used because:")
                _warn(str(why))
            raise _errors.user_error(RuntimeError(NO_KERNEL))
    # A backend the board runs: the CPU computes the values, with math allowed for this call
    # (its flash kernel, if enabled, still goes first).
    torch._C._set_sdp_use_math(True)
    try:
        return _ops.run(func, args, kwargs)
    finally:
        torch._C._set_sdp_use_math(False)


HANDLERS: dict[Callable, Callable] = {
    torch._scaled_mm: scaled_mm,
    torch.nn.functional.scaled_dot_product_attention: scaled_dot_product_attention,
}
