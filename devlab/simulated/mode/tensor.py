"""What a tensor says about its device: `device`, `is_cuda`, `is_cpu`, `get_device()` read the
mark of its storage, and `is_pinned()` whether the simulation pinned it, in every thread."""

from __future__ import annotations

import torch

from ..core.marks import PLAIN, is_pinned, mark_of
from ..core.patcher import Patcher

_TB = torch._C.TensorBase
_orig_device = _TB.device
_orig_is_cuda = _TB.is_cuda
_orig_is_cpu = _TB.is_cpu
_orig_get_device = _TB.get_device
_orig_is_pinned = _TB.is_pinned
_DisableTF = torch._C.DisableTorchFunction


def _device(self: torch.Tensor) -> torch.device:
    m = mark_of(self)
    if m is not None:
        return m.session.devices[m.index].torch_device
    if type(self) in PLAIN:
        with _DisableTF():
            return _orig_device.__get__(self)
    return _orig_device.__get__(self)


def _is_cuda(self: torch.Tensor) -> bool:
    return True if mark_of(self) is not None else _orig_is_cuda.__get__(self)


def _is_cpu(self: torch.Tensor) -> bool:
    return False if mark_of(self) is not None else _orig_is_cpu.__get__(self)


def _get_device(self: torch.Tensor) -> int:
    m = mark_of(self)
    return m.index if m is not None else _orig_get_device(self)


_get_device.__doc__ = _orig_get_device.__doc__


def _is_pinned(self: torch.Tensor, device: object = None) -> bool:
    return is_pinned(self) or (mark_of(self) is None and _orig_is_pinned(self))


_is_pinned.__doc__ = _orig_is_pinned.__doc__


def install(p: Patcher) -> None:
    p.set(torch.Tensor, "device", property(_device, doc=_orig_device.__doc__))
    p.set(torch.Tensor, "is_cuda", property(_is_cuda, doc=_orig_is_cuda.__doc__))
    p.set(torch.Tensor, "is_cpu", property(_is_cpu, doc=_orig_is_cpu.__doc__))
    p.set(torch.Tensor, "get_device", _get_device)
    p.set(torch.Tensor, "is_pinned", _is_pinned)
