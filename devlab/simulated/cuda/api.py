"""`torch.cuda` and `torch.accelerator` for simulated GPUs: the functions and classes a
program asks about its GPUs, their memory, streams, events and random state."""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from devlab.host import cpu_cores

from ..core import devices as _devices
from ..core import errors as _errors
from ..core import fork as _fork
from ..core import session as _session
from ..core import workers as _workers
from ..core.errors import entry
from ..core.patcher import Patcher
from ..core.session import DeviceState
from . import memory as _memory
from .memory import total_memory

_F = TypeVar("_F", bound=Callable[..., Any])


def initializes(fn: _F) -> _F:
    """A stand-in for a torch.cuda function that initializes CUDA (its original calls
    `torch.cuda._lazy_init()`, or C++ does): it initializes the simulated runtime, which a
    child forked after its parent did may not (`_fork`)."""

    @functools.wraps(fn)
    def initialized(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        _fork.initialize()
        return fn(*args, **kwargs)

    return initialized  # type: ignore[return-value]


def _gpu(device: Any = None) -> DeviceState:
    """The simulated GPU a torch.cuda device argument names (torch.cuda's errors)."""
    index = _devices.cuda_index(device)
    return _session.session.devices[index]  # type: ignore[union-attr]  # cuda_index checked


def device_name(index: int) -> str:
    sess = _session.session
    spec = sess.spec if sess is not None else None
    modeled = "" if spec is None else f"modeled {spec.name}, "
    return f"Simulated GPU {index} ({modeled}CPU-backed)"


@dataclass(frozen=True)
class SimulatedDeviceProperties:
    """What torch.cuda.get_device_properties answers for a simulated GPU."""

    name: str
    total_memory: int
    major: int = 0
    minor: int = 0
    multi_processor_count: int = 0
    is_integrated: bool = True
    is_multi_gpu_board: bool = False
    simulated: bool = True

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, "
                f"minor={self.minor}, total_memory={self.total_memory // (1024 * 1024)}MB, "
                f"multi_processor_count={self.multi_processor_count}, simulated=True)")


@entry
def is_available() -> bool:
    return _session.session is not None


@entry
def device_count() -> int:
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
    major, minor = _capability()
    return SimulatedDeviceProperties(name=device_name(i), total_memory=total_memory(i),
                                     multi_processor_count=cpu_cores(), major=major,
                                     minor=minor)


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
def synchronize(device: Any = None) -> None:
    """Wait for the device's queued work; with no device, for every simulated GPU's.

    CUDA's synchronize() waits for the current device only, but d2l and most timing code
    call it meaning "wait for the GPUs", and waiting for all keeps such timings honest here.
    """
    index = _devices.cuda_index(device)
    _workers.host_sync(None if device is None else index)


@entry
def is_initialized() -> bool:
    """As torch.cuda's: initialized here, and not in a child forked after its parent was."""
    sess = _session.session
    return bool(sess is not None and sess.initialized and not _session.bad_fork)


@entry
@initializes
def init() -> None:
    """Nothing to initialize for simulated GPUs."""


# Simulated GPUs compute on the CPU, so they draw from the CPU generator: seeding "the GPUs"
# seeds it, and the same seed gives the same values as the same code on the CPU.
@entry
def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


@entry
def seed() -> None:
    torch.default_generator.seed()


@entry
@initializes
def initial_seed() -> int:
    return torch.default_generator.initial_seed()


@entry
@initializes
def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    return torch.get_rng_state()


@entry
def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    torch.set_rng_state(new_state)


@entry
@initializes
def get_rng_state_all() -> list[torch.Tensor]:
    return [torch.get_rng_state() for _ in range(device_count())]


@entry
def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    if new_states:
        torch.set_rng_state(new_states[0])


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


class Stream:
    """A simulated GPU's one stream: its worker's queue (no capture, no priorities)."""

    # What torch.cuda.Stream says of a GPU's default stream (c10's DeviceType 1 is CUDA), which
    # code passes on to ops (FSDP2's record_grad_output_stream, torch 2.15).
    stream_id = 0
    device_type = 1
    cuda_stream = 0
    native_handle = 0

    @entry
    @initializes
    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device_index = _devices.cuda_index(device)
        self.device = torch.device("cuda", self.device_index)
        self.priority = priority

    @entry
    def synchronize(self) -> None:
        _workers.host_sync(self.device_index)

    def query(self) -> bool:
        return _workers.idle(self.device_index)

    def wait_stream(self, stream: Any) -> None:
        """One stream per device: ordering across devices is kept by the host syncs."""

    def wait_event(self, event: Any) -> None:
        """As wait_stream."""

    @entry
    def record_event(self, event: Any = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def is_capturing(self) -> bool:
        return False

    def __enter__(self) -> Stream:  # `with stream:` - the device's only stream
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.device_index == self.device_index

    def __hash__(self) -> int:
        return hash(("devlab-simulated-stream", self.device_index))

    def __repr__(self) -> str:
        return f"<simulated Stream device=cuda:{self.device_index}>"


class Event:
    """torch.cuda.Event for simulated GPUs: records when the device's queue reaches it.

    With a performance model, that is the modeled time (so `elapsed_time` gives modeled
    milliseconds, as the usual GPU timing code expects); otherwise this machine's clock.
    """

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, **kwargs: Any) -> None:
        self.enable_timing = enable_timing
        self.time: float | None = None
        self.device_index: int | None = None

    @entry
    @initializes
    def record(self, stream: Any = None) -> None:
        i = stream.device_index if isinstance(stream, Stream) else _devices.cuda_index(None)
        self.device_index = i
        self.time = None
        sess = _session.session
        self.time = sess.charges.reached(i) if sess is not None else None
        if self.time is None:  # no model: this machine's time when the GPU's queue gets here
            _workers.at_queue_end(i, self._stamp)

    def _stamp(self) -> None:
        self.time = time.perf_counter()

    def query(self) -> bool:
        return self.time is not None

    @entry
    def synchronize(self) -> None:
        if self.device_index is not None:
            _workers.host_sync(self.device_index)

    def wait(self, stream: Any = None) -> None:
        """See Stream.wait_stream."""

    @entry
    def elapsed_time(self, end_event: Event) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise _errors.user_error(RuntimeError(
                "Both events must be created with argument 'enable_timing=True'."))
        self.synchronize()
        end_event.synchronize()
        if self.time is None or end_event.time is None:
            raise _errors.user_error(RuntimeError(
                "Both events must be recorded before calculating elapsed time."))
        return (end_event.time - self.time) * 1000.0


# torch.Event / torch.Stream: device-generic (torch.accelerator's docs time with
# `torch.Event(enable_timing=True)`). While simulating, the current accelerator is a simulated
# GPU, so without a device, or with a cuda one, they are torch.cuda.Event / torch.cuda.Stream
# above (an Event then waits for the GPU's queued work); another device gets torch's own.
_orig_event = getattr(torch, "Event", None)
_orig_stream = getattr(torch, "Stream", None)


def _cuda_or_none(device: Any) -> bool:
    return device is None or _devices.parse(device)[0] == "cuda"


class AcceleratorEvent(Event):
    """torch.Event(device=None, *, enable_timing=False, blocking=False, interprocess=False)."""

    def __new__(cls, device: Any = None, **kwargs: Any) -> Any:
        if not _cuda_or_none(device) and _orig_event is not None:
            return _orig_event(device, **kwargs)
        return super().__new__(cls)

    @entry
    def __init__(self, device: Any = None, *, enable_timing: bool = False,
                 blocking: bool = False, interprocess: bool = False) -> None:
        super().__init__(enable_timing, blocking, interprocess)
        if device is not None:
            _devices.cuda_index(device)  # a missing GPU fails here, as torch's own check does

    def __repr__(self) -> str:
        where = "" if self.device_index is None else f" device=cuda:{self.device_index}"
        return f"<simulated Event{where}>"


class AcceleratorStream(Stream):
    """torch.Stream(device=None, *, priority=0)."""

    def __new__(cls, device: Any = None, **kwargs: Any) -> Any:
        if not _cuda_or_none(device) and _orig_stream is not None:
            return _orig_stream(device, **kwargs)
        return super().__new__(cls)

    @entry
    def __init__(self, device: Any = None, *, priority: int = 0) -> None:
        super().__init__(device, priority)


@entry
@initializes
def current_stream(device: Any = None) -> Stream:
    return Stream(device)


class _NoStream(contextlib.nullcontext):
    """torch.cuda.stream(s): every simulated GPU has one stream, so nothing to switch."""


@entry
def stream(stream: Any) -> contextlib.AbstractContextManager:
    return _NoStream()


@entry
def set_stream(stream: Stream) -> None:
    """Make `stream` current: with one stream per GPU, that makes its device current."""
    if not isinstance(stream, Stream):
        raise _errors.user_error(TypeError(
            "expected the stream of a simulated GPU (torch.cuda.current_stream()), "
            f"got {type(stream).__name__}"))
    _session.tls.device = _devices.checked_ordinal(stream.device_index)


_CUDA_FUNCS: dict[str, Callable[..., Any] | type] = {
    **_memory.CUDA_FUNCS,
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
    "manual_seed": manual_seed,
    "manual_seed_all": manual_seed,
    "seed": seed,
    "seed_all": seed,
    "initial_seed": initial_seed,
    "get_rng_state": get_rng_state,
    "set_rng_state": set_rng_state,
    "get_rng_state_all": get_rng_state_all,
    "set_rng_state_all": set_rng_state_all,
    "device": device,
    "Stream": Stream,
    "Event": Event,
    "current_stream": current_stream,
    "default_stream": current_stream,
    "stream": stream,
    "set_stream": set_stream,
    "device_of": device_of,
    "can_device_access_peer": can_device_access_peer,
    "_lazy_init": _lazy_init,
    "_is_in_bad_fork": _fork.is_in_bad_fork,
}


# torch.accelerator: the device-generic API newer tutorials use
# (`torch.accelerator.current_accelerator().type if torch.accelerator.is_available()`).
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


_ACCEL_FUNCS: dict[str, Callable[..., Any] | type] = {
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


def install(p: Patcher) -> None:
    _memory.install(p)
    if _orig_event is not None and _orig_stream is not None:
        p.set(torch, "Event", AcceleratorEvent)
        p.set(torch, "Stream", AcceleratorStream)
    # torch.cuda re-exports functions defined in submodules (torch.cuda.memory,
    # torch.cuda.random); code may call either name, so both are patched.
    modules = [torch.cuda] + [sys.modules[n] for n in ("torch.cuda.memory", "torch.cuda.random")
                              if n in sys.modules]
    for mod in modules:
        for name, fn in _CUDA_FUNCS.items():
            if mod is torch.cuda or _defined_in(mod, name):
                p.set(mod, name, fn)
    accel = [m for m in (getattr(torch, "accelerator", None),
                         sys.modules.get("torch.accelerator.memory")) if m is not None]
    for mod in accel:
        for name, fn in _ACCEL_FUNCS.items():
            if _defined_in(mod, name) or (mod is torch.accelerator and name in vars(mod)):
                p.set(mod, name, fn)


def _defined_in(mod: Any, name: str) -> bool:
    obj = vars(mod).get(name)
    return obj is not None and getattr(obj, "__module__", None) == mod.__name__


