"""What a tensor says about its device: `device`, `is_cuda`, `is_cpu`, `get_device()` read the
mark of its storage, and `is_pinned()` whether the simulation pinned it, in every thread."""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from devlab.engine.simulated.base.import_patches import when_imported
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.base.storage_marks import PLAIN, is_pinned, mark_of

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


# Where ShardedTensor (FSDP1's sharded state dicts) keeps its implementation of `device`.
SHARDED_TENSOR_OPS = "torch.distributed._shard.sharded_tensor._ops.tensor_ops"


def _sharded_tensor_device(p: Patcher, module: ModuleType) -> None:
    """ShardedTensor answers `device` from a table keyed by `torch.Tensor.device.__get__` as
    it was when its module was imported, and torch asks it with the one there now: with the
    property patched, a ShardedTensor imported before the simulation started would refuse
    `device` (DCP's load asks it), and one imported during it would refuse it after. The
    table answers under both keys while the simulation runs, and under torch's own after."""
    from torch.distributed._shard.sharded_tensor import api

    ops = api._SHARDED_OPS
    original, patched = _orig_device.__get__, torch.Tensor.device.__get__
    impl = ops.get(original, ops.get(patched))
    if impl is None:
        return
    ops[original] = ops[patched] = impl
    p.on_restore(functools.partial(ops.pop, patched, None))


def install(p: Patcher) -> None:
    p.set(torch.Tensor, "device", property(_device, doc=_orig_device.__doc__))
    when_imported(p, SHARDED_TENSOR_OPS, functools.partial(_sharded_tensor_device, p))
    p.set(torch.Tensor, "is_cuda", property(_is_cuda, doc=_orig_is_cuda.__doc__))
    p.set(torch.Tensor, "is_cpu", property(_is_cpu, doc=_orig_is_cpu.__doc__))
    p.set(torch.Tensor, "get_device", _get_device)
    p.set(torch.Tensor, "is_pinned", _is_pinned)
