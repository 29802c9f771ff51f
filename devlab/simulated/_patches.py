"""Everything the simulation changes in torch, recorded so that stop() puts back the very
same objects: Tensor attributes, torch.cuda / torch.accelerator functions, the default-device
mode, and a storage tagger for torch.save/torch.load.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.serialization as _ser
import torch.utils._device as _torch_device

from . import _mode, _state, _workers
from ._state import MARK, tls

_MISSING = object()


class Patcher:
    """setattr with a record; restore() undoes every change in reverse order, exactly."""

    def __init__(self) -> None:
        self._undo: list[tuple[object, str, object]] = []

    def set(self, obj: object, name: str, value: object) -> None:
        # Only the object's own attribute is saved: an inherited one is "restored" by deleting
        # ours, so e.g. torch.Tensor.device is again looked up on torch._C.TensorBase.
        own = vars(obj).get(name, _MISSING)
        self._undo.append((obj, name, own))
        setattr(obj, name, value)

    def restore(self) -> None:
        errors: list[BaseException] = []
        while self._undo:
            obj, name, own = self._undo.pop()
            try:
                if own is _MISSING:
                    delattr(obj, name)
                else:
                    setattr(obj, name, own)
            except Exception as e:  # keep restoring the rest
                errors.append(e)
        if errors:
            raise errors[0]


# --- Tensor attributes ---------------------------------------------------------------------

_TB = torch._C.TensorBase
_orig_device = _TB.device
_orig_is_cuda = _TB.is_cuda
_orig_is_cpu = _TB.is_cpu
_orig_get_device = _TB.get_device
_DisableTF = torch._C.DisableTorchFunction
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _mark_of(t: torch.Tensor) -> Any:
    """The live mark of t's storage, read without entering any torch function mode."""
    s = _state.storage_of(t)
    m = getattr(s, MARK, None)
    if m is not None and m.session is _state.session:
        return m
    return None


def _device(self: torch.Tensor) -> torch.device:
    m = _mark_of(self)
    if m is not None:
        return m.session.devices[m.index].torch_device
    if type(self) in _PLAIN:
        with _DisableTF():
            return _orig_device.__get__(self)
    return _orig_device.__get__(self)


def _is_cuda(self: torch.Tensor) -> bool:
    return True if _mark_of(self) is not None else _orig_is_cuda.__get__(self)


def _is_cpu(self: torch.Tensor) -> bool:
    return False if _mark_of(self) is not None else _orig_is_cpu.__get__(self)


def _get_device(self: torch.Tensor) -> int:
    m = _mark_of(self)
    return m.index if m is not None else _orig_get_device(self)


_get_device.__doc__ = _orig_get_device.__doc__


def patch_tensor(p: Patcher) -> None:
    p.set(torch.Tensor, "device", property(_device, doc=_orig_device.__doc__))
    p.set(torch.Tensor, "is_cuda", property(_is_cuda, doc=_orig_is_cuda.__doc__))
    p.set(torch.Tensor, "is_cpu", property(_is_cpu, doc=_orig_is_cpu.__doc__))
    p.set(torch.Tensor, "get_device", _get_device)


# --- torch.cuda ----------------------------------------------------------------------------

_F = TypeVar("_F", bound=Callable[..., Any])


def _entry(fn: _F) -> _F:
    """A user's call enters the simulation here (torch.cuda.set_device(7), ...): an error
    raised in torch's name leaves without the simulation's frames (_state.drop_own_frames)."""

    @functools.wraps(fn)
    def entry(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            _state.drop_own_frames(e)
            raise

    return entry  # type: ignore[return-value]


def _session() -> _state.Session:
    sess = _state.session
    if sess is None:  # a stale reference to a patched function after stop()
        raise _state.user_error(RuntimeError("devlab GPU simulation is not running"))
    return sess


def _index(device: Any = None) -> int:
    """torch.cuda's device argument (None, int, str, torch.device) -> checked index."""
    if device is None:
        return _mode.checked_index(_mode.current_device())
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "cuda":
            raise _state.user_error(ValueError(f"Expected a cuda device, but got: {device}"))
        i = _mode.current_device() if device.index is None else device.index
    else:
        i = int(device)
    if i < 0:
        i = _mode.current_device()
    sess = _session()
    if not 0 <= i < sess.count:
        raise _state.user_error(AssertionError("Invalid device id"))
    return i


def device_name(index: int) -> str:
    return f"Simulated GPU {index} (CPU-backed)"


def total_memory(index: int) -> int:
    """A simulated GPU's capacity: its limit, or the host's memory when unlimited."""
    lim = _session().devices[index].limit
    if lim is not None:
        return lim
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # psutil is a dependency; still, capacity is only informative
        return 0


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


@_entry
def is_available() -> bool:
    return _state.session is not None


@_entry
def device_count() -> int:
    sess = _state.session
    return sess.count if sess is not None else 0


@_entry
def current_device() -> int:
    return _mode.current_device()


@_entry
def set_device(device: Any) -> None:
    if device is None:
        return
    i = device if isinstance(device, int) else _index(device)
    if i < 0:  # torch: a negative index is a no-op
        return
    tls.device = _mode.checked_index(i)


@_entry
def get_device_name(device: Any = None) -> str:
    return device_name(_index(device))


@_entry
def get_device_properties(device: Any = None) -> SimulatedDeviceProperties:
    i = _index(device)
    return SimulatedDeviceProperties(name=device_name(i), total_memory=total_memory(i),
                                     multi_processor_count=_workers.cpu_cores())


@_entry
def get_device_capability(device: Any = None) -> tuple[int, int]:
    _index(device)
    return (0, 0)  # no real compute capability: code gated on one takes its plain path


@_entry
def synchronize(device: Any = None) -> None:
    """Wait for the device's queued work; with no device, for every simulated GPU's.

    CUDA's synchronize() waits for the current device only, but d2l and most timing code
    call it meaning "wait for the GPUs", and waiting for all keeps such timings honest here.
    """
    if device is None:
        _index(None)
        _workers.wait_all()
    else:
        _workers.wait(_index(device))


@_entry
def memory_allocated(device: Any = None) -> int:
    return _session().devices[_index(device)].allocated


@_entry
def max_memory_allocated(device: Any = None) -> int:
    return _session().devices[_index(device)].peak


@_entry
def memory_reserved(device: Any = None) -> int:
    """Allocated bytes, or the whole limit of a GPU that reserves it up front (growth off)."""
    return _session().devices[_index(device)].reserved


@_entry
def max_memory_reserved(device: Any = None) -> int:
    return _session().devices[_index(device)].peak_reserved


@_entry
def reset_peak_memory_stats(device: Any = None) -> None:
    dev = _session().devices[_index(device)]
    with _state.lock:
        dev.peak = dev.allocated


@_entry
def memory_stats(device: Any = None) -> dict[str, int]:
    dev = _session().devices[_index(device)]
    return {
        "allocated_bytes.all.current": dev.allocated,
        "allocated_bytes.all.peak": dev.peak,
        "reserved_bytes.all.current": dev.reserved,
        "reserved_bytes.all.peak": dev.peak_reserved,
    }


@_entry
def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes: as cudaMemGetInfo, what is reserved is not free."""
    i = _index(device)
    total = total_memory(i)
    return (max(0, total - _session().devices[i].reserved), total)


@_entry
def empty_cache() -> None:
    """Nothing is cached: a simulated GPU frees a storage's bytes when the storage dies."""


@_entry
def is_initialized() -> bool:
    sess = _state.session
    return bool(sess is not None and sess.used)


@_entry
def is_current_stream_capturing() -> bool:
    return False


@_entry
def init() -> None:
    """Nothing to initialize for simulated GPUs."""


# Simulated GPUs compute on the CPU, so they draw from the CPU generator: seeding "the GPUs"
# seeds it, and the same seed gives the same values as the same code on the CPU.
@_entry
def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


@_entry
def seed() -> None:
    torch.default_generator.seed()


@_entry
def initial_seed() -> int:
    return torch.default_generator.initial_seed()


@_entry
def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    return torch.get_rng_state()


@_entry
def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    torch.set_rng_state(new_state)


@_entry
def get_rng_state_all() -> list[torch.Tensor]:
    return [torch.get_rng_state() for _ in range(device_count())]


@_entry
def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    if new_states:
        torch.set_rng_state(new_states[0])


class device:  # noqa: N801 - stands in for torch.cuda.device
    """`with torch.cuda.device(i):` for simulated GPUs: the thread's current device."""

    @_entry
    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None else (device if isinstance(device, int) else
                                              _index(device))
        self.prev_idx = -1

    @_entry
    def __enter__(self) -> None:
        self.prev_idx = _mode.current_device()
        if self.idx >= 0:
            tls.device = _mode.checked_index(self.idx)

    def __exit__(self, *exc: object) -> None:
        if self.idx >= 0:
            tls.device = self.prev_idx


def _cudnn_is_acceptable(tensor: torch.Tensor) -> bool:
    return False  # no cuDNN behind a simulated GPU: modules take their plain paths


@_entry
def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    i = _index(device)
    dev = _session().devices[i]
    lim = "unlimited" if dev.limit is None else _state.format_size(dev.limit)
    reserved = ("" if dev.reserved == dev.allocated
                else f", reserved {_state.format_size(dev.reserved)}")
    return (f"Simulated GPU {i} (CPU-backed) memory: allocated {_state.format_size(dev.allocated)}"
            f"{reserved}, peak {_state.format_size(dev.peak)}, limit {lim}\n")


class Stream:
    """A simulated GPU's one stream: its worker's queue (no capture, no priorities)."""

    @_entry
    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device_index = _index(device)
        self.device = torch.device("cuda", self.device_index)
        self.priority = priority

    @_entry
    def synchronize(self) -> None:
        _workers.wait(self.device_index)

    def query(self) -> bool:
        return _workers.idle(self.device_index)

    def wait_stream(self, stream: Any) -> None:
        """One stream per device: ordering across devices is kept by the host syncs."""

    def wait_event(self, event: Any) -> None:
        """As wait_stream."""

    @_entry
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
    """torch.cuda.Event for simulated GPUs: records when the device's queue reaches it."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, **kwargs: Any) -> None:
        self.enable_timing = enable_timing
        self.time: float | None = None
        self.device_index: int | None = None

    @_entry
    def record(self, stream: Any = None) -> None:
        i = stream.device_index if isinstance(stream, Stream) else _index(None)
        self.device_index = i
        self.time = None
        _workers.at_queue_end(i, self._stamp)

    def _stamp(self) -> None:
        self.time = time.perf_counter()

    def query(self) -> bool:
        return self.time is not None

    @_entry
    def synchronize(self) -> None:
        if self.device_index is not None:
            _workers.wait(self.device_index)

    def wait(self, stream: Any = None) -> None:
        """See Stream.wait_stream."""

    @_entry
    def elapsed_time(self, end_event: Event) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise _state.user_error(RuntimeError(
                "Both events must be created with argument 'enable_timing=True'."))
        self.synchronize()
        end_event.synchronize()
        if self.time is None or end_event.time is None:
            raise _state.user_error(RuntimeError(
                "Both events must be recorded before calculating elapsed time."))
        return (end_event.time - self.time) * 1000.0


# torch.Event / torch.Stream: device-generic (torch.accelerator's docs time with
# `torch.Event(enable_timing=True)`). While simulating, the current accelerator is a simulated
# GPU, so without a device, or with a cuda one, they are torch.cuda.Event / torch.cuda.Stream
# above (an Event then waits for the GPU's queued work); another device gets torch's own.
_orig_event = getattr(torch, "Event", None)
_orig_stream = getattr(torch, "Stream", None)


def _cuda_or_none(device: Any) -> bool:
    return device is None or isinstance(device, int) or torch.device(device).type == "cuda"


class AcceleratorEvent(Event):
    """torch.Event(device=None, *, enable_timing=False, blocking=False, interprocess=False)."""

    def __new__(cls, device: Any = None, **kwargs: Any) -> Any:
        if not _cuda_or_none(device) and _orig_event is not None:
            return _orig_event(device, **kwargs)
        return super().__new__(cls)

    @_entry
    def __init__(self, device: Any = None, *, enable_timing: bool = False,
                 blocking: bool = False, interprocess: bool = False) -> None:
        super().__init__(enable_timing, blocking, interprocess)
        if device is not None:
            _index(device)  # a missing GPU fails here, as torch's own check does

    def __repr__(self) -> str:
        where = "" if self.device_index is None else f" device=cuda:{self.device_index}"
        return f"<simulated Event{where}>"


class AcceleratorStream(Stream):
    """torch.Stream(device=None, *, priority=0)."""

    def __new__(cls, device: Any = None, **kwargs: Any) -> Any:
        if not _cuda_or_none(device) and _orig_stream is not None:
            return _orig_stream(device, **kwargs)
        return super().__new__(cls)

    @_entry
    def __init__(self, device: Any = None, *, priority: int = 0) -> None:
        super().__init__(device, priority)


@_entry
def current_stream(device: Any = None) -> Stream:
    return Stream(device)


class _NoStream(contextlib.nullcontext):
    """torch.cuda.stream(s): every simulated GPU has one stream, so nothing to switch."""


@_entry
def stream(stream: Any) -> contextlib.AbstractContextManager:
    return _NoStream()


@_entry
def set_stream(stream: Stream) -> None:
    """Make `stream` current: with one stream per GPU, that makes its device current."""
    if not isinstance(stream, Stream):
        raise _state.user_error(TypeError(
            "expected the stream of a simulated GPU (torch.cuda.current_stream()), "
            f"got {type(stream).__name__}"))
    tls.device = _mode.checked_index(stream.device_index)


@_entry
def reset_accumulated_memory_stats(device: Any = None) -> None:
    """A simulated GPU keeps no accumulated (historical) counters: nothing to reset."""
    _index(device)


_CUDA_FUNCS: dict[str, Callable[..., Any] | type] = {
    "is_available": is_available,
    "device_count": device_count,
    "current_device": current_device,
    "set_device": set_device,
    "get_device_name": get_device_name,
    "get_device_properties": get_device_properties,
    "get_device_capability": get_device_capability,
    "synchronize": synchronize,
    "memory_allocated": memory_allocated,
    "max_memory_allocated": max_memory_allocated,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "reset_max_memory_allocated": reset_peak_memory_stats,
    "memory_reserved": memory_reserved,
    "max_memory_reserved": max_memory_reserved,
    "memory_stats": memory_stats,
    "mem_get_info": mem_get_info,
    "memory_summary": memory_summary,
    "empty_cache": empty_cache,
    "is_initialized": is_initialized,
    "is_current_stream_capturing": is_current_stream_capturing,
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
    "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
}


# torch.accelerator: the device-generic API newer tutorials use
# (`torch.accelerator.current_accelerator().type if torch.accelerator.is_available()`).
class device_index(device):  # noqa: N801
    """`with torch.accelerator.device_index(i):`."""


@_entry
def current_accelerator(check_available: bool = False) -> torch.device:
    return torch.device("cuda")


@_entry
def get_memory_info(device_index: Any = None) -> tuple[int, int]:
    return mem_get_info(device_index)


# The dense dtypes a CPU tensor holds and converts between (quantized, bit and sub-byte
# shell dtypes left out); names missing from an older torch are skipped.
_SUPPORTED_DTYPES = frozenset(
    d for d in (getattr(torch, n, None) for n in (
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
        "float8_e4m3fn", "float8_e5m2"))
    if isinstance(d, torch.dtype))


@_entry
def accelerator_capability(device: Any = None) -> dict[str, Any]:
    """torch.accelerator.get_device_capability: a simulated GPU holds what the CPU holds."""
    _index(device)
    return {"supported_dtypes": set(_SUPPORTED_DTYPES)}


@_entry
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
    "memory_allocated": memory_allocated,
    "max_memory_allocated": max_memory_allocated,
    "memory_reserved": memory_reserved,
    "max_memory_reserved": max_memory_reserved,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "memory_stats": memory_stats,
    "get_memory_info": get_memory_info,
    "empty_cache": empty_cache,
    "empty_host_cache": empty_host_cache,
    "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
    "get_device_capability": accelerator_capability,
    "current_stream": current_stream,
    "set_stream": set_stream,
}


def patch_cuda(p: Patcher) -> None:
    p.set(torch.backends.cudnn, "is_acceptable", _cudnn_is_acceptable)
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


# --- default device (`with torch.device("cuda:0")`, torch.set_default_device) -------------

_orig_device_context_tf = _torch_device.DeviceContext.__torch_function__


def _device_context_tf(self: Any, func: Callable, types: Any, args: tuple = (),
                       kwargs: dict | None = None) -> Any:
    """DeviceContext, when it names a simulated GPU: route instead of asking for CUDA.

    The simulation mode already routes the calls it sees; this catches the factories that
    torch's own Python code calls while that mode is busy with an outer call.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    kwargs = kwargs or {}
    if (_state.session is not None and self.device.type == "cuda"
            and func in _mode._CONSTRUCTORS and kwargs.get("device") is None):
        try:
            return _mode._routed(func, args, kwargs, self.device)
        except Exception as e:  # a user's call may enter the simulation here too
            _state.drop_own_frames(e)
            raise
    return _orig_device_context_tf(self, func, types, args, kwargs)


def patch_device_context(p: Patcher) -> None:
    p.set(_torch_device.DeviceContext, "__torch_function__", _device_context_tf)


# --- threads torch starts itself ----------------------------------------------------------

def _wrap_in_routing(fn: Callable[..., Any]) -> Callable[..., Any]:
    def routed(*args: Any, **kwargs: Any) -> Any:
        with _mode.SimulationMode():
            return fn(*args, **kwargs)

    routed.__wrapped__ = fn  # type: ignore[attr-defined]
    return routed


def patch_threads(p: Patcher) -> None:
    # DataLoader(pin_memory=True, num_workers>0) pins batches in a thread of its own, where
    # the routing mode of the starting thread is absent.
    pm = sys.modules.get("torch.utils.data._utils.pin_memory")
    if pm is not None and hasattr(pm, "_pin_memory_loop"):
        p.set(pm, "_pin_memory_loop", _wrap_in_routing(pm._pin_memory_loop))


# --- torch.save / torch.load ---------------------------------------------------------------

def _untyped(obj: Any) -> Any:
    return obj._untyped_storage if isinstance(obj, torch.storage.TypedStorage) else obj


def _tag(obj: Any) -> str | None:
    m = _state.storage_mark(_untyped(obj))
    return f"cuda:{m.index}" if m is not None else None


def _restore(obj: Any, location: str) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if _state.session is None or not (location == "cuda" or location.startswith("cuda:")):
        return None
    try:
        return _restore_on(obj, location)
    except Exception as e:  # torch.load entered the simulation here
        _state.drop_own_frames(e)
        raise


def _restore_on(obj: Any, location: str) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    i = _mode.current_device() if location == "cuda" else int(location.split(":", 1)[1])
    count = device_count()
    if i >= count:
        raise _state.user_error(RuntimeError(
            f"Attempting to deserialize object on CUDA device {i} but "
            f"torch.cuda.device_count() is {count}. Please use torch.load with map_location "
            "to map your storages to an existing device."
        ))
    s = _untyped(obj)
    if _state.storage_mark(s) is None:  # fresh from the file: it now lives on GPU i
        _state.mark_storages([s], i)
    return obj


# Before torch's own taggers (cpu is priority 10): a marked storage is really a CPU one.
_SER_PRIORITY = 1
_registered: tuple | None = None


def register_serialization() -> None:
    global _registered
    _ser.register_package(_SER_PRIORITY, _tag, _restore)
    _registered = next(e for e in _ser._package_registry if e[1] is _tag)


def unregister_serialization() -> None:
    global _registered
    if _registered is not None:
        with contextlib.suppress(ValueError):
            _ser._package_registry.remove(_registered)
        _registered = None
