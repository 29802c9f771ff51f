"""torch.compile while simulating: the code runs uncompiled, and the process says so once.

Compiling for a GPU makes code for CUDA (inductor's Triton kernels), which a simulated GPU,
computing on the CPU, cannot run; and dynamo traces every call through the simulation's own
function mode, where it computed wrong values (measured: `torch.compile(lambda x: x * 2 + 1,
backend="eager")` gave 2 for 1, on the CPU and on a simulated GPU alike; `aot_eager` the
same). So while GPUs are simulated dynamo's stance is "force_eager"
(`torch.compiler.set_stance`'s, for the whole process: dynamo's config values are each
thread's): a compiled function or module runs as written, op by op, with the right values; its
speed says nothing of compiled code. Stopping the simulation puts the prior stance back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from ..core.imports import when_imported
from ..core.notice import Notice
from ..core.patcher import Patcher

EVAL_FRAME = "torch._dynamo.eval_frame"
NOTICE = ("devlab: torch.compile runs the code uncompiled while GPUs are simulated (compiled "
          "code is CUDA code a simulated GPU cannot run); the values are right, the speed is "
          "not a compiled one's.")
_notice = Notice(NOTICE)


def _telling(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - torch.compile's name
        _notice.tell()
        return original(*args, **kwargs)

    return compile


def install(p: Patcher) -> None:
    def patch(eval_frame: ModuleType) -> None:
        # the stance is the process's (dynamo's config values are each thread's, and each
        # notebook cell's context's)
        prior = eval_frame._set_stance(eval_frame.DynamoStance(stance="force_eager"))
        p.on_restore(lambda: eval_frame._set_stance(prior))

    when_imported(p, EVAL_FRAME, patch)
    p.set(torch, "compile", _telling(torch.compile))
