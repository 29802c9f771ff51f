"""Device names: TensorFlow device strings and torch names as one `DeviceSpec`.

The rule (`DeviceSpec.from_string`, the one parser of device names):

- A name is a string of printable ASCII without whitespace. Surrounding whitespace is not
  trimmed: `' /GPU:0'` and `'/GPU:0\\n'` are errors that show the name without it.
- torch's names `cuda`, `cuda:N`, `mps`, `mps:N` (`cpu`, `cpu:N` are TensorFlow's short form).
- TensorFlow's names: parts joined by `/`, each one of `job:NAME`, `replica:N`, `task:N`,
  `device:TYPE:N`, `device:TYPE:*`, or the short `TYPE`, `TYPE:N`, `TYPE:*`, with at most one
  device type: `/GPU:1`, `/gpu:1`, `GPU:1`, `/device:GPU:1`,
  `/job:localhost/replica:0/task:0/device:GPU:1`. Empty parts are skipped, as TensorFlow skips
  them, so `''` is the empty spec.
- `N` is one or more of the ASCII digits 0-9 (`/GPU:01` is `/GPU:1`): no sign, no `_`, no
  other script's digits, so no negative index. `NAME` and a `TYPE` after `device:` are a
  letter then letters, digits or `_`, as TensorFlow's runtime parser (`device_name_utils.cc`)
  reads them; a short `TYPE` is one of TensorFlow's (CPU, GPU, TPU, ...) or MPS, in any case,
  and torch's types are matched in any case too. `cpu` and `gpu` become `CPU` and `GPU`.

Anything else is a `ValueError` saying what was wrong, in TensorFlow's words where TensorFlow
has them (an over-long input is echoed only by its ends). A name used as a device
(`full_name`, `to_torch`, `devlab.core.placement_scope.resolve`) must also name a device type: `''` and
`/job:localhost` name none. `to_torch` maps `GPU:N` to `cuda:N` for the indices torch can hold
(0-127: torch keeps a device index in 8 bits), and `CPU:0`/`MPS:0` to torch's one `cpu`/`mps`;
`/CPU:1` names no torch device (logical CPUs of `devlab.config` are `resolve`'s to look up).
Nothing here touches CUDA.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

# TensorFlow's own short device types, matched case-insensitively; MPS is devlab's addition
# for Apple GPUs, which torch names apart from CUDA.
VALID_DEVICE_TYPES = frozenset({"CPU", "GPU", "TPU", "CUSTOM", "EPU", "MPS"})

# torch device types accepted as aliases, and the TensorFlow type each means.
TORCH_ALIASES = {"cpu": "CPU", "cuda": "GPU", "mps": "MPS"}
_TORCH_TYPES = {v: k for k, v in TORCH_ALIASES.items()}
# torch has one device of these types: index 0 is the only one.
_SINGLE_DEVICE_TYPES = frozenset({"cpu", "mps"})

# torch keeps a device index in 8 signed bits (c10::DeviceIndex): cuda:127 is the last one.
MAX_DEVICE_INDEX = 127

LOCAL_JOB = "localhost"

# TensorFlow upper-cases exactly these two spellings, for backwards compatibility
# (`_as_device_str_or_none`); any other type, such as `tpu` or `Gpu`, stays as written.
_UPPER_CASED = {"cpu": "CPU", "gpu": "GPU"}

# Error messages quote user input up to this many characters, then only its ends.
_ECHO_LIMIT = 60

_NUMBER = re.compile(r"[0-9]+")
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_PRINTABLE_ASCII = re.compile(r"[!-~]*")  # no space, no control character, nothing past ASCII


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """A device name as TensorFlow parses it: `/job:J/replica:R/task:T/device:TYPE:IDX`.

    Every field is optional; `device_index=None` means "any" (`*`). As in TensorFlow, the
    device types `cpu` and `gpu` become `CPU` and `GPU` however the spec is made
    (`/device:gpu:0` -> `/device:GPU:0`). Fields made by hand follow the same rule as names
    (the module's docstring): a negative index or a job with a space is a `ValueError`.
    """

    job: str | None = None
    replica: int | None = None
    task: int | None = None
    device_type: str | None = None
    device_index: int | None = None

    def __post_init__(self) -> None:
        for field in ("replica", "task", "device_index"):
            value = getattr(self, field)
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"DeviceSpec {field} is a whole number 0 or more, or None; got {value!r}.")
        for field in ("job", "device_type"):
            value = getattr(self, field)
            if value is not None and not (isinstance(value, str) and _IDENTIFIER.fullmatch(value)):
                raise ValueError(
                    f"DeviceSpec {field} is a letter followed by letters, digits or '_' "
                    f"(ASCII), or None; got {value!r}."
                )
        canonical = _UPPER_CASED.get(self.device_type or "")
        if canonical is not None:
            object.__setattr__(self, "device_type", canonical)

    @classmethod
    def from_string(cls, spec: str) -> DeviceSpec:
        """Parse a TensorFlow device string (`/GPU:1`, `/device:GPU:1`, `gpu`, ...) or a torch
        name (`cpu`, `cuda`, `cuda:1`, `mps`), by the rule in this module's docstring."""
        if isinstance(spec, DeviceSpec):
            return spec
        if not isinstance(spec, str):
            raise TypeError(
                f"A device name must be a string such as '/GPU:0' or 'cuda:0', not {type(spec).__name__}."
            )
        _check_characters(spec)
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
        which physical device a logical one runs on, is `devlab.core.placement_scope.resolve`'s job.
        """
        self._check_names_a_device()
        if self.job not in (None, LOCAL_JOB) or self.replica not in (None, 0) or self.task not in (None, 0):
            raise ValueError(
                f"{echo(self.to_string())} names a remote device; devlab runs in one process, "
                f"so only /job:{LOCAL_JOB}/replica:0/task:0 exists."
            )
        assert self.device_type is not None
        torch_type = _TORCH_TYPES.get(self.device_type.upper())
        if torch_type is None:
            raise ValueError(
                f"Device type {echo(self.device_type)} has no PyTorch device; "
                f"devlab maps {', '.join(sorted(_TORCH_TYPES))}."
            )
        index = self.device_index or 0
        if torch_type in _SINGLE_DEVICE_TYPES:
            if index != 0:
                kind = TORCH_ALIASES[torch_type]
                raise ValueError(
                    f"{echo(self.to_string())} names no torch device: torch has one "
                    f"{torch_type} device, '{torch_type}', which is /device:{kind}:0. Use "
                    f"/{kind}:0 (a logical /{kind}:{index} made with "
                    "devlab.config.set_logical_device_configuration is found by devlab.resolve)."
                )
            return torch.device(torch_type)
        if index > MAX_DEVICE_INDEX:
            # torch.device would wrap it round (cuda:128 is cuda:-128, cuda:2**32 is cuda:0).
            raise ValueError(
                f"{echo(self.to_string())} has a device index no torch device can have: torch "
                f"numbers devices 0 to {MAX_DEVICE_INDEX}; use the index of an existing device, "
                "such as 0 or 1."
            )
        return torch.device(torch_type, index)

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

    def _check_names_a_device(self) -> None:
        if self.device_type is None:
            raise ValueError(
                f"The device name {echo(self.to_string())} names no device type; "
                "use a name such as '/GPU:0', '/CPU:0' or 'cuda:0'."
            )

    def __str__(self) -> str:
        return self.to_string()

    def __repr__(self) -> str:
        return (
            f"<DeviceSpec(job={self.job}, replica={self.replica}, task={self.task}, "
            f"device_type={self.device_type}, device_index={self.device_index})>"
        )


def full_name(x: str | DeviceSpec | torch.device | torch.Tensor) -> str:
    """The fully qualified TensorFlow name of a device, a name, or a tensor's device:
    `/job:localhost/replica:0/task:0/device:GPU:1`. A name without a device type (`''`) is
    an error, as it is for `devlab.resolve`."""
    spec = as_spec(x)
    spec._check_names_a_device()
    return spec.full().to_string()


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
    """`text` quoted for an error message, on one line: whole up to a readable length, else
    its two ends and its length, e.g. `'/GPU:11111111…11111111' (5,005 characters)`; a
    newline or other unprintable character shows as its escape (`\\n`)."""
    if len(text) > _ECHO_LIMIT:
        return f"{quote}{_visible(text[:_ECHO_LIMIT - 20])}…{_visible(text[-20:])}{quote} ({len(text):,} characters)"
    return f"{quote}{_visible(text)}{quote}"


def _visible(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _check_characters(spec: str) -> None:
    if _PRINTABLE_ASCII.fullmatch(spec):
        return
    stripped = spec.strip()
    if not stripped:
        raise ValueError(
            f"The device name {echo(spec)} is only whitespace; use a name such as '/GPU:0', "
            "'/CPU:0' or 'cuda:0'."
        )
    if stripped != spec and _PRINTABLE_ASCII.fullmatch(stripped):
        raise ValueError(
            f"The device name {echo(spec)} has whitespace around it; write it without: {echo(stripped)}."
        )
    bad = next(c for c in spec if not _PRINTABLE_ASCII.fullmatch(c))
    ascii_digits = "".join(str(int(c)) if c.isdecimal() else c for c in spec)
    if bad.isdecimal() and _PRINTABLE_ASCII.fullmatch(ascii_digits):
        raise ValueError(
            f"The device name {echo(spec)} has the digit {echo(bad)} (U+{ord(bad):04X}); write "
            f"numbers with the ASCII digits 0-9: {echo(ascii_digits)}."
        )
    problem = "whitespace" if bad.isspace() else f"{echo(bad)} (U+{ord(bad):04X})"
    raise ValueError(
        f"The device name {echo(spec)} has {problem}; a device name is ASCII letters, the "
        "digits 0-9, ':', '/', '*' and '_', such as '/GPU:0' or 'cuda:0'."
    )


def _parse_torch_alias(spec: str) -> DeviceSpec | None:
    # `cpu` and `cpu:0` are TensorFlow names already; only torch's other types need this.
    name, _, index = spec.partition(":")
    if name.lower() not in ("cuda", "mps"):
        return None
    if index and not _NUMBER.fullmatch(index):
        raise ValueError(
            f"Invalid device index {echo(index)} in the torch device name {echo(spec)}; "
            f"write '{name}' or '{name}:N' with N a whole number 0 or more, in digits 0-9."
        )
    return DeviceSpec(
        device_type=TORCH_ALIASES[name.lower()],
        device_index=_parse_int(index, "device index", spec) if index else None,
    )


def _string_to_components(spec: str) -> tuple[str | None, int | None, int | None, str | None, int | None]:
    # A port of TensorFlow's device_spec._string_to_components, so the same strings are
    # accepted and rejected with the same words, with the names and numbers of TensorFlow's
    # runtime parser (ASCII identifiers and digits) where Python's int() would take more.
    job: str | None = None
    replica: int | None = None
    task: int | None = None
    device_type: str | None = None
    device_index: int | None = None
    for part in (spec or "").split("/"):
        y = part.split(":")
        ly = len(y)
        if ly == 2 and y[0] == "job":
            job = _parse_identifier(y[1], "job name", spec)
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
            device_type = _parse_identifier(y[1], "device type", spec)
            if y[2] != "*":
                device_index = _parse_int(y[2], "device index", spec)
        elif ly and y[0] != "":
            raise ValueError(
                f"Unknown attribute {echo(y[0])} is encountered while parsing the device spec: {echo(spec)}."
            )
        elif part:
            # TensorFlow skips a part such as ':;' unread; devlab refuses what it cannot read.
            raise ValueError(
                f"The part {echo(part)} of the device spec {echo(spec)} names no attribute: a part "
                "is job:NAME, replica:N, task:N, device:TYPE:N or TYPE[:N]."
            )
    return job, replica, task, device_type, device_index


def _parse_identifier(text: str, field: str, spec: str) -> str:
    if not _IDENTIFIER.fullmatch(text):
        example = "'localhost' or 'worker'" if field == "job name" else "'GPU' or 'CPU'"
        raise ValueError(
            f"Invalid {field} {echo(text)} while parsing the device spec: {echo(spec)}; it must be "
            f"a letter followed by letters, digits or '_', such as {example}."
        )
    return text


def _parse_int(text: str, field: str, spec: str) -> int:
    if _NUMBER.fullmatch(text):
        try:
            return int(text)
        except ValueError:  # more digits than Python converts (4,300 by default)
            problem = "it is too long for a number; use a small whole number such as 0 or 1."
    elif text.startswith("-") and _NUMBER.fullmatch(text[1:]):
        problem = f"a {field} is 0 or more."
    else:
        problem = "it must be a whole number written with the digits 0-9" + (
            " or '*'." if field == "device index" else ".")
    raise ValueError(f"Invalid {field} {echo(text)} while parsing the device spec: {echo(spec)}; {problem}")
