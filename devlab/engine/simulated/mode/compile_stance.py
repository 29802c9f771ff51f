"""torch.compile while simulating: the code runs uncompiled, and the process says so once.

Compiling for a GPU makes code for CUDA (inductor's Triton kernels), which a simulated GPU,
computing on the CPU, cannot run; and dynamo traces every call through the simulation's own
function mode, where it computed wrong values (measured: `torch.compile(lambda x: x * 2 + 1,
backend="eager")` gave 2 for 1, on the CPU and on a simulated GPU alike; `aot_eager` the
same). So while GPUs are simulated dynamo's stance is "force_eager"
(`torch.compiler.set_stance`'s, for the whole process: dynamo's config values are each
thread's): a compiled function or module runs as written, op by op, with the right values; its
speed says nothing of compiled code. Stopping the simulation puts the prior stance back.

CUDA graphs asked of torch.compile (`mode="reduce-overhead"` or `"max-autotune"`, inductor's
`triton.cudagraphs` option, the `"cudagraphs"` backend; Hugging Face's `generate` with a static
cache asks for reduce-overhead by itself) are not made either: the calls run op by op, each
kernel its own launch on a modeled GPU. A second line says so, once, naming what shows a graph's
single launch: capturing the step with `torch.cuda.graph`, which devlab simulates (cuda/graphs.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from devlab.engine.simulated.base.import_patches import when_imported
from devlab.engine.simulated.base.notices import Notice
from devlab.engine.simulated.base.patcher import Patcher

EVAL_FRAME = "torch._dynamo.eval_frame"
NOTICE = ("devlab: torch.compile runs the code uncompiled while GPUs are simulated (compiled "
          "code is CUDA code a simulated GPU cannot run); the values are right, the speed is "
          "not a compiled one's.")
GRAPHS_NOTICE = ("devlab: torch.compile's CUDA graphs ({asked}) are not made while GPUs are "
                 "simulated: each call runs its kernels one launch at a time; to see a CUDA "
                 "graph's single launch, capture the step with torch.cuda.graph, which devlab "
                 "simulates.")
_notice = Notice(NOTICE)
_graphs_notice = Notice(GRAPHS_NOTICE)


def cuda_graphs_asked(kwargs: dict[str, Any]) -> str | None:
    """What in torch.compile's arguments asks for CUDA graphs (as torch's mode table,
    `torch._inductor.list_mode_options`, has it), in the user's words; None if nothing does."""
    mode = kwargs.get("mode")
    if mode in ("reduce-overhead", "max-autotune"):
        return f"mode={mode!r}"
    options = kwargs.get("options")
    if isinstance(options, dict) and options.get("triton.cudagraphs"):
        return "options={'triton.cudagraphs': True}"
    if kwargs.get("backend") == "cudagraphs":
        return "backend='cudagraphs'"
    return None


def _telling(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - torch.compile's name
        _notice.tell()
        asked = cuda_graphs_asked(kwargs)
        if asked is not None and not _graphs_notice.told.is_set():
            _graphs_notice.text = GRAPHS_NOTICE.format(asked=asked)
            _graphs_notice.tell()
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
