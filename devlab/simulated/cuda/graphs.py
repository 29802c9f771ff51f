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

Memory: what the capture allocates is kept alive by the graph until `reset()` or the graph is
gone, and counts in `memory_allocated` (on CUDA, blocks the capture freed return to the graph's
private pool, which counts them as reserved, not allocated: that pool is not modeled; pools
shared through `pool=` are accepted and share nothing). External inputs a capture read are kept
alive too (CUDA would read freed memory). Random ops draw fresh values at each replay from the
CPU's generator, as a GPU's replay draws fresh Philox offsets.

Not simulated: work on another GPU than the capturing one (devlab's own error: how CUDA
orders another device's stream with a capture is not modeled); printing a GPU tensor during
capture is not refused (torch prints with dispatch modes off; on a GPU it is a host sync);
`debug_dump`, the raw cudaGraph handles and `torch.cuda.MemPool` (a private pool of the caching
allocator, which transformers' continuous batching shares among its graphs) are devlab's own
error; a replay is synchronous on
this machine (the modeled clock still queues it).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from devlab.aten_ops import COPY_OPS, SYNC_OPS

from ..core import errors as _errors
from ..core import session as _session
from ..core import workers as _workers
from ..core.errors import entry
from ..core.marks import is_pinned, live_mark, storage_of, tensors_of
from ..core.patcher import Patcher
from ..mode.dispatched import run as _run_dispatched
from . import api as _api

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


_pool_ids = itertools.count(1)


@entry
def graph_pool_handle() -> tuple[int, int]:
    """torch.cuda.graph_pool_handle(): a token graphs share a memory pool by (user-made pools
    have only the second number set, as CUDA's `MemPool::graph_pool_handle`)."""
    return (0, next(_pool_ids))


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
            to_gpu = (_session.current_index() is not None if getattr(_session.tls, "calls", 0)
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
                targets.append((i, o))
                s = storage_of(o)
                if s is not None:
                    self.fresh.add(_key(s))
        self.ops.append(_Op(func, args, dict(kwargs), tuple(targets)))

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

    @entry
    @_api.initializes
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
        cap.rng_state = torch.default_generator.get_state()
        cap.recorder.__enter__()
        self._pool = pool if pool else (next(_pool_ids), 0)
        self._capture = cap
        _session.capture = cap

    @entry
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
        if cap.failed:
            raise cuda_error(INVALIDATED)
        if cap.refused is not None:
            raise _errors.user_error(NotImplementedError(f"capture abandoned: {cap.refused}"))
        self._ops = ops
        self._kernels = kernels
        self._device = cap.device
        self._ended = True
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

    @entry
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
        """Drop the graph and what it keeps alive (its memory returns to the allocator)."""
        self.abort()
        self._ops = ()
        self._kernels = ()
        self._ended = False

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


class MemPool:
    """torch.cuda.MemPool: a memory pool of the caching allocator's own, which the allocator
    model does not have. Refused by name (torch's CPU build says only "Tried to instantiate
    dummy base class MemPool"); transformers' continuous batching asks for one to share among
    its CUDA graphs, unless `ContinuousBatchingConfig(use_cuda_graph=False)`."""

    @entry
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        raise _errors.not_simulated(
            "torch.cuda.MemPool (a private pool of the caching allocator)",
            "allocate from the default pool; CUDA graphs share memory through "
            "torch.cuda.graph_pool_handle() (for transformers' generate_batch: "
            "ContinuousBatchingConfig(use_cuda_graph=False))")


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
    for mod in (torch.cuda, torch.cuda.memory):
        p.set(mod, "MemPool", MemPool)
    p.set(_api.Stream, "is_capturing", _stream_is_capturing)
    # torch.cuda.graph makes its default capture stream once per process, on the current GPU
    # of the first capture: a simulated stream must not outlive the simulation in torch.
    p.set(torch_graphs.graph, "default_capture_stream", None)
    if not hasattr(torch._C, "_host_emptyCache"):  # a CPU build; torch.cuda.graph calls it
        p.set(torch._C, "_host_emptyCache", _host_empty_cache)
    p.on_restore(_abort_capture)
