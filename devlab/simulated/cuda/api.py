"""`torch.cuda` and `torch.accelerator` for simulated GPUs: the functions and classes a
program asks about its GPUs, their memory, streams, events and random state."""

from __future__ import annotations

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
from ..core import hazards as _hazards
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
    # For the hazard checks, CUDA's rule: the current device's work only (`core.hazards`).
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


# CUDA's stream ids, as c10/cuda/CUDAStream.cpp numbers them (Note [StreamId assignment]): the
# default stream is 0; a stream from a pool is (index << 5) | (type << 1) | 1, where type is
# 1 + the priority's place (0 for priority 0, up to 3 for the highest) and index runs round
# the pool's 32 streams. So `torch.cuda.Stream()` gives 3, 35, 67, ... and, after 32 streams,
# 3 again: the same CUDA stream, as on a GPU.
_STREAM_TYPE_BITS = 4
_STREAMS_PER_POOL = 32
_PRIORITIES = 4  # c10::cuda::max_compile_time_stream_priorities
_CUDA = 1  # c10's DeviceType::CUDA
_pool_counters: dict[tuple[int, int], int] = {}  # (GPU, priority's place) -> streams handed out


def _pool_stream_id(index: int, priority: int) -> int:
    """The next stream of GPU `index`'s pool for `priority` (getStreamFromPool's round robin)."""
    place = min(max(-int(priority), 0), _PRIORITIES - 1)
    with _session.lock:
        n = _pool_counters.get((index, place), 0)
        _pool_counters[(index, place)] = n + 1
    return ((n % _STREAMS_PER_POOL) << (_STREAM_TYPE_BITS + 1)) | ((place + 1) << 1) | 1


def _cuda_stream(stream: Any) -> bool:
    return isinstance(stream, torch._C.Stream) and stream.device_type == _CUDA


class Stream(torch._C.Stream):
    """torch.cuda.Stream for a simulated GPU: a real `torch.Stream` (so torch's C++ argument
    parser takes it: `Tensor.record_stream`, ops given a stream), with CUDA's stream ids.

    `Stream(device=None, priority=0)` takes the next stream of the device's pool, as CUDA's
    does; `Stream(stream_id=, device_index=, device_type=)` names an existing one.
    Values are computed on the CPU in program order, so a program's results are those of the
    same program correctly synchronized (on a GPU an unsynchronized one's are undefined)."""

    @entry
    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Any:
        if kwargs:  # an existing stream, as torch.cuda.Stream(stream_id=...) names one
            unknown = set(kwargs) - {"stream_id", "device_index", "device_type", "stream_ptr"}
            if unknown or "stream_id" not in kwargs or "stream_ptr" in kwargs:
                raise _errors.user_error(TypeError(
                    "a simulated GPU's Stream takes (device=None, priority=0), or stream_id=, "
                    f"device_index=, device_type= of an existing stream; got {sorted(kwargs)}"))
            index = _devices.cuda_index(kwargs.get("device_index"))
            if kwargs.get("device_type", _CUDA) != _CUDA:
                raise _errors.user_error(ValueError(
                    f"device_type={kwargs['device_type']} is not CUDA's ({_CUDA})"))
            stream_id = int(kwargs["stream_id"])
        else:
            index = _devices.cuda_index(device)
            stream_id = _pool_stream_id(index, priority)
        _fork.initialize()
        return super().__new__(cls, stream_id=stream_id, device_index=index,
                               device_type=_CUDA)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # __new__ made it

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """(lowest, highest) priority, as torch.cuda.Stream.priority_range() reports."""
        return (0, -(_PRIORITIES - 1))

    @property
    def priority(self) -> int:
        return -(((self.stream_id >> 1) & ((1 << _STREAM_TYPE_BITS) - 1)) - 1) \
            if self.stream_id else 0

    @property
    def cuda_stream(self) -> int:  # type: ignore[override]
        """The stream's handle: 0 for the default (legacy) stream, as CUDA's; a number of its
        own for the others (no real cudaStream_t exists)."""
        return self.stream_id

    @property
    def native_handle(self) -> int:  # type: ignore[override]
        return self.stream_id

    @entry
    @initializes
    def synchronize(self) -> None:
        """The host waits for this stream's work (on a modeled GPU, this stream's only)."""
        _workers.wait(self.device_index)
        sess = _session.session
        if sess is not None:
            sess.charges.sync_stream(self.device_index, self.stream_id)
        _hazards.host_waited(self.device_index, self.stream_id)

    def query(self) -> bool:
        """Whether the stream's work is done: on a modeled GPU, whether the host's modeled
        time has passed the stream's (a False answer costs the host one call's time, so a
        polling loop ends); otherwise whether the GPU's queue is idle."""
        sess = _session.session
        at = sess.charges.reached(self.device_index, self.stream_id) if sess is not None else None
        done = (sess.charges.poll(at) if sess is not None and at is not None
                else _workers.idle(self.device_index))
        if done:
            _hazards.host_waited(self.device_index, self.stream_id)
        return done

    @entry
    @initializes
    def wait_stream(self, stream: Any) -> None:
        """Work queued on this stream from now on starts after what `stream` has queued."""
        if not _cuda_stream(stream):
            raise _errors.user_error(TypeError(
                f"wait_stream expects a CUDA stream, got {type(stream).__name__}"))
        sess = _session.session
        if stream != self and stream.device_index == self.device_index:
            _hazards.stream_waited(self.device_index, self.stream_id, stream.stream_id)
        if sess is not None and stream != self:
            sess.charges.wait_for(self.device_index, self.stream_id,
                                  sess.charges.reached(stream.device_index, stream.stream_id))

    @entry
    @initializes
    def wait_event(self, event: Any) -> None:
        """Work queued on this stream from now on starts after the work `event` recorded."""
        if not isinstance(event, Event):
            raise _errors.user_error(TypeError(
                f"wait_event expects a torch.cuda.Event, got {type(event).__name__}"))
        at = event.position
        if at is not None and at[0] == self.device_index:
            _hazards.stream_waited(self.device_index, self.stream_id, at[1], at[2])
        sess = _session.session
        if sess is not None and event.time is not None and event.modeled:
            sess.charges.wait_for(self.device_index, self.stream_id, event.time)

    @entry
    def record_event(self, event: Any = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def is_capturing(self) -> bool:
        return False

    @entry
    def __enter__(self) -> Stream:  # `with stream:` makes it current, as torch.Stream does
        ctx = StreamContext(self)
        ctx.__enter__()
        self.__dict__.setdefault("_contexts", []).append(ctx)  # `with s:` may nest
        return self

    def __exit__(self, *exc: object) -> None:
        self.__dict__["_contexts"].pop().__exit__(*exc)

    def __repr__(self) -> str:
        return (f"<simulated torch.cuda.Stream device=cuda:{self.device_index} "
                f"stream_id={self.stream_id}>")


def _handed_out(stream_ptr: int) -> bool:
    """Whether `stream_ptr` is a stream handle a simulated GPU hands out (`cuda_stream`): 0,
    the default stream, or a pool stream's id (see _pool_stream_id)."""
    kind = (stream_ptr >> 1) & ((1 << _STREAM_TYPE_BITS) - 1)
    return stream_ptr == 0 or (stream_ptr & 1 == 1 and 1 <= kind <= _PRIORITIES
                               and stream_ptr >> (_STREAM_TYPE_BITS + 1) < _STREAMS_PER_POOL)


class ExternalStream(Stream):
    """torch.cuda.ExternalStream(stream_ptr, device=None): a stream the program got from
    elsewhere as its `cudaStream_t` value. On a simulated GPU the only such values are its own
    streams' (`torch.cuda.Stream().cuda_stream`, 0 for the default stream): the external
    stream is that stream (its stream_id is the pointer, as c10 makes an external stream's),
    so work queued on either is ordered as one stream's. Any other pointer (a stream of CuPy,
    Numba or a C++ extension) names nothing here: devlab's error says so."""

    @entry
    def __new__(cls, stream_ptr: Any, device: Any = None, **kwargs: Any) -> Any:
        if kwargs:
            raise _errors.user_error(TypeError(
                f"ExternalStream takes (stream_ptr, device=None); got {sorted(kwargs)}"))
        if isinstance(stream_ptr, bool) or not isinstance(stream_ptr, int) or stream_ptr < 0:
            raise _errors.user_error(TypeError(
                "ExternalStream's stream_ptr is a cudaStream_t's integer value (a "
                f"stream's .cuda_stream), got {stream_ptr!r}"))
        index = _devices.cuda_index(device)
        if not _handed_out(stream_ptr):
            raise _errors.user_error(ValueError(
                f"torch.cuda.ExternalStream(stream_ptr={stream_ptr:#x}) on a simulated GPU: "
                "no CUDA stream of another library (CuPy, Numba, a C++ extension) exists "
                "here; the pointers a simulated GPU knows are its own streams' "
                "(torch.cuda.Stream().cuda_stream, 0 for the default stream). Pass one of "
                "those, or run this part on a real GPU."))
        return super().__new__(cls, stream_id=stream_ptr, device_index=index)

    def __repr__(self) -> str:
        return (f"<simulated torch.cuda.ExternalStream device=cuda:{self.device_index} "
                f"cuda_stream={self.stream_id:#x}>")


class Event:
    """torch.cuda.Event for simulated GPUs: records when the device's queue reaches it.

    With a performance model, that is the modeled time (so `elapsed_time` gives modeled
    milliseconds, as the usual GPU timing code expects); otherwise this machine's clock.
    """

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, **kwargs: Any) -> None:
        self.enable_timing = enable_timing
        self.time: float | None = None
        self.modeled = False  # `time` is the modeled clock's, not this machine's
        self.device_index: int | None = None
        self.position: tuple[int, int, int] | None = None  # (GPU, stream, its work): hazards

    @entry
    @initializes
    def record(self, stream: Any = None) -> None:
        if stream is None:  # the current stream of the current device, as CUDA's
            i = _devices.cuda_index(None)
            sid = _session.current_stream(i)
        elif _cuda_stream(stream):
            i, sid = stream.device_index, stream.stream_id
        else:
            raise _errors.user_error(TypeError(
                f"Event.record expects a CUDA stream, got {type(stream).__name__}"))
        self.device_index = i
        self.position = (i, sid, _hazards.mark(i, sid))
        self.time = None
        sess = _session.session
        self.time = sess.charges.reached(i, sid) if sess is not None else None
        self.modeled = self.time is not None
        if self.time is None:  # no model: this machine's time when the GPU's queue gets here
            _workers.at_queue_end(i, self._stamp)

    def _stamp(self) -> None:
        self.time = time.perf_counter()

    def query(self) -> bool:
        """Whether the work the event recorded is done: True for an event never recorded, as
        CUDA's; on a modeled GPU, whether the host's modeled time has passed the event's (a
        False answer costs the host one call's time, so a polling loop ends); otherwise
        whether the GPU's queue has reached it."""
        if self.device_index is None:
            return True
        sess = _session.session
        done = (sess.charges.poll(self.time) if self.modeled and sess is not None
                else self.time is not None)
        if done and self.position is not None:
            _hazards.host_waited(*self.position)
        return done

    @entry
    def synchronize(self) -> None:
        """The host waits for the work the event recorded (on a modeled GPU, to its time)."""
        if self.device_index is None:
            return
        _workers.wait(self.device_index)
        sess = _session.session
        if sess is not None and self.modeled:
            sess.charges.host_wait(self.time)
        if self.position is not None:
            _hazards.host_waited(*self.position)

    @entry
    def wait(self, stream: Any = None) -> None:
        """`stream` (the current one if None) waits for the work the event recorded."""
        (stream if stream is not None else current_stream()).wait_event(self)

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


class _GenericStream(type):
    """torch.Stream's class while simulating: every stream is still a `torch.Stream`
    (`isinstance(torch.cuda.current_stream(), torch.Stream)`, as in torch)."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch._C.Stream) if cls is AcceleratorStream else \
            type.__instancecheck__(cls, obj)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, torch._C.Stream) if cls is AcceleratorStream else \
            type.__subclasscheck__(cls, sub)


class AcceleratorStream(Stream, metaclass=_GenericStream):
    """torch.Stream(device=None, *, priority=0): a new stream of the GPU's pool."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Any:
        if not _cuda_or_none(device) and _orig_stream is not None:
            return _orig_stream(device, priority=priority, **kwargs)
        return super().__new__(cls, device, priority, **kwargs)


@entry
@initializes
def current_stream(device: Any = None) -> Stream:
    """The thread's current stream on `device` (its default stream unless one was set)."""
    index = _devices.cuda_index(device)
    return Stream(stream_id=_session.current_streams().get(index, 0), device_index=index)


@entry
@initializes
def default_stream(device: Any = None) -> Stream:
    """`device`'s default stream (stream id 0)."""
    return Stream(stream_id=0, device_index=_devices.cuda_index(device))


class StreamContext:
    """`with torch.cuda.stream(s):` s is the current stream (and its device the current
    device) inside; the streams and device before it come back after, as torch's
    StreamContext does. `None` changes nothing."""

    def __init__(self, stream: Any) -> None:
        if stream is not None and not _cuda_stream(stream):
            raise _errors.user_error(TypeError(
                "expected a stream of a simulated GPU (torch.cuda.Stream), "
                f"got {type(stream).__name__}"))
        self.stream = stream
        self._before: list[tuple[int, int]] = []
        self._device = -1

    @entry
    def __enter__(self) -> Any:
        s = self.stream
        if s is None:
            return None
        ids = _session.current_streams()
        self._device = _session.current_device()
        self._before = [(i, ids.get(i, 0)) for i in {self._device, s.device_index}]
        set_stream(s)
        return s

    def __exit__(self, *exc: object) -> None:
        if self.stream is None:
            return
        ids = _session.current_streams()
        for i, stream_id in self._before:
            ids[i] = stream_id
        _session.tls.device = self._device


@entry
def stream(stream: Any) -> StreamContext:
    return StreamContext(stream)


@entry
def set_stream(stream: Any) -> None:
    """Make `stream` current on its device, and its device the current device (as
    torch._C._cuda_setStream does). None changes nothing."""
    if stream is None:
        return
    if not _cuda_stream(stream):
        raise _errors.user_error(TypeError(
            "expected the stream of a simulated GPU (torch.cuda.current_stream()), "
            f"got {type(stream).__name__}"))
    index = _devices.checked_ordinal(stream.device_index)
    _fork.initialize()
    _session.current_streams()[index] = stream.stream_id
    _session.tls.device = index
    if stream.stream_id:
        _hazards.left_default_stream()


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
    "ExternalStream": ExternalStream,
    "Event": Event,
    "current_stream": current_stream,
    "default_stream": default_stream,
    "stream": stream,
    "StreamContext": StreamContext,
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


def _c_set_stream(stream_id: int = 0, device_index: int = 0, device_type: int = _CUDA) -> None:
    """`torch._C._cuda_setStream`, which torch's own test harness calls
    (common_utils.CudaNonDefaultStream) where Python code would call torch.cuda.set_stream."""
    set_stream(Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))


def _c_set_device(device: int) -> None:
    """`torch._C._cuda_setDevice` (a function of its own: torch.compile's tracing rules name
    each torch function once)."""
    set_device(device)


# torch._C's entry points for the current stream and device, as torch's own Python code calls
# them (a CPU build has none).
_C_FUNCS = {"_cuda_setStream": entry(_c_set_stream), "_cuda_setDevice": entry(_c_set_device)}


def install(p: Patcher) -> None:
    _memory.install(p)
    for name, fn in _C_FUNCS.items():
        p.set(torch._C, name, fn)
    _pool_counters.clear()  # a new simulation's GPUs hand out their pools from the start
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


