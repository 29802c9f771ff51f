"""`torch.accelerator` for simulated GPUs: the device-generic API newer tutorials use
(`torch.accelerator.current_accelerator().type if torch.accelerator.is_available()`), over the
torch.cuda stand-ins."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from devlab.engine.simulated.base import device_args as _devices
from devlab.engine.simulated.base.cuda_errors import entry
from devlab.engine.simulated.cuda import memory as _memory
from devlab.engine.simulated.cuda.device_api import (
    current_device,
    device,
    device_count,
    is_available,
    set_device,
    synchronize,
)
from devlab.engine.simulated.cuda.streams import current_stream, set_stream


class device_index(device):  # noqa: N801
    """`with torch.accelerator.device_index(i):`."""


@entry
def current_accelerator(check_available: bool = False) -> torch.device:
    return torch.device("cuda")


@entry
def get_memory_info(device_index: Any = None) -> tuple[int, int]:
    return _memory.mem_get_info(device_index)


# The dense dtypes a CPU tensor holds and converts between (quantized, bit and sub-byte
# shell dtypes left out); names missing from an older torch are skipped.
_SUPPORTED_DTYPES = frozenset(
    d for d in (getattr(torch, n, None) for n in (
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
        "float8_e4m3fn", "float8_e5m2"))
    if isinstance(d, torch.dtype))


@entry
def accelerator_capability(device: Any = None) -> dict[str, Any]:
    """torch.accelerator.get_device_capability: a simulated GPU holds what the CPU holds."""
    _devices.cuda_index(device)
    return {"supported_dtypes": set(_SUPPORTED_DTYPES)}


@entry
def empty_host_cache() -> None:
    """No pinned-memory cache: pinning for a simulated GPU is a plain copy."""


ACCEL_FUNCS: dict[str, Callable[..., Any] | type] = {
    "is_available": is_available,
    "device_count": device_count,
    "current_accelerator": current_accelerator,
    "current_device_index": current_device,
    "current_device_idx": current_device,
    "set_device_index": set_device,
    "set_device_idx": set_device,
    "device_index": device_index,
    "synchronize": synchronize,
    "memory_allocated": _memory.memory_allocated,
    "max_memory_allocated": _memory.max_memory_allocated,
    "memory_reserved": _memory.memory_reserved,
    "max_memory_reserved": _memory.max_memory_reserved,
    "reset_peak_memory_stats": _memory.reset_peak_memory_stats,
    "memory_stats": _memory.memory_stats,
    "get_memory_info": get_memory_info,
    "empty_cache": _memory.empty_cache,
    "empty_host_cache": empty_host_cache,
    "reset_accumulated_memory_stats": _memory.reset_accumulated_memory_stats,
    "get_device_capability": accelerator_capability,
    "current_stream": current_stream,
    "set_stream": set_stream,
}

