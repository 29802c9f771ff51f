"""The TorchFunctionMode that makes CPU tensors behave as tensors on simulated GPUs.

It sees every torch call made in a routed thread *before* torch runs it, which is where a
`device="cuda:1"` can still become a CPU call. Calls that need more than the device rule go to
their handler (moves, autograd, asynchronous launch: `HANDLERS`, which start() fills, as the
handlers build on this module); factories given a device, or under a default device naming a
GPU, are placed there (`_factories`); every other op runs where its tensors are (`_ops.run`).

Torch's function modes are per-thread: `push_routing`/`pop_routing` put the mode on this
thread's stack and take it off, `routing()` routes a block, `suspended()` takes the mode off for
one (`threads` routes every thread started while simulating).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, _pop_mode, _push_mode

from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import hazards as _hazards
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base import storage_marks as _marks
from devlab.engine.simulated.base.storage_marks import MARK, STORAGE_ERRORS, mark_of
from devlab.engine.simulated.mode import device_rule as _ops
from devlab.engine.simulated.mode import factories as _factories

Tensor = torch.Tensor
_MethodWrapper = type(Tensor.grad.__get__)  # what torch passes for an attribute getter
_HigherOrder = torch._ops.HigherOrderOperator
_keyset = torch._ops._compute_keyset


def _passthrough(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Calls without tensors: straight through (no device to set, nothing to mark)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    try:
        return func(*args, **kwargs)
    except Exception as e:
        _errors.torch_error(e)
        raise


def _higher_order(func: Any, args: tuple, kwargs: dict) -> Any:
    """A higher-order operator (flex_attention, cond, scan...) is Python code around ops and
    autograd Functions: it runs with the simulation's mode pushed again, as HigherOrderOperator
    runs after its override check, so each op inside is placed and its outputs marked as it
    returns. Marked only after the whole call, an autograd Function's saved outputs read `cpu`
    while it saves them (activation checkpointing records that, and finds `cuda:N` when it
    recomputes). The ops inside charge a modeled clock, so the call itself charges nothing."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    index, host, _ = _ops.placement(func, args, kwargs)
    if index is not None:
        _workers.wait(index)
    key = _keyset(args, kwargs, func.non_fallthrough_keys).highestPriorityTypeId()
    with routing():
        out = _ops.call(index, func.dispatch, (key, *args), kwargs)
    if index is not None:
        _marks.mark_outputs(out, index, host)
    return out


# The mode's handler table: calls that need more than the device rule. start() fills it from
# the handler modules (`fill_handlers`), which build on this one; the calls here need nothing.
HANDLERS: dict[Callable, Callable] = {}
_PASSTHROUGH: dict[Callable, Callable] = {
    # Calls without tensors that every training step makes: straight through.
    torch._C._set_grad_enabled: _passthrough,
}
for _name in ("_record_function_enter_new", "_record_function_exit"):  # profiler ranges
    _op = getattr(torch.ops.profiler, _name, None)
    for _f in (_op, getattr(_op, "_RecordFunction", None), getattr(_op, "default", None)):
        if _f is not None:
            _PASSTHROUGH[_f] = _passthrough


def fill_handlers(*tables: dict[Callable, Callable]) -> None:
    """Make the handler table `tables`' entries (a later table's win), then the passthroughs."""
    merged: dict[Callable, Callable] = {}
    for table in (*tables, _PASSTHROUGH):
        merged.update(table)
    if merged != HANDLERS:
        HANDLERS.clear()
        HANDLERS.update(merged)
    _plain_calls.clear()  # the fast path's per-call decisions read HANDLERS


class SimulationMode(TorchFunctionMode):
    """Routes simulated-GPU work to the CPU. Each routed thread has one on its stack; it passes
    every call through once the simulation it was made for has stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.session = _session.session

    @property
    def inert(self) -> bool:
        return self.session is None or self.session is not _session.session

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        if kwargs is None:
            kwargs = {}
        sess = self.session
        if sess is not _session.session or sess is None:
            return func(*args, **kwargs)
        try:
            if type(func) is _MethodWrapper:
                # An attribute read (`.shape`, `.grad`: the tensor alone) or write (`p.data =
                # t`, `p.grad = g`): metadata, known even while the tensor's op is queued, and
                # no kernel; a write may name another device, as on CUDA. Only a read's tensor
                # result may need a mark (a gradient the C++ engine made). Inline, as most
                # calls are these (and `func.__name__` would build a string each time).
                try:
                    out = func(*args)
                except Exception as e:
                    _errors.torch_error(e)
                    raise
                if len(args) == 1 and isinstance(out, Tensor) and mark_of(out) is None:
                    owner = mark_of(args[0])
                    if owner is not None:
                        _marks.mark_outputs(out, owner.index)
                return out
            # The host's time stops at the wall clock's pace while the call is inside the
            # simulation (Note [The host's modeled time] in gpu_model/modeled_clock.py); an op that runs
            # on the host gives its time back (`_ops.run`).
            charges = sess.charges
            modeled = charges is not _NO_CHARGES  # NoCharges' enter and leave do nothing
            if modeled:
                charges.enter()
            try:
                if fast_path:
                    out = _fast(sess, charges, func, args, kwargs)
                    if out is not _MISS:
                        modeled = False  # the fast path's charge left (call_and_leave)
                        return out
                if _hazards.armed and func not in _METADATA:
                    _check_host_reads(func, args, kwargs)
                h = HANDLERS.get(func)
                if h is not None:
                    return h(func, args, kwargs)
                if kwargs:
                    if kwargs.get("pin_memory"):
                        return _factories.pinned_factory(func, args, kwargs)
                    d = kwargs.get("device")
                    if d is not None:
                        return _factories.place(func, args, kwargs, d)
                if func in _factories.CONSTRUCTORS:
                    d = _factories.default_device()
                    if d is not None:
                        return _factories.place(func, args, kwargs, d)
                if isinstance(func, _HigherOrder):
                    return _higher_order(func, args, kwargs)
                return _ops.run(func, args, kwargs)
            finally:
                if modeled:
                    charges.leave()
        except Exception as e:
            # The user's call entered the simulation here: an error raised in torch's name
            # leaves without the simulation's frames.
            _errors.drop_own_frames(e)
            raise
        except BaseException as e:  # an interrupt: nothing of the call stays alive
            _errors.let_go(e)
            args = kwargs = None  # noqa: F841
            raise


# Note [The mode's fast path]
# Most calls a learner's loop makes are one op on tensors of one simulated GPU, with nothing
# else in play: `_fast` runs those as the full path (`_ops.run`) would, step for step (the
# call, without the `tls.index` and `tls.calls` nothing inside it reads: Note [What the fast
# path's call leaves out]; `mark_outputs`, `note_streams` once a stream was used,
# `take_workspace`, the charge), without the full path's questions, which it answers
# once per call (`_plain_calls`) or from a few module flags. A sized factory given a simulated
# GPU (`torch.empty(1000, device="cuda")`, `torch.zeros`, `ones`, `full`, `rand`, `randn`) is
# run as `_factories.place` runs it (`_fast_factory`, `_factories.fast_place`), and a tensor's
# free is the mark's callback on either path. Anything unusual sends the call down the full
# path, before anything has happened: a handler's call, another factory, a higher-order
# operator or a keyword naming a device (`_plain_calls`); for a factory, no `device=`, a
# keyword beside device, dtype and requires_grad, or a device that is not a simulated GPU
# named by a str or torch.device; a pending non-blocking copy (`hazards.armed`); an op's GPU
# on a non-default current stream (`"stream"`; after a stream was used, an op on the default
# stream takes the fast path and notes its stream as the full path does); a CUDA graph's
# capture; queued work on a worker or a worker's error; another function mode below the
# simulation's (`with torch.device(...)`), a dispatch mode other than the placement log alone
# (`Marking`, a user's mode, the log beside another: See Note [The fast path under the log]),
# saved-tensor hooks; and among the tensors, a subclass, a host tensor, a tensor without a
# storage, or two GPUs. `fallbacks`, when a test sets it to a Counter, counts each call taken
# (`"fast"`, `"fast factory"`) and each reason to fall back (tests/test_simulated_fast_path.py);
# `fast_path = False` sends every call down the full path (the equivalence test, and the
# benchmark's before-and-after in one run: benchmarks/op_cost.py).

# Note [What the fast path's call leaves out]
# The full path's call (`device_rule.call`) sets this thread's `tls.index` (the GPU the op
# runs on: `current_index()`) and `tls.calls` (calls in progress) around `func`, for what runs
# inside the call and asks: a dispatch mode (the placement log, `Marking` in
# dispatch_devices.py, cuFFT's plan watch, a user's mode reading `current_index()`), a CUDA
# graph's capture (cuda/graphs.py), a backward pass's copies (autograd.py, under a handler).
# Those are all that read them
# (`grep -rn "tls.index\|tls.calls\|current_index\|calls_in_progress"`), and the fast path
# runs a call without them only where none of them can run inside it: no dispatch mode on
# the stack (under the placement log it makes the full path's call: Note [The fast path under
# the log]), no capture, no saved-tensor hooks, no function mode below, not a handler's call
# (backward and grad are), and torch has taken the simulation's own mode off the stack while
# `func` runs, so Python inside it (a torch function written in Python, autocast's CUDA
# policy in cuda/amp.py, a weakref callback, the garbage collector) reaches none of devlab's
# routing. The marking, the workspace and the charge after the call read neither (the full
# path restores both before them). So the fast path does not set them: four thread-local
# reads and writes per op. The one reader left out is contrived: the Python implementation of
# a user's custom op (torch.library) asking `current_index()` from inside the op reads the
# enclosing call's GPU (None at the top level) where the full path gives the op's own.

# Note [The fast path under the log]
# The placement log is a dispatch mode: torch runs its `__torch_dispatch__` for each aten op
# inside the call, and it runs the op with `dispatch_devices.run`, which reads this thread's
# `tls.calls` (a call the function mode placed is in progress: its GPU stands, nothing inside
# is placed or marked again) and `tls.index` (that GPU, the log line's device), then records a
# tuple and writes its line. It reads nothing else of the simulation's, asks nothing of the
# full path's questions and changes no state the fast path reads. So with the log alone on
# this thread's dispatch mode stack (`_recorder_alone`: one mode, of a class in `RECORDERS`,
# exactly; the log adds its own, and a subclass, which may do more, is not it), the fast path
# takes the call, and makes it as the full path does: `device_rule.call`, which sets both
# around `func` (the factory's `fast_place` makes that call already). Everything else is the
# full path's step for step, as without the log: the full path, too, runs a small op under the
# log as any op (an asynchronous launch stays on the host under a dispatch mode:
# `async_launch.carried_state`), marks after the call and charges the same kernel; the log's
# own Python runs inside the call, where a modeled host's time is the model's. Any other
# dispatch mode (`Marking`, cuFFT's plan watch, FakeTensorMode, a user's), or the log beside
# one, takes the full path ("mode or hook"). tests/test_simulated_fast_path.py checks that a
# logged op takes the fast path and that random logged programs give the same lines, records,
# values, memory figures and modeled times with the fast path on and off.

fast_path = True
fallbacks: Any = None  # a collections.Counter while a test counts
_MISS = object()
_Parameter = torch.nn.Parameter
_tf_stack_len = torch._C._len_torch_function_stack
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_dispatch_mode_at = torch._C._get_dispatch_stack_at
_saved_tensor_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_NO_CHARGES = _session.NO_CHARGES
_mark_outputs = _marks.mark_outputs
_recount = _marks.recount
_take_workspace = _ops.take_workspace
_call = _ops.call
_note_streams = _ops.note_streams
_current_stream = _session.current_stream
_runs_cublas = _ops._runs_cublas  # func -> whether it runs cuBLAS, as take_workspace learns it
# func -> whether the fast path may take it: True (no handler, not a factory, not a
# higher-order op), False, or the handler's `plain_when(args, kwargs)`, which says when the
# handler would run the call as any op runs (async_launch's small products)
_plain_calls: dict[Callable, Any] = {}
_FACTORY = object()  # ... or a sized factory: `_fast_factory` decides


# The dispatch modes under which the fast path still runs a call, each alone on the stack: a
# mode that runs every op it sees with `dispatch_devices.run` and only records (the placement
# log adds its class: core/placement_log.py). Its exact class: a subclass may do more.
# See Note [The fast path under the log].
RECORDERS: set[type] = set()


def _recorder_alone() -> bool:
    """Whether this thread's dispatch mode stack is one mode of a class in `RECORDERS`."""
    return _dispatch_stack_len() == 1 and type(_dispatch_mode_at(0)) in RECORDERS


def _plain(func: Callable) -> Any:
    h = HANDLERS.get(func)
    if h is not None:
        plain = getattr(h, "plain_when", False)
    elif func in _factories.FAST:
        plain = _FACTORY
    else:
        plain = func not in _factories.CONSTRUCTORS and not isinstance(func, _HigherOrder)
    _plain_calls[func] = plain
    return plain


def _fast_factory(sess: Any, func: Callable, args: tuple, kwargs: dict) -> Any:
    """A sized factory given a simulated GPU (`torch.empty(n, device="cuda")`) as the full
    path's `_factories.place` runs it, or `_MISS` (nothing done): the fast path's checks, then
    `_factories.fast_place`'s own."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if "device" not in kwargs or "pin_memory" in kwargs:
        return _miss("handler")  # a default device's, a pinned one's: the full path's
    if _session.at_first_use is not None:  # CUDA_VISIBLE_DEVICES and settings set after the
        return _miss("first use")  # start count until here: the full path reads them again
    if _session.capture is not None:
        return _miss("capture")
    if _hazards.armed:  # a factory's stream is the allocator's business: no note of it
        return _miss("hazards")
    if _workers._pending_total or _workers._alert:
        return _miss("queued work")
    if (_tf_stack_len() or _saved_tensor_hooks(False) is not None
            or (_dispatch_stack_len() and not _recorder_alone())):
        return _miss("mode or hook")
    out = _factories.fast_place(sess, func, args, kwargs)
    if type(out) is str:
        return _miss(out)
    if fallbacks is not None:
        fallbacks["fast factory"] += 1
    return out


def _miss(reason: str) -> object:
    if fallbacks is not None:
        fallbacks[reason] += 1
    return _MISS


def _fast(sess: Any, charges: Any, func: Callable, args: tuple, kwargs: dict) -> Any:
    """`func(*args, **kwargs)` on its tensors' simulated GPU as `_ops.run` runs it, or `_MISS`
    (nothing done) where the call needs the full path (Note [The mode's fast path]); `charges`
    is the session's."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    plain = _plain_calls.get(func)
    if plain is None:
        plain = _plain(func)
    if plain is not True:
        if plain is _FACTORY:
            out = _fast_factory(sess, func, args, kwargs)
            if out is not _MISS and charges is not _NO_CHARGES:
                charges.leave()  # as an op's charge leaves (the mode's `leave`)
            return out
        if plain is False or not plain(args, kwargs):
            return _miss("handler")
    if kwargs and ("device" in kwargs or "pin_memory" in kwargs):
        return _miss("device keyword")
    if _session.capture is not None:
        return _miss("capture")
    if _hazards.armed:
        return _miss("hazards")
    if _workers._pending_total or _workers._alert:
        return _miss("queued work")
    if _tf_stack_len() or _saved_tensor_hooks(False) is not None:
        return _miss("mode or hook")
    # a dispatch mode: only the placement log, alone (See Note [The fast path under the log])
    logged = _dispatch_stack_len()
    if logged and not _recorder_alone():
        return _miss("mode or hook")
    index = None
    for a in (*args, *kwargs.values()) if kwargs else args:
        ta = type(a)
        if ta is Tensor or ta is _Parameter:
            try:
                m = getattr(a.untyped_storage(), MARK, None)
            except STORAGE_ERRORS:
                return _miss("no storage")
            if m is None or m.session is not sess:
                return _miss("host tensor")
            if index is None:
                index = m.index
            elif m.index != index:
                return _miss("devices")
        elif isinstance(a, (list, tuple)):
            # the same look as above, written out again: a function call per tensor would
            # cost the hot path more than the look itself (Note [The mode's fast path])
            for x in a:
                tx = type(x)
                if tx is Tensor or tx is _Parameter:
                    try:
                        m = getattr(x.untyped_storage(), MARK, None)
                    except STORAGE_ERRORS:
                        return _miss("no storage")
                    if m is None or m.session is not sess:
                        return _miss("host tensor")
                    if index is None:
                        index = m.index
                    elif m.index != index:
                        return _miss("devices")
                elif isinstance(x, Tensor):
                    return _miss("subclass")
        elif isinstance(a, Tensor):
            return _miss("subclass")
    if index is None:
        return _miss("no tensor")
    tracking = _hazards.tracking  # a stream was used: the op notes its stream (note_streams)
    if tracking and _current_stream(index):
        return _miss("stream")
    if fallbacks is not None:
        fallbacks["fast"] += 1
    if logged:  # the log's dispatch reads the call's GPU and that a call is in progress
        out = _call(index, func, args, kwargs)
    else:
        # _ops.call, inline, without its `tls.index` and `tls.calls`: nothing the call can run
        # reads them (See Note [What the fast path's call leaves out])
        try:
            out = func(*args, **kwargs)
        except Exception as e:
            _errors.torch_error(e)
            raise
    # mark_outputs, inline for one plain tensor (no host inputs to alias)
    to = type(out)
    if to is Tensor or to is _Parameter:
        try:
            s = out.untyped_storage()
        except STORAGE_ERRORS:
            fresh = _mark_outputs(out, index, None)
        else:
            m = getattr(s, MARK, None)
            if m is None or m.session is not sess:
                _marks.mark_one(s, index)  # by the module: where a test interrupts a mark
                fresh = True
            else:
                _recount(s, m)
                fresh = False
    else:
        fresh = _mark_outputs(out, index, None)
    if tracking:
        _note_streams(func, index, args, kwargs)
    if _runs_cublas.get(func) is not False:  # take_workspace asks only of products
        _take_workspace(func, index)
    if charges is not _NO_CHARGES:  # without a model the session's NoCharges charges nothing
        # the charge and the mode's `leave` at once: the op's GPU is on its default stream
        charges.call_and_leave(func, args, kwargs, out, index, fresh)
    return out


# Calls that read a tensor's metadata, not its values: no read of a copy still pending.
_METADATA = frozenset({
    Tensor.size, Tensor.dim, Tensor.numel, Tensor.stride, Tensor.is_pinned, Tensor.data_ptr,
    Tensor.untyped_storage, Tensor.element_size, Tensor.storage_offset, Tensor.is_contiguous,
    Tensor.__len__, Tensor.record_stream, Tensor.get_device, Tensor.nelement,
    Tensor.__hash__, Tensor.is_floating_point, Tensor.is_complex,
})


# Copies to a GPU queue on a stream, behind the pending copy when it is the same stream: no host
# read (a pinned staging buffer passed on to another GPU is correct code).
_MOVES = frozenset({Tensor.to, Tensor.cuda})


def _check_host_reads(func: Callable, args: tuple, kwargs: dict) -> None:
    """A call is about to read these tensors: `hazards` checks the host storages a
    non-blocking copy may still be writing (only while one is pending)."""
    if func in _MOVES or (func is Tensor.copy_ and args and isinstance(args[0], Tensor)
                          and _marks.index_of(args[0]) is not None):
        return
    storages = []
    for t in _marks.tensors_of(args, kwargs):
        try:
            s = t.untyped_storage()
        except Exception:  # noqa: S112 - a tensor without storage reads no pending copy
            continue
        if getattr(s, _hazards.PENDING, None) is not None:
            storages.append(s)
    if storages:
        _hazards.check_read(storages)


def push_routing() -> SimulationMode:
    """Route this thread: put the simulation's mode on its stack (undo with pop_routing)."""
    mode = SimulationMode()
    _push_mode(mode)
    _session.tls.routed = mode.session
    return mode


def remove_mode(mode: TorchFunctionMode) -> bool:
    """Take `mode` off this thread's function mode stack, keeping the modes above it."""
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


def _restore(stack: list) -> None:
    """Make this thread's function mode stack `stack` again (bottom first), keeping any mode
    pushed on top meanwhile above it."""
    extra = []
    while torch._C._len_torch_function_stack():
        m = _pop_mode()
        if not any(m is s for s in stack):
            extra.append(m)
    for m in stack:
        _push_mode(m)
    for m in reversed(extra):
        _push_mode(m)


def pop_routing(mode: SimulationMode) -> None:
    """Undo push_routing."""
    remove_mode(mode)
    _session.tls.__dict__.pop("routed", None)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Take this thread's simulation modes off its stack for the block, and put them back in
    their places after (host work timed as plain PyTorch runs it)."""
    functions = torch.overrides._get_current_function_mode_stack()
    for m in functions:
        if isinstance(m, SimulationMode):
            remove_mode(m)
    try:
        yield
    finally:
        _restore(functions)


@contextlib.contextmanager
def routing() -> Iterator[None]:
    """Route this thread's work while inside: nothing to do if the running simulation's mode is
    on its stack; else its mode for the block. Also inside the simulation's own handling of a
    call, where torch has taken the mode off the stack (torch's code that runs there, a tensor
    subclass's dispatch making DTensor's RNG tracker, moves tensors to simulated GPUs), and
    where a dispatch mode running an op has switched torch functions off (`_dispatched.run`)."""
    if torch._C._is_torch_function_all_disabled():
        with torch._C._EnableTorchFunction(), routing():
            yield
        return
    if any(isinstance(m, SimulationMode) and not m.inert
           for m in torch.overrides._get_current_function_mode_stack()):
        yield
        return
    before = _session.tls.__dict__.get("routed")
    mode = push_routing()
    try:
        yield
    finally:
        remove_mode(mode)
        if before is None:
            _session.tls.__dict__.pop("routed", None)
        else:
            _session.tls.routed = before
