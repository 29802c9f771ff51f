"""The placement scope: `with devlab.device("/GPU:1"):`, how a name becomes a device
(`resolve`, `resolve_device`) and the short label a device goes by (`device_label`)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from devlab.core import config
from devlab.core.names import DeviceSpec, as_spec, echo
from devlab.engine import runtime, simulated

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a requested name runs: the logical device, its torch device, and any fallback."""

    requested: DeviceSpec
    logical: config.LogicalDevice
    fell_back: bool = False

    @property
    def device(self) -> torch.device:
        return self.logical.torch_device

    @property
    def full_name(self) -> str:
        return self.logical.full_name

    @property
    def note(self) -> str | None:
        """Why the device differs from the one asked for (soft placement), if it does."""
        if not self.fell_back:
            return None
        return (
            f"Soft placement: {echo(self.requested.full().to_string(), '')} does not exist; "
            f"placed on {self.full_name} instead."
        )


def resolve(name: str | DeviceSpec | torch.device, soft: bool | None = None) -> Placement:
    """Turn a device name into the logical device work runs on.

    A name without an index means index 0, as TensorFlow merges it. An unknown device is a
    `RuntimeError` listing the available ones unless soft placement is on (`soft`, or
    `devlab.config.set_soft_device_placement(True)`), which falls back to the same kind of
    device if there is one, else the CPU, and says so in `Placement.note`.
    """
    spec = as_spec(name)
    # Rejects a missing type, remote jobs and types torch has no device for, in to_torch's
    # words. The index is looked up below instead: one that does not exist may fall back.
    spec.replace(device_index=None).to_torch()
    wanted = spec.full()
    available = config.logical_devices()
    for dev in available:
        if dev.device_type == wanted.device_type.upper() and dev.spec.device_index == wanted.device_index:
            return Placement(spec, dev)
    soft = config.get_soft_device_placement() if soft is None else soft
    if not soft:
        names = ", ".join(d.full_name for d in available)
        raise RuntimeError(
            f"{echo(wanted.to_string(), '')} unknown device. Could not satisfy device specification "
            f"{echo(wanted.to_string())}. All available devices: [{names}]. "
            "Turn on soft placement (devlab.config.set_soft_device_placement(True), or "
            "%%device --soft) to fall back instead." + _simulate_hint(wanted)
        )
    same_kind = [d for d in available if d.device_type == wanted.device_type.upper()]
    fallback = same_kind[0] if same_kind else next(d for d in available if d.device_type == "CPU")
    return Placement(spec, fallback, fell_back=True)


def _simulate_hint(wanted: DeviceSpec) -> str:
    """For a GPU that does not exist: how simulated GPUs would give it, where they can."""
    if wanted.device_type.upper() != "GPU" or not isinstance(wanted.device_index, int):
        return ""
    if config.list_physical_devices("GPU") and not simulated.is_active():
        return ""  # real GPUs: devlab does not simulate beside them
    count = wanted.device_index + 1
    if count > 64:  # an index no one means as a count of GPUs
        return ""
    call = f"devlab.config.simulate_gpus({count})"
    if runtime.is_initialized():
        return (f" Or simulate GPUs on the CPU: restart the kernel, then call {call} before "
                "placing any work (devices cannot change once work has been placed).")
    return f" Or simulate GPUs on the CPU: {call}, before placing any work."


def resolve_device(device: str | DeviceSpec | torch.device) -> torch.device:
    """The `torch.device` work named `device` runs on.

    Names (TensorFlow's `/GPU:0`, torch's `cuda:0`) go through `resolve`, which knows the
    logical devices and soft placement; a `torch.device` is used as it is.
    """
    if isinstance(device, torch.device):
        return device
    return resolve(device).device


def device_label(device: torch.device, name: str | None = None) -> str:
    """A short TensorFlow-style label for charts and tables: `CPU:0`, `GPU:1`, `GPU:0 (simulated)`,
    `GPU:0 (modeled T4)` (a simulated GPU with a performance model).

    `name` replaces the `GPU:1` part (a logical device's own name, or `GPU:0 + GPU:1` for work
    on two GPUs); what kind of device it is still follows from `device`.
    """
    if device.type == "cpu":
        return name or "CPU:0"
    if device.type == "cuda":
        index = 0 if device.index is None else device.index
        name = name or f"GPU:{index}"
        if not simulated.is_active():
            return name
        spec = simulated.model()
        return f"{name} " + ("(simulated)" if spec is None else f"(modeled {spec.name})")
    return name or str(device).upper()


class device(contextlib.ContextDecorator):
    """Run a block (or, as a decorator, a function) with a device as the default.

    Tensors and modules created inside land on that device; on exit the previous default
    device is back, also after an exception or KeyboardInterrupt. Like `torch.device` as a
    context manager, it does not move existing tensors, nor `from_numpy`, `*_like` results
    or `torch.load`.
    """

    def __init__(self, name: str | DeviceSpec | torch.device | Placement,
                 soft: bool | None = None) -> None:
        self.name = name  # a Placement: a name `resolve` has read already (the magics)
        self.soft = soft
        self._contexts: list[Any] = []

    def __enter__(self) -> Placement:
        placement = (self.name if isinstance(self.name, Placement)
                     else resolve(self.name, soft=self.soft))
        runtime.mark_initialized()
        from devlab.core import placement_log

        if placement.fell_back:
            placement_log.note_fallback(placement)
        ctx = torch.device(placement.device)
        ctx.__enter__()
        self._contexts.append(ctx)
        return placement

    def __exit__(self, *exc: object) -> None:
        self._contexts.pop().__exit__(*exc)


_session_default: list[torch.device | None] = []


def set_default(name: str | DeviceSpec | torch.device, soft: bool | None = None) -> Placement:
    """Make a device the default for the rest of the session (`%device NAME`)."""
    placement = resolve(name, soft=soft)
    runtime.mark_initialized()
    if not _session_default:
        _session_default.append(torch.get_default_device())
    torch.set_default_device(placement.device)
    return placement


def reset_default() -> None:
    """Undo `set_default`: the default device is what it was before devlab changed it."""
    if _session_default:
        previous = _session_default.pop()
        torch.set_default_device(None if previous == torch.device("cpu") else previous)


def current_default() -> torch.device:
    """The device factories use now."""
    return torch.get_default_device()
