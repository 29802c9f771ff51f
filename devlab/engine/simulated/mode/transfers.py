"""Moving tensors between the host and simulated GPUs: `.to`, `.cuda`, `.cpu`, `.copy_`,
`torch.as_tensor`, and the host reads (`.tolist()`, `.numpy()`) that need the values on the
host first.

Every copy runs as one `aten::_to_copy` executing on its destination (`current_index()` is
the destination GPU, or None for the host), so the placement log sees a copy from the CPU onto
the simulated device, or back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._device as _torch_device

from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import device_args as _devices
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import hazards as _hazards
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base import storage_marks as _marks
from devlab.engine.simulated.base.storage_marks import index_of, is_pinned, pin
from devlab.engine.simulated.mode import device_rule as _ops
from devlab.engine.simulated.mode.autograd import route_copy_backward

Tensor = torch.Tensor


def copy_to(t: Tensor, target: int | None, dtype: Any = None, non_blocking: bool = False,
            memory_format: Any = None) -> Tensor:
    """A fresh copy of t on simulated GPU `target` (None: the host)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    src = index_of(t)
    if src is not None:
        _workers.wait(src)
    if target is not None:
        _workers.wait(target)
    kw: dict[str, Any] = {"device": "cpu", "dtype": dtype or t.dtype, "copy": True,
                          "non_blocking": non_blocking}
    if memory_format is not None:
        kw["memory_format"] = memory_format
    out = _ops.call(target, Tensor.to, (t,), kw)
    if target is not None:
        _marks.mark_outputs(out, target)
    elif non_blocking and src is not None:
        pin(out.untyped_storage())  # as CUDA's _to_copy: a non-blocking copy to the host
        _hazards.queued_to_host(out.untyped_storage(), src, _session.current_stream(src),
                                _source_block(t))
    elif src is not None and (_hazards.armed or _hazards.tracking):
        _hazards.host_waited(src, _session.current_stream(src))  # a blocking copy waits
    sess = _session.session
    if sess is not None:
        # From pageable host memory the host waits even for a non-blocking copy (CUDA stages
        # it through a pinned buffer); from pinned memory, or to it, it does not.
        blocking = not non_blocking or (src is None and not is_pinned(t))
        # The host's side: the source if it is the host's, else the copy made (pinned when
        # the copy to the host was non-blocking, as above); pageable memory is staged.
        pinned = is_pinned(t) if src is None else target is None and non_blocking
        sess.charges.copy(src, target, t.nbytes, blocking, "aten::_to_copy", pinned)
    if out.grad_fn is not None and src != target:
        route_copy_backward(out, src, target)
    return out


def _source_block(t: Tensor) -> Any:
    """The allocator block of a GPU tensor a copy to the host reads (`hazards` checks that it
    outlives the copy)."""
    m = _marks.mark_of(t)
    return getattr(m, "block", None)


def _split_copy(args: tuple, kwargs: dict) -> tuple[tuple, dict, bool]:
    """Take `copy` out of Tensor.to's arguments (torch's _parse_to refuses it)."""
    copy = bool(kwargs.pop("copy", False)) if "copy" in kwargs else False
    bools = [i for i, a in enumerate(args) if isinstance(a, bool)]
    if len(bools) == 2:  # to(device, dtype, non_blocking, copy) / to(dtype, non_blocking, copy)
        copy = args[bools[1]]
        args = args[: bools[1]] + args[bools[1] + 1:]
    return args, kwargs, copy


def _device_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`.to()`'s and `Module.to()`'s device argument made safe for torch's `_parse_to`: a bare
    int (`.to(1)`) as `cuda:N`, which torch would read as an index on the accelerator a CPU
    build lacks; a device string checked (`_devices.parse`), as torch would wrap a large
    index round (`cuda:255` is `cuda`)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if args and not isinstance(args[0], bool) and isinstance(args[0], (int, str)):
        args = (_device(args[0]),) + args[1:]
    d = kwargs.get("device")
    if d is not None and not isinstance(d, bool) and isinstance(d, (int, str)):
        kwargs = dict(kwargs, device=_device(d))
    return args, kwargs


def _device(device: int | str) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if isinstance(device, str):
        _devices.parse(device)  # torch's own errors, and never a wrapped index
        return device
    d = _devices.DEVICE_TYPE("cuda", device)
    _devices.made(d, index=device)
    return d


def parse_to(func: Callable, args: tuple, kwargs: dict) -> Any:
    """torch._C._nn._parse_to, as Module.to calls it."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    args, kwargs = _device_args(args, kwargs)
    return _ops.call(None, func, args, kwargs)


def to(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    self = args[0]
    rest, kw_rest, copy = _split_copy(args[1:], dict(kwargs))
    other = rest[0] if rest and isinstance(rest[0], Tensor) else kw_rest.get("other")
    rest, kw_rest = _device_args(rest, kw_rest)
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*rest, **kw_rest)
    src = index_of(self)
    if isinstance(other, Tensor):
        target = index_of(other)
    elif device is None:
        target = src
    else:
        target = _devices.target(device)
        if target is _devices.OTHER:  # meta and other devices: torch's own business
            if src is not None:
                _workers.wait(src)
            return _ops.call(None, func, args, kwargs)
    if target == src and not copy:
        if src is None:  # a host or meta tensor staying where it is: torch's own conversion
            return _ops.call(None, func, args, kwargs)
        kw: dict[str, Any] = {"dtype": dtype or self.dtype, "non_blocking": non_blocking}
        if memory_format is not None:
            kw["memory_format"] = memory_format
        if src is not None:
            _workers.wait(src)  # a conversion reads the values, which may still be queued
        out = _ops.call(src, func, (self, "cpu"), kw)
        if src is not None and out is not self:
            _marks.mark_outputs(out, src)
        return out
    return copy_to(self, target, dtype, non_blocking, memory_format)


def cuda(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    self = args[0]
    device = args[1] if len(args) > 1 else kwargs.get("device")
    non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
    target = _devices.target("cuda" if device is None else device)
    if target is _devices.HOST or target is _devices.OTHER:
        raise _errors.user_error(RuntimeError("Invalid device, must be cuda device"))
    if index_of(self) == target:
        return self
    return copy_to(self, target, None, non_blocking, kwargs.get("memory_format"))


def cpu(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    self = args[0]
    if index_of(self) is None:
        return _ops.call(None, func, args, kwargs)
    return copy_to(self, None, None, False, kwargs.get("memory_format"))


def tolist(func: Callable, args: tuple, kwargs: dict) -> Any:
    # As on CUDA, the values cross to the host first: one copy the placement log can see.
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    self = args[0]
    if index_of(self) is None:
        return _ops.call(None, func, args, kwargs)
    return copy_to(self, None).tolist()


def copy_(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    dst, src = args[0], args[1] if len(args) > 1 else kwargs["src"]
    i_dst, i_src = index_of(dst), index_of(src)
    if i_src is not None:
        _workers.wait(i_src)
    if i_dst is not None:
        _workers.wait(i_dst)
    out = _ops.call(i_dst, func, args, kwargs)
    sess = _session.session
    if sess is not None and (i_dst is not None or i_src is not None):
        non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking"))
        host = src if i_src is None else dst if i_dst is None else None
        pinned = isinstance(host, Tensor) and is_pinned(host)
        sess.charges.copy(i_src, i_dst, src.nbytes if isinstance(src, Tensor) else 0,
                          not non_blocking, "aten::copy_", pinned)
        if _hazards.tracking and i_src is not None and i_src == i_dst:
            # A copy within a GPU is work on its current stream that reads src and writes dst:
            # both blocks must outlive it (the freed-while-in-use rule, as for any GPU op).
            _hazards.used_on(i_src, _session.current_stream(i_src),
                             [_source_block(src), _source_block(dst)])
        if i_dst is None and i_src is not None:
            stream = _session.current_stream(i_src)
            if non_blocking and is_pinned(dst):  # into pageable memory the host waits
                _hazards.queued_to_host(dst.untyped_storage(), i_src, stream,
                                        _source_block(src))
            elif _hazards.armed or _hazards.tracking:
                _hazards.host_waited(i_src, stream)
    return out


def numpy(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    i = index_of(args[0])
    if i is not None:
        raise _errors.numpy_of_gpu_tensor(i)
    return _ops.call(None, func, args, kwargs)


def type_(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    out = _ops.run(func, args, kwargs)
    if isinstance(out, str) and index_of(args[0]) is not None:
        return out.replace("torch.", "torch.cuda.", 1)
    return out


def pin_memory(func: Callable, args: tuple, kwargs: dict) -> Any:
    """`t.pin_memory()`: a pinned copy of a host tensor (itself if pinned already), as on CUDA.
    Pinned host memory needs an accelerator's runtime, which a CPU build of torch lacks; on a
    simulated machine the host's memory is the GPUs', so pinning is a copy with a mark."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    self = args[0]
    if index_of(self) is not None or self.layout is not torch.strided:
        raise _errors.user_error(RuntimeError(
            f"cannot pin '{self.type().replace('torch.', 'torch.cuda.', 1)}' "
            "only dense CPU tensors can be pinned"))
    if is_pinned(self):
        return self
    out = _ops.call(None, Tensor.clone, (self,), {})
    pin(out.untyped_storage())
    return out


def as_tensor(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    data = args[0] if args else kwargs.get("data", kwargs.get("obj"))
    device = kwargs.get("device")
    if device is None and _torch_device.CURRENT_DEVICE is not None:
        device = _torch_device.CURRENT_DEVICE
    if device is None:
        target = index_of(data) if isinstance(data, Tensor) else None
    else:
        target = _devices.target(device)
    if target is None or target is _devices.OTHER:
        if (target is _devices.HOST and device is not None and isinstance(data, Tensor)
                and index_of(data) is not None):
            return copy_to(data, None, kwargs.get("dtype"))
        return _ops.run(func, args, kwargs)
    kw = dict(kwargs, device="cpu")
    if isinstance(data, Tensor):
        if index_of(data) == target:
            _workers.wait(target)  # a dtype given converts, reading the values
            out = _ops.call(target, func, args, kw)
            if out is not data:
                _marks.mark_outputs(out, target)
            return out
        return copy_to(data, target, kwargs.get("dtype"))
    out = _ops.call(target, func, args, kw)
    if not isinstance(data, (list, tuple, int, float, bool, complex)):
        # numpy arrays and buffers are shared by as_tensor on the CPU; on a GPU they're copied.
        out = out.clone()
    _marks.mark_outputs(out, target)
    return out


def record_stream(func: Callable, args: tuple, kwargs: dict) -> None:
    """`t.record_stream(s)`: t's block is in use on stream s too, so the caching allocator
    does not hand it out again, once t is freed, until s's work queued by then is done
    (`CachingAllocator.record_stream`). A host tensor gets torch's own error."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    self = args[0]
    stream = args[1] if len(args) > 1 else kwargs["s"]
    m = _marks.mark_of(self)
    if m is None:
        _ops.call(None, func, args, kwargs)  # a host tensor: torch's error for the CPU
        return
    if stream.device_type != 1:  # c10's DeviceType::CUDA
        raise _errors.user_error(RuntimeError(
            f"record_stream: expected a CUDA stream, got one of {stream.device}"))
    # A wrapper (DTensor) records the blocks of the tensors it wraps.
    marks = [m] if isinstance(m, _marks.Mark) else [
        inner for t in _marks.inner_tensors(self)
        if isinstance(inner := _marks.mark_of(t), _marks.Mark)]
    sess = _session.session
    with _session.lock:
        for mk in marks:
            if mk.block is not None and sess is not None:
                sess.devices[mk.index].allocator.record_stream(mk.block, stream.stream_id)


HANDLERS: dict[Callable, Callable] = {
    Tensor.to: to,
    Tensor.cuda: cuda,
    Tensor.cpu: cpu,
    Tensor.copy_: copy_,
    Tensor.numpy: numpy,
    Tensor.__array__: numpy,
    Tensor.tolist: tolist,
    Tensor.type: type_,
    Tensor.pin_memory: pin_memory,
    Tensor.record_stream: record_stream,
    torch.as_tensor: as_tensor,
    torch.asarray: as_tensor,
    torch._C._nn._parse_to: parse_to,
}
