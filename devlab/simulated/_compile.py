"""torch.compile while simulating: the code runs uncompiled, and the process says so once.

Compiling for a GPU makes code for CUDA (inductor's Triton kernels), which a simulated GPU,
computing on the CPU, cannot run; and dynamo traces every call through the simulation's own
function mode, where it computed wrong values (measured: `torch.compile(lambda x: x * 2 + 1,
backend="eager")` gave 2 for 1, on the CPU and on a simulated GPU alike; `aot_eager` the
same). So while GPUs are simulated dynamo is off (`torch._dynamo.config.disable`, what
`TORCH_COMPILE_DISABLE=1` sets): a compiled function or module runs as written, op by op, with
the right values; its speed says nothing of compiled code. Stopping the simulation puts the
setting back.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from ._imports import when_imported
from ._patcher import Patcher

CONFIG = "torch._dynamo.config"
NOTICE = ("devlab: torch.compile runs the code uncompiled while GPUs are simulated (compiled "
          "code is CUDA code a simulated GPU cannot run); the values are right, the speed is "
          "not a compiled one's.")
_told = threading.Event()


def tell_once() -> None:
    if not _told.is_set():
        _told.set()
        print(NOTICE, file=sys.stderr, flush=True)


def _telling(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - torch.compile's name
        tell_once()
        return original(*args, **kwargs)

    return compile


def install(p: Patcher) -> None:
    def patch(config: ModuleType) -> None:
        before = config.disable
        config.disable = True
        p.on_restore(lambda: setattr(config, "disable", before))

    when_imported(p, CONFIG, patch)
    p.set(torch, "compile", _telling(torch.compile))
