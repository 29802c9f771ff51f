"""Device names: TensorFlow device strings and torch names as one `DeviceSpec`.

Parsing follows `tf.DeviceSpec.from_string` field for field, including its canonical
`to_string()` (with TensorFlow's upper-casing of `cpu` and `gpu`) and its error texts, which
echo an over-long input only in part. Nothing here touches CUDA.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

# TensorFlow's own short device types, matched case-insensitively; MPS is devlab's addition
# for Apple GPUs, which torch names apart from CUDA.
VALID_DEVICE_TYPES = frozenset({"CPU", "GPU", "TPU", "CUSTOM", "EPU", "MPS"})

# torch device types accepted as aliases, and the TensorFlow type each means.
TORCH_ALIASES = {"cpu": "CPU", "cuda": "GPU", "mps": "MPS"}
_TORCH_TYPES = {v: k for k, v in TORCH_ALIASES.items()}

LOCAL_JOB = "localhost"

# TensorFlow upper-cases exactly these two spellings, for backwards compatibility
# (`_as_device_str_or_none`); any other type, such as `tpu` or `Gpu`, stays as written.
_UPPER_CASED = {"cpu": "CPU", "gpu": "GPU"}

# Error messages quote user input up to this many characters, then only its ends.
_ECHO_LIMIT = 60


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """A device name as TensorFlow parses it: `/job:J/replica:R/task:T/device:TYPE:IDX`.

    Every field is optional; `device_index=None` means "any" (`*`). As in TensorFlow, the
    device types `cpu` and `gpu` become `CPU` and `GPU` however the spec is made
    (`/device:gpu:0` -> `/device:GPU:0`).
    """

    job: str | None = None
    replica: int | None = None
    task: int | None = None
    device_type: str | None = None
    device_index: int | None = None

    def __post_init__(self) -> None:
        canonical = _UPPER_CASED.get(self.device_type or "")
        if canonical is not None:
            object.__setattr__(self, "device_type", canonical)

    @classmethod
    def from_string(cls, spec: str) -> DeviceSpec:
        """Parse a TensorFlow device string (`/GPU:1`, `/device:GPU:1`, `gpu`, ...) or a torch
        name (`cpu`, `cuda`, `cuda:1`, `mps`)."""
        if isinstance(spec, DeviceSpec):
            return spec
        if not isinstance(spec, str):
            raise TypeError(
                f"A device name must be a string such as '/GPU:0' or 'cuda:0', not {type(spec).__name__}."
            )
        torch_alias = _parse_torch_alias(spec)
        if torch_alias is not None:
            return torch_alias
        return cls(*_string_to_components(spec))

    @classmethod
    def from_torch(cls, device: torch.device | str) -> DeviceSpec:
        """The spec of a `torch.device` (index `None` when the device has none)."""
        device = torch.device(device)
        if device.type not in TORCH_ALIASES:
            raise ValueError(
                f"torch device type '{device.type}' has no devlab name; devlab knows "
                f"{', '.join(sorted(TORCH_ALIASES))}."
            )
        index = device.index
        if device.type == "cpu":
            index = 0 if index is None else index
        return cls(device_type=TORCH_ALIASES[device.type], device_index=index)

    def to_string(self) -> str:
        """The canonical TensorFlow form, only the fields given, in TensorFlow's order."""
        out = []
        if self.job is not None:
            out.append("/job:" + self.job)
        if self.replica is not None:
            out.append(f"/replica:{self.replica}")
        if self.task is not None:
            out.append(f"/task:{self.task}")
        if self.device_type is not None:
            index = "*" if self.device_index is None else str(self.device_index)
            out.append(f"/device:{self.device_type}:{index}")
        return "".join(out)

    def to_torch(self) -> torch.device:
        """The `torch.device` this name stands for; a missing index means index 0.

        This is the plain mapping (`GPU:1` -> `cuda:1`); whether that device exists, and
        which physical device a logical one runs on, is `devlab.scope.resolve`'s job.
        """
        if self.device_type is None:
            raise ValueError(
                f"The device name {echo(self.to_string())} names no device type; "
                "use a name such as '/GPU:0', '/CPU:0' or 'cuda:0'."
            )
        if self.job not in (None, LOCAL_JOB) or self.replica not in (None, 0) or self.task not in (None, 0):
            raise ValueError(
                f"{echo(self.to_string())} names a remote device; devlab runs in one process, "
                f"so only /job:{LOCAL_JOB}/replica:0/task:0 exists."
            )
        torch_type = _TORCH_TYPES.get(self.device_type.upper())
        if torch_type is None:
            raise ValueError(
                f"Device type {echo(self.device_type)} has no PyTorch device; "
                f"devlab maps {', '.join(sorted(_TORCH_TYPES))}."
            )
        if torch_type == "cpu":
            # Logical CPUs all run on torch's one CPU device.
            return torch.device("cpu")
        index = self.device_index or 0
        try:
            device = torch.device(torch_type, index)
        except (OverflowError, RuntimeError, ValueError):
            device = None
        # torch keeps a device index in a small integer and wraps a larger one round
        # (cuda:128 becomes cuda:-128, cuda:2**32 becomes cuda:0): that names another device.
        if device is None or device.index != index:
            raise ValueError(
                f"{echo(self.to_string())} has a device index no torch device can have; "
                "use the index of an existing device, such as 0 or 1."
            )
        return device

    def full(self) -> DeviceSpec:
        """This spec with the local job, replica and task filled in and index `*` as 0."""
        return DeviceSpec(
            job=LOCAL_JOB if self.job is None else self.job,
            replica=0 if self.replica is None else self.replica,
            task=0 if self.task is None else self.task,
            device_type=self.device_type,
            device_index=self.device_index or 0,
        )

    def replace(self, **changes: Any) -> DeviceSpec:
        """A copy with the given fields changed."""
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        return self.to_string()

    def __repr__(self) -> str:
        return (
            f"<DeviceSpec(job={self.job}, replica={self.replica}, task={self.task}, "
            f"device_type={self.device_type}, device_index={self.device_index})>"
        )


def full_name(x: str | DeviceSpec | torch.device | torch.Tensor) -> str:
    """The fully qualified TensorFlow name of a device, a name, or a tensor's device:
    `/job:localhost/replica:0/task:0/device:GPU:1`."""
    return as_spec(x).full().to_string()


def as_spec(x: str | DeviceSpec | torch.device | torch.Tensor) -> DeviceSpec:
    """A `DeviceSpec` for a string, spec, `torch.device` or tensor (its device)."""
    if isinstance(x, DeviceSpec):
        return x
    if isinstance(x, torch.Tensor):
        return DeviceSpec.from_torch(x.device)
    if isinstance(x, torch.device):
        return DeviceSpec.from_torch(x)
    return DeviceSpec.from_string(x)


def echo(text: str, quote: str = "'") -> str:
    """`text` quoted for an error message: whole up to a readable length, else its two ends
    and its length, e.g. `'/GPU:11111111…11111111' (5,005 characters)`."""
    if len(text) <= _ECHO_LIMIT:
        return f"{quote}{text}{quote}"
    return f"{quote}{text[:_ECHO_LIMIT - 20]}…{text[-20:]}{quote} ({len(text):,} characters)"


def _parse_torch_alias(spec: str) -> DeviceSpec | None:
    # `cpu` and `cpu:0` are TensorFlow names already; only torch's other types need this.
    name, _, index = spec.partition(":")
    if name.lower() not in ("cuda", "mps"):
        return None
    if index and not index.isdigit():
        raise ValueError(
            f"Invalid device index {echo(index)} in the torch device name {echo(spec)}; "
            f"write '{name}' or '{name}:N' with N a whole number."
        )
    return DeviceSpec(
        device_type=TORCH_ALIASES[name.lower()],
        device_index=_parse_int(index, "device index", spec) if index else None,
    )


def _string_to_components(spec: str) -> tuple[str | None, int | None, int | None, str | None, int | None]:
    # A line-for-line port of TensorFlow's device_spec._string_to_components so that the
    # same strings are accepted and rejected with the same words.
    job: str | None = None
    replica: int | None = None
    task: int | None = None
    device_type: str | None = None
    device_index: int | None = None
    for part in (spec or "").split("/"):
        y = part.split(":")
        ly = len(y)
        if ly == 2 and y[0] == "job":
            job = y[1]
        elif ly == 2 and y[0] == "replica":
            replica = _parse_int(y[1], "replica", spec)
        elif ly == 2 and y[0] == "task":
            task = _parse_int(y[1], "task", spec)
        elif ly in (1, 2) and y[0].upper() in VALID_DEVICE_TYPES:
            if device_type is not None:
                raise ValueError(
                    f"Multiple device types are not allowed while parsing the device spec: {echo(spec, '')}."
                )
            device_type = y[0].upper()
            if ly == 2 and y[1] != "*":
                device_index = _parse_int(y[1], "device index", spec)
        elif ly == 3 and y[0] == "device":
            if device_type is not None:
                raise ValueError(
                    f"Multiple device types are not allowed while parsing the device spec: {echo(spec, '')}."
                )
            device_type = y[1]
            if y[2] != "*":
                device_index = _parse_int(y[2], "device index", spec)
        elif ly and y[0] != "":
            raise ValueError(
                f"Unknown attribute {echo(y[0])} is encountered while parsing the device spec: {echo(spec)}."
            )
    return job, replica, task, device_type, device_index


def _parse_int(text: str, field: str, spec: str) -> int:
    try:
        return int(text)
    except ValueError:
        # TensorFlow lets int()'s own message through; naming the field is kinder.
        if text.isdigit():  # digits int() refuses: more than Python converts (4,300 by default)
            problem = "it is too long for a number; use a small whole number such as 0 or 1."
        else:
            problem = "it must be a whole number" + (" or '*'." if field == "device index" else ".")
        raise ValueError(
            f"Invalid {field} {echo(text)} while parsing the device spec: {echo(spec)}; {problem}"
        ) from None
