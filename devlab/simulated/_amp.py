"""Mixed precision on simulated GPUs: `torch.autocast("cuda", ...)` casts as a GPU would.

A simulated GPU's ops run on the CPU, where only CPU autocast acts; CUDA autocast's switch alone
would leave every product in float32, silently. So while an autocast region for "cuda" is
active, CPU autocast is switched on with the same dtype (float16 by default, as on CUDA; CPU
autocast supports float16 and bfloat16) and put back as it was on exit. `torch.is_autocast_
enabled("cuda")` and `torch.get_autocast_dtype("cuda")` keep answering as on a GPU. The ops CPU
autocast casts are CPU autocast's lists, which agree with CUDA's on the common ones (matmul,
linear, convolutions to the low dtype; reductions and losses in float32).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.amp import autocast_mode

from . import _session
from ._patcher import Patcher

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


def install(p: Patcher) -> None:
    p.set(_autocast, "__enter__", _enter)
    p.set(_autocast, "__exit__", _exit)
