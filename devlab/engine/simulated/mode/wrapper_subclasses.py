"""Tensor subclasses that wrap other tensors (DTensor, a functional collective's
AsyncCollectiveTensor, ...) on simulated GPUs.

A wrapper subclass has no storage of its own: `torch.Tensor._make_wrapper_subclass(cls, size,
device=...)` makes a tensor of the device it is given. Given a simulated GPU (its inner tensor's
`device`), torch would make a C++ CUDA tensor, which a CPU build cannot take through autograd
(the process aborts). So a wrapper asked for on a simulated GPU is made on the CPU in C++ and
carries a `WrapperMark` naming its GPU (no bytes: its inner tensors hold them). A wrapper made
in C++ (DTensor's constructor) has none and lives where its inner tensors live
(`_marks.wrapped_mark`); an op whose output is a wrapper marks the inner tensors C++ computed
unseen (`_marks.mark_outputs`).
"""

from __future__ import annotations

from typing import Any

import torch

from devlab.engine.simulated.base import device_args as _devices
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.base.storage_marks import WRAPPER_MARK, WrapperMark

_original = torch._C.TensorBase._make_wrapper_subclass
_CPU = torch.device("cpu")


def _simulated_index(device: Any) -> int | None:
    if device is None:
        return None
    kind, index = _devices.parse(device)
    if kind != "cuda":
        return None
    return _session.current_device() if index is None else _devices.checked_ordinal(index)


def _make_wrapper_subclass(cls: type, *args: Any, **kwargs: Any) -> torch.Tensor:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    sess = _session.session
    index = _simulated_index(kwargs.get("device")) if sess is not None else None
    if index is None:
        return _original(cls, *args, **kwargs)
    kwargs["device"] = _CPU
    out = _original(cls, *args, **kwargs)
    out.__dict__[WRAPPER_MARK] = WrapperMark(index, sess)
    return out


def install(p: Patcher) -> None:
    p.set(torch.Tensor, "_make_wrapper_subclass", staticmethod(_make_wrapper_subclass))
