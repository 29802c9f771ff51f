"""Which simulated GPU a tensor lives on, and how many bytes each GPU holds.

A simulated GPU's tensor is an ordinary CPU tensor whose *storage* carries a `Mark`. Every
view of a storage shares one Python storage object while the C++ storage lives (PyObject
preservation), so a mark set once is seen by views, `.data`, `.detach()` and `Parameter(t)`;
the mark is also a weak reference to the storage, whose callback returns the bytes to the GPU
when the C++ storage dies. Bytes are counted in CUDA's 512-byte blocks, so
`torch.cuda.memory_allocated` reads as on a real GPU. `mark_outputs` marks an op's fresh outputs
(the call that made them, and the dispatch mode that sees torch's own ops, both use it).
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from typing import Any

import torch

from devlab.engine.gpu_model.caching_allocator import Block, OutOfMemory
from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import fork_rule as _fork
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import hazards as _hazards
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.session import DeviceState, Session

MARK = "_devlab_sim"
PINNED = "_devlab_pinned"  # a host storage pinned while simulating: its session
WRAPPER_MARK = "_devlab_sim_wrapper"

Tensor = torch.Tensor

_DisableTF = torch._C.DisableTorchFunction
_tf_stack_len = torch._C._len_torch_function_stack
_get_ident = threading.get_ident
# Tensor types whose untyped_storage() is torch's own (no __torch_function__ of their own).
PLAIN = (torch.Tensor, torch.nn.Parameter)
STORAGE_ERRORS = (RuntimeError, NotImplementedError, TypeError, ValueError)
_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_functorch_unwrap = torch._C._functorch.get_unwrapped


# Note [Why a storage's CPU memory is freed on the host's clock]
# A large simulated tensor the host lets go of costs the host the CPU's release of its memory:
# glibc gives a large block back to the system (munmap), which tears down each of its pages,
# about 50 ms for 64 MiB on this 2-core machine under load, and a modeled GPU's events read
# that as host time, where CUDA's caching allocator keeps the block and the free costs
# microseconds. It is not bracketed (`charges.enter`/`leave` around it, as `_release` brackets
# the allocator's work) nor handed to a GPU's worker, because no devlab code runs at the free:
# torch's storage dealloc (THPStorage_subclass_dealloc) runs the weak references' callbacks
# (this `_release`, when the referent is already unreachable: `m()` is None) and clears the
# storage's __dict__ before it destroys the C++ storage, whose DataPtr's deleter (the CPU
# allocator's free) runs last, after `_release` has returned; nothing after it calls Python.
# Taking the memory's last reference needs a DataPtr whose deleter calls Python
# (`torch.frombuffer` over a buffer devlab owns): moving one into the storage
# (`UntypedStorage._swap_data_ptr_`) also swaps the storage's allocator and its resizable
# flag, so `resize_` on the tensor would raise "Trying to resize storage that is not
# resizable" where it works on a GPU; making the memory that way from the start has the same
# flag. Keeping freed memory instead (mallopt: no mmap, no trim) would make the free cheap but
# keep every freed page in the process for good, against Binder's memory budget. A queued op's
# storage the user let go of is freed on its GPU's worker (the op's tensors go there), off the
# host's clock; an output that takes such a storage's memory (Note [A queued output takes a
# dropped one's memory] in mode/async_launch.py) frees only untouched pages.


_freeing = 0  # frees under way (under the session's lock): one inside another is nested
_collecting = False  # the garbage collector is running (`_gc_phase`)


# Note [A free the garbage collector makes]
# The modeled clock's sections allocate (spans, records): the garbage collector can run inside
# one and collect a simulated storage held in a reference cycle (an exception's traceback, an
# autograd graph), whose free then asks the clock on the thread that holds its lock. The lock
# is re-entrant (See Note [The clock's lock, entered again by its own thread] in
# gpu_model/modeled_clock.py; a plain lock waited for itself for ever), but the free's
# `was_inside` would move the host's time halfway through a section outside the simulation
# (`record`'s, a `reset`). So a free during a collection does the allocator's work alone and
# leaves the host's clock as it is: its few microseconds count as whatever the clock was
# counting. The callback is the process's (gc.callbacks), a flag and nothing more, so it stays
# for the life of the process.
def _gc_phase(phase: str, info: dict) -> None:
    global _collecting
    _collecting = phase == "start"


if _gc_phase not in gc.callbacks:
    gc.callbacks.append(_gc_phase)


# Note [A free the garbage collector makes inside the allocator]
# The session's lock is re-entrant, and the allocator's work under it allocates (a split's
# `Block`, a segment's lists, a snapshot's dicts): a collection can start halfway through an
# allocation, between the cached block taken off its pool's list and the split's rest put
# back, and a free it makes there (`_release` on the same thread, let in by the re-entrant
# lock) merged its block with that half-split neighbour: the pool's lists and the segment's
# blocks went out of step (an IndexError the weakref callback swallowed, the block never
# freed, two free neighbours never merged again). Such a free, a collection's on the thread
# that holds the session's lock, is deferred (`_deferred`) and done by `_settle_deferred`
# once the allocator's call it interrupted has returned: at the end of `_charge` (so an op's
# allocation that set off the collection reads its memory figures with the free done) and at
# the next free, check or mark. So the allocator sees the free just after the call, one
# order of the two, and a free made anywhere else is as before.
_deferred: list[Mark] = []


def _settle_deferred() -> None:
    """Do the frees deferred while the allocator worked (See Note [A free the garbage
    collector makes inside the allocator]); the caller holds the session's lock."""
    while _deferred:
        m = _deferred.pop(0)
        if m.block is not None and m.session is _session.session:
            if _hazards.tracking:
                _hazards.freed(m.index, m.block)
            m.session.devices[m.index].allocator.free(m.block)
            m.block = None


# The main thread's id (`_release`'s cheap answer to "a thread devlab runs?"): devlab marks
# only threads it starts (`gpu_workers.UNROUTED`), never the main one, so a free there needs
# no look at the thread object (`threading.current_thread()` is a Python call and a dict
# lookup per free). A forked child's main thread is the one that forked.
_main_ident = threading.main_thread().ident


def _main_after_fork() -> None:
    global _main_ident
    _main_ident = threading.get_ident()


if hasattr(os, "register_at_fork"):  # no fork, no child: Windows
    os.register_at_fork(after_in_child=_main_after_fork)


def _release(m: Mark) -> None:
    """The storage died (weakref callback): its block goes back to the GPU's allocator (the
    CPU's release of its memory follows on the host's clock: See Note [Why a storage's CPU
    memory is freed on the host's clock])."""
    global _freeing
    sess = m.session
    if sess is _session.session and m.block is not None:
        clock = sess.charges.clock  # the allocator's work is not the host's (Note [The host's
        # modeled time] in gpu_model/modeled_clock.py; without a model there is no host time to
        # stop: no calls per free). A free on a thread devlab runs (a GPU's worker dropping a
        # queued op's inputs) is not the host's either: bracketed, it would stop the host's
        # clock while the program, outside the simulation, sleeps or loads data. Nor is a
        # free the garbage collector makes (See Note [A free the garbage collector makes]).
        if (clock is None or _collecting or (_get_ident() != _main_ident and getattr(
                threading.current_thread(), _workers.UNROUTED, False))):
            if _collecting and _session.lock._is_owned():
                # See Note [A free the garbage collector makes inside the allocator]
                _deferred.append(m)
                return
            with _session.lock:
                if _deferred:
                    _settle_deferred()
                if m.block is not None:
                    if _hazards.tracking:
                        _hazards.freed(m.index, m.block)
                    sess.devices[m.index].allocator.free(m.block)
                    m.block = None
            return
        since = clock.wall()  # the bracket's `enter`
        with _session.lock:
            _freeing += 1
            try:
                if _deferred:
                    _settle_deferred()
                if m.block is not None:  # as above
                    if _hazards.tracking:
                        _hazards.freed(m.index, m.block)
                    sess.devices[m.index].allocator.free(m.block)
                    m.block = None
            finally:
                _freeing -= 1
                # `enter` then and `leave` now at once (a free inside this one, which the
                # garbage collector may start, is inside its bracket: nothing of its own)
                if not _freeing:
                    clock.was_inside(since)


class Mark(weakref.ref):
    """What a storage carries: its simulated device, its session and the bytes accounted.

    It is also the weak reference to that storage whose callback gives the bytes back (one
    object per storage instead of two; CPython drops the callback once it has run, so the
    storage -> mark -> storage loop does not outlive the storage).
    """

    __slots__ = ("block", "index", "session")

    index: int
    block: Block | None  # the allocator's block holding the storage's bytes
    session: Session

    @property
    def nbytes(self) -> int:
        """The bytes the storage holds on its GPU (its block's size)."""
        return 0 if self.block is None else self.block.size


def new_mark(storage: torch.UntypedStorage, index: int, session: Session) -> Mark:
    """A mark of `storage` on simulated GPU `index` that counts no bytes yet (an interrupt before
    it is charged leaks nothing). Made by weakref's own constructor, then filled in: every op's
    output gets one, and a Python `__new__` and `__init__` would cost more than the rest."""
    m = Mark(storage, _release)
    m.index = index
    m.session = session
    m.block = None
    return m


def live_mark(storage: torch.UntypedStorage | None) -> Mark | None:
    """The storage's mark if this simulation made it (None: a host storage, or one marked by an
    earlier simulation)."""
    m = getattr(storage, MARK, None)
    if m is not None and m.session is _session.session:
        return m
    return None


def storage_of(t: torch.Tensor) -> torch.UntypedStorage | None:
    """t's storage, read past every torch function mode and subclass override.

    None for sparse, nested or storage-less tensors, which are never simulated.
    """
    try:
        if type(t) in PLAIN and not _tf_stack_len():
            return t.untyped_storage()
        with _DisableTF():
            return t.untyped_storage()
    except STORAGE_ERRORS:
        return transformed_storage(t)


def transformed_storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    """The storage under a torch.func transform's wrapper (vmap's BatchedTensor, grad's and
    jacrev's TensorWrapper), which has none of its own: the innermost wrapped tensor's. Its
    mark is the wrapper's device, and an op inside the transform writes its result there, which
    is what the transform hands back (vmap as a view, grad unwrapped). None for other tensors
    without a storage."""
    try:
        if not _functorch_wrapped(t):
            return None
        while _functorch_wrapped(t):
            t = _functorch_unwrap(t)
        with _DisableTF():
            return t.untyped_storage()
    except STORAGE_ERRORS:
        return None


def mark_of(t: torch.Tensor) -> Mark | WrapperMark | None:
    """The live mark of t's storage (None: a host tensor, or no simulation). The question every
    op asks of its tensors, so one call, read past modes and subclass overrides."""
    sess = _session.session
    if sess is None:
        return None
    try:
        if type(t) in PLAIN and not _tf_stack_len():
            s = t.untyped_storage()
        else:
            with _DisableTF():
                s = t.untyped_storage()
    except STORAGE_ERRORS:
        s = transformed_storage(t)
        if s is None:
            return None if type(t) in PLAIN else wrapped_mark(t)
    m = getattr(s, MARK, None)
    if m is not None and m.session is sess:
        return m
    return None if type(t) in PLAIN else wrapped_mark(t)


def inner_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensors a wrapper subclass holds (DTensor's local shard, a functional collective's
    AsyncCollectiveTensor's result), as it names them to torch (`__tensor_flatten__`); none
    for other tensors."""
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is None:
        return []
    try:
        names, _ = flatten(t)
        return [x for x in (getattr(t, n, None) for n in names) if isinstance(x, torch.Tensor)]
    except Exception:  # a subclass's own flatten failing is not this question's business
        return []


class WrapperMark:
    """What a wrapper subclass made for a simulated GPU carries (`_wrappers`): its device; it
    holds no bytes of its own."""

    __slots__ = ("index", "nbytes", "session")

    def __init__(self, index: int, session: Session) -> None:
        self.index = index
        self.session = session
        self.nbytes = 0


def wrapped_mark(t: torch.Tensor) -> Mark | WrapperMark | None:
    """A wrapper subclass lives where it was made for, or else where the tensors it wraps live
    (its own storage is empty): the mark of its first inner tensor on a simulated GPU."""
    own = getattr(t, "__dict__", {}).get(WRAPPER_MARK)
    if own is not None and own.session is _session.session:
        return own
    for inner in inner_tensors(t):
        m = mark_of(inner)
        if m is not None:
            return m
    return None


def pin(storage: torch.UntypedStorage) -> None:
    """Mark a host storage as pinned (page-locked) memory. On a simulated machine the host's
    memory is the GPUs', so pinning is only this mark: `is_pinned()` reads it, and a copy from
    it to a GPU can be asynchronous, as on CUDA."""
    setattr(storage, PINNED, _session.session)


def is_pinned(t: torch.Tensor) -> bool:
    """True if t lives in host memory this simulation pinned."""
    sess = _session.session
    return sess is not None and getattr(storage_of(t), PINNED, None) is sess


def index_of(t: torch.Tensor) -> int | None:
    """Simulated GPU index of a tensor; None for a real CPU tensor (or no simulation)."""
    m = mark_of(t)
    return m.index if m is not None else None


def _charge(dev: DeviceState, m: Mark, nbytes: int) -> OutOfMemory | None:
    """Give mark `m` a block of `nbytes` from the device's allocator (none for 0), freeing the
    one it held; if the allocator cannot, change nothing and return its out-of-memory. The
    caller holds the lock.

    No call between the allocation and the mark's block, where an interrupt could land: the
    allocator's blocks are always the live marks' blocks."""
    if dev.queued:
        dev.settle()
    a = dev.allocator
    if not dev.opened:
        dev.open()  # the GPU's first tensor: its CUDA context is made
    old = m.block
    # On the thread's current stream of the GPU: blocks are cached per stream, as CUDA's.
    block: Block | OutOfMemory | None = (
        a.allocate(nbytes, _session.current_stream(dev.index)) if nbytes else None)
    if isinstance(block, OutOfMemory):
        return block
    m.block = block
    if old is not None:
        a.free(old)
    if dev.watches:
        alloc = a.allocated
        for watch in dev.watches:
            if alloc > watch.peak:
                watch.peak = alloc
    if _deferred:  # frees a collection made inside this allocation, after it and its peak
        _settle_deferred()  # (See Note [A free the garbage collector makes inside the allocator])
    return None


def _charge_or_raise(dev: DeviceState, m: Mark, nbytes: int) -> None:
    """`_charge`, and if it does not fit: first wait for the device's queued work (its freed
    tensors leave the count when the work is done), as CUDA's allocator frees its cache and
    synchronizes before it gives up; then CUDA's out-of-memory error."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    _workers.drain(dev.index)  # outside the lock: the worker frees storages under it
    with _session.lock:
        oom = _charge(dev, m, nbytes)
    if oom is not None:
        raise _errors.out_of_memory(dev, oom)


def check_fits(index: int, nbytes: int) -> None:
    """Raise CUDA's out-of-memory error if `nbytes` more could not be allocated on the device
    (before a factory allocates them on the host)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    sess = _session.session
    if sess is None:
        return
    dev = sess.devices[index]
    a = dev.allocator
    if a.total is None and a.allowed is None:
        return
    with _session.lock:
        if not dev.opened:
            dev.open()
        fits = a.refusal(nbytes, _session.current_stream(index)) is None
        if _deferred:  # (Note [A free the garbage collector makes inside the allocator])
            _settle_deferred()
    if not fits:
        _workers.drain(index)
        with _session.lock:
            oom = a.refusal(nbytes, _session.current_stream(index))
        if oom is not None:
            raise _errors.out_of_memory(dev, oom)


def mark(storages: list[torch.UntypedStorage], index: int) -> None:
    """Mark fresh storages as living on simulated GPU `index`, all or none: if they do not fit
    under its limit, raise CUDA's out-of-memory error and mark nothing."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if len(storages) == 1:
        mark_one(storages[0], index)
        return
    sess = _session.session
    if sess is None:
        return
    if not sess.used:
        _first_use(sess)
    dev = sess.devices[index]
    marks = []
    try:
        for s in storages:
            m = new_mark(s, index, sess)
            setattr(s, MARK, m)
            marks.append(m)
            with _session.lock:
                oom = _charge(dev, m, s.nbytes())
            if oom is not None:
                _charge_or_raise(dev, m, s.nbytes())
    except BaseException:
        with _session.lock:
            for m in marks:
                _charge(dev, m, 0)
        for s in storages:
            if getattr(s, MARK, None) is not None:
                delattr(s, MARK)
        raise


def mark_one(s: torch.UntypedStorage, index: int) -> None:
    """`mark` for one fresh storage: almost every op's output, so kept short."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    sess = _session.session
    if sess is None:
        return
    if not sess.used:
        _first_use(sess)
    dev = sess.devices[index]
    nb = s.nbytes()
    m = Mark(s, _release)  # new_mark, inline: this runs for almost every op's output
    m.index = index
    m.session = sess
    m.block = None
    setattr(s, MARK, m)
    with _session.lock:
        oom = _charge(dev, m, nb)
    if oom is not None:
        try:
            _charge_or_raise(dev, m, nb)
        except BaseException:
            delattr(s, MARK)
            raise


def recount(storage: torch.UntypedStorage, m: Mark) -> None:
    """Re-account a marked storage whose size may have changed (resize_, set_, out= ops)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    nb = storage.nbytes()
    if (m.block.requested if m.block is not None else 0) != nb:
        dev = m.session.devices[m.index]
        with _session.lock:
            oom = _charge(dev, m, nb)
        if oom is not None:
            _charge_or_raise(dev, m, nb)


def _first_use(sess: Session) -> None:
    """The first simulated tensor: the simulated CUDA runtime initializes (refused in a child
    forked after its parent initialized it), and devlab's device settings are fixed."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    _fork.initialize()
    sess.used = True
    from devlab.engine import runtime

    runtime.mark_initialized()


def tensors_of(args: tuple, kwargs: dict) -> list[Tensor]:
    """The tensors among an op's arguments (one level into lists and tuples)."""
    ts: list[Tensor] = []
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, Tensor):
            ts.append(a)
        elif isinstance(a, (list, tuple)):
            ts.extend(x for x in a if isinstance(x, Tensor))
    return ts


def mark_outputs(out: Any, index: int, host: list | None = None) -> bool:
    """Mark the fresh storages among an op's outputs as living on simulated GPU `index`;
    returns whether there were any (the op made new memory, so it ran a kernel).

    Storages already marked are views or in-place results (re-counted if resized); `host`
    holds the storages of host inputs, which an output may alias (a broadcast CPU scalar).
    """
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if type(out) in PLAIN and not host:  # almost every op: one plain tensor
        s = storage_of(out)
        if s is not None:
            m = live_mark(s)
            if m is None:
                mark_one(s, index)
                return True
            recount(s, m)
            return False
    outs = (out,) if isinstance(out, Tensor) else out if isinstance(out, (tuple, list)) else ()
    fresh: list[torch.UntypedStorage] = []
    fresh_inner = False
    for o in outs:
        if not isinstance(o, Tensor):
            continue
        if type(o) not in PLAIN and inner_tensors(o):
            # A wrapper (DTensor) computes its inner tensors in C++, unseen: they are the
            # op's fresh outputs on this GPU.
            fresh_inner = mark_outputs(inner_tensors(o), index, host) or fresh_inner
            continue
        s = storage_of(o)
        if s is None:
            _refuse_storageless(o)
            continue
        m = live_mark(s)
        if m is not None:
            recount(s, m)
        elif not (host and any(s is h for h in host)) and not any(s is f for f in fresh):
            fresh.append(s)
    if fresh:
        mark(fresh, index)
    return bool(fresh) or fresh_inner


def _refuse_storageless(t: Tensor) -> None:
    """A sparse or nested result cannot carry a mark: refuse rather than let it quietly land on
    the host."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if t.layout is not torch.strided or t.is_nested:
        raise _errors.not_simulated(
            f"a {t.layout} tensor", "they hold dense (strided) tensors only: keep this tensor "
            "on the CPU (or stop the simulation)")


# Note [Tensors under torch.func's transforms]
# vmap's BatchedTensor and grad's TensorWrapper have no storage of their own, so no mark can sit
# on them: their storage is the innermost wrapped tensor's (`transformed_storage`), and what a
# transform returns (vmap, grad, jacrev, jacfwd, hessian, `functional_call` ensembles) is what its
# ops wrote there, on that tensor's GPU. `torch.func.functionalize` is not covered: its wrapper
# has a storage of its own, which nothing marks, so what it returns says `cpu` (with the right
# values) where CUDA would say the GPU.
