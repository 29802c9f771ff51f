"""CUDA's memory API as a program sees it, over each simulated GPU's caching allocator
(`devlab.engine.gpu_model.caching_allocator`): torch.cuda's memory functions, and the `torch._C` entry points
torch's own Python code calls (`memory_summary`'s table, `memory_snapshot`,
`torch.cuda.memory._record_memory_history`, `_snapshot` and `_dump_snapshot`), so those run
unchanged and read what a GPU's allocator would report; and memory pools: `torch.cuda.MemPool`
(a private pool of the allocator's, `PrivatePool`) and the entry points torch's own
`use_mem_pool` calls (`_cuda_beginAllocateCurrentThreadToPool`, `_cuda_endAllocateToPool`,
`_cuda_releasePool`)."""

from __future__ import annotations

import collections
import itertools
import sys
import threading
from types import FrameType
from typing import Any

import torch

from devlab.engine.gpu_model.caching_allocator import OutOfMemory, PoolError
from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import device_args as _devices
from devlab.engine.simulated.base import fork_rule as _fork
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.cuda_errors import entry
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.base.session import DeviceState


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
        if dev.queued or dev.graphs:
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
            if dev.queued or dev.graphs:
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
    """`torch._C._cuda_memorySnapshot`: every GPU's segments and recorded traces; with a pool
    id (`(first, second, include_traces)`, as `memory_snapshot(mempool_id)` passes it) that
    pool's segments only."""
    include_traces = not (isinstance(arg, tuple) and len(arg) > 2 and not arg[2])
    pool_id = (int(arg[0]), int(arg[1])) if isinstance(arg, tuple) and len(arg) > 1 else (0, 0)
    segments: list[dict[str, Any]] = []
    traces: list[list[dict[str, Any]]] = []
    for dev in _devices_all():
        with _session.lock:
            if dev.queued or dev.graphs:
                dev.settle()
            segments.extend(dev.allocator.snapshot(pool_id))
            traces.append(dev.allocator.trace() if include_traces else [])
    return {"segments": segments, "device_traces": traces}


# -- memory pools --------------------------------------------------------------------------------

# c10::generate_mempool_id's two counters: ids made by the user (graph_pool_handle, MemPool)
# set the second number, a CUDA graph's own pool the first.
_user_pool_ids = itertools.count(1)
_graph_pool_ids = itertools.count(1)


def new_pool_id(user_created: bool) -> tuple[int, int]:
    """A fresh memory-pool id, as `c10::generate_mempool_id` makes it."""
    return (0, next(_user_pool_ids)) if user_created else (next(_graph_pool_ids), 0)


def pool_id_of(pool: Any) -> tuple[int, int]:
    """A memory-pool id argument (a pair of ints, or a MemPool) as a pair, or a TypeError
    naming what it takes."""
    if isinstance(pool, MemPool):
        return pool.id
    try:
        a, b = pool
        if isinstance(a, int) and isinstance(b, int):
            return (a, b)
    except (TypeError, ValueError):
        pass
    raise _errors.user_error(TypeError(
        "a memory pool is given by its id, a pair of ints (from CUDAGraph.pool(), "
        f"torch.cuda.graph_pool_handle() or MemPool.id), not {pool!r}"))


def _pool_call(index: int, call: str, *args: Any) -> Any:
    """Call the allocator's private-pool method on simulated GPU `index`, torch's
    RuntimeError for what it refuses."""
    dev = _gpu(index)
    with _session.lock:
        try:
            return getattr(dev.allocator, call)(*args)
        except PoolError as e:
            raise _errors.user_error(RuntimeError(str(e))) from None


class MemPool:
    """torch.cuda.MemPool on simulated GPUs: a private pool of the current GPU's caching
    allocator (`c10::cuda::MemPool`: made with one use, `createOrIncrefPool`; released and its
    unused segments freed when it goes, `releasePool` then `emptyCache(id)`).

    `allocator=` (a CUDAPluggableAllocator) and `use_on_oom=True` are devlab's own error: the
    simulated allocator is CUDA's native one, and its out-of-memory fallback to pools is not
    modeled."""

    @entry
    def __init__(self, allocator: Any = None, use_on_oom: bool = False,
                 no_split: bool = False) -> None:
        if allocator is not None:
            raise _errors.not_simulated(
                "a MemPool with an allocator of its own (torch.cuda.memory."
                "CUDAPluggableAllocator)", "use torch.cuda.MemPool() with the caching allocator")
        if use_on_oom:
            raise _errors.not_simulated(
                "MemPool(use_on_oom=True) (the allocator's fallback to a pool when it runs out "
                "of memory)", "leave use_on_oom=False")
        _fork.initialize()
        index = _session.current_device()
        self._released = True  # until the pool exists: __del__ then has nothing to give back
        self._device = index
        self._session = _session.session
        self._id = new_pool_id(True)
        pp = _pool_call(index, "create_or_incref_pool", self._id)
        pp.no_split = bool(no_split)
        self._released = False

    @property
    def id(self) -> tuple[int, int]:
        """The pool's id, a pair of ints (user-made: the first is 0)."""
        return self._id

    @property
    def allocator(self) -> None:
        """The pool's own allocator: none (the caching allocator's)."""
        return None

    @entry
    def use_count(self) -> int:
        """How many uses the pool has: the MemPool, each `use_mem_pool` block under way, each
        CUDA graph captured into it (`getPoolUseCount`)."""
        return int(_pool_call(self._device, "pool_use_count", self._id))

    def snapshot(self, include_traces: bool = True) -> list[dict[str, Any]]:
        """The pool's segments, as `torch.cuda.memory_snapshot(self.id)` gives them."""
        return torch.cuda.memory_snapshot(self.id, include_traces=include_traces)

    def __del__(self) -> None:
        # MemPool::~MemPool: releasePool, then emptyCache(id).
        try:
            if self._released or self._session is not _session.session:
                return
            self._released = True
            dev = _gpu(self._device)
            with _session.lock:
                dev.allocator.release_pool(self._id)
                dev.allocator.empty_cache(self._id)
        except Exception:  # noqa: S110 - at interpreter exit torch or devlab may be gone
            pass

    def __repr__(self) -> str:
        return f"<simulated torch.cuda.MemPool {self._id} on cuda:{self._device}>"


@entry
def begin_allocate_current_thread_to_pool(device: int, mempool_id: Any) -> None:
    """`torch._C._cuda_beginAllocateCurrentThreadToPool`: this thread's requests on the GPU go
    to the pool (one more use of it)."""
    thread = threading.get_ident()
    _pool_call(_devices.cuda_index(device), "begin_allocate_to_pool", pool_id_of(mempool_id),
               lambda _stream: threading.get_ident() == thread)


@entry
def end_allocate_to_pool(device: int, mempool_id: Any) -> None:
    """`torch._C._cuda_endAllocateToPool`."""
    _pool_call(_devices.cuda_index(device), "end_allocate_to_pool", pool_id_of(mempool_id))


@entry
def release_pool(device: int, mempool_id: Any) -> None:
    """`torch._C._cuda_releasePool`: one use fewer of the pool."""
    _pool_call(_devices.cuda_index(device), "release_pool", pool_id_of(mempool_id))


_POOL_FUNCS = {
    "_cuda_beginAllocateCurrentThreadToPool": begin_allocate_current_thread_to_pool,
    "_cuda_endAllocateToPool": end_allocate_to_pool,
    "_cuda_releasePool": release_pool,
}


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


class CUDAPluggableAllocator:
    """torch.cuda.memory.CUDAPluggableAllocator on simulated GPUs: devlab's own error. Its
    `.so` calls cudaMalloc/cudaFree, and a simulated GPU's memory is the host's, kept by the
    caching allocator model: there is no CUDA allocator to load or swap in."""

    @entry
    def __init__(self, path_to_so_file: str, alloc_fn_name: str, free_fn_name: str) -> None:
        raise _errors.not_simulated(
            "torch.cuda.memory.CUDAPluggableAllocator (an allocator compiled to call cudaMalloc, "
            "swapped in with torch.cuda.memory.change_current_allocator)",
            "a simulated GPU has no CUDA allocator to replace: its memory is kept by the model "
            "of PyTorch's caching allocator, which torch.cuda.memory_stats() reads")


@entry
def change_current_allocator(allocator: Any) -> None:
    """torch.cuda.memory.change_current_allocator: torch's own error once the allocator is
    initialized (as CUDA's is at CUDA's initialization), else devlab's own."""
    sess = _session.session
    if sess is not None and (sess.initialized or sess.used):
        raise _errors.user_error(RuntimeError("Can't swap an already initialized allocator"))
    raise _errors.not_simulated(
        "torch.cuda.memory.change_current_allocator (swapping in a CUDAPluggableAllocator)",
        "a simulated GPU has no CUDA allocator to replace: its memory is kept by the model "
        "of PyTorch's caching allocator, which torch.cuda.memory_stats() reads")


def install(p: Patcher) -> None:
    """Put the allocator's entry points where torch's Python code calls them (torch.cuda.memory
    bound the pool ones, and MemPool's base class, when it was imported)."""
    import torch.cuda.memory as torch_memory

    for name, fn in _C_FUNCS.items():
        p.set(torch._C, name, fn)
    for name, fn in _POOL_FUNCS.items():
        p.set(torch._C, name, fn)
        p.set(torch_memory, name, fn)
    p.set(torch_memory, "MemPool", MemPool)
    p.set(torch.cuda, "MemPool", MemPool)
    for module in (torch_memory, torch.cuda):
        p.set(module, "CUDAPluggableAllocator", CUDAPluggableAllocator)
        p.set(module, "change_current_allocator", change_current_allocator)
