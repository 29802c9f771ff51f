"""Whether the device runtime is initialized.

TensorFlow fixes visible devices, memory growth and logical devices once its runtime starts.
devlab's runtime counts as started once CUDA is initialized (real GPUs) or devlab first
places work (a simulated GPU tensor, a placement scope, listing logical devices).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_initialized = False
_on_initialize: list[Callable[[], None]] = []


def on_initialize(hook: Callable[[], None]) -> None:
    """Run `hook` once when the runtime initializes (applies settings chosen before)."""
    if hook not in _on_initialize:
        _on_initialize.append(hook)


def is_initialized() -> bool:
    """True once the device runtime has started and device settings are fixed."""
    return _initialized or _cuda_initialized()


def mark_initialized() -> None:
    """Record that devlab has placed work; device settings are fixed from now on."""
    global _initialized
    if _initialized:
        return
    _initialized = True
    for hook in list(_on_initialize):
        hook()


def reset() -> None:
    """Forget devlab's own initialization (used by `stop_simulation` and the tests).

    A real CUDA context cannot be torn down, so this cannot un-initialize CUDA.
    """
    global _initialized
    _initialized = False


# Kept before the simulation can patch torch.cuda: this asks about real CUDA only, and never
# initializes it.
_real_cuda_is_initialized = torch.cuda.is_initialized


def _cuda_initialized() -> bool:
    return bool(_real_cuda_is_initialized())
