"""Simulated GPUs: ordinary PyTorch code behaves as on a machine with N GPUs, on the CPU.

A simulated GPU's tensor is a CPU tensor whose storage is marked with the GPU's index
(`base.storage_marks`); while the simulation runs, `Tensor.device`/`is_cuda`/`get_device` report the
mark (`mode.tensor_properties`), `torch.cuda` and `torch.accelerator` answer for the simulated GPUs
(`cuda.namespaces`), and a TorchFunctionMode on every routed thread (`mode.routing`, `mode.thread_starts`)
places each op where its tensors are (`mode.device_rule`), moves tensors (`mode.transfers`), runs backward
passes routed (`mode.autograd`) and launches heavy products asynchronously on one worker per GPU
(`mode.async_launch`, `base.gpu_workers`). Where torch asks C++ about devices, the simulation answers
(`mode.device_queries`); autocast for "cuda" casts as on a GPU (`cuda.amp`); torch.save/load keep
devices (`mode.serialization`); DataParallel works (`torch_distributed.nn_parallel`); torch.distributed
runs on gloo where a program asks for NCCL, and DDP buckets by simulated GPU (`distributed`).
Each GPU counts its bytes, with an optional limit. Values are real (computed on the CPU); speed
says nothing about a real GPU (See Note [What a simulated GPU costs]). Every change to torch goes through one undo log (`base.patcher`),
and stop() puts torch back exactly.

Limits: a thread started before the simulation is not routed (`thread_routing()` routes it;
`route_running_threads()` routes every running one, as a start from DEVLAB_SIMULATE_GPUS does;
without them, making a GPU tensor there fails with one line saying so).
Compiled code (`torch.compile`d code runs uncompiled while simulating,
`mode.compile_stance`), cuDNN, CUDA's own random streams (random ops on simulated GPUs draw from the
CPU's generators) and sparse tensors are not simulated (sparse ones are refused; a call that
needs the CUDA runtime fails with an error naming itself). Streams and events are CUDA's
(`cuda.streams`). CUDA graphs are recorded and replayed op by op (`cuda.graphs`). As on CUDA, a
child forked after the simulated GPUs were initialized may not use them (`base.fork_rule`); at most
`max_count()` GPUs (torch's device index is 8 bits).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch

from devlab._helpers.sizes import check_memory_limit
from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import fork_rule as _fork
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import hazards as _hazards
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base import torch_requirements as _requirements
from devlab.engine.simulated.base.session import current_index
from devlab.engine.simulated.base.storage_marks import index_of
from devlab.engine.simulated.mode import async_launch as _launch
from devlab.engine.simulated.mode.dispatch_devices import run as run_dispatched
from devlab.engine.simulated.torch_distributed.fork_safety.hang_report import (
    hang_timeout,
    reset_hang_timeout,
    set_hang_timeout,
)

__all__ = [
    "check_count",
    "computing",
    "current_index",
    "device_count",
    "allocations",
    "explain",
    "fresh_start",
    "leftover",
    "listen_findings",
    "observe_findings",
    "gpu_spec",
    "hang_timeout",
    "model",
    "modeled_host",
    "modeled_time",
    "topology",
    "models",
    "host_only",
    "index_of",
    "is_active",
    "is_used",
    "max_count",
    "memory_stats",
    "nvml_used",
    "reconfigure",
    "reset_hang_timeout",
    "reset_after_fork_for_rank",
    "reset_peak",
    "watch_peak",
    "run_dispatched",
    "set_hang_timeout",
    "start",
    "stop",
    "synchronize",
    "thread_routing",
    "route_running_threads",
    "settle_at_first_use",
    "asked",
    "timeline",
    "Timeline",
]

# Note [What a simulated GPU costs]
# A simulated GPU is the CPU, so its speed says nothing about a real GPU; what it costs is the
# CPU's work plus the simulation's bookkeeping around each torch call. Measured for the manual
# before issue 36's layout (`benchmarks/simulated.py`, which prints the figures now; its
# `--steps` counts instructions under callgrind, which the machine's load does not change): a
# small MLP's training step on a simulated GPU took 2.2 to 2.6 times the CPU step's time,
# depending on the CPU, and 2.17 times its instructions, 2.41 times with a modeled T4 clock;
# about 1.5 times is torch's own cost of having any function mode on the stack, which the
# simulation needs to see a call before torch runs it. The benchmark's targets (2.5 x, 3 x with
# a model) are what a change to the per-call path must keep; a modeled GPU's times come from
# the model, never from this CPU (See Note [Why the clock charges torch calls]).

_control_lock = threading.RLock()
_undo: Any = None  # the running simulation's _patcher.Patcher
_start_routing: Any = None  # the modes start() put on its thread's stacks
_start_thread: int | None = None
_MB = 1024 * 1024


@functools.cache
def max_count() -> int:
    """The most GPUs a simulation can have: one past the largest device index torch holds
    without wrapping it round (it keeps an index in a small integer, so `cuda:255` would name
    another device), as torch's own device constructor tells."""

    def addressable(index: int) -> bool:
        try:
            return torch.device("cuda", index).index == index
        except (RuntimeError, OverflowError):
            return False

    # torch's device index is a signed integer of 8 bits (today), 16, 32 or 64.
    largest = max((2 ** bits - 1 for bits in (7, 15, 31, 63) if addressable(2 ** bits - 1)),
                  default=0)
    return largest + 1


def check_count(count: object, what: str = "count") -> int:
    """`count` if it is a number of GPUs a simulation can have, else a ValueError saying what
    would be right (checked before anything is switched on)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"{what} is the number of GPUs to simulate, a whole number of at "
                         f"least 1; got {count!r}.")
    if count > max_count():
        raise ValueError(
            f"{what} {count} is more GPUs than torch can address: a torch device index is a "
            f"small integer (cuda:0 to cuda:{max_count() - 1}), so devlab simulates at most "
            f"{max_count()} GPUs.")
    return count


def _limits_bytes(count: int, memory_limits_mb: list[int | None] | None) -> list[int | None]:
    if memory_limits_mb is None:
        return [None] * count
    limits = list(memory_limits_mb)
    if len(limits) != count:
        raise ValueError(f"memory_limits_mb has {len(limits)} entries for {count} simulated GPUs")
    return [None if lim is None else lim * _MB
            for lim in (check_memory_limit(mb, "each memory limit") for mb in limits)]


def start(count: int, memory_limits_mb: list[int | None] | None = None, *,
          asynchronous: bool = True, model: Any = None, topology: Any = None) -> None:
    """Simulate `count` GPUs (one memory limit in MB per GPU; None = unlimited).

    `model` names a real GPU ("T4", "L4", "A100-40GB", "H100", ...: `models()`), or is the
    `GpuSpec` a caller resolved already (`gpu_spec`), whose public specifications the GPUs'
    modeled clock follows (see `modeled_time`, `explain`); each GPU then has that GPU's memory
    as torch reports it, and a CUDA context (a memory limit is a per-process limit on it).
    `topology` names the machine their collectives are timed in (one the GPU is sold in,
    `devlab.gpu_model.topologies`; default: its first, which `explain` names).
    Calling it again before any simulated
    tensor exists replaces the configuration. `asynchronous=False` runs every op synchronously
    on the calling thread. Refuses on a machine with real CUDA GPUs, and on a torch that lacks
    what the simulation relies on.
    """
    global _undo, _start_routing, _start_thread
    check_count(count)
    spec = gpu_spec(model) if model is not None else None
    machine = None
    if topology is not None:
        if spec is None:
            raise ValueError("a topology times a modeled GPU's collectives: give a model too")
        from devlab.engine.gpu_model.links import topology as _topology

        machine = _topology(topology, spec)  # one the GPU is not sold in fails here
    limits = _limits_bytes(count, memory_limits_mb)
    with _control_lock:
        if _session.bad_fork:  # the inherited GPUs are initialized: CUDA's rule (_fork)
            raise _errors.forked_after_init()
        if _session.session is not None:
            if _session.session.used:
                raise RuntimeError(
                    "Simulated GPUs cannot be modified after being initialized")
            stop()
        if torch.cuda.is_available():
            raise RuntimeError("real CUDA GPUs are available: devlab does not simulate GPUs "
                               "on a machine that has them")
        _requirements.check()
        # Only now: these modules reach into torch internals the check has vouched for.
        from devlab.engine.simulated.base.patcher import Patcher
        from devlab.engine.simulated.cuda import amp as _amp
        from devlab.engine.simulated.cuda import capability as _capability
        from devlab.engine.simulated.cuda import cuda_build as _build
        from devlab.engine.simulated.cuda import cufft_plans as _cufft
        from devlab.engine.simulated.cuda import graphs as _graphs
        from devlab.engine.simulated.cuda import namespaces as _namespaces
        from devlab.engine.simulated.instruments import profiler_kineto as _profiler_kineto
        from devlab.engine.simulated.mode import autograd as _autograd
        from devlab.engine.simulated.mode import compile_stance as _compile
        from devlab.engine.simulated.mode import device_queries as _queries
        from devlab.engine.simulated.mode import factories as _factories
        from devlab.engine.simulated.mode import routing as _routing
        from devlab.engine.simulated.mode import serialization as _serialization
        from devlab.engine.simulated.mode import tensor_properties as _tensor
        from devlab.engine.simulated.mode import thread_starts as _threads
        from devlab.engine.simulated.mode import transfers as _moves
        from devlab.engine.simulated.mode import wrapper_subclasses as _wrappers
        from devlab.engine.simulated.torch_distributed import c10d as _c10d
        from devlab.engine.simulated.torch_distributed import dtensor as _dtensor
        from devlab.engine.simulated.torch_distributed import fork_safety as _fork_safety
        from devlab.engine.simulated.torch_distributed import loopback_stores as _stores
        from devlab.engine.simulated.torch_distributed import nn_parallel as _parallel

        # The mode's handlers build on the mode's module, so the table is filled from here.
        _routing.fill_handlers(_moves.HANDLERS, _autograd.HANDLERS, _amp.HANDLERS,
                               _cufft.HANDLERS, _capability.HANDLERS, _launch.handlers())
        # A stop() from another thread could only disarm this thread's old modes.
        for old in torch.overrides._get_current_function_mode_stack():
            if isinstance(old, _routing.SimulationMode) and old.inert:
                _routing.remove_mode(old)
        patcher = Patcher()
        try:
            for module in (_tensor, _wrappers, _namespaces, _graphs, _build, _cufft, _queries,
                           _factories, _amp, _threads, _parallel, _serialization, _c10d, _stores,
                           _fork_safety, _dtensor, _compile, _profiler_kineto):
                module.install(patcher)
            charges = _session.NO_CHARGES
            if spec is not None:
                from devlab.engine.simulated.clock.charges import (  # only a modeled simulation loads it
                    Charges,
                    Clock,
                )

                charges = Charges(Clock(spec, count), machine)
            _session.session = _session.Session(limits, spec=spec, charges=charges)
            from devlab.engine.simulated import instruments as _instruments

            _instruments.install(patcher, count, spec.name if spec is not None else None)
            # importlib.reload(torch.cuda) executes it afresh: the changes are set again.
            from devlab.engine.simulated.base.import_patches import reapply_on_reload

            reapply_on_reload(patcher)
            _session.forget_thread_state()
            _hazards.reset()
            _fresh_marks.clear()
            routing = _routing.push_routing()
        except BaseException:
            _session.session = None
            patcher.restore()
            raise
        _undo, _start_routing, _start_thread = patcher, routing, threading.get_ident()
        _launch.enabled = asynchronous
        _session.at_first_use = None  # a new start is the program's own choice


def reconfigure(memory_limits_mb: list[int | None],
                memory_growth: list[bool] | None = None,
                physical: list[int] | None = None) -> None:
    """Replace the set of simulated GPUs (one entry per GPU: MB limit or None).

    `memory_growth` has one flag per GPU, as `devlab.config.set_memory_growth` sets them:
    True (the default for all when None) grows on demand, PyTorch's way; False reserves the
    GPU's whole limit up front, TensorFlow's default, so `memory_stats(i)["reserved"]` and
    `torch.cuda.memory_reserved(i)` read the limit. A GPU without a limit reserves nothing
    beyond what is allocated: its only capacity is the host's memory.

    `physical` says which physical GPU each one is a logical device of (default: each its
    own): with a modeled clock, logical GPUs of one physical GPU share its one queue, so
    work on them does not overlap, as on a real GPU split into logical devices.

    Allowed only before the first simulated tensor, as TensorFlow's logical devices are.
    """
    with _control_lock:
        sess = _session.session
        if sess is None:
            raise RuntimeError("GPU simulation is not running: call start() first")
        if sess.used:
            raise RuntimeError("Virtual devices cannot be modified after being initialized")
        limits = list(memory_limits_mb)
        if not limits:
            raise ValueError("at least one simulated GPU is needed")
        check_count(len(limits), "the number of logical GPUs")
        growth = None if memory_growth is None else [bool(g) for g in memory_growth]
        if growth is not None and len(growth) != len(limits):
            raise ValueError(f"memory_growth has {len(growth)} entries for {len(limits)} "
                             "simulated GPUs")
        if physical is not None and len(physical) != len(limits):
            raise ValueError(f"physical has {len(physical)} entries for {len(limits)} "
                             "simulated GPUs")
        queues = None if physical is None else [sorted(set(physical)).index(p) for p in physical]
        sess.configure(_limits_bytes(len(limits), limits), growth, queues)
        if _session.current_device() >= sess.count:
            _session.tls.device = 0


def stop() -> None:
    """Return torch to exactly its normal behaviour: every patch and mode removed.

    Call it from the thread that called start(): another thread cannot take the routing mode
    off that thread's stack, so it only disarms it (the mode passes every call through, and
    the next start() there removes it). Modes of other threads are disarmed the same way.
    """
    global _undo, _start_routing, _start_thread
    with _control_lock:
        errors: list[BaseException] = []
        try:
            _workers.shutdown()
        except BaseException as e:
            errors.append(e)
        routing = _start_routing
        if routing is not None and threading.get_ident() == _start_thread:
            from devlab.engine.simulated.mode import routing as _routing

            _routing.pop_routing(routing)
        _start_routing = _start_thread = None
        # A default device naming a simulated GPU would make every factory fail afterwards.
        cur = torch.utils._device.CURRENT_DEVICE
        if cur is not None and cur.type == "cuda":
            try:
                torch.set_default_device(None)
            except BaseException as e:
                errors.append(e)
        if _undo is not None:
            try:
                _undo.restore()
            except BaseException as e:
                errors.append(e)
            _undo = None
        _session.session = None
        _session.at_first_use = None
        _session.forget_thread_state()
        _hazards.reset()
        _fresh_marks.clear()
        _launch.enabled = False
        if errors:
            raise errors[0]


@contextlib.contextmanager
def thread_routing() -> Iterator[None]:
    """Route simulated-GPU work in the current thread, which was started before the simulation
    (every thread started while it runs is routed already)."""
    if _session.session is None:
        raise RuntimeError("GPU simulation is not running: call start() first")
    from devlab.engine.simulated.mode import routing as _routing

    with _routing.routing():
        yield


def route_running_threads() -> list[threading.Thread]:
    """Route every thread of this process running now (but daemon threads and the simulation's
    own) from its next Python call on, as threads started while simulating are: the threads it
    arranged that for. A start from DEVLAB_SIMULATE_GPUS calls it, as torch may have been
    imported first in any thread of the program (`mode.thread_starts`)."""
    if _session.session is None:
        raise RuntimeError("GPU simulation is not running: call start() first")
    from devlab.engine.simulated.mode import thread_starts as _threads

    return _threads.route_running_threads()


def settle_at_first_use(call: Any) -> None:
    """Make `call()` once, when the program first asks about the simulated GPUs (a device
    query, a device argument, the runtime's initialization), before it reads them; forgotten
    at stop() and at a new start(). How a start from the environment reads it again there."""
    _session.at_first_use = call


def asked() -> None:
    """The program asks about the simulated GPUs (devlab's own device lists do, as torch.cuda's
    device queries do): make the call `settle_at_first_use` arranged, if it is still due."""
    if _session.at_first_use is not None:
        _session.first_use()


def reset_after_fork_for_rank() -> None:
    """In a child forked from this process: use the simulated GPUs it inherited, as a spawned
    process would, although the parent had initialized them (which makes CUDA, and simulated
    GPUs, refuse a forked child: `_fork`). For devlab's own forked ranks, whose parent
    finished its queued work before forking; nothing to do without a simulation."""
    _fork.reset_for_rank()


def models() -> list[str]:
    """The real GPUs a simulation can model (`start(..., model=name)`; devlab.gpu_model)."""
    from devlab.engine.gpu_model.specs import SPECS

    return list(SPECS)


def gpu_spec(name: Any) -> Any:
    """The public specifications of the real GPU `name` models (a `GpuSpec`; case does not
    matter, and "A100" is "A100-80GB"; a `GpuSpec` is itself)."""
    from devlab.engine.gpu_model.specs import gpu

    return gpu(name)


def model() -> Any:
    """The `GpuSpec` the running simulation models (None: no model, or no simulation)."""
    sess = _session.session
    return sess.spec if sess is not None else None


def topology() -> str | None:
    """The key of the machine the modeled GPUs' collectives are timed in ("pcie3-host"; None:
    no model, or no simulation)."""
    sess = _session.session
    charges = sess.charges if sess is not None else None
    return charges.topology.key if charges is not None and charges.clock is not None else None


def modeled_time() -> float:
    """The host's modeled time in seconds since the simulation started: it advances with each
    launch, copy and host sync on the modeled GPUs, and at the wall clock's pace while the
    program is outside the simulation (its Python, sleeps, waits), never with the time this
    machine's CPU takes to compute the GPUs' values."""
    sess = _session.session
    clock = sess.charges.clock if sess is not None else None
    if clock is None:
        raise RuntimeError("no modeled GPU: start the simulation with a model, e.g. "
                           "devlab.config.simulate_gpus(2, model='T4')")
    return clock.catch_up()


@contextlib.contextmanager
def modeled_host() -> Iterator[None]:
    """Inside, the host's modeled time moves by the modeled costs alone, as with
    DEVLAB_HOST_CLOCK=modeled: the wall time the block takes (this machine's Python between
    launches) is not the host's. `devlab.timing` times modeled GPUs so, as its figures say:
    the model's, ops queued back to back, the same on every run whatever this machine's speed.
    Nothing to do without a modeled GPU."""
    sess = _session.session
    clock = sess.charges.clock if sess is not None else None
    if clock is None:
        yield
        return
    clock.hold()
    try:
        yield
    finally:
        clock.release()


@contextlib.contextmanager
def host_only() -> Iterator[None]:
    """Run host-only work as plain PyTorch runs it, without the simulation's modes on this
    thread (each adds microseconds to every op): how devlab times the CPU. Work inside must
    not touch simulated GPUs' tensors: nothing routes or marks it."""
    if _session.session is None:
        yield
        return
    from devlab.engine.simulated.mode import routing as _routing

    with _routing.suspended():
        yield


def is_active() -> bool:
    """True while GPUs are simulated."""
    return _session.session is not None


def device_count() -> int:
    """Number of simulated GPUs (0 when not simulating)."""
    sess = _session.session
    return sess.count if sess is not None else 0


def is_used() -> bool:
    """True once a simulated tensor has been created since start()."""
    sess = _session.session
    return bool(sess is not None and sess.used)


def _device(index: int) -> _session.DeviceState:
    sess = _session.session
    if sess is None:
        raise RuntimeError("GPU simulation is not running")
    if not 0 <= index < sess.count:
        raise IndexError(f"no simulated GPU {index} (there are {sess.count})")
    return sess.devices[index]


def computing(device: torch.device | int) -> bool:
    """True while simulated GPU `device` (a torch device or an index) has queued work its
    worker thread has not run yet: in wall time, whether this CPU is still computing what was
    launched on it, as `torch.cuda.current_stream().query()` tells of a real GPU's queue. (On
    a simulated GPU `query()` answers from the modeled clock instead.)"""
    index = device if isinstance(device, int) else torch.device(device).index
    if index is None:  # "cuda": the current device
        index = _session.current_device()
    _device(index)  # a GPU that exists, or the error that says which do
    return not _workers.idle(index)


def nvml_used(index: int) -> int | None:
    """What NVML (and nvidia-smi) count in use on modeled simulated GPU `index`: every process
    of this simulated machine, each one's CUDA context, reserved memory and libraries' buffers
    (None: no simulation, or a GPU with no model, which has no context)."""
    if _session.session is None:
        return None
    from devlab.engine.simulated import instruments

    return instruments.used_on(index)


def memory_stats(index: int) -> dict[str, int | None]:
    """Bytes on simulated GPU `index`: allocated now, peak since reset, limit (the memory
    limit, else the capacity of the GPU it models; None = the host's memory), and reserved:
    what CUDA's caching allocator holds, or the whole limit when the GPU reserves it up front
    (memory growth off, see `reconfigure`)."""
    dev = _device(index)
    with _session.lock:
        return {"allocated": dev.allocated, "peak": dev.peak,
                "limit": dev.limit if dev.limit is not None else dev.total,
                "reserved": dev.reserved}


def watch_peak(index: int) -> _session.PeakWatch:
    """Watch the highest allocation of simulated GPU `index` from now on (`.peak`, bytes) until
    `.close()`, without touching the peak `torch.cuda.max_memory_allocated` reads."""
    dev = _device(index)
    with _session.lock:
        return _session.PeakWatch(dev)


def reset_peak(index: int) -> None:
    """Start peak tracking of simulated GPU `index` afresh from what is allocated now."""
    dev = _device(index)
    with _session.lock:
        dev.allocator.reset_peak()


def allocations() -> int:
    """How many allocations the simulated GPUs' allocators have made or refused (out of
    memory), all GPUs together: a count that changed says work touched a GPU. Counts since
    start() or the last `torch.cuda.reset_accumulated_memory_stats`."""
    sess = _session.session
    if sess is None:
        return 0
    with _session.lock:
        return sum(s.small.allocation_total + s.large.allocation_total + s.counters["num_ooms"]
                   for s in (d.allocator.stats for d in sess.devices))


def fresh_start() -> list[int]:
    """Make the simulated GPUs as a new test expects them, without stopping the simulation
    (tensors that are still referenced stay): wait for queued work (an error it raised is
    dropped: it was the last test's), forget pending work the hazard checks knew of, give the
    allocators' cached segments back (torch.cuda.empty_cache), reset peak statistics, and
    make this thread's current device GPU 0 on its default streams. Returns the bytes still
    allocated on each GPU (what earlier code holds)."""
    sess = _session.session
    if sess is None:
        raise RuntimeError("GPU simulation is not running: call start() first")
    _workers.drain()
    try:
        _workers.wait_all()
    except Exception:  # noqa: S110 - the last test's error, reported there
        pass
    _hazards.reset()
    left = leftover()
    with _session.lock:
        marks = _fresh_marks.get(id(sess))
        now = []
        for i, dev in enumerate(sess.devices):
            # A GPU nothing allocated on, freed on or cached for since the last fresh start
            # is fresh already: its peaks are its current values and its cache is empty.
            mark = _allocator_mark(dev.allocator)
            if marks is None or i >= len(marks) or marks[i] != mark:
                dev.allocator.empty_cache()
                dev.allocator.reset_peak()
                mark = _allocator_mark(dev.allocator)
            now.append(mark)
        _fresh_marks.clear()  # one session's at a time
        _fresh_marks[id(sess)] = now
    streams = _session.current_streams()
    if streams:
        streams.clear()
    _session.tls.device = 0
    return left


# The allocators' state at the last fresh_start, per session (by id: a new session, even at
# the same address, brings new allocators whose marks differ from any kept here).
_fresh_marks: dict[int, list[tuple[int, ...]]] = {}


def _allocator_mark(allocator: Any) -> tuple[int, ...]:
    """What changes when an allocator allocates, frees, caches or gives back memory, or its
    statistics are reset: every allocation counts in a total, every free lowers the bytes
    allocated, and the cache is what is reserved beyond them."""
    stats = allocator.stats
    small, large = stats.small, stats.large
    return (id(allocator), small.allocation_total, large.allocation_total,
            small.allocated_bytes + large.allocated_bytes,
            small.reserved_bytes + large.reserved_bytes, stats.counters["num_ooms"],
            small.allocated_bytes_peak + large.allocated_bytes_peak,
            small.reserved_bytes_peak + large.reserved_bytes_peak)


def leftover() -> list[int]:
    """The bytes allocated on each simulated GPU once its queued work is done and cuBLAS's
    workspaces are released (`torch._C._cuda_clearCublasWorkspaces`, as torch's own tests do
    before they count memory): what the program's tensors still hold."""
    sess = _session.session
    if sess is None:
        raise RuntimeError("GPU simulation is not running: call start() first")
    _workers.drain()
    with _session.lock:
        for dev in sess.devices:
            if dev.queued or dev.graphs:
                dev.settle()
            dev.clear_workspace()
        return [dev.allocator.allocated for dev in sess.devices]


def listen_findings(callback: Any) -> Any:
    """Send every hazard finding (`base.hazards.Finding`: a non_blocking copy read before the
    host waited for it, a tensor freed while another stream's work uses it or its copy to the
    host reads it) to `callback`
    instead of a warning, until the returned function is called (the pytest plugin fails the
    test that made one)."""
    return _hazards.listen(callback)


def observe_findings(callback: Any) -> Any:
    """Also tell `callback` of every hazard finding, whoever else takes it (the placement log
    notes each among its lines), until the returned function is called."""
    return _hazards.observe(callback)


def synchronize(index: int | None = None) -> None:
    """Wait for queued work on simulated GPU `index` (all GPUs if None)."""
    if index is not None:
        _device(index)
    _workers.host_sync(index)
    _hazards.host_waited(index)


def explain(fn: Any) -> Any:
    """Run `fn()` on the modeled GPUs and break down each kernel and copy it made into launch,
    compute and memory time (an `Explanation`; modeled from the GPU's specifications, not
    measured). `explain(lambda: x @ x)` explains one product."""
    from devlab.engine.simulated.clock.explain import explain as _explain

    return _explain(fn)


def timeline(fn: Any) -> Any:
    """Run `fn()` on the modeled GPUs and return one step's timeline per GPU (a `Timeline`,
    modeled): kernels on each GPU's queue, collectives on its communication stream, how much
    communication compute hid, and what waited (a rank for the slowest one, compute for a
    collective). In a distributed run, return it from each rank and put the ranks' together
    with `Timeline.merge`."""
    from devlab.engine.simulated.clock.step_timeline import timeline as _timeline

    return _timeline(fn)


def __getattr__(name: str) -> Any:
    if name == "Timeline":  # imported on use: the clock's modules load torch's internals
        from devlab.engine.simulated.clock.step_timeline import Timeline

        return Timeline
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
