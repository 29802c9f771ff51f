"""What an aten op means for placement: copies between devices and ops that make the host wait.

Shared by the placement log (which shows them) and the simulated GPUs' modeled clock (which
charges them). Which ops these are is `devlab.engine.gpu_model.ops_catalog`'s; here they are torch's overloads.
"""

from __future__ import annotations

from typing import Any

import torch

from devlab.engine.gpu_model import ops_catalog

aten = torch.ops.aten

COPY_OPS = frozenset(ops_catalog.overloads("copy"))
SYNC_OPS = {func: op.host_sync for func, op in ops_catalog.overloads("host_sync").items()}
COPY_TO_HOST = "copy to the host: .cpu(), .to('cpu'), .tolist() or .numpy()"


def copy_ends(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
              current: int | None) -> tuple[torch.device, torch.device, int, bool]:
    """(source, destination, bytes, blocking) of a copy op. `current` is the simulated GPU the
    op executes on (its destination), if one is."""
    if func is aten.copy_.default:
        dst, src = args[0], args[1]
        non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
    else:
        src, dst = args[0], out
        non_blocking = bool(kwargs.get("non_blocking", False))
    dst_dev = torch.device("cuda", current) if current is not None else dst.device
    return src.device, dst_dev, src.numel() * src.element_size(), not non_blocking
