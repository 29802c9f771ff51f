"""Where torch asks C++ about devices, answered for simulated GPUs.

C++ sees only the CPU: every simulated tensor is a CPU tensor there, and a CPU build of torch
has no accelerator. So the questions torch's Python code puts to C++ about devices get the
simulated machine's answers while the simulation runs:

- `torch._C._group_tensors_by_device_and_dtype`, which optimizers (their default foreach and
  fused paths), `clip_grad_norm_`, GradScaler and SWA use to batch tensors per device, groups
  by simulated GPU; C++ would put tensors of two GPUs in one group, and the foreach kernel
  would then mix devices.
- `torch.device(1)`: C++ reads a bare int as an index on the accelerator, and finds none. The
  simulation stands a thin wrapper in for `torch.device` that reads it as `cuda:1`; it makes
  torch's own device objects, so `isinstance`, pickling and `with torch.device(...)` are as
  before. (`Module.to(1)`, `.to(1)`, `device=1` are read in `_moves` and `_devices`.)
- `torch.Generator(device="cuda")`: C++ has no CUDA generator. The stand-in makes a CPU
  generator (a subclass of torch's own, so every op takes it) whose `device` is the simulated
  GPU; random ops on simulated GPUs draw from the CPU's generators, as they always do here.
- `torch.backends.cudnn.is_acceptable` says no, so modules take their plain (CPU) paths.

`torch.device` and `torch.Generator` are C types that cannot be changed, so the simulation
replaces the names with stand-ins whose `isinstance` checks and pickling are the real types'.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch

from devlab.engine.simulated.base import device_args as _devices
from devlab.engine.simulated.base.cuda_errors import entry
from devlab.engine.simulated.base.device_args import DEVICE_TYPE
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.base.storage_marks import index_of

_orig_group = torch._C._group_tensors_by_device_and_dtype


def group_tensors_by_device_and_dtype(
        tensorlistlist: list[list[torch.Tensor | None]], with_indices: bool = False,
) -> dict[tuple[torch.device, torch.dtype], tuple[list[list[Any]], list[int]]]:
    """torch._C._group_tensors_by_device_and_dtype, by simulated device.

    As the C++ original (aten/src/ATen/native/ForeachUtils.h): the key of index i is the
    device and dtype of tensorlistlist[0][i]; every non-empty list adds its i-th entry (None
    stays None) to that group. C++ groups by dtype; the devices, which C++ cannot see, come from
    the first list and go in the keys. (A later list whose i-th tensor lives elsewhere meets the
    foreach op's own rule: PyTorch's mixed-device error.)
    """
    if not tensorlistlist or not tensorlistlist[0]:
        return _orig_group(tensorlistlist, with_indices)
    places = [None if t is None else index_of(t) for t in tensorlistlist[0]]
    if len(set(places)) == 1:  # one device: C++ groups by dtype, the keys get the device
        grouped = _orig_group(tensorlistlist, with_indices)
        if places[0] is None:
            return grouped
        device = DEVICE_TYPE("cuda", places[0])  # an index of a simulated GPU: no check
        return {(device, dtype): group for (_, dtype), group in grouped.items()}
    # Several devices: group each device's indices in C++, then put them back in order.
    result: dict[tuple[torch.device, torch.dtype], tuple[list[list[Any]], list[int]]] = {}
    for place in dict.fromkeys(places):
        picked = [i for i, p in enumerate(places) if p == place]
        sub = [[tl[i] for i in picked] if len(tl) else [] for tl in tensorlistlist]
        device = DEVICE_TYPE("cpu") if place is None else DEVICE_TYPE("cuda", place)
        for (_, dtype), (lists, indices) in _orig_group(sub, True).items():
            result[(device, dtype)] = (lists, [picked[i] for i in indices] if with_indices
                                       else [])
    return result


class _StandIn(type):
    """The metaclass of a stand-in for a C type: calling it calls `make`, and `isinstance` and
    `issubclass` answer for the real type."""

    real: type
    make: Callable[..., Any]

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.make(*args, **kwargs)

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls.real)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls.real)


def stand_in(real: type, make: Callable[..., Any]) -> type:
    """A class to put where `real`'s name was: pickled, printed and documented as `real`."""
    return _StandIn(real.__name__, (), {
        "real": real, "make": staticmethod(make), "__doc__": real.__doc__,
        "__module__": real.__module__, "__qualname__": real.__qualname__})


def _make_device(*args: Any, **kwargs: Any) -> torch.device:
    """torch.device(...): a bare int is `cuda:N`; an index torch would wrap round is refused
    (`_devices.made`)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if len(args) == 1 and not kwargs and isinstance(args[0], int) and not isinstance(args[0],
                                                                                       bool):
        args = ("cuda", args[0])
    d = DEVICE_TYPE(*args, **kwargs)
    if d.type == "cuda":
        _devices.made(d, args[0] if len(args) == 1 else kwargs.get("type"),
                      args[1] if len(args) > 1 else kwargs.get("index"))
    return d


GENERATOR_TYPE: Final = torch.Generator


class SimulatedGenerator(GENERATOR_TYPE):  # type: ignore[misc, valid-type]
    """A random generator of a simulated GPU: a CPU generator whose device is the GPU."""

    def __new__(cls, index: int) -> SimulatedGenerator:
        self = super().__new__(cls)  # torch's CPU generator
        self._devlab_index = index
        return self

    def __init__(self, index: int) -> None:
        pass

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", self._devlab_index)

    def __repr__(self) -> str:
        return f"<simulated Generator device=cuda:{self._devlab_index}>"


def _make_generator(device: Any = "cpu") -> torch.Generator:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    target = _devices.target(device)
    if isinstance(target, int):
        return SimulatedGenerator(target)
    return GENERATOR_TYPE(device)


def _cudnn_is_acceptable(tensor: torch.Tensor) -> bool:
    return False  # no cuDNN behind a simulated GPU: modules take their plain paths


def install(p: Patcher) -> None:
    p.set(torch._C, "_group_tensors_by_device_and_dtype", group_tensors_by_device_and_dtype)
    p.set(torch.backends.cudnn, "is_acceptable", _cudnn_is_acceptable)
    p.set(torch, "Generator", stand_in(GENERATOR_TYPE, entry(_make_generator)))
    # On every build: a CPU build's `torch.device(0)` needs it, and on a CUDA build too torch
    # wraps an index it cannot hold round (`torch.device("cuda", 255)` is `cuda`, the current
    # device), which the stand-in refuses.
    p.set(torch, "device", stand_in(DEVICE_TYPE, entry(_make_device)))
