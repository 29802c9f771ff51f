"""The helpers of Dive into Deep Learning's "GPUs" chapter, drop-in, counting logical GPUs.

They never initialize the runtime, so device settings can still be chosen after calling them.
"""

from __future__ import annotations

import torch

from devlab.core import config


def cpu() -> torch.device:
    """Get the CPU device."""
    return torch.device("cpu")


def gpu(i: int = 0) -> torch.device:
    """Get a GPU device: the torch device logical GPU `i` runs on (`cuda:i` when unsplit)."""
    gpus = config.logical_devices("GPU")
    if 0 <= i < len(gpus):
        return gpus[i].torch_device
    return torch.device(f"cuda:{i}")


def num_gpus() -> int:
    """Get the number of available (visible, logical) GPUs."""
    return len(config.logical_devices("GPU"))


def try_gpu(i: int = 0) -> torch.device:
    """Return gpu(i) if exists, otherwise return cpu()."""
    if num_gpus() >= i + 1:
        return gpu(i)
    return cpu()


def try_all_gpus() -> list[torch.device]:
    """Return all available GPUs, or [cpu(),] if no GPU exists."""
    devices = [gpu(i) for i in range(num_gpus())]
    return devices if devices else [cpu()]
