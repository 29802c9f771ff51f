"""What devices exist, and the settings TensorFlow asks you to choose before first use.

Mirrors `tf.config`: physical devices (what the machine has), logical devices (what work is
placed on: visible physical devices, each split by its logical configuration), visible
devices, memory growth, memory limits, soft placement. Settings that shape the devices are
fixed once the runtime initializes (`devlab.runtime`); changing them afterwards raises
TensorFlow's own error. Simulated GPUs (`simulate_gpus`) are physical GPUs of this machine
for as long as the simulation runs, and say so.

How each setting maps to PyTorch:

- visible devices: devlab's names (`/GPU:0`), `num_gpus`, `try_gpu` and the placement scope
  count visible GPUs only. torch itself hides devices only through `CUDA_VISIBLE_DEVICES`
  set before the process first uses CUDA, so plain `torch.device("cuda:1")` still reaches a
  hidden real GPU; simulated GPUs are renumbered as `CUDA_VISIBLE_DEVICES` would.
- memory growth: PyTorch's caching allocator always grows on demand, which is what
  TensorFlow calls memory growth, so it is on by default. Turning it off on a real GPU makes
  devlab reserve the device's free memory in the allocator when the runtime starts (what
  TensorFlow does by default); on a simulated GPU with a memory limit the whole limit shows
  as reserved (one without a limit has only the host's memory, so it reserves nothing extra).
- memory limit (`LogicalDeviceConfiguration(memory_limit=MB)`): on a real GPU,
  `torch.cuda.set_per_process_memory_fraction` for the sum of the device's logical limits;
  on a simulated GPU, the simulation's own accounting raises `torch.OutOfMemoryError`.
- several logical devices on one GPU: on a real GPU they are names for the same CUDA device
  (torch has no virtual devices), sharing its memory limit; on simulated GPUs each logical
  device is its own simulated GPU with its own limit.
- soft placement: used by `devlab.device` to fall back to an existing device, and logged.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import torch

from devlab._helpers.sizes import check_memory_limit
from devlab.core.names import MAX_DEVICE_INDEX, DeviceSpec
from devlab.engine import runtime, simulated

_MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class PhysicalDevice:
    """A device of this machine, named as TensorFlow names it (`/physical_device:GPU:0`)."""

    name: str
    device_type: str
    simulated: bool = dataclasses.field(default=False, compare=False)

    @property
    def index(self) -> int:
        return int(self.name.rsplit(":", 1)[1])

    def __repr__(self) -> str:
        extra = ", simulated=True" if self.simulated else ""
        return f"PhysicalDevice(name='{self.name}', device_type='{self.device_type}'{extra})"


@dataclasses.dataclass(frozen=True)
class LogicalDevice:
    """A device work is placed on (`/device:GPU:0`), and the torch device it runs on."""

    name: str
    device_type: str
    torch_device: torch.device = dataclasses.field(compare=False)
    physical: PhysicalDevice = dataclasses.field(compare=False)
    memory_limit: int | None = dataclasses.field(default=None, compare=False)  # MB

    @property
    def simulated(self) -> bool:
        return self.physical.simulated

    @property
    def spec(self) -> DeviceSpec:
        return DeviceSpec.from_string(self.name)

    @property
    def full_name(self) -> str:
        return self.spec.full().to_string()

    def __repr__(self) -> str:
        extra = ", simulated=True" if self.simulated else ""
        return f"LogicalDevice(name='{self.name}', device_type='{self.device_type}'{extra})"


@dataclasses.dataclass(frozen=True)
class LogicalDeviceConfiguration:
    """One logical device to make of a physical one; `memory_limit` in MB, as in TensorFlow."""

    memory_limit: int | None = None
    experimental_priority: int | None = None
    experimental_device_ordinal: int | None = None

    def __post_init__(self) -> None:
        check_memory_limit(self.memory_limit)
        for name in ("experimental_priority", "experimental_device_ordinal"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int):
                raise TypeError(f"{name} is a whole number or None, as in TensorFlow; got {value!r}.")


# TensorFlow's older name for the same thing.
VirtualDeviceConfiguration = LogicalDeviceConfiguration


@dataclasses.dataclass
class _Settings:
    visible: list[PhysicalDevice] | None = None  # None: all
    memory_growth: dict[str, bool] = dataclasses.field(default_factory=dict)
    logical: dict[str, list[LogicalDeviceConfiguration]] = dataclasses.field(default_factory=dict)
    soft_placement: bool = False
    simulated_gpus: int = 0
    simulated_memory_mb: int | None = None
    simulated_model: str | None = None
    simulated_topology: str | None = None


_settings = _Settings()


# --- physical devices -------------------------------------------------------------------


def list_physical_devices(device_type: str | None = None) -> list[PhysicalDevice]:
    """The machine's devices (`CPU`, `GPU`, ...), simulated GPUs included while simulating.

    Never initializes CUDA: real GPUs are counted as `torch.cuda.device_count()` counts them.
    """
    simulated.asked()  # CUDA_VISIBLE_DEVICES set since torch's import counts (_settle_environment)
    devices = [PhysicalDevice("/physical_device:CPU:0", "CPU")]
    if simulated.is_active():
        devices += [
            PhysicalDevice(f"/physical_device:GPU:{i}", "GPU", simulated=True)
            for i in range(_settings.simulated_gpus)
        ]
    else:
        devices += [PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(_real_gpu_count())]
        if _mps_available():
            devices.append(PhysicalDevice("/physical_device:MPS:0", "MPS"))
    return _of_type(devices, device_type)


def gpu_status() -> str:
    """One sentence on the GPUs of this machine, and why there are none where there are none."""
    simulated.asked()
    if simulated.is_active():
        n = _settings.simulated_gpus
        spec = simulated.model()
        if spec is not None:
            return (
                f"{n} simulated GPU{'s' if n != 1 else ''} (CPU-backed: values are real; times "
                f"on them are modeled from {spec.full_name} specifications, not measured)."
            )
        return (
            f"{n} simulated GPU{'s' if n != 1 else ''} (CPU-backed: values are real, "
            "speeds say nothing about a real GPU)."
        )
    n = _real_gpu_count()
    if n:
        return f"{n} CUDA GPU{'s' if n != 1 else ''} (torch {torch.__version__}, CUDA {torch.version.cuda})."
    from devlab.engine import nvml_reader as nvml

    if torch.version.cuda is None and torch.version.hip is None:
        seen = nvml.device_count()
        driver = f" The NVIDIA driver sees {seen} GPU{'s' if seen != 1 else ''}, but" if seen else ""
        return (
            f"No GPU:{driver} this torch build ({torch.__version__}) has no CUDA support. "
            "devlab.config.simulate_gpus(2) simulates GPUs on the CPU."
        )
    reason = nvml.unavailable_reason()
    why = f" (NVML: {reason})" if reason else ""
    return f"No GPU: torch.cuda.is_available() is False{why}. devlab.config.simulate_gpus(2) simulates GPUs on the CPU."


def get_device_details(device: PhysicalDevice) -> dict[str, Any]:
    """What is known about a physical device: name, total memory (bytes), compute capability,
    PCI bus id and driver version, as far as NVML or torch can tell."""
    device = _known_physical(device)
    if device.device_type == "CPU":
        import platform

        import psutil

        return {
            "device_name": platform.processor() or platform.machine(),
            "total_memory": psutil.virtual_memory().total,
            "cores": os.cpu_count(),
        }
    if device.simulated:
        limit = _settings.simulated_memory_mb
        spec = simulated.model()
        details: dict[str, Any] = {
            "device_name": "Simulated GPU "  # torch's and nvidia-smi's name: no index
                           + (f"(modeled {spec.name}, CPU-backed)" if spec else "(CPU-backed)"),
            "simulated": True,
        }
        if spec is not None:
            details["modeled_on"] = spec.full_name
        if limit is not None:
            details["total_memory"] = limit * _MIB
        return details
    if device.device_type == "MPS":
        return {"device_name": "Apple GPU (Metal Performance Shaders)"}
    from devlab.engine import nvml_reader as nvml

    details = nvml.device_details(device.index)
    if not details:
        # Without NVML, torch can tell, at the cost of initializing CUDA.
        props = torch.cuda.get_device_properties(device.index)
        details = {
            "device_name": props.name,
            "total_memory": props.total_memory,
            "compute_capability": (props.major, props.minor),
        }
    return details


# --- logical devices --------------------------------------------------------------------


def list_logical_devices(device_type: str | None = None) -> list[LogicalDevice]:
    """The devices work is placed on. Like TensorFlow's, this initializes the runtime."""
    runtime.mark_initialized()
    return logical_devices(device_type)


def logical_devices(device_type: str | None = None) -> list[LogicalDevice]:
    """`list_logical_devices` without initializing the runtime (for devlab's own helpers)."""
    out: list[LogicalDevice] = []
    counts: dict[str, int] = {}
    for phys in get_visible_devices():
        for cfg in _settings.logical.get(phys.name) or [LogicalDeviceConfiguration()]:
            k = counts.get(phys.device_type, 0)
            counts[phys.device_type] = k + 1
            out.append(
                LogicalDevice(
                    name=f"/device:{phys.device_type}:{k}",
                    device_type=phys.device_type,
                    torch_device=_torch_device(phys, k),
                    physical=phys,
                    memory_limit=cfg.memory_limit if cfg.memory_limit is not None else (
                        _settings.simulated_memory_mb if phys.simulated else None
                    ),
                )
            )
    return _of_type(out, device_type)


def _torch_device(phys: PhysicalDevice, logical_index: int) -> torch.device:
    if phys.device_type == "CPU":
        return torch.device("cpu")
    if phys.device_type == "MPS":
        return torch.device("mps")
    # Simulated GPUs are renumbered to the logical devices; a real GPU keeps its CUDA index
    # whatever logical devices are made of it.
    return torch.device("cuda", logical_index if phys.simulated else phys.index)


def get_logical_device_configuration(device: PhysicalDevice) -> list[LogicalDeviceConfiguration] | None:
    """The logical devices configured for `device`, or None if it is used whole."""
    cfg = _settings.logical.get(_known_physical(device).name)
    return list(cfg) if cfg else None


def set_logical_device_configuration(
    device: PhysicalDevice, logical_devices: list[LogicalDeviceConfiguration] | None
) -> None:
    """Split `device` into logical devices (or set its memory limit with one configuration).

    Allowed until the runtime initializes; afterwards changing it raises
    "Virtual devices cannot be modified after being initialized".
    """
    device = _known_physical(device)
    configs = None if logical_devices is None else list(logical_devices)
    if configs is not None:
        if not configs:
            raise ValueError("Pass at least one LogicalDeviceConfiguration, or None to use the device whole.")
        for cfg in configs:
            if not isinstance(cfg, LogicalDeviceConfiguration):
                raise TypeError(
                    f"Expected devlab.config.LogicalDeviceConfiguration, got {type(cfg).__name__}."
                )
        if device.device_type == "CPU" and any(c.memory_limit is not None for c in configs):
            raise ValueError("Setting memory limit on CPU virtual devices is currently not supported")
        if device.device_type == "GPU" and any(c.memory_limit is None for c in configs):
            raise ValueError("Setting memory limit is required for GPU virtual devices")
        if device.device_type == "GPU" and _settings.memory_growth.get(device.name) is True:
            raise ValueError("Cannot set memory growth on device when virtual devices configured")
        _check_logical_count(device, len(configs))
    if _settings.logical.get(device.name) == configs or (configs is None and device.name not in _settings.logical):
        return
    if runtime.is_initialized():
        raise RuntimeError("Virtual devices cannot be modified after being initialized")
    if configs is None:
        del _settings.logical[device.name]
    else:
        _settings.logical[device.name] = configs
    _apply_simulation()


# --- visible devices ----------------------------------------------------------------------


def get_visible_devices(device_type: str | None = None) -> list[PhysicalDevice]:
    """The physical devices devlab places work on (all of them unless chosen)."""
    physical = list_physical_devices()
    visible = physical if _settings.visible is None else [d for d in physical if d in _settings.visible]
    return _of_type(visible, device_type)


def set_visible_devices(devices: PhysicalDevice | list[PhysicalDevice], device_type: str | None = None) -> None:
    """Choose the physical devices to use (of `device_type` only, if given).

    Allowed until the runtime initializes; afterwards changing it raises
    "Visible devices cannot be modified after being initialized".
    """
    if not isinstance(devices, (list, tuple)):
        devices = [devices]
    device_type = device_type.upper() if device_type else None
    devices = [_known_physical(d) for d in devices]
    for d in devices:
        if device_type is not None and d.device_type != device_type:
            raise ValueError(f"Unrecognized device: {d!r} is not a {device_type} device.")
    current = get_visible_devices()
    new = [d for d in current if device_type is not None and d.device_type != device_type] + devices
    if not any(d.device_type == "CPU" for d in new):
        raise ValueError(
            "The CPU must stay visible: PyTorch always has it. "
            "Pass device_type='GPU' to choose among GPUs only."
        )
    if sorted(new, key=_order) == sorted(current, key=_order):
        return
    if runtime.is_initialized():
        raise RuntimeError("Visible devices cannot be modified after being initialized")
    _settings.visible = sorted(new, key=_order)
    _apply_simulation()


# --- memory growth --------------------------------------------------------------------------


def get_memory_growth(device: PhysicalDevice) -> bool:
    """Whether memory on `device` grows on demand (PyTorch's default) or is reserved up front."""
    device = _known_physical(device)
    if device.device_type not in ("GPU", "MPS"):
        raise ValueError("Cannot get memory growth on non-GPU and non-Pluggable devices")
    return _settings.memory_growth.get(device.name, True)


def set_memory_growth(device: PhysicalDevice, enable: bool) -> None:
    """Let memory on a GPU grow on demand (True, PyTorch's way) or reserve it up front (False).

    Allowed until the runtime initializes; afterwards changing it raises
    "Physical devices cannot be modified after being initialized".
    """
    device = _known_physical(device)
    if device.device_type not in ("GPU", "MPS"):
        raise ValueError("Cannot set memory growth on non-GPU and non-Pluggable devices")
    if not isinstance(enable, bool):
        raise TypeError(f"enable must be True or False, got {enable!r}.")
    if enable and device.name in _settings.logical:
        raise ValueError("Cannot set memory growth on device when virtual devices configured")
    if get_memory_growth(device) == enable:
        _settings.memory_growth[device.name] = enable
        return
    if runtime.is_initialized():
        raise RuntimeError("Physical devices cannot be modified after being initialized")
    _settings.memory_growth[device.name] = enable
    _apply_simulation()


# --- soft placement -------------------------------------------------------------------------


def get_soft_device_placement() -> bool:
    """Whether placing work on a device that does not exist falls back (True) or fails."""
    return _settings.soft_placement


def set_soft_device_placement(enabled: bool) -> None:
    """Fall back to an existing device (and log it) instead of failing; off by default."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False, got {enabled!r}.")
    _settings.soft_placement = enabled


# --- simulated GPUs -------------------------------------------------------------------------


def simulate_gpus(count: int, memory_limit: int | None = None, model: str | None = None,
                  topology: str | None = None) -> None:
    """Simulate `count` GPUs on the CPU (each with `memory_limit` MB, if given).

    Ordinary PyTorch code then sees `count` CUDA devices whose tensors really live in host
    memory: values are exact, speeds say nothing about a real GPU. With `model` ("T4", "P100",
    "V100", "L4", "A100-40GB", "A100-80GB", "H100", ...: `devlab.simulated.models()`; "A100"
    is "A100-80GB"), the simulated GPUs keep a modeled clock of that GPU instead: timing code
    (devlab.timing, torch.cuda.Event) reads modeled times, from the GPU's public
    specifications, not measured; each GPU then has that GPU's memory as torch reports it on
    one (a T4's 14.75 GiB, not its datasheet's 16 GB) and a CUDA context, and `memory_limit` is
    a per-process limit on it. Their collectives are timed in the machine the GPU is sold in
    by default (two T4s on PCIe through host memory, A100s on an NVSwitch board: `explain()`
    names it), or in `topology`, another the GPU is sold in
    (`devlab.gpu_model.topologies(model)`: "pcie3-p2p", "nvlink3-4gpu", ...). Choose before
    first use.
    """
    simulated.check_count(count)
    check_memory_limit(memory_limit)
    # The program's own choice: the environment is not read again at first use.
    simulated.settle_at_first_use(None)
    spec = None
    if model is not None:
        spec = simulated.gpu_spec(model)  # an unknown name fails here, naming the models
        model = spec.name
    if topology is not None:
        if spec is None:
            raise ValueError("a topology times a modeled GPU's collectives: give a model too, "
                             "e.g. simulate_gpus(2, model='T4', topology='pcie3-p2p')")
        from devlab.engine.gpu_model.links import topology as _topology

        topology = _topology(topology, spec).key  # one the GPU is not sold in fails here
    if (
        simulated.is_active()
        and _settings.simulated_gpus == count
        and _settings.simulated_memory_mb == memory_limit
        and _settings.simulated_model == model
        and _settings.simulated_topology == topology
    ):
        return
    real = 0 if simulated.is_active() else _real_gpu_count()
    if real:
        # Refused rather than simulated beside the real ones: a simulated cuda:0 next to the
        # real cuda:0 would be two devices with one name, with real and simulated speeds and
        # memory mixed in one lesson (See Note [Real GPUs beside simulated ones], below).
        raise RuntimeError(
            f"This machine has {real} real GPU{'s' if real != 1 else ''}, so devlab does not "
            "simulate GPUs: simulated ones would take the real ones' CUDA names. To simulate, "
            "use a machine or runtime without a GPU (in Colab: Runtime > Change runtime type > "
            "CPU). To make more devices of a real GPU, split it with "
            "devlab.config.set_logical_device_configuration."
        )
    if runtime.is_initialized():
        raise RuntimeError(
            "Physical devices cannot be modified after being initialized "
            "(choose simulated GPUs before placing work, or call devlab.config.stop_simulation() first)."
        )
    stop_simulation()  # a new set of simulated GPUs starts with none of the old one's settings
    _settings.simulated_gpus = count
    _settings.simulated_memory_mb = memory_limit
    _settings.simulated_model = model
    _settings.simulated_topology = topology
    _settings.visible = None
    simulated.start(count, [memory_limit] * count, model=spec,  # resolved once, above
                    topology=topology)
    _apply_simulation()


def stop_simulation() -> None:
    """Stop simulating GPUs: torch behaves exactly as without devlab again."""
    if not simulated.is_active():
        return
    simulated.stop()
    _settings.simulated_gpus = 0
    _settings.simulated_memory_mb = None
    _settings.simulated_model = None
    _settings.simulated_topology = None
    _settings.visible = None
    for name in [n for n in _settings.logical if "GPU" in n]:
        del _settings.logical[name]
    _settings.memory_growth.clear()
    runtime.reset()


def reset() -> None:
    """Forget every setting and stop any simulation (used by `%unload_ext devlab` and tests)."""
    global _settings
    stop_simulation()
    _settings = _Settings()
    runtime.reset()


def _apply_simulation() -> None:
    # Simulated GPUs are renumbered to the logical GPUs, each with its own limit; with memory
    # growth off on its physical GPU, a logical GPU reserves its whole limit up front; logical
    # GPUs of one physical GPU share its modeled queue (a split GPU adds no compute).
    if simulated.is_active():
        gpus = logical_devices("GPU")
        simulated.reconfigure([d.memory_limit for d in gpus],
                              [_settings.memory_growth.get(d.physical.name, True) for d in gpus],
                              [d.physical.index for d in gpus])


def _apply_real_cuda_settings() -> None:
    # Runs once, when the runtime initializes: the settings now take effect in torch.
    if simulated.is_active() or not _real_gpu_count():
        return
    for phys in get_visible_devices("GPU"):
        configs = _settings.logical.get(phys.name)
        if configs:
            total = torch.cuda.get_device_properties(phys.index).total_memory
            limit = sum(c.memory_limit or 0 for c in configs) * _MIB
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), phys.index)
        elif _settings.memory_growth.get(phys.name) is False:
            # TensorFlow's default: map (nearly) all free memory up front. Allocating it once
            # leaves it reserved in torch's caching allocator.
            free, _ = torch.cuda.mem_get_info(phys.index)
            block = torch.empty(int(free * 0.9), dtype=torch.uint8, device=f"cuda:{phys.index}")
            del block
            torch.cuda.reset_peak_memory_stats(phys.index)  # the program's peak starts here


runtime.on_initialize(_apply_real_cuda_settings)


# --- helpers ---------------------------------------------------------------------------------


def _real_gpu_count() -> int:
    if simulated.is_active():
        return 0
    try:
        return torch.cuda.device_count()
    except Exception:
        return 0


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def _of_type(devices: list[Any], device_type: str | None) -> list[Any]:
    if device_type is None:
        return list(devices)
    if not isinstance(device_type, str):
        raise TypeError(f"device_type is a string such as 'GPU' or 'CPU', not {type(device_type).__name__}.")
    return [d for d in devices if d.device_type == device_type.upper()]


def _known_physical(device: Any) -> PhysicalDevice:
    if isinstance(device, PhysicalDevice):
        for d in list_physical_devices():
            if d.name == device.name:
                return d
    raise ValueError(
        f"Unrecognized device: {device!r}. Pass one of devlab.config.list_physical_devices(): "
        f"{list_physical_devices()}."
    )


def _check_logical_count(device: PhysicalDevice, count: int) -> None:
    # Logical devices are named /device:TYPE:0, 1, ... and simulated GPUs become cuda:0, 1, ...:
    # torch numbers devices 0 to MAX_DEVICE_INDEX (an 8-bit index), so no more than that.
    others = sum(len(_settings.logical.get(p.name) or [None])
                 for p in list_physical_devices(device.device_type) if p.name != device.name)
    most = MAX_DEVICE_INDEX + 1
    if others + count > most:
        kind = device.device_type
        raise ValueError(
            f"{count:,} logical devices on {device.name} would make {others + count:,} logical "
            f"{kind} devices; torch numbers devices 0 to {MAX_DEVICE_INDEX}, so there can be at "
            f"most {most}" + (f" ({most - others} on this one)." if others else ".")
        )


def _order(d: PhysicalDevice) -> tuple[int, int]:
    kinds = ["CPU", "GPU", "MPS"]
    return (kinds.index(d.device_type) if d.device_type in kinds else len(kinds), d.index)


def _cuda_visible(count: int, visible: str | None) -> int:
    """How many of `count` GPUs a process sees under CUDA_VISIBLE_DEVICES=`visible`, read as
    CUDA reads it: unset, all; else the comma-separated indices up to the first that is not
    one of the machine's (out of range, repeated, or not a number: "", "-1" hide them all).
    The simulated machine has `count` GPUs; the process sees the listed ones, renumbered from
    0. (A GPU's UUID is not matched: it ends the list, as an unknown one does.)"""
    if visible is None:
        return count
    seen: list[int] = []
    for entry in visible.split(","):
        entry = entry.strip()
        if not entry.isdigit() or int(entry) >= count or int(entry) in seen:
            break
        seen.append(int(entry))
    return len(seen)


# What a start from the environment reads (`simulate_from_environment`).
ENVIRONMENT = ("DEVLAB_SIMULATE_GPUS", "DEVLAB_SIMULATE_GPU_MEMORY_MB", "DEVLAB_SIMULATE_GPU_MODEL",
               "DEVLAB_SIMULATE_GPU_TOPOLOGY", "CUDA_VISIBLE_DEVICES")


def _environment() -> tuple[str | None, ...]:
    return tuple(os.environ.get(name) for name in ENVIRONMENT)


def cuda_visible_count(count: int, visible: str | None = None) -> int:
    """How many of a simulated machine's `count` GPUs this process sees under its
    `CUDA_VISIBLE_DEVICES` (or `visible`), as CUDA would show them (`_cuda_visible`)."""
    return _cuda_visible(count, os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None
                         else visible)


def simulate_from_environment() -> bool:
    """Start simulated GPUs if `DEVLAB_SIMULATE_GPUS=N` is set (how a Binder image turns them
    on for everyone); `DEVLAB_SIMULATE_GPU_MEMORY_MB` sets each one's memory and
    `DEVLAB_SIMULATE_GPU_MODEL` the GPU they model ("T4"), `DEVLAB_SIMULATE_GPU_TOPOLOGY` the
    machine its collectives are timed in ("pcie3-p2p"). `CUDA_VISIBLE_DEVICES` hides GPUs of
    that machine as it hides real ones (`_cuda_visible`). Returns whether it started. A
    malformed value is reported and ignored: importing devlab must not fail.

    The start-up hook starts them when torch is imported, but CUDA reads CUDA_VISIBLE_DEVICES
    only when it initializes, so a program may set it after `import torch` (a notebook's
    `%env` cell, a script choosing its GPU): the variables are read again at the program's
    first question about the GPUs (`_settle_environment`), and a change restarts the
    simulation as they now say."""
    started = _start_from_environment()
    if started:
        simulated.settle_at_first_use(functools.partial(_settle_environment, _environment()))
    return started


def _settle_environment(seen: tuple[str | None, ...]) -> None:
    """At the first question about the simulated GPUs, before any is used: start them again
    if the environment no longer says what it said at their start (`seen`)."""
    if _environment() == seen or not simulated.is_active() or simulated.is_used():
        return
    stop_simulation()
    _start_from_environment()


def _start_from_environment() -> bool:
    import warnings

    raw = os.environ.get("DEVLAB_SIMULATE_GPUS", "").strip()
    if not raw or simulated.is_active():
        return False
    raw_mb = os.environ.get("DEVLAB_SIMULATE_GPU_MEMORY_MB", "").strip()
    raw_model = os.environ.get("DEVLAB_SIMULATE_GPU_MODEL", "").strip()
    raw_topology = os.environ.get("DEVLAB_SIMULATE_GPU_TOPOLOGY", "").strip()
    try:
        count = int(raw)
        memory = int(raw_mb) if raw_mb else None
        if count == 0:
            return False
        count = _cuda_visible(count, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if count == 0:  # CUDA sees no GPU: torch.cuda.is_available() is False
            return False
        simulate_gpus(count, memory_limit=memory, model=raw_model or None,
                      topology=raw_topology or None)
    except (ValueError, RuntimeError) as exc:
        warnings.warn(
            f"devlab ignored DEVLAB_SIMULATE_GPUS={raw!r}"
            + (f", DEVLAB_SIMULATE_GPU_MEMORY_MB={raw_mb!r}" if raw_mb else "")
            + (f", DEVLAB_SIMULATE_GPU_MODEL={raw_model!r}" if raw_model else "")
            + (f", DEVLAB_SIMULATE_GPU_TOPOLOGY={raw_topology!r}" if raw_topology else "")
            + f": {exc} Set it to a whole number of GPUs, e.g. DEVLAB_SIMULATE_GPUS=2.",
            stacklevel=2,
        )
        return False
    # The variable gives the whole process its GPUs, and torch may have been imported first in
    # any of its threads (the start-up hook starts them there): every thread runs routed, the
    # main one included, not the importing thread alone.
    simulated.route_running_threads()
    return True


# Note [Real GPUs beside simulated ones]
# `simulate_gpus` refuses on a machine where torch sees a real CUDA GPU (`simulated.start`
# refuses on its own too, and `DEVLAB_SIMULATE_GPUS` is then ignored with a warning). Simulating
# beside one was rejected: simulated GPUs take CUDA's names (`cuda:0`,
# `torch.cuda.device_count()`), so a simulated `cuda:0` beside the real `cuda:0` would be two
# devices with one name, torch's own C++ paths would still reach the real one, and a lesson would
# mix real and simulated speeds and memory in one chart. A lesson that needs two GPUs on a
# one-GPU machine (Colab's GPU runtime) splits the real one into logical GPUs instead
# (`lesson.setup`, `set_logical_device_configuration`: TensorFlow's way of running multi-GPU code
# on one GPU); both are `cuda:0` to torch, so the lessons use `lab.gpus` and TensorFlow names,
# never a literal `cuda:1`. The real path stays thin: counts from `torch.cuda.device_count()`,
# memory from NVML (asking torch would initialize CUDA, after which nothing can be split);
# tests/test_real_gpu.py fakes torch.cuda's device queries and NVML at that boundary.
