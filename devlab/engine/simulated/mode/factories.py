"""Ops given a device: `torch.ones(3, device="cuda:1")`, factories under a default device
(`with torch.device("cuda:1")`, `torch.set_default_device`), and factories given
`pin_memory=True` (pinned host memory)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._device as _torch_device

from devlab.engine.gpu_model import ops_catalog
from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import device_args as _devices
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base import storage_marks as _marks
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.mode import device_rule as _ops

CONSTRUCTORS = ops_catalog.factories()
_DisableTF = torch._C.DisableTorchFunction

_SIZED = ops_catalog.callables("sized")
# Note [Why empty memory reads as zeros]
# Memory a simulated GPU hands out reads as zeros, as memory a GPU gives a new process usually
# does (never another process's data), where the host's would hold whatever the process freed
# there last: NaNs, in a program that trains on weights it forgot to initialize (pytorch/
# examples' FSDP2 Transformer leaves its layers as `to_empty` made them). CUDA promises nothing
# of it, and memory its caching allocator reuses within a program holds that program's values.
# The zeros are the simulation's, not an op of the program's: while something watches ops (the
# placement log or another dispatch mode, torch.profiler) they are written without an aten op
# (`memset`), so that `torch.empty(n, device="cuda")` shows `aten::empty` alone, as on a GPU, not
# an `aten::zero_` on the CPU after it; unwatched, `zero_()` is the cheaper call.
_EMPTY = ops_catalog.callables("empty")
_memset = ctypes.memset
_dispatch_modes = torch._C._len_torch_dispatch_stack
_profiling = torch._C._autograd._profiler_enabled


def _zero(out: torch.Tensor) -> None:
    """Fill a new `empty` tensor's storage with zeros (Note [Why empty memory reads as zeros])."""
    if not (_dispatch_modes() or _profiling()):
        out.zero_()
        return
    try:
        s = out.untyped_storage()
    except _marks.STORAGE_ERRORS:  # a layout without one storage (sparse): its own op
        out.zero_()
        return
    n = s.nbytes()
    if n:
        _memset(s.data_ptr(), 0, n)


def _nbytes(func: Callable, args: tuple, kwargs: dict) -> int:
    """Bytes a size-taking factory will allocate (0 if unknown), to refuse before allocating."""
    if func not in _SIZED:
        return 0
    try:
        size = args[0] if (func is torch.full or (len(args) == 1 and not isinstance(args[0], int))) \
            else args
        if "size" in kwargs:
            size = kwargs["size"]
        n = 1
        for d in size:
            n *= int(d)
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        return n * dtype.itemsize
    except (TypeError, ValueError, IndexError, AttributeError):
        return 0


def _meta(t: torch.Tensor) -> bool:
    """Whether t's storage is a meta one (a FakeTensor's): shapes only, nothing to place."""
    s = _marks.storage_of(t)
    return s is not None and s.device.type == "meta"


def place(func: Callable, args: tuple, kwargs: dict, device: Any) -> Any:
    """Run an op given a device: on the CPU, its outputs marked with that device."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    target = _devices.target(device)
    if target is _devices.OTHER:
        return _ops.call(None, func, args, kwargs)
    if target is _devices.HOST:
        for i in {_marks.index_of(t) for t in _marks.tensors_of(args, {})} - {None}:
            _workers.wait(i)
        return _ops.call(None, func, args, dict(kwargs, device="cpu"))
    size = _nbytes(func, args, kwargs)
    if size:
        _marks.check_fits(target, size)
    _workers.wait(target)
    # Decided: a CPU op whose outputs live on `target`. No mode below may place it again (a
    # simulation mode under a DeviceContext would run it as a host op).
    with _DisableTF():
        out = _ops.call(target, func, args, dict(kwargs, device="cpu"))
        if isinstance(out, torch.Tensor) and _meta(out):
            return out  # under a FakeTensorMode (DTensor's sharding propagation): no memory
        if func in _EMPTY and isinstance(out, torch.Tensor):
            _zero(out)  # See Note [Why empty memory reads as zeros]
    _marks.mark_outputs(out, target)
    _session.session.charges.factory(func, args, out, target)  # type: ignore[union-attr]
    return out


# The fast path's factories (See Note [The mode's fast path] in mode/routing.py): the sized
# ones (`torch.empty/zeros/ones/full/rand/randn`), given a simulated GPU by `device=` and
# nothing else but a dtype and requires_grad.
FAST = _SIZED
_FAST_KEYWORDS = frozenset({"device", "dtype", "requires_grad"})
# A `device=` value (a str or torch.device) -> its CUDA index (None: the current GPU), or
# OTHER for any other device: `target`'s parsing, read once per value
_cuda_of: dict[Any, Any] = {}
_UNSEEN = object()
_Tensor = torch.Tensor
_NO_CHARGES = _session.NO_CHARGES


def fast_place(sess: Any, func: Callable, args: tuple, kwargs: dict) -> Any:
    """`place(func, args, kwargs, kwargs["device"])`, step for step, for a sized factory given
    a simulated GPU by a plain `device=` (the caller has checked that nothing unusual is in
    play); or the reason (a str) it needs `place` itself, before anything has happened."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if not _FAST_KEYWORDS.issuperset(kwargs):
        return "factory keyword"
    d = kwargs.get("device")
    td = type(d)
    if td is not str and td is not _devices.DEVICE_TYPE:
        return "device keyword"  # None, an int, a wrapper: `target` reads it
    index = _cuda_of.get(d, _UNSEEN)
    if index is _UNSEEN:
        try:
            kind, index = _devices.parse(d)
        except Exception:  # noqa: BLE001 - `place` raises it, in its own words
            return "device keyword"
        if kind != "cuda":
            index = _devices.OTHER
        if len(_cuda_of) < 64:  # a program names a few devices
            _cuda_of[d] = index
    if index is _devices.OTHER:
        return "device keyword"  # the host, meta: `place` runs them
    if index is None:
        index = _session.current_device()
    if not 0 <= index < sess.count:
        return "device keyword"  # `place` raises CUDA's invalid-ordinal error
    a = sess.devices[index].allocator
    if a.total is not None or a.allowed is not None:  # check_fits asks only then
        size = _nbytes(func, args, kwargs)
        if size:
            _marks.check_fits(index, size)
    # _workers.wait(index) waits for nothing: the caller found no queued work
    kw = dict(kwargs, device="cpu")
    with _DisableTF():
        out = _ops.call(index, func, args, kw)
        # no FakeTensorMode below (no dispatch mode but the placement log): never a meta tensor
        if func in _EMPTY and type(out) is _Tensor:
            _zero(out)  # See Note [Why empty memory reads as zeros]
    s = out.untyped_storage() if type(out) is _Tensor else None
    if s is not None and getattr(s, _marks.MARK, None) is None:
        _marks.mark_one(s, index)  # mark_outputs' step for a fresh storage
    else:
        _marks.mark_outputs(out, index)
    charges = sess.charges
    if charges is not _NO_CHARGES:
        charges.factory(func, args, out, index)
    return out


def default_device() -> torch.device | None:
    """The default device if it names a simulated GPU (`torch.set_default_device("cuda")`)."""
    cur = _torch_device.CURRENT_DEVICE
    return cur if cur is not None and cur.type == "cuda" else None


_orig_context_tf = _torch_device.DeviceContext.__torch_function__


def _device_context_tf(self: Any, func: Callable, types: Any, args: tuple = (),
                       kwargs: dict | None = None) -> Any:
    """DeviceContext, when it names a simulated GPU: route instead of asking for CUDA.

    The simulation mode already routes the calls it sees; this catches the factories that
    torch's own Python code calls while that mode is busy with an outer call.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    kwargs = kwargs or {}
    if (_session.session is not None and self.device.type == "cuda"
            and func in CONSTRUCTORS and kwargs.get("device") is None):
        try:
            return place(func, args, kwargs, self.device)
        except Exception as e:  # a user's call may enter the simulation here too
            _errors.drop_own_frames(e)
            raise
        except BaseException as e:
            _errors.let_go(e)
            args = kwargs = None  # noqa: F841
            raise
    return _orig_context_tf(self, func, types, args, kwargs)


def install(p: Patcher) -> None:
    p.set(_torch_device.DeviceContext, "__torch_function__", _device_context_tf)


def pinned_factory(func: Callable, args: tuple, kwargs: dict) -> Any:
    """A factory given `pin_memory=True` (`torch.empty(n, pin_memory=True)`): its tensor in
    pinned host memory; on a GPU, CUDA's error."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    device = kwargs.get("device")
    if device is None and func in CONSTRUCTORS:
        device = default_device()
    if device is not None and _devices.target(device) is not _devices.HOST:
        raise _errors.user_error(RuntimeError("Only dense CPU tensors can be pinned"))
    kw = {k: v for k, v in kwargs.items() if k != "pin_memory"}
    if device is not None:
        kw["device"] = "cpu"
    with _DisableTF():  # decided: a host op (a default device naming a GPU would place it)
        out = _ops.call(None, func, args, kw)
    for t in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(t, torch.Tensor):
            _marks.pin(t.untyped_storage())
    return out
