"""The running simulation: its GPUs with their byte counts, and each thread's device state."""

from __future__ import annotations

import functools
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from devlab.engine.gpu_model import capacity
from devlab.engine.gpu_model.caching_allocator import (
    AllocatorConfig,
    Block,
    CachingAllocator,
    OutOfMemory,
)
from devlab.engine.gpu_model.specs import GpuSpec


class DeviceState:
    """The memory of one simulated GPU: CUDA's caching allocator (`devlab.engine.gpu_model.caching_allocator`)
    over the GPU's capacity. Bytes throughout.

    `limit` is the user's memory limit (TensorFlow's `memory_limit`; None: none). A GPU modeled
    on a real one (`spec`) has that GPU's capacity as torch reports it and a CUDA context, held
    from the GPU's first use; a limit on it is a per-process limit, as
    `set_per_process_memory_fraction` sets on a real GPU. A GPU with no model has its limit as
    its capacity, or the host's memory when unlimited, and no context.

    `reserve_up_front` is memory growth off: at its first use the GPU reserves nine tenths of
    its free memory in the allocator (one cached segment), as devlab does on a real GPU to map
    its memory up front as TensorFlow does by default (`devlab.config`).

    `queued` lists, for each op queued on this GPU's worker (`_workers`), the marks of the
    storages it holds its own tensors on, one per tensor; `settle` frees the blocks only those
    still use (See Note [Why queued work's storages are uncounted]).
    """

    # Note [Why queued work's storages are uncounted]
    # CUDA's caching allocator is stream-ordered: a tensor the user lets go of frees its block
    # at once, though a kernel queued on the stream still reads or writes it (the block is
    # reused only by work queued after). A simulated GPU's queued product (`mode/async_launch.py`)
    # holds tensors of its own on the user's storages, never the user's tensors, so a storage
    # used by nothing but queued work is one the user let go of: `settle` frees its block,
    # counting the storage's uses against the queued work's. A worker takes its op out of
    # `queued` before the op's tensors go (`base/gpu_workers.py`), so the count never takes a
    # storage for queued work's alone while the user still holds it.

    __slots__ = ("allocator", "context", "graphs", "index", "limit", "opened", "outside",
                 "queued", "raw",
                 "reserve_up_front", "torch_device", "watches", "workspace", "workspace_bytes",
                 "backward_workspace")

    def __init__(self, index: int, limit: int | None, reserve_up_front: bool = False,
                 spec: GpuSpec | None = None, config: AllocatorConfig | None = None) -> None:
        self.index = index
        self.limit = limit
        self.reserve_up_front = reserve_up_front
        if spec is not None:
            total: int | None = capacity.total_memory(spec)
            allowed = limit
            self.context = capacity.context_bytes(spec)
        else:
            total, allowed, self.context = limit, None, 0
        self.allocator = CachingAllocator(index, total, 0, allowed, config)
        self.opened = False
        # Device memory libraries hold outside the caching allocator (NCCL's buffers), by
        # owner: charged to free memory as the CUDA context is (`hold_outside`).
        self.outside: dict[int, int] = {}
        # cuBLAS's workspaces: torch keeps one per (cuBLAS handle, stream), allocated at the
        # handle's first matrix product and kept until torch._C._cuda_clearCublasWorkspaces()
        # (`take_workspace`). The host's threads' handle takes `workspace`; autograd's engine
        # runs a GPU's backward on a device thread of its own, with its own handle, whose
        # products take `backward_workspace`: a training step holds both.
        self.workspace: Block | None = None
        self.backward_workspace: Block | None = None
        self.raw: dict[int, Block] = {}  # torch.cuda.caching_allocator_alloc's, by address
        self.workspace_bytes = capacity.cublas_workspace_bytes(
            spec, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
        self.queued: dict[int, list] = {}  # id(op) -> marks, one per tensor the op holds
        # devlab's own watches (%%memwatch): each keeps its peak apart from `peak`, which
        # torch.cuda.max_memory_allocated reads and only the user resets.
        self.watches: list[PeakWatch] = []
        # What CUDA graphs captured on this GPU keep alive (cuda/graphs.py `_Hold`): `settle`
        # gives back to their private pools the blocks only a graph still uses.
        self.graphs: list[Any] = []
        self.torch_device = torch.device("cuda", index)

    @property
    def allocated(self) -> int:
        """Bytes allocated now: the blocks the user's tensors hold."""
        if self.queued or self.graphs:
            with lock:
                self.settle()
        return self.allocator.allocated

    @property
    def peak(self) -> int:
        """The highest allocation since the user last reset it (max_memory_allocated)."""
        return self.allocator.peak_allocated

    @property
    def total(self) -> int | None:
        """The capacity torch reports (None: the host's memory)."""
        return self.allocator.total

    def open(self) -> None:
        """The GPU's first use (the caller holds the lock): its CUDA context takes its share of
        the memory, and with memory growth off the allocator reserves most of the rest."""
        if self.opened:
            return
        self.opened = True
        a = self.allocator
        a.context = self.context
        free = a.free_memory() if a.total is not None else None
        if self.reserve_up_front and free:
            room = free if a.allowed is None else min(free, a.allowed)
            a.free(a.malloc(int(room * 0.9)))
            a.reset_peak()  # what the program allocates starts here

    def hold_outside(self, owner: int, nbytes: int) -> bool:
        """A library's own cudaMalloc of `nbytes` for `owner` (an id), outside torch's caching
        allocator: memory_allocated() does not show it, mem_get_info() and NVML do (the caller
        holds the lock). False where it does not fit in the GPU's free memory (nothing held)."""
        if not self.opened:
            self.open()
        a = self.allocator
        if a.total is not None and nbytes > a.free_memory():
            return False
        self.outside[owner] = self.outside.get(owner, 0) + nbytes
        a.context += nbytes
        return True

    def release_outside(self, owner: int) -> None:
        """What `owner` held outside the allocator is freed (the caller holds the lock)."""
        self.allocator.context -= self.outside.pop(owner, 0)

    def take_workspace(self, backward: bool = False) -> OutOfMemory | None:
        """The first matrix product on this GPU of the host's handle (`backward`: of autograd's
        device thread's): cuBLAS's workspace for that handle is allocated (the caller holds
        the lock); the allocator's out-of-memory where it does not fit."""
        have = self.backward_workspace if backward else self.workspace
        if have is not None or not self.workspace_bytes:
            return None
        if not self.opened:
            self.open()
        got = self.allocator.allocate(self.workspace_bytes)
        if isinstance(got, OutOfMemory):
            return got
        if backward:
            self.backward_workspace = got
        else:
            self.workspace = got
        return None

    def clear_workspace(self) -> None:
        """torch._C._cuda_clearCublasWorkspaces: every handle's (the caller holds the lock)."""
        for block in (self.workspace, self.backward_workspace):
            if block is not None:
                self.allocator.free(block)
        self.workspace = self.backward_workspace = None

    def _held(self) -> Any:
        """Each mark queued work holds, with how many of its tensors hold it."""
        held: dict[int, list] = {}
        for marks in list(self.queued.values()):
            for m in marks:
                entry = held.get(id(m))
                if entry is None:
                    held[id(m)] = [m, 1]
                else:
                    entry[1] += 1
        return held.values()

    def settle(self) -> None:
        """Free the blocks of storages only queued work, or a CUDA graph, still uses (the
        caller holds the lock; See Note [Why queued work's storages are uncounted])."""
        for hold in self.graphs:
            hold.settle()
        for m, n in self._held():
            s = m()
            if (s is not None and m.block is not None
                    and _use_count(s._cdata) == 1 + n  # type: ignore[misc]
                    and sys.getrefcount(s) <= _BARE_REFS):
                # Nothing but its Python object (1) and the queued work's tensors use it.
                self.allocator.free(m.block)
                m.block = None

    def donor(self, nbytes: int) -> torch.UntypedStorage | None:
        """A storage of `nbytes` bytes that an asynchronous launch made (`DONOR` set), that
        only queued work still uses and that no later launch took yet: it is marked taken and
        returned, for the next output of its size to take its memory once that work is done
        (the caller holds the lock; See Note [A queued output takes a dropped one's memory]
        in mode/async_launch.py)."""
        for m, n in self._held():
            s = m()
            if (s is not None and getattr(s, DONOR, False) and s.nbytes() == nbytes
                    and _use_count(s._cdata) == 1 + n  # type: ignore[misc]
                    and sys.getrefcount(s) <= _BARE_REFS):
                setattr(s, DONOR, False)  # one taker: a second would get cold memory
                return s
        return None

    @property
    def reserved(self) -> int:
        """Bytes the allocator holds in segments (memory_reserved)."""
        return self.allocator.reserved

    @property
    def peak_reserved(self) -> int:
        return self.allocator.peak_reserved

    def free_memory(self) -> int | None:
        """What cudaMemGetInfo calls free: the capacity less the context and what is reserved
        (None: a GPU on the host's memory, which has no figure of its own)."""
        total = self.allocator.total
        if total is None:
            return None
        return max(0, total - self.allocator.context - self.reserved)


# Set on a storage an asynchronous launch made for its output: its memory may go to a later
# output once the user let go of it (`DeviceState.donor`); False once taken.
DONOR = "_devlab_donor"

# A storage's C++ use count (`_requirements` checks torch has it before a simulation starts).
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _bare_refs() -> int:
    """What sys.getrefcount reads in settle() for a storage no Python code holds: the storage
    of a tensor whose storage object was made and let go, read back through a weak reference as
    settle() reads a mark."""
    t = torch.empty(0)
    w = weakref.ref(t.untyped_storage())
    s = w()
    return sys.getrefcount(s)


_BARE_REFS = _bare_refs()


class PeakWatch:
    """The highest allocation of one simulated GPU since the watch began (`peak`, bytes);
    `close()` ends it. Read and written under the session's lock."""

    __slots__ = ("_device", "peak")

    def __init__(self, device: DeviceState) -> None:
        self._device = device
        self.peak = device.allocated
        device.watches.append(self)

    def close(self) -> None:
        with lock:
            if self in self._device.watches:
                self._device.watches.remove(self)

    def __repr__(self) -> str:
        return f"PeakWatch(GPU:{self._device.index}, peak={self.peak:,} bytes)"


class NoCharges:
    """What a simulation without a GPU model charges: nothing. `clock.charges.Charges`, the
    modeled one, has the same methods; every charge to a clock goes through the session's."""

    __slots__ = ()
    clock = None  # the modeled clock (`gpu_model.modeled_clock.Clock`): none

    def enter(self) -> None:
        """The host enters the simulation (a call on a simulated GPU, a wait for one): until
        the matching `leave`, the host's modeled time is the model's, not the wall clock's."""

    def leave(self) -> None:
        """The host leaves the simulation: its time runs at the wall clock's pace again."""

    def call(self, func: Any, args: tuple, kwargs: dict, out: Any, index: int,
             fresh: bool) -> None:
        """A torch call that ran on GPU `index`; `fresh`: it made new memory."""

    def factory(self, func: Any, args: tuple, out: Any, index: int) -> None:
        """A factory that made `out` on GPU `index`."""

    def begin_backward(self) -> None:
        """A backward pass starts."""

    def backward_failed(self) -> None:
        """The backward pass begun raised."""

    def backward(self, nodes: list[Any]) -> None:
        """The backward pass through these graph nodes (it has ended)."""

    def collective(self, op: str, sizes: tuple[int, ...], ranks: int, index: int,
                   exchange: Any, group: object, *, join: bool, numel: int = 0,
                   now: bool = False) -> Any:
        """A collective of `sizes` bytes among `ranks` GPUs, launched on GPU `index`; when it
        ends, in modeled seconds: unknown."""
        return None

    def join(self, index: int, until: float | None = None) -> None:
        """GPU `index`'s queue waits for its collectives (`work.wait()`)."""

    def copy(self, src: int | None, dst: int | None, nbytes: int, blocking: bool,
             op: str = "copy", pinned: bool = False) -> None:
        """A copy between the host (None) and a GPU, or between two GPUs; `pinned`: the host's
        side is pinned memory."""

    def sync(self, index: int | None = None) -> None:
        """The host waits for GPU `index`'s queue (every GPU's if None)."""

    def reached(self, index: int, stream: int | None = None) -> float | None:
        """When GPU `index`'s `stream` (this thread's current one if None) reaches work
        enqueued now (an Event's time), in modeled seconds: unknown."""
        return None

    def wait_for(self, index: int, stream: int, until: float | None) -> None:
        """GPU `index`'s `stream` starts later work no earlier than `until` (a time `reached`
        gave: `wait_event`, `wait_stream`)."""

    def sync_stream(self, index: int, stream: int) -> None:
        """The host waits for one stream of GPU `index` (`Stream.synchronize`)."""

    def host_wait(self, until: float | None) -> None:
        """The host waits until `until` (`Event.synchronize`)."""

    def done(self, until: float | None) -> bool:
        """Whether the GPUs have reached `until` by the host's time now (an event's query as
        the caching allocator makes it): without a model, always."""
        return True

    def poll(self, until: float | None) -> bool:
        """An event's or stream's query of work ending at `until` (a time `reached` gave):
        without a model, never asked (the GPU's queue answers), so done."""
        return True

    def reset(self, count: int, queues: list[int] | None = None) -> None:
        """The GPUs were reconfigured before first use."""

    def begin_capture(self) -> Any:
        """A CUDA graph's capture starts: what is charged until `end_capture` is recorded,
        not run. Returns what `end_capture` needs."""
        return None

    def end_capture(self, token: Any) -> tuple:
        """The capture begun (`token`) ends: the kernels it recorded, the GPUs' queues as they
        were before it."""
        return ()

    def replay(self, kernels: tuple) -> None:
        """A CUDA graph of these recorded kernels is replayed: one launch for all of them."""


NO_CHARGES = NoCharges()


_F = TypeVar("_F", bound=Callable[..., Any])


def inside(fn: _F) -> _F:
    """A stand-in that waits for the simulated GPUs or reads their clock (a sync, an event, a
    collective): while it runs the host is inside the simulation, so the wall time it takes
    (the CPU finishing queued work, another rank's) is not the host's (Note [The host's
    modeled time] in gpu_model/modeled_clock.py)."""

    @functools.wraps(fn)
    def bracketed(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        sess = session
        if sess is None:
            return fn(*args, **kwargs)
        charges = sess.charges
        charges.enter()
        try:
            return fn(*args, **kwargs)
        finally:
            charges.leave()

    return bracketed  # type: ignore[return-value]


class Session:
    """One start()..stop() run; marks and modes from an earlier run are ignored by a later one.

    `spec` is the real GPU the simulated ones model (None: no performance model); `charges` what
    the simulation charges a modeled clock for, the only way to it (`clock.charges.Charges`, made
    by start(): the model's modules sit above this one), `NO_CHARGES` without a model.
    `used`: a simulated tensor was made (the configuration is fixed from then on);
    `initialized`: the simulated CUDA runtime is initialized in this process (`_fork`).
    """

    __slots__ = ("__weakref__", "charges", "count", "devices", "initialized", "spec", "used")

    def __init__(self, limits: list[int | None], growth: list[bool] | None = None,
                 spec: Any = None, charges: NoCharges = NO_CHARGES) -> None:
        self.used = False
        self.initialized = False
        self.spec = spec
        self.charges = charges
        self.configure(limits, growth)

    def configure(self, limits: list[int | None], growth: list[bool] | None = None,
                  queues: list[int] | None = None) -> None:
        """Set the GPUs: one limit (bytes or None) and memory-growth flag (default on) each;
        `queues`, the modeled queue each runs on (logical GPUs of one physical GPU share one)."""
        self.count = len(limits)
        growth = [True] * self.count if growth is None else growth
        config = AllocatorConfig.parse(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
        self.devices = [DeviceState(i, lim, not grows, self.spec, config)
                        for i, (lim, grows) in enumerate(zip(limits, growth, strict=True))]
        for d in self.devices:
            d.allocator.events = _StreamEvents(self, d.index)
        self.charges.reset(self.count, queues)


class _StreamEvents:
    """A GPU's streams as its caching allocator asks after them (`record_stream`): on a
    modeled GPU an event completes when the host's modeled time passes the stream's work;
    without a model, at once (the simulated GPU has run all the work it was given)."""

    __slots__ = ("index", "session")

    def __init__(self, session: Session, index: int) -> None:
        self.session = weakref.proxy(session)
        self.index = index

    def record(self, stream: int) -> float | None:
        return self.session.charges.reached(self.index, stream)

    def done(self, at: float | None) -> bool:
        return self.session.charges.done(at)


# The running session (None when not simulating). Read on every op, so a plain global.
session: Session | None = None

# Reentrant: a weakref callback (storage freed) can run inside a locked section of the same
# thread when garbage collection triggers there.
lock = threading.RLock()

# A call to make once, at the first device query, device argument or initialization of the
# simulated CUDA runtime in this process (`first_use`): a simulation started from the
# environment reads it again there, as CUDA reads CUDA_VISIBLE_DEVICES when it initializes,
# not when torch is imported (`devlab.core.config.simulate_from_environment`). Read where the
# program asks about devices (a plain global: an op reads it).
at_first_use: Callable[[], None] | None = None


def first_use() -> None:
    """Make the `at_first_use` call, once, before the caller reads the session (other threads
    wait for it); the simulated runtime's initialization drops it (`fork_rule.initialize`)."""
    global at_first_use
    with _first_use_lock:  # not `lock`: the call stops and starts the GPUs' workers
        call, at_first_use = at_first_use, None
        if call is not None:
            call()


_first_use_lock = threading.RLock()


# This process was forked after its parent initialized the simulated CUDA runtime, so, by
# CUDA's rule, it may not use the simulated GPUs (`_fork`).
bad_fork = False

# The CUDA graph capture under way in this process, if any (`cuda.graphs`): a host sync
# anywhere while it runs is CUDA's capture error (capture mode "global"), so `workers.host_sync`
# asks it. One at a time, as torch.cuda.graph's one capture stream allows.
capture: Any = None

# Per thread, as CUDA's: `device` is torch.cuda.current_device(), `index` the simulated GPU the
# op running right now executes on (None on the host), `routed` the session whose mode the
# thread carries (see mode.routing).
tls = threading.local()

# Note [Reading tls]
# A `threading.local` attribute that is not set is an AttributeError raised, its message
# formatted, then caught: `getattr(tls, "streams", None)` in a thread that never chose a
# stream costs about 1,700 instructions more than `tls.__dict__.get("streams")` (the thread's
# own dict, which `threading.local` hands back as its `__dict__`), and the allocator asks
# `current_stream` at every allocation. Where a name is read per op and may be unset, read
# the dict.


def current_index() -> int | None:
    """The simulated GPU an op is executing on right now in this thread, or None."""
    return tls.__dict__.get("index")


def calls_in_progress() -> int:
    """How many of the function mode's placed calls (`device_rule.call`) this thread is inside."""
    return tls.__dict__.get("calls", 0)


def current_device() -> int:
    """This thread's current simulated GPU (`torch.cuda.current_device()`); 0 in a new thread."""
    return tls.__dict__.get("device", 0)


def is_routed() -> bool:
    """True when this thread's torch calls go through the running simulation's mode."""
    sess = session
    return sess is not None and tls.__dict__.get("routed") is sess


def current_streams() -> dict[int, int]:
    """This thread's current stream id on each GPU of the running session (CUDA keeps the
    current stream per thread and per device; a GPU not listed is on its default stream, 0)."""
    got = tls.__dict__.get("streams")  # not getattr: See Note [Reading tls]
    if got is None or got[0]() is not session:
        got = (weakref.ref(session) if session is not None else _no_session, {})
        tls.streams = got
    return got[1]


def _no_session() -> None:
    return None


def current_stream(index: int) -> int:
    """The id of this thread's current stream on GPU `index` (0: its default stream)."""
    got = tls.__dict__.get("streams")  # not getattr: See Note [Reading tls]
    if got is None or got[0]() is not session:
        return 0
    return got[1].get(index, 0)


def forget_thread_state() -> None:
    """Drop this thread's device state (stop(), and a fresh start)."""
    tls.__dict__.pop("streams", None)
    tls.__dict__.pop("device", None)
    tls.__dict__.pop("index", None)
    tls.__dict__.pop("routed", None)
