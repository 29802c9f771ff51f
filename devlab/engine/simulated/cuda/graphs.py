"""CUDA graphs on simulated GPUs: `torch.cuda.CUDAGraph`, and through it torch's own
`torch.cuda.graph` and `make_graphed_callables`.

A capture records, in a dispatch mode on the capturing thread, the aten ops that run on a
simulated GPU, with the very tensors they read and write; `replay()` runs them again into the
same storages (an op's fresh outputs are copied into the tensors the capture made; in-place and
`out=` ops write where they wrote). So after a replay the static outputs hold what a GPU's
replay leaves there, for whatever the static inputs hold then.

What a GPU does during capture, the simulation does too:

- nothing runs: the ops do run on the CPU (their outputs need shapes, and the values are
  what the capture's memory holds, which a GPU leaves undefined), but every GPU storage made
  before the capture that an op writes is put back as it was when the capture ends, as the
  GPU never ran the op (an optimizer's step inside a capture steps only at replay);
- a host sync (`.item()`, `.cpu()`, `nonzero`, `synchronize()`, a copy from pageable host
  memory) is CUDA's "operation not permitted when stream is capturing", and the capture is
  invalidated: `capture_end` (the `with torch.cuda.graph` block's end) raises CUDA's
  "operation failed due to a previous error during capture", having put devlab and torch back
  as they were before the capture;
- on a modeled GPU, a capture charges the host its launches but runs nothing on the GPU, and
  a replay costs the host ONE launch for the whole graph, its kernels running back to back with
  their modeled times (`clock.Clock.replay`): the lesson CUDA graphs teach.

Memory is the graph's private pool, as CUDA's caching allocator keeps it (Note [Interaction
with CUDA graph capture] in CUDACachingAllocator.cpp; `devlab.engine.gpu_model.caching_allocator.PrivatePool`):
what the capture allocates comes from that pool's own segments (`beginAllocateToPool`, for the
capturing stream and, in devlab, the capturing thread's other streams); `pool=` (another
graph's `pool()`, `graph_pool_handle()` or a MemPool's `id`) shares one pool. The graph keeps
each tensor its capture made alive for its replays, through tensors of its own on the same
storages (`_Hold`), so a storage only the graph still uses is one the program let go of: its
block goes back to the private pool, reserved, no longer allocated (checked before each op of
the capture and whenever memory is read), and only that pool reuses it. `reset()` (or the
graph's end) releases the pool (`releasePool`): with no graph or MemPool left using it, the next
`empty_cache()` frees its unused segments. External inputs a capture read are kept alive (CUDA
would read freed memory). Random ops draw fresh values at each replay from the CPU's
generator, as a GPU's replay draws fresh Philox offsets.

Not simulated: work on another GPU than the capturing one (devlab's own error: how CUDA
orders another device's stream with a capture is not modeled); printing a GPU tensor during
capture is not refused (torch prints with dispatch modes off; on a GPU it is a host sync);
`debug_dump` and the raw cudaGraph handles are devlab's own error; a replay is synchronous on
this machine (the modeled clock still queues it).
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from devlab.engine.aten_overloads import COPY_OPS, SYNC_OPS
from devlab.engine.gpu_model.caching_allocator import PoolError
from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.cuda_errors import entry
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.base.session import _BARE_REFS, _use_count
from devlab.engine.simulated.base.storage_marks import is_pinned, live_mark, storage_of, tensors_of
from devlab.engine.simulated.cuda import device_api as _device_api
from devlab.engine.simulated.cuda import streams as _streams
from devlab.engine.simulated.cuda.memory import new_pool_id, pool_id_of
from devlab.engine.simulated.mode.dispatch_devices import run as _run_dispatched

Tensor = torch.Tensor
_DisableTF = torch._C.DisableTorchFunction
_aten = torch.ops.aten

_CUDA_HINT = ("CUDA kernel errors might be asynchronously reported at some other API call, so "
              "the stacktrace below might be incorrect.\n"
              "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
              "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
# cudaErrorStreamCaptureUnsupported, cudaErrorStreamCaptureInvalidated, cudaErrorIllegalState.
NOT_PERMITTED = "operation not permitted when stream is capturing"
INVALIDATED = "operation failed due to a previous error during capture"
ILLEGAL_STATE = "the operation cannot be performed in the present state"
_MODES = ("global", "thread_local", "relaxed")


def cuda_error(what: str) -> Exception:
    """CUDA's error as torch raises it from a failed CUDA call (`AT_CUDA_CHECK`)."""
    err = getattr(torch, "AcceleratorError", RuntimeError)
    return _errors.user_error(err(f"CUDA error: {what}\n{_CUDA_HINT}"))


def _torch_check(message: str) -> RuntimeError:
    """torch's error from a failed TORCH_CHECK in CUDAGraph.cpp."""
    return _errors.user_error(RuntimeError(message))


@entry
def graph_pool_handle() -> tuple[int, int]:
    """torch.cuda.graph_pool_handle(): a token graphs share a memory pool by (user-made pools
    have only the second number set, as CUDA's `MemPool::graph_pool_handle`)."""
    return new_pool_id(True)


class _Hold:
    """What a graph keeps alive of its capture's memory: for each storage the capture made, its
    mark and how many tensors of the graph's own (aliases of the program's) are on it. The
    program's tensors are not kept, so a storage used by the graph's tensors alone is one the
    program let go of; `settle` gives its block back to the private pool it came from, as
    CUDA's allocator does when the tensor is freed (See Note [Why queued work's storages are
    uncounted] in base/session.py: the same count)."""

    def __init__(self) -> None:
        # storage key -> [its mark, the graph's tensors on it, a weak reference to it]
        self.marks: dict[int, list] = {}
        self.aliases: dict[int, tuple[Any, Tensor]] = {}  # id(program's tensor) -> (ref, alias)
        self.dropped: list[int] = []  # storages a recorded tensor of the program's left

    def alias(self, t: Tensor, s: torch.UntypedStorage) -> Tensor:
        """The graph's own tensor for the program's `t` (same storage, sizes, strides)."""
        got = self.aliases.get(id(t))
        if got is not None and got[0] is not None and got[0]() is t:
            return got[1]
        with _DisableTF(), _disable_current_modes():
            alias = t.detach()
        k = _key(s)
        entry = self.marks.get(k)
        if entry is None:
            # An op's fresh output is marked once the op returns (mode.device_rule), after it is
            # recorded: its mark is looked up when it is first needed.
            self.marks[k] = [live_mark(s), 1, weakref.ref(s)]
        else:
            entry[1] += 1
        dropped = self.dropped
        try:
            ref: Any = weakref.ref(t, lambda _r, k=k: dropped.append(k))
        except TypeError:  # a tensor type without weak references: checked at reads only
            ref = None
        self.aliases[id(t)] = (ref, alias)
        return alias

    def settle(self, every: bool = True) -> None:
        """Free the blocks of the storages only the graph uses (`every`: all it holds, else
        those a recorded tensor of the program's has left since). The caller holds the lock."""
        keys = list(self.marks) if every else self.dropped
        if not every:
            self.dropped = []
        for k in keys:
            entry = self.marks.get(k)
            if entry is None:
                continue
            m, n, sref = entry
            if m is None:
                st = sref()
                m = entry[0] = live_mark(st) if st is not None else None
                if m is None:
                    continue  # not (yet) on a simulated GPU's allocator
            s = m()
            if s is None or m.block is None:
                continue
            if _use_count(s._cdata) == 1 + n and sys.getrefcount(s) <= _BARE_REFS:
                m.session.devices[m.index].allocator.free(m.block)
                m.block = None
            elif not every:
                self.dropped.append(k)  # still used (it may be dying now): look again later

    def clear(self) -> None:
        self.marks.clear()
        self.aliases.clear()
        self.dropped = []


class _Op(NamedTuple):
    """One recorded op: what it was called with, and the tensors the capture made for its
    fresh outputs, by their position among its output tensors."""

    func: Any
    args: tuple
    kwargs: dict
    targets: tuple[tuple[int, Tensor], ...]


def _leaves(out: Any) -> list[Any]:
    """An op's outputs, one level into tuples and lists (aten returns no deeper nesting)."""
    if isinstance(out, (tuple, list)):
        flat: list[Any] = []
        for o in out:
            flat.extend(o if isinstance(o, (tuple, list)) else (o,))
        return flat
    return [out]


def _fresh_returns(func: Any, out: Any) -> list[bool]:
    """For each output leaf of `func`: whether its schema says it is new memory (not a view,
    nor an in-place or `out=` result, which alias an argument)."""
    returns = func._schema.returns
    outs = out if len(returns) > 1 else (out,)
    flags: list[bool] = []
    for r, o in zip(returns, outs, strict=False):
        n = len(o) if isinstance(o, (tuple, list)) else 1
        flags.extend([r.alias_info is None] * n)
    return flags


def _written(func: Any, args: tuple, kwargs: dict) -> list[Tensor]:
    """The tensors `func` writes in place (its schema's mutable arguments)."""
    written: list[Tensor] = []
    for i, a in enumerate(func._schema.arguments):
        info = a.alias_info
        if info is None or not info.is_write:
            continue
        v = args[i] if i < len(args) else kwargs.get(a.name)
        if isinstance(v, Tensor):
            written.append(v)
        elif isinstance(v, (list, tuple)):
            written.extend(x for x in v if isinstance(x, Tensor))
    return written


def _key(s: torch.UntypedStorage) -> int:
    return s._cdata


class _Recorder(TorchDispatchMode):
    """The capture's dispatch mode: runs each op as the simulation's marking mode does, and
    records those that run on a simulated GPU."""

    marks_simulated = True  # places and marks as it goes, as dispatched.Marking

    def __init__(self, capture: _Capture) -> None:
        super().__init__()
        self.capture: _Capture | None = capture

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        cap = self.capture
        if cap is None:  # its capture has ended (a mode object outliving it)
            return _run_dispatched(func, args, kwargs)[0]
        if func in SYNC_OPS:
            ts = tensors_of(args, kwargs)
            if any(cap.on_gpu(t) for t in ts):
                cap.refuse(SYNC_OPS[func])
        elif func in COPY_OPS:
            cap.check_copy(func, args, kwargs)
        if cap.hold.dropped:
            # Blocks the program let go of go back to the private pool before this op
            # allocates, as CUDA's allocator frees them when the tensor is freed.
            with _session.lock:
                cap.hold.settle(every=False)
        cap.save_written(func, args, kwargs)
        out, index = _run_dispatched(func, args, kwargs)
        if index is not None and index != cap.device:
            cap.unsimulated(func, index)
        if index is not None or any(cap.on_gpu(t) for t in tensors_of(args, kwargs)):
            cap.record(func, args, kwargs, out)
        return out


class _Capture:
    """A capture under way: its graph, its thread, what it recorded and what it must put
    back."""

    def __init__(self, graph: CUDAGraph, device: int, mode: str) -> None:
        self.graph = graph
        self.device = device
        self.mode = mode
        self.thread = threading.get_ident()
        self.ops: list[_Op] = []
        self.refused: Exception | None = None  # devlab's own error, if it gave up the capture
        self.fresh: set[int] = set()  # the GPU storages the capture made
        self.saved: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}
        self.failed = False
        self.recorder = _Recorder(self)
        self.clock_state: Any = None
        self.rng_state: Tensor | None = None
        self.hold = _Hold()
        self.pool: tuple[int, int] | None = None  # set once its allocation goes to the pool

    def on_gpu(self, t: Tensor) -> bool:
        s = storage_of(t)
        return s is not None and (live_mark(s) is not None or _key(s) in self.fresh)

    def refuse(self, what: str) -> None:
        """`what` is a host sync: CUDA refuses it during capture and invalidates the capture.
        In capture modes other than "global", only the capturing thread's own calls are."""
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        if self.mode != "global" and threading.get_ident() != self.thread:
            return
        self.failed = True
        self.ops.clear()  # an invalidated capture keeps nothing for a replay
        err = cuda_error(NOT_PERMITTED)
        err.add_note(f"devlab: the host waits for the GPU here ({what}), which CUDA refuses "
                     "while a CUDA graph is being captured; do it before or after the capture.")
        raise err

    def unsimulated(self, func: Any, index: int) -> None:
        """An op ran on another GPU than the one capturing: how CUDA would order it with the
        capture (another device's stream joining it, or running outside it) is not simulated,
        so devlab gives the capture up, in its own words."""
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        self.ops.clear()
        self.refused = _errors.not_simulated(
            f"{func.name()} on cuda:{index} during a CUDA graph capture on cuda:{self.device}",
            f"capture each GPU's work in a graph of its own, with torch.cuda.device({index}) "
            "current")
        raise self.refused

    def check_copy(self, func: Any, args: tuple, kwargs: dict) -> None:
        """A copy between the host and a GPU during capture syncs the host (to the host, or
        from pageable host memory), which CUDA refuses."""
        if func is _aten._to_copy.default:
            src = args[0]
            # Inside a call the simulation placed (a move), the current index is its
            # destination; one C++ issued (autograd's cast back) stays on its source's GPU,
            # as dispatched.run places it.
            to_gpu = (_session.current_index() is not None if _session.calls_in_progress()
                      else isinstance(src, Tensor) and self.on_gpu(src))
        else:
            src = args[1] if len(args) > 1 else kwargs.get("src")
            to_gpu = self.on_gpu(args[0])
        if not isinstance(src, Tensor):
            return
        from_gpu = self.on_gpu(src)
        if from_gpu and not to_gpu:
            self.refuse("a copy to the host")
        if to_gpu and not from_gpu and src.dim() != 0 and not is_pinned(src):
            self.refuse("a copy from pageable host memory")

    def save_written(self, func: Any, args: tuple, kwargs: dict) -> None:
        """Keep the bytes of GPU storages made before the capture that `func` writes, to put
        them back when the capture ends (the GPU never ran the op)."""
        for t in _written(func, args, kwargs):
            s = storage_of(t)
            if s is None or live_mark(s) is None:
                continue
            k = _key(s)
            if k in self.fresh or k in self.saved:
                continue
            with _DisableTF(), _disable_current_modes():
                self.saved[k] = (s, s.clone())

    def record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        leaves = _leaves(out)
        flags = _fresh_returns(func, out)
        targets = []
        for i, (o, fresh) in enumerate(zip(leaves, flags, strict=False)):
            if fresh and isinstance(o, Tensor):
                s = storage_of(o)
                if s is not None:
                    self.fresh.add(_key(s))
                targets.append((i, self.own(o)))
        self.ops.append(_Op(func, tuple(self.own_all(a) for a in args),
                            {k: self.own_all(v) for k, v in kwargs.items()}, tuple(targets)))

    def own(self, t: Tensor) -> Tensor:
        """The graph's own alias of `t` if the capture made its storage, else `t` itself."""
        s = storage_of(t)
        if s is None or _key(s) not in self.fresh:
            return t
        return self.hold.alias(t, s)

    def own_all(self, v: Any) -> Any:
        if isinstance(v, Tensor):
            return self.own(v)
        if isinstance(v, (list, tuple)) and any(isinstance(x, Tensor) for x in v):
            return type(v)(self.own(x) if isinstance(x, Tensor) else x for x in v)
        return v

    def restore(self) -> None:
        """Put back the GPU storages the capture wrote that it did not make."""
        with _DisableTF(), _disable_current_modes():
            for s, copy in self.saved.values():
                s.copy_(copy)
        self.saved.clear()


class CUDAGraph:
    """torch.cuda.CUDAGraph for simulated GPUs (See the module's docstring)."""

    @entry
    def __init__(self, keep_graph: bool = False) -> None:
        self._keep_graph = bool(keep_graph)
        self._ops: tuple[_Op, ...] = ()
        self._kernels: tuple = ()
        self._device: int | None = None
        self._pool: tuple[int, int] | None = None
        self._ended = False
        self._capture: _Capture | None = None
        self._hold: _Hold | None = None
        self._held_by: tuple[Any, int, tuple[int, int] | None] | None = None

    @entry
    @_device_api.initializes
    @_session.inside  # its CPU work is not the host's time
    def capture_begin(self, pool: tuple[int, int] | None = None,
                      capture_error_mode: str = "global",
                      check_input_liveness: bool = False) -> None:
        """Begin capturing the work this thread runs on its current simulated GPU."""
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        if capture_error_mode not in _MODES:
            raise _errors.user_error(RuntimeError(
                "Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`, "
                f"got {capture_error_mode}"))
        if self._ended:
            raise _torch_check("This CUDAGraph instance already owns a captured graph. To "
                               "capture a new graph, create a new instance.")
        if _session.current_streams().get(_session.current_device(), 0) == 0:
            raise _torch_check("CUDA graphs must be captured on a non-default stream. (However, "
                               "after capture, it's ok to replay them on the default stream.)")
        if _session.capture is not None:
            # torch.cuda.graph's one capture stream: CUDA refuses a second capture under way
            # in global mode (and devlab records one at a time).
            raise cuda_error(NOT_PERMITTED)
        _workers.host_sync(_session.current_device())  # what was queued before is not captured
        cap = _Capture(self, _session.current_device(), capture_error_mode)
        sess = _session.session
        cap.clock_state = sess.charges.begin_capture() if sess is not None else None
        # Simulated GPUs draw from the CPU's generator. A GPU's capture reserves Philox offsets
        # without advancing its generator (each replay advances it), so the capture's draws
        # are given back at its end.
        pool_id = pool_id_of(pool) if pool else new_pool_id(False)
        if sess is not None:
            # beginAllocateToPool: the capturing stream's requests go to the graph's pool (and,
            # in devlab, the capturing thread's on other streams: those joined to the capture)
            stream = _session.current_streams().get(cap.device, 0)
            thread = cap.thread
            with _session.lock:
                try:
                    sess.devices[cap.device].allocator.begin_allocate_to_pool(
                        pool_id, lambda s: s == stream or threading.get_ident() == thread)
                except PoolError as e:
                    if cap.clock_state is not None:
                        sess.charges.end_capture(cap.clock_state)
                    raise _torch_check(str(e)) from None
            cap.pool = pool_id
        cap.rng_state = torch.default_generator.get_state()
        cap.recorder.__enter__()
        self._pool = pool_id
        self._capture = cap
        _session.capture = cap

    @entry
    @_session.inside  # its CPU work is not the host's time
    def capture_end(self) -> None:
        """End the capture: the recorded ops are the graph; GPU memory the capture wrote but
        did not make is as it was before it."""
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        cap = self._capture
        if cap is None:
            raise cuda_error(ILLEGAL_STATE)
        if cap.thread != threading.get_ident():
            raise _torch_check("Capture must end on the same stream it began on.")
        ops = tuple(cap.ops)
        kernels = self._finish(cap)
        if cap.failed or cap.refused is not None:
            # No graph: nothing uses its pool any more (devlab puts the allocator back too,
            # where torch would leave the capture's pool routed)
            self._release_pool(cap)
        if cap.failed:
            raise cuda_error(INVALIDATED)
        if cap.refused is not None:
            raise _errors.user_error(NotImplementedError(f"capture abandoned: {cap.refused}"))
        self._ops = ops
        self._kernels = kernels
        self._device = cap.device
        self._ended = True
        self._hold = cap.hold
        self._held_by = (_session.session, cap.device, cap.pool)
        sess = _session.session
        if sess is not None:
            with _session.lock:
                sess.devices[cap.device].graphs.append(cap.hold)
                cap.hold.settle()
        if not self._ops:
            import warnings

            warnings.warn("The CUDA Graph is empty. This usually means that the graph was "
                          "attempted to be captured on wrong device or stream.", stacklevel=3)

    def _finish(self, cap: _Capture) -> tuple:
        """Take the capture's mode off this thread's stack and put everything back; returns
        the kernels the capture charged."""
        self._capture = None
        if _session.capture is cap:
            _session.capture = None
        try:
            cap.recorder.__exit__(None, None, None)
            sess = _session.session
            if cap.pool is not None and sess is not None:
                with _session.lock:  # endAllocateToPool
                    sess.devices[cap.device].allocator.end_allocate_to_pool(cap.pool)
        finally:
            # The mode and its capture refer to each other: let go of what they hold now, not
            # at the next garbage collection (a storage returns to its GPU when it dies).
            cap.recorder.capture = None
            cap.ops.clear()
            cap.fresh.clear()
            cap.restore()
            if cap.rng_state is not None:
                torch.default_generator.set_state(cap.rng_state)
            sess = _session.session
            kernels = (sess.charges.end_capture(cap.clock_state)
                       if sess is not None and cap.clock_state is not None else ())
        return tuple(kernels)

    def abort(self) -> None:
        """End a capture under way without a graph (the simulation stops)."""
        cap = self._capture
        if cap is not None:
            self._finish(cap)
            self._release_pool(cap)

    @staticmethod
    def _release_pool(cap: _Capture) -> None:
        """A capture that made no graph gives its pool back (`releasePool`)."""
        sess = _session.session
        if cap.pool is not None and sess is not None:
            with _session.lock:
                sess.devices[cap.device].allocator.release_pool(cap.pool)
            cap.pool = None
        cap.hold.clear()

    @entry
    @_session.inside  # its CPU work is not the host's time
    def replay(self) -> None:
        """Run the recorded ops again into the same tensors; on a modeled GPU, one launch."""
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        if not self._ended:
            raise _torch_check(
                "Called CUDAGraph::replay without a preceding successful capture.")
        if _session.capture is not None and _session.capture.thread == threading.get_ident():
            # Launching a graph into a capturing stream would nest it; devlab does not.
            raise _errors.not_simulated("replaying a CUDA graph during another capture",
                                        "replay it after the capture ends")
        # Queued work writing its inputs lands first, as the stream's order has it.
        _workers.wait(self._device if self._device is not None else 0)
        with (_DisableTF(), _disable_current_modes(),
              torch._C._AutoDispatchBelowADInplaceOrView()):
            for op in self._ops:
                new = op.func(*op.args, **op.kwargs)
                if op.targets:
                    leaves = _leaves(new)
                    for i, target in op.targets:
                        target.copy_(leaves[i])
        sess = _session.session
        if sess is not None:
            sess.charges.replay(self._kernels)

    @entry
    def reset(self) -> None:
        """Drop the graph and what it keeps alive: its blocks go back to its private pool, and
        the pool is released (`releasePool`): with nothing else using it, the next
        `empty_cache()` frees its segments."""
        self.abort()
        self._ops = ()
        self._kernels = ()
        held, self._held_by = self._held_by, None
        hold, self._hold = self._hold, None
        if held is not None:
            sess, device, pool_id = held
            if sess is _session.session and sess is not None:
                with _session.lock:
                    try:
                        sess.devices[device].graphs.remove(hold)
                    except ValueError:
                        pass
                    if pool_id is not None:
                        sess.devices[device].allocator.release_pool(pool_id)
        if hold is not None:
            hold.clear()  # the graph's aliases go: storages only they held die
        self._ended = False

    def __del__(self) -> None:
        # CUDAGraph::~CUDAGraph calls reset(): the graph's pool is released with it.
        try:
            if getattr(self, "_held_by", None) is not None:
                self.reset()
        except Exception:  # noqa: S110 - at interpreter exit torch or devlab may be gone
            pass

    @entry
    def pool(self) -> tuple[int, int]:
        """The token another capture may share this graph's memory pool by."""
        if not self._ended or self._pool is None:
            raise _torch_check(
                "Called CUDAGraph::pool() without a preceding successful capture.")
        return self._pool

    def instantiate(self) -> None:
        """Nothing to instantiate: the recorded ops are the executable graph."""
        if not self._ended:
            raise _torch_check("capture_end() must have been called before calling instantiate")

    def enable_debug_mode(self) -> None:
        """Accepted; `debug_dump` is what devlab cannot do."""

    @entry
    def debug_dump(self, debug_path: str) -> None:
        raise _errors.not_simulated("CUDAGraph.debug_dump (cudaGraphDebugDotPrint)",
                                    "list the ops with devlab's placement log instead")

    @entry
    def raw_cuda_graph(self) -> int:
        raise _errors.not_simulated("a raw cudaGraph_t", "use replay()")

    @entry
    def raw_cuda_graph_exec(self) -> int:
        raise _errors.not_simulated("a raw cudaGraphExec_t", "use replay()")

    @property
    def recorded_ops(self) -> list[str]:
        """The names of the aten ops a replay runs, in order (devlab's own)."""
        return [op.func.name() for op in self._ops]

    def __repr__(self) -> str:
        state = f"{len(self._ops)} ops on cuda:{self._device}" if self._ended else "empty"
        return f"<simulated CUDAGraph: {state}>"


@entry
def is_current_stream_capturing() -> bool:
    """Whether this thread's current stream on its current simulated GPU is capturing."""
    cap = _session.capture
    return (cap is not None and cap.thread == threading.get_ident()
            and cap.device == _session.current_device())


def _stream_is_capturing(self: Any) -> bool:
    cap = _session.capture
    return cap is not None and cap.device == getattr(self, "device_index", None)


def _host_empty_cache() -> None:
    """torch._C._host_emptyCache: no pinned-memory cache (pinning is a mark here)."""


def _abort_capture() -> None:
    cap = _session.capture
    if cap is not None:
        cap.graph.abort()
        _session.capture = None


_FUNCS: dict[str, Callable[..., Any] | type] = {
    "CUDAGraph": CUDAGraph,
    "graph_pool_handle": graph_pool_handle,
    "is_current_stream_capturing": is_current_stream_capturing,
}


def install(p: Patcher) -> None:
    """torch.cuda's graph API (and torch.cuda.graphs', which make_graphed_callables reads)."""
    import torch.cuda.graphs as torch_graphs

    for mod in (torch.cuda, torch_graphs):
        for name, fn in _FUNCS.items():
            p.set(mod, name, fn)
    p.set(_streams.Stream, "is_capturing", _stream_is_capturing)
    # torch.cuda.graph makes its default capture stream once per process, on the current GPU
    # of the first capture: a simulated stream must not outlive the simulation in torch.
    p.set(torch_graphs.graph, "default_capture_stream", None)
    if not hasattr(torch._C, "_host_emptyCache"):  # a CPU build; torch.cuda.graph calls it
        p.set(torch._C, "_host_emptyCache", _host_empty_cache)
    p.on_restore(_abort_capture)
