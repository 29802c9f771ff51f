"""State of the simulation: the simulated devices, storage marks and byte accounting.

A simulated GPU's tensor is an ordinary CPU tensor whose *storage* carries a `_Mark`. Every
view of a storage shares one Python storage object while the C++ storage lives (PyObject
preservation), so a mark set once is seen by views, `.data`, `.detach()` and `Parameter(t)`;
a weak reference to the storage object tells when the C++ storage dies, which is when its
bytes leave the device.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import TypeVar

import torch

MARK = "_devlab_sim"

# CUDA's caching allocator hands out blocks in multiples of 512 bytes; counting the same way
# makes `memory_allocated` read as it would on a real GPU.
_BLOCK = 512


class Session:
    """One start()..stop() run; marks from an earlier run are ignored by a later one."""

    __slots__ = ("__weakref__", "count", "devices", "used")

    def __init__(self, limits: list[int | None], growth: list[bool] | None = None) -> None:
        self.count = len(limits)
        growth = [True] * self.count if growth is None else growth
        self.devices = [DeviceState(i, lim, not grows)
                        for i, (lim, grows) in enumerate(zip(limits, growth, strict=True))]
        self.used = False


@dataclass
class DeviceState:
    """Byte accounting of one simulated GPU (bytes; limit None = unlimited).

    `reserve_up_front` is memory growth off: the GPU holds its whole limit from the start, as
    TensorFlow maps a GPU's memory by default, so its reserved bytes are the limit. Without a
    limit there is no capacity of its own to hold (its memory is the host's), and reserved
    stays what is allocated.
    """

    index: int
    limit: int | None
    reserve_up_front: bool = False
    allocated: int = 0
    peak: int = 0
    torch_device: torch.device = field(init=False)

    def __post_init__(self) -> None:
        self.torch_device = torch.device("cuda", self.index)

    @property
    def reserved(self) -> int:
        """Bytes held for this GPU: allocated, or its whole limit when reserved up front."""
        if self.reserve_up_front and self.limit is not None:
            return self.limit
        return self.allocated

    @property
    def peak_reserved(self) -> int:
        if self.reserve_up_front and self.limit is not None:
            return self.limit
        return self.peak


def _release(m: _Mark) -> None:
    """The storage died (weakref callback): its bytes leave the device."""
    sess = m.session
    if sess is session:
        with lock:
            sess.devices[m.index].allocated -= m.nbytes


class _Mark(weakref.ref):
    """What a storage carries: its simulated device, its session and the bytes accounted.

    It is also the weak reference to that storage whose callback gives the bytes back (one
    object per storage instead of two; CPython drops the callback once it has run, so the
    storage -> mark -> storage loop does not outlive the storage).
    """

    __slots__ = ("index", "nbytes", "session")

    def __new__(cls, storage: torch.UntypedStorage, index: int, session: Session,
                nbytes: int) -> _Mark:
        self = super().__new__(cls, storage, _release)
        self.index = index
        self.session = session
        self.nbytes = nbytes
        return self

    def __init__(self, storage: torch.UntypedStorage, index: int, session: Session,
                 nbytes: int) -> None:
        super().__init__(storage, _release)


# The running session (None when not simulating). Read on every op, so a plain global.
session: Session | None = None

# Reentrant: a weakref callback (storage freed) can run inside a locked section of the same
# thread when garbage collection triggers there.
lock = threading.RLock()

tls = threading.local()


def current_index() -> int | None:
    """The simulated GPU an op is executing on right now in this thread, or None."""
    return getattr(tls, "index", None)


def storage_mark(storage: torch.UntypedStorage) -> _Mark | None:
    """The live mark of a storage (None if unmarked or marked by an earlier session)."""
    m = getattr(storage, MARK, None)
    if m is not None and m.session is session and session is not None:
        return m
    return None


_DisableTF = torch._C.DisableTorchFunction
# Tensor types whose untyped_storage() is torch's own (no __torch_function__ of their own).
PLAIN = (torch.Tensor, torch.nn.Parameter)
STORAGE_ERRORS = (RuntimeError, NotImplementedError, TypeError, ValueError)


def storage_of(t: torch.Tensor) -> torch.UntypedStorage | None:
    """t's storage, read past every torch function mode and subclass override.

    None for sparse, nested or storage-less tensors, which are never simulated.
    """
    try:
        with _DisableTF():
            return t.untyped_storage()
    except STORAGE_ERRORS:
        return None


def index_of(t: torch.Tensor) -> int | None:
    """Simulated GPU index of a tensor; None for a real CPU tensor (or no simulation)."""
    if session is None:
        return None
    s = storage_of(t)
    if s is None:
        return None
    m = getattr(s, MARK, None)
    if m is not None and m.session is session:
        return m.index
    return None


def rounded(nbytes: int) -> int:
    return (nbytes + _BLOCK - 1) // _BLOCK * _BLOCK


def format_size(size: int) -> str:
    """CUDA's allocator formatting of a byte count (c10/cuda/CUDACachingAllocator.cpp)."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


# --- errors raised in PyTorch's name ---------------------------------------------------------

_USER_ERROR = "_devlab_user_error"
_PACKAGE_DIR = os.path.dirname(__file__)


_E = TypeVar("_E", bound=BaseException)


def user_error(err: _E) -> _E:
    """Mark an error the simulation raises as PyTorch would (out of memory, mixed devices,
    an invalid device...), for `drop_own_frames`."""
    setattr(err, _USER_ERROR, True)
    return err


def drop_own_frames(err: BaseException) -> None:
    """Where a user's call entered the simulation, take the simulation's frames out of the
    traceback of an error `user_error` marked, so it ends at the user's line, as CUDA's errors
    (raised in C++) do. Every other frame (the user's, torch's) stays. The caller re-raises
    with a bare `raise`, which on Python 3.11+ keeps the edited traceback; on 3.10 the frames
    stay, and IPython hides all but the last (they set `__tracebackhide__`).

    Errors not marked (devlab's own bugs) keep their whole traceback; torch's own errors in a
    call the simulation made for the user are marked by `torch_error`. A marked
    error keeps its mark, so an outer entry point drops its frames too (a backward pass whose
    hook, the user's code, ran out of memory on a simulated GPU).
    """
    if not getattr(err, _USER_ERROR, False):
        return
    kept = []
    tb = err.__traceback__
    while tb is not None:
        if os.path.dirname(tb.tb_frame.f_code.co_filename) != _PACKAGE_DIR:
            kept.append(tb)
        tb = tb.tb_next
    for outer, inner in zip(kept, kept[1:], strict=False):
        outer.tb_next = inner
    if kept:
        kept[-1].tb_next = None
    err.__traceback__ = kept[0] if kept else None


def torch_error(err: BaseException) -> None:
    """Mark, as `user_error` does, an error torch raised in a call the simulation made for the
    user (a shape mismatch, a bad view...), so `drop_own_frames` ends it at the user's line too.

    The caller made that call and catches the error: its own frame heads the traceback. If a
    frame of the simulation lies further in (a patch torch called back into, a hook wrapper),
    the error may be devlab's own and keeps its whole traceback.
    """
    tb = err.__traceback__
    tb = tb.tb_next if tb is not None else None
    while tb is not None:
        if os.path.dirname(tb.tb_frame.f_code.co_filename) == _PACKAGE_DIR:
            return
        tb = tb.tb_next
    setattr(err, _USER_ERROR, True)


def _oom(dev: DeviceState, nbytes: int) -> torch.OutOfMemoryError:
    assert dev.limit is not None
    reserved = dev.reserved
    free = max(0, dev.limit - reserved)
    return user_error(torch.OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {format_size(nbytes)}. GPU {dev.index} has a "
        f"total capacity of {format_size(dev.limit)} of which {format_size(free)} is free. "
        f"Of the allocated memory {format_size(dev.allocated)} is allocated by PyTorch, and "
        f"{format_size(reserved - dev.allocated)} is reserved by PyTorch but unallocated. "
        "(This GPU is simulated on the CPU; its "
        "memory limit comes from devlab.config.simulate_gpus(memory_limit=...) or "
        "set_logical_device_configuration.) Free tensors you no longer need (del x)."
    ))


def check_fits(index: int, nbytes: int) -> None:
    """Raise CUDA's out-of-memory error if `nbytes` more would exceed the device's limit."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    sess = session
    if sess is None:
        return
    dev = sess.devices[index]
    if dev.limit is not None:
        nb = rounded(nbytes)
        with lock:
            if dev.allocated + nb > dev.limit:
                raise _oom(dev, nb)


def mark_storages(storages: list[torch.UntypedStorage], index: int) -> None:
    """Mark fresh storages as living on simulated GPU `index`, all or none.

    Raises the out-of-memory error, marking nothing, if they do not fit under the limit.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if len(storages) == 1:
        mark_storage(storages[0], index)
        return
    sess = session
    if sess is None:
        return
    sizes = [rounded(s.nbytes()) for s in storages]
    total = sum(sizes)
    dev = sess.devices[index]
    with lock:
        if dev.limit is not None and dev.allocated + total > dev.limit:
            raise _oom(dev, total)
        dev.allocated += total
        if dev.allocated > dev.peak:
            dev.peak = dev.allocated
    for s, nb in zip(storages, sizes, strict=True):
        setattr(s, MARK, _Mark(s, index, sess, nb))
    if not sess.used:
        _first_use(sess)


def mark_storage(s: torch.UntypedStorage, index: int) -> None:
    """mark_storages for one storage: the path taken by almost every op, kept short."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    sess = session
    if sess is None:
        return
    nb = (s.nbytes() + _BLOCK - 1) & -_BLOCK
    dev = sess.devices[index]
    with lock:
        alloc = dev.allocated + nb
        if dev.limit is not None and alloc > dev.limit:
            raise _oom(dev, nb)
        dev.allocated = alloc
        if alloc > dev.peak:
            dev.peak = alloc
    s._devlab_sim = _Mark(s, index, sess, nb)
    if not sess.used:
        _first_use(sess)


def _first_use(sess: Session) -> None:
    sess.used = True
    from devlab import runtime

    runtime.mark_initialized()


def resized(storage: torch.UntypedStorage, m: _Mark) -> None:
    """Re-account a marked storage whose size changed (resize_, set_, out= ops)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    nb = rounded(storage.nbytes())
    if nb == m.nbytes:
        return
    dev = m.session.devices[m.index]
    with lock:
        grow = nb - m.nbytes
        if grow > 0 and dev.limit is not None and dev.allocated + grow > dev.limit:
            raise _oom(dev, grow)
        dev.allocated += grow
        m.nbytes = nb
        if dev.allocated > dev.peak:
            dev.peak = dev.allocated
