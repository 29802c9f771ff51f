"""`torch.cuda`'s device functions for simulated GPUs, as torch keeps them in
torch/cuda/__init__.py: what GPUs exist and which is current (`is_available`, `device_count`,
`set_device`, `torch.cuda.device`), what each says about itself (name, properties,
capability), `synchronize`, and `_lazy_init`, which a call that needs the CUDA runtime meets.
`initializes` marks the stand-ins whose originals initialize CUDA."""

from __future__ import annotations

import functools
import sys
import threading
import uuid as uuid_module
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from devlab._helpers.host import cpu_cores
from devlab.engine.gpu_model import specs
from devlab.engine.gpu_model.specs import GpuSpec
from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import device_args as _devices
from devlab.engine.simulated.base import fork_rule as _fork
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import hazards as _hazards
from devlab.engine.simulated.base import machine
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.cuda_errors import entry
from devlab.engine.simulated.base.session import inside
from devlab.engine.simulated.cuda.memory import total_memory

_F = TypeVar("_F", bound=Callable[..., Any])


def initializes(fn: _F) -> _F:
    """A stand-in for a torch.cuda function that initializes CUDA (its original calls
    `torch.cuda._lazy_init()`, or C++ does): it initializes the simulated runtime, which a
    child forked after its parent did may not (`_fork`)."""

    @functools.wraps(fn)
    def initialized(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        if _session.at_first_use is not None:
            _session.first_use()
        _fork.initialize()
        return fn(*args, **kwargs)

    return initialized  # type: ignore[return-value]



def device_name(index: int) -> str:
    """What torch.cuda.get_device_name(index) answers: the board's kind, not its index, as a
    real board's name (and the same name nvidia-smi and NVML give it: `nvml_answers`)."""
    sess = _session.session
    spec = sess.spec if sess is not None else None
    modeled = "" if spec is None else f"modeled {spec.name}, "
    return f"Simulated GPU ({modeled}CPU-backed)"


@dataclass(frozen=True)
class SimulatedDeviceProperties:
    """What torch.cuda.get_device_properties answers for a simulated GPU: the fields of torch's
    `_CudaDeviceProperties`. On a modeled GPU, the board's (`board_properties`); without a
    model, no board's: `multi_processor_count` is this machine's CPU cores (what computes a
    simulated GPU's work: code sizing its launches by it sizes them for what runs them), the
    repr says so, and the other figures a board would give are 0."""

    name: str
    total_memory: int
    major: int = 0
    minor: int = 0
    multi_processor_count: int = 0
    is_integrated: bool = True
    is_multi_gpu_board: bool = False
    max_threads_per_multi_processor: int = 0
    warp_size: int = 32
    regs_per_multiprocessor: int = 0
    L2_cache_size: int = 0  # noqa: N815 - torch's name
    clock_rate: int = 0  # kHz, as CUDA's
    memory_clock_rate: int = 0  # kHz
    memory_bus_width: int = 0  # bits
    shared_memory_per_block: int = 0
    shared_memory_per_multiprocessor: int = 0
    uuid: uuid_module.UUID | None = None
    pci_bus_id: int = 0
    pci_device_id: int = 0
    pci_domain_id: int = 0
    simulated: bool = True
    modeled: str | None = None  # the board the model follows (a GpuSpec's key)

    @property
    def gcnArchName(self) -> str:  # noqa: N802 - torch's name; a CUDA build answers the name
        return self.name

    def __repr__(self) -> str:
        sms = (f"{self.multi_processor_count}" if self.modeled else
               f"{self.multi_processor_count} (this machine's CPU cores: no board modeled)")
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, "
                f"minor={self.minor}, total_memory={self.total_memory // (1024 * 1024)}MB, "
                f"multi_processor_count={sms}, uuid={self.uuid}, pci_bus_id={self.pci_bus_id}, "
                f"pci_device_id={self.pci_device_id}, pci_domain_id={self.pci_domain_id}, "
                f"L2_cache_size={self.L2_cache_size // (1024 * 1024)}MB, simulated=True)")


def board_uuid(index: int) -> uuid_module.UUID:
    """Simulated GPU `index`'s UUID: the one NVML and `nvidia-smi` give it on the machine this
    simulation is (`machine.board_uuid`; the machine's key, as the instruments name it, from
    the GPU count and model)."""
    sess = _session.session
    count = sess.count if sess is not None else 0
    model = sess.spec.name if sess is not None and sess.spec is not None else None
    return machine.board_uuid(machine.machine_key(count, model), index)


def board_properties(index: int, spec: GpuSpec, total: int) -> SimulatedDeviceProperties:
    """What CUDA's device properties hold on the board `spec` models: its SMs, L2, memory bus
    and clocks from the datasheets (`devlab.gpu_model.specs`), the per-SM limits of its compute
    capability; its UUID and PCI bus as NVML gives them (`machine.board_uuid`, `pci_bus`)."""
    major, minor = (int(x) for x in spec.compute_capability.split("."))
    arch = specs.ARCH[spec.compute_capability]
    return SimulatedDeviceProperties(
        name=device_name(index), total_memory=total, major=major, minor=minor,
        multi_processor_count=spec.sms, is_integrated=False,
        max_threads_per_multi_processor=arch["threads_per_sm"], regs_per_multiprocessor=65536,
        L2_cache_size=int(spec.l2_cache_mb * 1024 * 1024),
        clock_rate=specs.boost_clock_mhz(spec) * 1000,
        memory_clock_rate=specs.memory_clock_mhz(spec) * 1000,
        memory_bus_width=spec.memory_bus_bits, shared_memory_per_block=48 * 1024,
        shared_memory_per_multiprocessor=arch["shared_kib_per_sm"] * 1024,
        uuid=board_uuid(index), pci_bus_id=machine.pci_bus(index), modeled=spec.name)


@entry
def is_available() -> bool:
    if _session.at_first_use is not None:
        _session.first_use()
    return _session.session is not None


@entry
def device_count() -> int:
    if _session.at_first_use is not None:
        _session.first_use()
    sess = _session.session
    return sess.count if sess is not None else 0


@entry
@initializes
def current_device() -> int:
    return _session.current_device()


def _ordinal(device: Any) -> int:
    """The index torch.cuda.set_device/torch.cuda.device take (-1: none, keep the current)."""
    if device is None:
        return -1
    kind, index = _devices.parse(device)
    if kind != "cuda":
        raise _errors.not_a_cuda_device(device)
    return _session.current_device() if index is None else index


@entry
@initializes
def set_device(device: Any) -> None:
    i = _ordinal(device)
    if i >= 0:  # torch: a negative index is a no-op
        _session.tls.device = _devices.checked_ordinal(i)


@entry
@initializes
def get_device_name(device: Any = None) -> str:
    return device_name(_devices.cuda_index(device))


@entry
@initializes
def get_device_properties(device: Any = None) -> SimulatedDeviceProperties:
    i = _devices.cuda_index(device)
    sess = _session.session
    spec = sess.spec if sess is not None else None
    if spec is not None:
        return board_properties(i, spec, total_memory(i))
    return SimulatedDeviceProperties(name=device_name(i), total_memory=total_memory(i),
                                     multi_processor_count=cpu_cores(),
                                     uuid=board_uuid(i), pci_bus_id=machine.pci_bus(i))


@entry
@initializes
def get_device_capability(device: Any = None) -> tuple[int, int]:
    _devices.cuda_index(device)
    return _capability()


def _capability() -> tuple[int, int]:
    """A modeled GPU's compute capability (a T4's 7.5, an H100's 9.0: code sizing buffers or
    choosing dtypes by it chooses as on that GPU); (0, 0) for a GPU with no model, so code
    gated on one takes its plain path."""
    sess = _session.session
    spec = sess.spec if sess is not None else None
    if spec is None:
        return (0, 0)
    major, minor = spec.compute_capability.split(".")
    return (int(major), int(minor))


@entry
@initializes
@inside
def synchronize(device: Any = None) -> None:
    """Wait for the device's queued work; with no device, for every simulated GPU's.

    CUDA's synchronize() waits for the current device only, but d2l and most timing code
    call it meaning "wait for the GPUs", and waiting for all keeps such timings honest here.
    """
    index = _devices.cuda_index(device)
    _workers.host_sync(None if device is None else index)
    # For the hazard checks, CUDA's rule: the current device's work only (`base.hazards`).
    _hazards.host_waited(index)


@entry
def is_initialized() -> bool:
    """As torch.cuda's: initialized here, and not in a child forked after its parent was."""
    sess = _session.session
    return bool(sess is not None and sess.initialized and not _session.bad_fork)


@entry
@initializes
def init() -> None:
    """Nothing to initialize for simulated GPUs."""



class device:  # noqa: N801 - stands in for torch.cuda.device
    """`with torch.cuda.device(i):` for simulated GPUs: the thread's current device."""

    @entry
    def __init__(self, device: Any) -> None:
        self.idx = _ordinal(device)
        self.prev_idx = -1

    @entry
    def __enter__(self) -> None:
        self.prev_idx = _session.current_device()
        if self.idx >= 0:
            _fork.initialize()
            _session.tls.device = _devices.checked_ordinal(self.idx)

    def __exit__(self, *exc: object) -> None:
        if self.idx >= 0:
            _session.tls.device = self.prev_idx


class device_of(device):  # noqa: N801
    """`with torch.cuda.device_of(tensor):` the tensor's device, if it is a simulated GPU."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.is_cuda else -1)


@entry
@initializes
def can_device_access_peer(device: Any, peer_device: Any) -> bool:
    """Simulated GPUs share the host's memory, so each reaches every other."""
    _devices.cuda_index(device)
    _devices.cuda_index(peer_device)
    return True


def _lazy_init() -> None:
    """torch.cuda._lazy_init: torch asks for the CUDA runtime, which no simulated GPU has.

    Torch calls it before it would create a tensor on a CUDA device itself, which happens only
    where the simulation does not route the call: in a thread that is not routed, or in a call
    the simulation does not cover. Either way, say so in one line, naming the caller.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    _fork.check()  # in a bad fork, CUDA's own error comes first, as in torch's
    if not _session.is_routed():
        name = threading.current_thread().name
        raise _errors.user_error(RuntimeError(
            f"devlab: thread {name!r} places work on a simulated GPU, but it was started "
            "before the simulation, so its work is not routed to the simulated GPUs. Start "
            "the thread after devlab.config.simulate_gpus(), or run its work inside "
            "`with devlab.simulated.thread_routing():`."))
    caller = sys._getframe(1)
    raise _errors.user_error(RuntimeError(
        f"devlab: {caller.f_code.co_name} (at {caller.f_code.co_filename}:{caller.f_lineno}) "
        "needs the CUDA runtime, which simulated GPUs do not have (they are the CPU). Run it "
        "on the CPU, or on a machine with a real GPU."))



CUDA_FUNCS: dict[str, Callable[..., Any] | type] = {
    "is_available": is_available,
    "device_count": device_count,
    "current_device": current_device,
    "set_device": set_device,
    "get_device_name": get_device_name,
    "get_device_properties": get_device_properties,
    "get_device_capability": get_device_capability,
    "synchronize": synchronize,
    "is_initialized": is_initialized,
    "init": init,
    "device": device,
    "device_of": device_of,
    "can_device_access_peer": can_device_access_peer,
    "_lazy_init": _lazy_init,
    "_is_in_bad_fork": _fork.is_in_bad_fork,
}
