"""What the plugin was asked for: the simulated GPUs' settings, from pytest's options or the
environment, each checked with an error that names what would be right; and the environment
that gives every process the tests start the same GPUs."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

VARIABLES = ("DEVLAB_SIMULATE_GPUS", "DEVLAB_SIMULATE_GPU_MEMORY_MB", "DEVLAB_SIMULATE_GPU_MODEL",
             "DEVLAB_SIMULATE_GPU_TOPOLOGY")
LEAKS = ("report", "fail", "off")

_MIB = 1024 * 1024
_UNITS = {"kib": 1024, "mib": _MIB, "gib": 1024 ** 3, "tib": 1024 ** 4,
          "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b)\s*$", re.IGNORECASE)


class OptionError(ValueError):
    """A bad option or variable (the plugin raises it as pytest's usage error)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """The simulated GPUs asked for: how many, the model (its canonical name), each GPU's
    memory limit in MiB (None: the model's memory, else the host's), the topology's key, and
    what a leak does (LEAKS)."""

    count: int
    model: str | None = None
    memory_mb: int | None = None
    topology: str | None = None
    leaks: str = "report"

    def environment(self) -> dict[str, str]:
        """The variables the start-up hook reads in every child process (an empty one: not
        set, so a child drops the parent's value)."""
        return {"DEVLAB_SIMULATE_GPUS": str(self.count),
                "DEVLAB_SIMULATE_GPU_MEMORY_MB": "" if self.memory_mb is None else str(self.memory_mb),
                "DEVLAB_SIMULATE_GPU_MODEL": self.model or "",
                "DEVLAB_SIMULATE_GPU_TOPOLOGY": self.topology or ""}

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def parse_size(text: object, what: str = "--gpu-memory") -> int:
    """'1GiB' -> 1024: a memory size in whole MiB (a decimal unit's bytes rounded down), at
    least 1 MiB; else an OptionError saying what is right."""
    if isinstance(text, int) and not isinstance(text, bool):
        text = f"{text}MiB"
    m = _SIZE.match(str(text)) if isinstance(text, str) else None
    if m is None:
        raise OptionError(
            f"{what} is a memory size per GPU with its unit, such as 1GiB, 512MiB or 16GB "
            f"(units KiB, MiB, GiB, TiB, or KB, MB, GB, TB); got {text!r}.")
    nbytes = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if nbytes < _MIB:
        raise OptionError(f"{what} is at least 1MiB per GPU; got {text!r}.")
    return nbytes // _MIB


def parse_count(text: object, what: str = "--simulate-gpus") -> int:
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        raw = str(text).strip()
        if not raw.isdigit():
            raise OptionError(f"{what} is the number of GPUs to simulate, a whole number of at "
                              f"least 1 (such as --simulate-gpus 2); got {text!r}.")
        value = int(raw)
    from devlab.engine import simulated

    try:
        return simulated.check_count(value, what)
    except ValueError as e:
        raise OptionError(str(e)) from None


def parse_model(name: str) -> str:
    from devlab.engine import simulated

    try:
        return simulated.gpu_spec(name).name
    except (ValueError, KeyError) as e:
        raise OptionError(f"--gpu-model: {e}") from None


def parse_topology(name: str, model: str | None) -> str:
    if model is None:
        raise OptionError("--gpu-topology times a modeled GPU's collectives: give --gpu-model "
                          "too, e.g. --gpu-model T4 --gpu-topology pcie3-p2p")
    from devlab.engine import simulated
    from devlab.engine.gpu_model.links import topology

    try:
        return topology(name, simulated.gpu_spec(model)).key
    except ValueError as e:
        raise OptionError(f"--gpu-topology: {e}") from None


def parse_leaks(value: str | None) -> str:
    leaks = (value or "report").strip().lower()
    if leaks not in LEAKS:
        raise OptionError(f"--gpu-leaks is one of {', '.join(LEAKS)}; got {value!r}.")
    return leaks


def settings(namespace: Any, environ: dict[str, str] | None = None) -> Settings:
    """The settings pytest's options ask for, each unset one from the environment's
    DEVLAB_* variable (what `python -m devlab run` and the start-up hook read)."""
    env = os.environ if environ is None else environ

    def pick(option: str, variable: str) -> str | None:
        value = getattr(namespace, option, None)
        if value is None:
            value = env.get(variable, "").strip() or None
        return value

    count = parse_count(pick("simulate_gpus", "DEVLAB_SIMULATE_GPUS"))
    model_name = pick("gpu_model", "DEVLAB_SIMULATE_GPU_MODEL")
    model = parse_model(model_name) if model_name else None
    memory = getattr(namespace, "gpu_memory", None)
    if memory is not None:
        memory_mb: int | None = parse_size(memory)
    else:
        raw = env.get("DEVLAB_SIMULATE_GPU_MEMORY_MB", "").strip()
        if raw and not raw.isdigit():
            raise OptionError("DEVLAB_SIMULATE_GPU_MEMORY_MB is a whole number of MiB per GPU "
                              f"(such as 1024); got {raw!r}.")
        memory_mb = int(raw) if raw else None
    topo_name = pick("gpu_topology", "DEVLAB_SIMULATE_GPU_TOPOLOGY")
    topology = parse_topology(topo_name, model) if topo_name else None
    return Settings(count, model, memory_mb, topology,
                    parse_leaks(getattr(namespace, "gpu_leaks", None)))


def marker_settings(base: Settings, args: tuple, kwargs: dict) -> tuple[int, Settings]:
    """What `@pytest.mark.simulated_gpus(n, model=, memory=)` asks of one test: the GPUs it
    needs, and the settings it runs on (the session's, with its model and memory)."""
    unknown = set(kwargs) - {"n", "model", "memory"}
    if unknown or len(args) > 1:
        raise OptionError("simulated_gpus takes (n=1, model=None, memory=None), such as "
                          "@pytest.mark.simulated_gpus(2, model='A100', memory='1GiB'); got "
                          f"{args!r} {kwargs!r}.")
    n = kwargs.get("n", args[0] if args else 1)
    n = parse_count(n, "simulated_gpus(n=...)")
    changes: dict[str, Any] = {}
    if kwargs.get("model") is not None:
        changes["model"] = parse_model(kwargs["model"])
        if changes["model"] != base.model:
            changes["topology"] = None  # the session's machine may not sell this GPU
    if kwargs.get("memory") is not None:
        changes["memory_mb"] = parse_size(kwargs["memory"], "simulated_gpus(memory=...)")
    return n, base.replace(**changes)
