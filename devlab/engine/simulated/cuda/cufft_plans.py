"""cuFFT's plan cache on simulated GPUs: `torch.backends.cuda.cufft_plan_cache` (and the
`torch._cufft_*` functions under it) as CUDA's, one LRU of plans per GPU.

Each FFT a program runs on a simulated GPU is watched by a dispatch mode for the aten ops that
call cuFFT on CUDA (`_fft_c2c`, `_fft_r2c`, `_fft_c2r`, `.out` too); their plans, as
`devlab.engine.gpu_model.cufft_plan_keys` derives them from the sizes and strides CUDA's kernels see, are looked
up in the GPU's cache. The caches belong to the running simulation: a start begins with empty
caches of torch's default capacity, stop() forgets them.

Not modeled: the FFTs of a backward pass (autograd's engine runs them outside the watched
call), and the plans' own GPU memory (their workspaces are freed after each call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from devlab.engine.gpu_model import cufft_plan_keys as _model
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.cuda_errors import entry, user_error
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.mode import device_rule as _ops

_caches: dict[int, _model.PlanCache] = {}
_DisableTF = torch._C.DisableTorchFunction
_FFT_OPS = (torch.ops.aten._fft_c2c, torch.ops.aten._fft_r2c, torch.ops.aten._fft_c2r)


def cache(index: int) -> _model.PlanCache:
    """GPU `index`'s plan cache, made on first use."""
    found = _caches.get(index)
    if found is None:
        found = _caches[index] = _model.PlanCache()
    return found


def _checked(name: str, device_index: Any) -> int:
    """The device index as torch's `cufft_*_impl` checks it, in its words."""
    count = _session.session.count if _session.session is not None else 0
    index = int(device_index)
    if not 0 <= index < count:
        raise user_error(RuntimeError(
            f"{name}: expected 0 <= device_index < {count}], but got device_index={index}"))
    return index


@entry
def get_plan_cache_size(device_index: int) -> int:
    return cache(_checked("cufft_get_plan_cache_size", device_index)).size


@entry
def get_plan_cache_max_size(device_index: int) -> int:
    return cache(_checked("cufft_get_plan_cache_max_size", device_index)).max_size


@entry
def set_plan_cache_max_size(device_index: int, max_size: int) -> None:
    index = _checked("cufft_set_plan_cache_max_size", device_index)
    if isinstance(max_size, bool) or not isinstance(max_size, int):
        # torch's argument parser: the C++ signature takes an int
        raise user_error(TypeError(
            f"_cufft_set_plan_cache_max_size(): argument 'max_size' (position 2) must be int, "
            f"not {type(max_size).__name__}"))
    try:
        cache(index).resize(max_size)
    except RuntimeError as e:
        raise user_error(RuntimeError(str(e))) from None


@entry
def clear_plan_cache(device_index: int) -> None:
    cache(_checked("cufft_clear_plan_cache", device_index)).clear()


def _record(func: Any, args: tuple, kwargs: dict) -> None:
    """Look up, in the running GPU's cache, the plans CUDA makes for this aten FFT op."""
    index = _session.current_index()
    if index is None or _session.session is None:
        return
    packet = func.overloadpacket
    names = ("self", "dim", "normalization", "forward")
    if packet is torch.ops.aten._fft_r2c:
        names = ("self", "dim", "normalization", "onesided")
    elif packet is torch.ops.aten._fft_c2r:
        names = ("self", "dim", "normalization", "last_dim_size")
    bound = dict(zip(names, args, strict=False))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    x: torch.Tensor = bound["self"]
    ndim = x.dim()
    dim = [int(d) % ndim if ndim else 0 for d in bound["dim"]]
    if not dim:
        return
    vt = str(x.dtype.to_real()).removeprefix("torch.")
    if vt == "bfloat16":  # torch promotes to float32 where cuFFT has no bfloat16 kernel
        vt = "float32"
    t = _model.Tensor(tuple(x.shape), tuple(x.stride()), x.is_complex())
    if packet is torch.ops.aten._fft_c2c:
        keys = _model.c2c_plans(t, dim, vt)
    elif packet is torch.ops.aten._fft_r2c:
        keys = _model.r2c_plans(t, dim, bool(bound["onesided"]), vt, x.storage_offset())
    else:
        keys = _model.c2r_plans(t, dim, int(bound["last_dim_size"]), vt)
    with _session.lock:
        plans = cache(index)
        for key in keys:
            plans.lookup(key)


class _PlanWatch(TorchDispatchMode):
    """Sees the aten ops of one FFT call; passes each through unchanged."""

    # It changes no op's outputs, so the simulation's marking stands as without it.
    marks_simulated = True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket in _FFT_OPS:
            _record(func, args, kwargs)
        with _DisableTF():
            return func(*args, **kwargs)


def _fft(func: Callable, args: tuple, kwargs: dict) -> Any:
    """An FFT call: run where the device rule puts it, its plans looked up as it runs."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    with _PlanWatch():
        return _ops.run(func, args, kwargs)


_NAMES = ("fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2", "irfft2",
          "rfftn", "irfftn", "hfft", "ihfft", "hfft2", "ihfft2", "hfftn", "ihfftn")
HANDLERS: dict[Callable, Callable] = {
    **{getattr(torch.fft, n): _fft for n in _NAMES if hasattr(torch.fft, n)},
    torch.stft: _fft, torch.istft: _fft,
    torch.Tensor.stft: _fft, torch.Tensor.istft: _fft,
}


def install(p: Patcher) -> None:
    """torch's cuFFT plan-cache functions answer for the simulated GPUs' caches (also inside
    `torch.backends.cuda.cuFFTPlanCache`, whose properties bound them at import)."""
    import torch.backends.cuda as backends_cuda

    funcs = {"_cufft_get_plan_cache_size": get_plan_cache_size,
             "_cufft_get_plan_cache_max_size": get_plan_cache_max_size,
             "_cufft_set_plan_cache_max_size": set_plan_cache_max_size,
             "_cufft_clear_plan_cache": clear_plan_cache}
    for name, fn in funcs.items():
        p.set(torch, name, fn)
    props = vars(backends_cuda.cuFFTPlanCache)
    p.set(props["size"], "getter", get_plan_cache_size)
    p.set(props["max_size"], "getter", get_plan_cache_max_size)
    p.set(props["max_size"], "setter", set_plan_cache_max_size)
    # The manager keeps one cache object per GPU once indexed: a start may have another count.
    kept = backends_cuda.cufft_plan_cache.caches
    before = list(kept)
    kept.clear()

    def restore() -> None:
        kept[:] = before
        _caches.clear()

    p.on_restore(restore)
    _caches.clear()
