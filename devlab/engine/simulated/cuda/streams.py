"""`torch.cuda.streams` for simulated GPUs, as torch keeps them in torch/cuda/streams.py and
torch/cuda/__init__.py: `Stream` (with CUDA's stream ids), `ExternalStream`, `Event`, the
current stream (`current_stream`, `stream`, `StreamContext`, `set_stream`), and
`torch.Event`/`torch.Stream`, the device-generic ones, while simulating."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import device_args as _devices
from devlab.engine.simulated.base import fork_rule as _fork
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import hazards as _hazards
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.cuda_errors import entry
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.base.session import inside
from devlab.engine.simulated.cuda.device_api import initializes, set_device

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
    @inside
    def synchronize(self) -> None:
        """The host waits for this stream's work (on a modeled GPU, this stream's only)."""
        _workers.wait(self.device_index)
        sess = _session.session
        if sess is not None:
            sess.charges.sync_stream(self.device_index, self.stream_id)
        _hazards.host_waited(self.device_index, self.stream_id)

    @inside
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
    @inside
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
    @inside
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
    @inside
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

    @inside
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
    @inside
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


CUDA_FUNCS: dict[str, Callable[..., Any] | type] = {
    "Stream": Stream,
    "ExternalStream": ExternalStream,
    "Event": Event,
    "current_stream": current_stream,
    "default_stream": default_stream,
    "stream": stream,
    "StreamContext": StreamContext,
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
    """torch.Event/torch.Stream while simulating; a new simulation's GPUs hand out their
    pools from the start."""
    for name, fn in _C_FUNCS.items():
        p.set(torch._C, name, fn)
    _pool_counters.clear()
    if _orig_event is not None and _orig_stream is not None:
        p.set(torch, "Event", AcceleratorEvent)
        p.set(torch, "Stream", AcceleratorStream)
