"""Simulated GPUs: ordinary PyTorch code behaves as on a machine with N GPUs, on the CPU.

A simulated GPU's tensor is a CPU tensor whose storage is marked with the GPU's index; while
the simulation runs, `Tensor.device`/`is_cuda`/`get_device` report the mark, `torch.cuda`
(and `torch.accelerator`) answer for the simulated GPUs, and a TorchFunctionMode routes
`device="cuda:N"`, `.to`, `.cuda`, `.cpu`, checks that an op's tensors share one device and
marks its outputs. Each GPU accounts the bytes of its storages (with CUDA's 512-byte blocks)
and can have a memory limit. Heavy matrix products run asynchronously on one worker thread
per GPU. `nn.DataParallel` and `nn.parallel.scatter/gather` work. Values are real (computed
on the CPU); speed says nothing about a real GPU.

Limits: the routing mode lives on the thread that called `start()` (torch function modes are
per-thread), so new work with `device="cuda"` is routed only in that thread, in threads that
enter `thread_routing()`, in DataLoader's pin-memory thread and in DataParallel's replicas;
reading `.device` of existing tensors works everywhere. `torch.device(0)` and
`torch.Generator(device="cuda")` are C++ constructors and still fail. CUDA graphs, NCCL,
`torch.compile` for CUDA, cuDNN, autocast to half precision and sparse tensors are not
simulated (sparse ones are refused). One stream per GPU.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch.overrides import _pop_mode, _push_mode

from . import _mode, _parallel, _patches, _state, _workers
from ._patches import SimulatedDeviceProperties
from ._state import current_index, index_of

__all__ = [
    "SimulatedDeviceProperties",
    "current_index",
    "device_count",
    "index_of",
    "is_active",
    "is_used",
    "memory_stats",
    "reconfigure",
    "reset_peak",
    "start",
    "stop",
    "synchronize",
    "thread_routing",
]

_control_lock = threading.RLock()
_patcher: _patches.Patcher | None = None
_mode_instance: _mode.SimulationMode | None = None
_mode_thread: int | None = None
_MB = 1024 * 1024


def _limits_bytes(count: int, memory_limits_mb: list[int | None] | None) -> list[int | None]:
    if memory_limits_mb is None:
        return [None] * count
    limits = list(memory_limits_mb)
    if len(limits) != count:
        raise ValueError(f"memory_limits_mb has {len(limits)} entries for {count} simulated GPUs")
    out: list[int | None] = []
    for lim in limits:
        if lim is not None and lim <= 0:
            raise ValueError(f"memory limit must be a positive number of MB, got {lim}")
        out.append(None if lim is None else int(lim * _MB))
    return out


def start(count: int, memory_limits_mb: list[int | None] | None = None, *,
          asynchronous: bool = True) -> None:
    """Simulate `count` GPUs (one memory limit in MB per GPU; None = unlimited).

    Calling it again before any simulated tensor exists replaces the configuration.
    `asynchronous=False` runs every op synchronously on the calling thread.
    """
    global _patcher, _mode_instance, _mode_thread
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive integer, got {count!r}")
    limits = _limits_bytes(count, memory_limits_mb)
    with _control_lock:
        if _state.session is not None:
            if _state.session.used:
                raise RuntimeError(
                    "Simulated GPUs cannot be modified after being initialized")
            stop()
        if torch.cuda.is_available():
            raise RuntimeError("real CUDA GPUs are available: devlab does not simulate GPUs "
                               "on a machine that has them")
        # A stop() from another thread could only make this thread's old mode inert.
        for old in torch.overrides._get_current_function_mode_stack():
            if isinstance(old, _mode.SimulationMode) and old.inert:
                _remove_mode(old)
        patcher = _patches.Patcher()
        mode = _mode.SimulationMode()
        try:
            _patches.patch_tensor(patcher)
            _patches.patch_cuda(patcher)
            _patches.patch_device_context(patcher)
            _patches.patch_threads(patcher)
            _parallel.patch_parallel(patcher)
            _patches.register_serialization()
            _state.session = _state.Session(limits)
            _state.tls.device = 0
            _push_mode(mode)
        except BaseException:
            _state.session = None
            _patches.unregister_serialization()
            patcher.restore()
            raise
        _patcher, _mode_instance, _mode_thread = patcher, mode, threading.get_ident()
        _mode.active_mode = mode
        _mode.set_asynchronous(asynchronous)


def reconfigure(memory_limits_mb: list[int | None],
                memory_growth: list[bool] | None = None) -> None:
    """Replace the set of simulated GPUs (one entry per GPU: MB limit or None).

    `memory_growth` has one flag per GPU, as `devlab.config.set_memory_growth` sets them:
    True (the default for all when None) grows on demand, PyTorch's way; False reserves the
    GPU's whole limit up front, TensorFlow's default, so `memory_stats(i)["reserved"]` and
    `torch.cuda.memory_reserved(i)` read the limit. A GPU without a limit reserves nothing
    beyond what is allocated: its only capacity is the host's memory.

    Allowed only before the first simulated tensor, as TensorFlow's logical devices are.
    """
    with _control_lock:
        sess = _state.session
        if sess is None:
            raise RuntimeError("GPU simulation is not running: call start() first")
        if sess.used:
            raise RuntimeError("Virtual devices cannot be modified after being initialized")
        limits = list(memory_limits_mb)
        if not limits:
            raise ValueError("at least one simulated GPU is needed")
        growth = None if memory_growth is None else [bool(g) for g in memory_growth]
        if growth is not None and len(growth) != len(limits):
            raise ValueError(f"memory_growth has {len(growth)} entries for {len(limits)} "
                             "simulated GPUs")
        new = _state.Session(_limits_bytes(len(limits), limits), growth)
        _state.session = new
        if _mode.current_device() >= new.count:
            _state.tls.device = 0


def _remove_mode(mode: _mode.SimulationMode) -> bool:
    """Take `mode` off this thread's torch function mode stack, keeping the others in order."""
    above = []
    found = False
    while torch._C._len_torch_function_stack():
        m = _pop_mode()
        if m is mode:
            found = True
            break
        above.append(m)
    for m in reversed(above):
        _push_mode(m)
    return found


def stop() -> None:
    """Return torch to exactly its normal behaviour: every patch and mode removed.

    Call it from the thread that called start(): another thread cannot take the routing mode
    off that thread's stack, so it only disarms it (it passes every call through unchanged
    until the next start() there removes it).
    """
    global _patcher, _mode_instance, _mode_thread
    with _control_lock:
        errors: list[BaseException] = []
        try:
            _workers.shutdown()
        except BaseException as e:
            errors.append(e)
        mode = _mode_instance
        if mode is not None:
            mode.inert = True
            if threading.get_ident() == _mode_thread:
                _remove_mode(mode)
        _mode_instance = _mode_thread = None
        _mode.active_mode = None
        # A default device naming a simulated GPU would make every factory fail afterwards.
        cur = torch.utils._device.CURRENT_DEVICE
        if cur is not None and cur.type == "cuda":
            try:
                torch.set_default_device(None)
            except BaseException as e:
                errors.append(e)
        _patches.unregister_serialization()
        if _patcher is not None:
            try:
                _patcher.restore()
            except BaseException as e:
                errors.append(e)
            _patcher = None
        _state.session = None
        _state.tls.__dict__.pop("device", None)
        _state.tls.__dict__.pop("index", None)
        _mode.set_asynchronous(False)
        if errors:
            raise errors[0]


@contextlib.contextmanager
def thread_routing() -> Iterator[None]:
    """Route simulated-GPU work in the current thread too (modes are per-thread).

    `start()` puts the routing mode on the thread that called it; another thread of yours
    that creates tensors with `device="cuda:N"` runs its work inside this block.
    """
    if _state.session is None:
        raise RuntimeError("GPU simulation is not running: call start() first")
    with _mode.SimulationMode():
        yield


def is_active() -> bool:
    """True while GPUs are simulated."""
    return _state.session is not None


def device_count() -> int:
    """Number of simulated GPUs (0 when not simulating)."""
    sess = _state.session
    return sess.count if sess is not None else 0


def is_used() -> bool:
    """True once a simulated tensor has been created since start()."""
    sess = _state.session
    return bool(sess is not None and sess.used)


def _device(index: int) -> _state.DeviceState:
    sess = _state.session
    if sess is None:
        raise RuntimeError("GPU simulation is not running")
    if not 0 <= index < sess.count:
        raise IndexError(f"no simulated GPU {index} (there are {sess.count})")
    return sess.devices[index]


def memory_stats(index: int) -> dict[str, int | None]:
    """Bytes on simulated GPU `index`: allocated now, peak since reset, limit (None = none),
    and reserved: what is allocated, or the whole limit when the GPU reserves it up front
    (memory growth off, see `reconfigure`)."""
    dev = _device(index)
    with _state.lock:
        return {"allocated": dev.allocated, "peak": dev.peak, "limit": dev.limit,
                "reserved": dev.reserved}


def reset_peak(index: int) -> None:
    """Start peak tracking of simulated GPU `index` afresh from what is allocated now."""
    dev = _device(index)
    with _state.lock:
        dev.peak = dev.allocated


def synchronize(index: int | None = None) -> None:
    """Wait for queued work on simulated GPU `index` (all GPUs if None)."""
    if index is None:
        _workers.wait_all()
    else:
        _device(index)
        _workers.wait(index)
