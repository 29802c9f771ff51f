"""CUDA's memory API as a program sees it, over each simulated GPU's caching allocator
(`devlab.gpu_model.allocator`): torch.cuda's memory functions, and the `torch._C` entry points
torch's own Python code calls (`memory_summary`'s table, `memory_snapshot`,
`torch.cuda.memory._record_memory_history`, `_snapshot` and `_dump_snapshot`), so those run
unchanged and read what a GPU's allocator would report."""

from __future__ import annotations

import collections
import sys
from types import FrameType
from typing import Any

import torch

from devlab.gpu_model.allocator import OutOfMemory

from ..core import devices as _devices
from ..core import errors as _errors
from ..core import fork as _fork
from ..core import session as _session
from ..core.errors import entry
from ..core.patcher import Patcher
from ..core.session import DeviceState


def _gpu(device: Any = None) -> DeviceState:
    """The simulated GPU a torch.cuda device argument names (torch.cuda's errors)."""
    index = _devices.cuda_index(device)
    return _session.session.devices[index]  # type: ignore[union-attr]  # cuda_index checked


def _devices_all() -> list[DeviceState]:
    sess = _session.session
    return [] if sess is None else sess.devices


def total_memory(index: int) -> int:
    """A simulated GPU's capacity as torch reports it: the real GPU's it models, else its
    limit, else the host's memory."""
    total = _gpu(index).total
    if total is not None:
        return total
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # psutil is a dependency; still, capacity is only informative
        return 0


@entry
def memory_allocated(device: Any = None) -> int:
    return _gpu(device).allocated


@entry
def max_memory_allocated(device: Any = None) -> int:
    return _gpu(device).peak


@entry
def memory_reserved(device: Any = None) -> int:
    """The bytes the allocator holds in segments."""
    return _gpu(device).reserved


@entry
def max_memory_reserved(device: Any = None) -> int:
    return _gpu(device).peak_reserved


@entry
def reset_peak_memory_stats(device: Any = None) -> None:
    dev = _gpu(device)
    with _session.lock:
        dev.allocator.reset_peak()


@entry
def reset_accumulated_memory_stats(device: Any = None) -> None:
    dev = _gpu(device)
    with _session.lock:
        dev.allocator.reset_accumulated()


def nested_stats(device: Any = None) -> dict[str, Any]:
    """`torch._C._cuda_memoryStats`: the allocator's statistics, nested as CUDA's."""
    dev = _gpu(device)
    with _session.lock:
        if dev.queued:
            dev.settle()
        return dev.allocator.memory_stats()


@entry
def memory_stats(device: Any = None) -> dict[str, Any]:
    """torch.cuda.memory_stats: the statistics flattened to dotted keys, sorted, as torch
    flattens `_cuda_memoryStats`."""
    flat: list[tuple[str, Any]] = []

    def add(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                add(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat.append((prefix, obj))

    add("", nested_stats(device))
    return collections.OrderedDict(sorted(flat))


@entry
def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes, as cudaMemGetInfo: the capacity less the CUDA context (asking
    makes one, as on a GPU) and what the allocator holds."""
    _fork.initialize()
    i = _devices.cuda_index(device)
    dev = _gpu(i)
    with _session.lock:
        dev.open()
        free = dev.free_memory()
    total = total_memory(i)
    return (max(0, total - dev.reserved) if free is None else free, total)


@entry
def empty_cache() -> None:
    """Release every cached segment with nothing allocated in it, on every GPU."""
    for dev in _devices_all():
        with _session.lock:
            if dev.queued:
                dev.settle()
            dev.allocator.empty_cache()


@entry
def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """Bytes from the GPU's caching allocator for another framework: the block's address."""
    if not isinstance(size, int) or size < 0:
        raise TypeError(f"caching_allocator_alloc: size is a number of bytes (an int >= 0), "
                        f"not {size!r}")
    _fork.initialize()
    dev = _gpu(device)
    with _session.lock:
        dev.open()
        # On the stream given (a stream object, or its id), else the current one.
        sid = (getattr(stream, "stream_id", stream) if stream is not None
               else _session.current_stream(dev.index))
        got = dev.allocator.allocate(size, int(sid))
        if not isinstance(got, OutOfMemory):
            dev.raw[got.address] = got
    if isinstance(got, OutOfMemory):
        raise _errors.out_of_memory(dev, got)
    return got.address


@entry
def caching_allocator_delete(mem_ptr: int) -> None:
    """Give back what `caching_allocator_alloc` returned (CUDA's error for any other pointer)."""
    for dev in _devices_all():
        with _session.lock:
            block = dev.raw.pop(mem_ptr, None)
            if block is not None:
                dev.allocator.free(block)
                return
    raise _errors.user_error(RuntimeError(f"invalid device pointer: {mem_ptr:#x}"))


# -- torch._C's allocator entry points ----------------------------------------------------------


def _frames() -> list[dict[str, Any]]:
    """The Python stack at an allocation, innermost first, as torch records it."""
    out = []
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        out.append({"filename": f.f_code.co_filename, "line": f.f_lineno,
                    "name": f.f_code.co_name})
        f = f.f_back
    return out


def record_memory_history(*args: Any, **kwargs: Any) -> None:
    """`torch._C._cuda_record_memory_history`, for every simulated GPU (Python frames only:
    a simulated GPU's allocations are made by Python code). Its arguments by position, as each
    torch version passes them: enabled, context, stacks, max_entries, clear_history, then
    flags this model has no use for, and (torch 2.13 on) the list of actions to skip."""
    enabled = args[0] if args else kwargs.get("enabled", "all")
    context = args[1] if len(args) > 1 else kwargs.get("context", "all")
    max_entries = args[3] if len(args) > 3 else kwargs.get("max_entries", sys.maxsize)
    clear_history = bool(args[4]) if len(args) > 4 else bool(kwargs.get("clear_history"))
    skip = kwargs.get("skip_actions") or next(
        (a for a in args[7:] if isinstance(a, (list, tuple))), [])
    for dev in _devices_all():
        with _session.lock:
            dev.allocator.record_history(enabled, context, max_entries,
                                         _frames if context else None, clear_history,
                                         list(skip))


def record_memory_history_legacy(enabled: bool, record_context: bool = True,
                                 trace_alloc_max_entries: int = 1,
                                 trace_alloc_record_context: bool = False,
                                 *args: Any) -> None:
    """The boolean form of `_record_memory_history` (`_cuda_record_memory_history_legacy`)."""
    record_memory_history("all" if enabled else None,
                          "all" if enabled and record_context else None,
                          max_entries=max(1, trace_alloc_max_entries)
                          if trace_alloc_record_context else sys.maxsize)


def memory_snapshot(arg: Any = None) -> dict[str, Any]:
    """`torch._C._cuda_memorySnapshot`: every GPU's segments and recorded traces."""
    include_traces = not (isinstance(arg, tuple) and len(arg) > 2 and not arg[2])
    segments: list[dict[str, Any]] = []
    traces: list[list[dict[str, Any]]] = []
    for dev in _devices_all():
        with _session.lock:
            if dev.queued:
                dev.settle()
            segments.extend(dev.allocator.snapshot())
            traces.append(dev.allocator.trace() if include_traces else [])
    return {"segments": segments, "device_traces": traces}


def reset_peak_c(device: Any = None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_c(device: Any = None) -> None:
    reset_accumulated_memory_stats(device)


def clear_cublas_workspaces() -> None:
    """`torch._C._cuda_clearCublasWorkspaces`: cuBLAS's workspaces go back to the allocator."""
    for dev in _devices_all():
        with _session.lock:
            dev.clear_workspace()


_C_FUNCS = {
    "_cuda_clearCublasWorkspaces": clear_cublas_workspaces,
    "_cuda_memoryStats": nested_stats,
    "_cuda_memorySnapshot": memory_snapshot,
    "_cuda_record_memory_history": record_memory_history,
    "_cuda_record_memory_history_legacy": record_memory_history_legacy,
    "_cuda_resetPeakMemoryStats": reset_peak_c,
    "_cuda_resetAccumulatedMemoryStats": reset_accumulated_c,
    "_cuda_emptyCache": empty_cache,
}

# torch.cuda's memory functions (torch.cuda.memory_summary stays torch's own: it formats what
# memory_stats returns into CUDA's table).
CUDA_FUNCS = {
    "memory_allocated": memory_allocated,
    "max_memory_allocated": max_memory_allocated,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "reset_max_memory_allocated": reset_peak_memory_stats,
    "memory_reserved": memory_reserved,
    "max_memory_reserved": max_memory_reserved,
    "memory_stats": memory_stats,
    "memory_stats_as_nested_dict": entry(nested_stats),
    "mem_get_info": mem_get_info,
    "empty_cache": empty_cache,
    "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
    "caching_allocator_alloc": caching_allocator_alloc,
    "caching_allocator_delete": caching_allocator_delete,
}


def install(p: Patcher) -> None:
    """Put the allocator's entry points where torch's Python code calls them."""
    for name, fn in _C_FUNCS.items():
        p.set(torch._C, name, fn)
