"""Device arguments, read once: what a `device=` value, a `.to(...)` target or a `torch.cuda`
device argument means on the simulated machine."""

from __future__ import annotations

import functools
from typing import Any, Final

import torch

from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import session as _session

# torch.device as torch defines it (the simulation may stand a wrapper in for torch.device).
DEVICE_TYPE: Final = type(torch.device("cpu"))


class _Other:
    """A device of a type torch handles itself (meta, ...)."""

    def __repr__(self) -> str:
        return "OTHER"


OTHER: Final = _Other()
HOST: Final = None


def parse(device: Any) -> tuple[str, int | None]:
    """(type, index or None) of a device argument: a str, a torch.device, or a bare int, which
    torch reads as an index on the accelerator, here CUDA."""
    if isinstance(device, DEVICE_TYPE):
        return device.type, device.index
    if isinstance(device, int) and not isinstance(device, bool):
        return "cuda", device
    if device == "cpu":
        return "cpu", None
    if device == "cuda":
        return "cuda", None
    if isinstance(device, str):
        return _parse_text(device)
    return made(DEVICE_TYPE(device))  # torch's own parsing and errors


@functools.lru_cache(maxsize=64)  # a program names a few devices, many times
def _parse_text(text: str) -> tuple[str, int | None]:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    return made(DEVICE_TYPE(text), text)  # torch's own parsing and errors


def made(d: torch.device, text: Any = None, index: Any = None) -> tuple[str, int | None]:
    """(type, index) of the torch.device `d` torch made from the string `text` or the `index`
    given, checked: torch keeps an index in a small integer and wraps a larger one round
    (`cuda:255` is `cuda`, the current device; `cuda:256` is `cuda:0`), so a CUDA index it
    did not keep is CUDA's invalid-ordinal error, never another GPU."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if d.type == "cuda":
        if isinstance(text, str):
            digits = text.rpartition(":")[2] if ":" in text else ""
            index = int(digits) if digits.isdecimal() else None
        if isinstance(index, int) and not isinstance(index, bool) and index != d.index:
            raise _errors.invalid_ordinal()
    return d.type, d.index


def checked_ordinal(index: int) -> int:
    """`index` if that simulated GPU exists, else CUDA's invalid-ordinal error."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if _session.at_first_use is not None:
        _session.first_use()
    sess = _session.session
    if sess is None or not 0 <= index < sess.count:
        raise _errors.invalid_ordinal()
    return index


def target(device: Any) -> int | None | _Other:
    """Where a `device=` argument or a `.to()` target places work: a simulated GPU's index
    (checked), HOST (None) for the CPU, or OTHER."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    kind, index = parse(device)
    if kind == "cuda":
        return checked_ordinal(_session.current_device() if index is None else index)
    return HOST if kind == "cpu" else OTHER


def cuda_index(device: Any = None) -> int:
    """A `torch.cuda` function's device argument (None, int, str, torch.device) as a simulated
    GPU's index, with torch.cuda's errors: a CPU device is refused, a missing GPU is an
    "Invalid device id", a negative index means the current device."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if _session.at_first_use is not None:
        _session.first_use()
    sess = _session.session
    if sess is None:
        raise _errors.not_running()
    if device is None:
        return checked_ordinal(_session.current_device())
    kind, index = parse(device)
    if kind != "cuda":
        raise _errors.not_a_cuda_device(device)
    if index is None or index < 0:
        index = _session.current_device()
    if not 0 <= index < sess.count:
        raise _errors.invalid_device_id()
    return index
