"""Where the simulated CUDA API goes: each torch.cuda and torch.accelerator name (and its
twin in torch.cuda.memory, torch.cuda.random, torch.accelerator.memory) patched with its
stand-in from `device_api`, `rng`, `streams`, `memory` and `accelerator`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.cuda import accelerator as _accelerator
from devlab.engine.simulated.cuda import device_api as _device_api
from devlab.engine.simulated.cuda import memory as _memory
from devlab.engine.simulated.cuda import rng as _rng
from devlab.engine.simulated.cuda import streams as _streams

_CUDA_FUNCS: dict[str, Callable[..., Any] | type] = {
    **_memory.CUDA_FUNCS, **_device_api.CUDA_FUNCS, **_rng.CUDA_FUNCS, **_streams.CUDA_FUNCS,
}


def install(p: Patcher) -> None:
    _memory.install(p)
    _streams.install(p)
    # torch.cuda re-exports functions defined in submodules (torch.cuda.memory,
    # torch.cuda.random); code may call either name, so both are patched.
    modules = [torch.cuda] + [sys.modules[n] for n in ("torch.cuda.memory", "torch.cuda.random")
                              if n in sys.modules]
    for mod in modules:
        for name, fn in _CUDA_FUNCS.items():
            if mod is torch.cuda or _defined_in(mod, name):
                p.set(mod, name, fn)
    accel = [m for m in (getattr(torch, "accelerator", None),
                         sys.modules.get("torch.accelerator.memory")) if m is not None]
    for mod in accel:
        for name, fn in _accelerator.ACCEL_FUNCS.items():
            if _defined_in(mod, name) or (mod is torch.accelerator and name in vars(mod)):
                p.set(mod, name, fn)


def _defined_in(mod: Any, name: str) -> bool:
    obj = vars(mod).get(name)
    return obj is not None and getattr(obj, "__module__", None) == mod.__name__


