"""The TorchFunctionMode that makes CPU tensors behave as tensors on simulated GPUs.

It sees every torch call made in the thread that started the simulation (modes are
per-thread) *before* torch runs it, which is where a `device="cuda:1"` can still be turned into
a CPU call. For each op it works out the simulated device the op runs on (from a `device=`
argument, the default device, or the marks of its tensors), refuses mixed devices with
PyTorch's own wording, runs the op on the CPU with `current_index()` set, and marks the fresh
output storages with the op's device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._device as _torch_device
from torch.overrides import TorchFunctionMode, _pop_mode, _push_mode

from . import _state, _workers
from ._state import MARK, mark_storage, mark_storages, resized, tls

Tensor = torch.Tensor
_DisableTF = torch._C.DisableTorchFunction
_tf_stack_len = torch._C._len_torch_function_stack
_MethodWrapper = type(Tensor.grad.__get__)  # what torch passes for an attribute getter

INVALID_ORDINAL = (
    "CUDA error: invalid device ordinal\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)

# What `device=` resolves to. _OTHER: a device torch handles itself (meta, ...).
_CPU = None
_OTHER = -1


def invalid_ordinal() -> Exception:
    err = getattr(torch, "AcceleratorError", RuntimeError)
    return _state.user_error(err(INVALID_ORDINAL))


def current_device() -> int:
    """The thread's current simulated device (torch.cuda.current_device())."""
    return getattr(tls, "device", 0)


def checked_index(index: int) -> int:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    sess = _state.session
    if sess is None or not 0 <= index < sess.count:
        raise invalid_ordinal()
    return index


def resolve(device: Any) -> int | None:
    """A `device=` value -> simulated index, _CPU (None) or _OTHER."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if isinstance(device, torch.device):
        t, i = device.type, device.index
    elif isinstance(device, str):
        if device == "cpu":
            return _CPU
        if device == "cuda":
            return checked_index(current_device())
        d = torch.device(device)
        t, i = d.type, d.index
    elif isinstance(device, int) and not isinstance(device, bool):
        # torch reads a bare integer device as an index on the accelerator, here CUDA.
        t, i = "cuda", device
    else:
        return _OTHER
    if t == "cpu":
        return _CPU
    if t != "cuda":
        return _OTHER
    return checked_index(current_device() if i is None else i)


_storage = _state.storage_of
_PLAIN = _state.PLAIN


def mark_out(out: Any, index: int, exclude: list | None = None) -> None:
    """Mark the fresh storages among an op's outputs as living on simulated GPU `index`.

    Storages already marked are views or in-place results; `exclude` holds the storages of
    unmarked (CPU) inputs, which an output may alias (e.g. a broadcast CPU scalar).
    """
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if isinstance(out, Tensor):
        if type(out) in _PLAIN and not _tf_stack_len():
            try:
                s = out.untyped_storage()
            except _state.STORAGE_ERRORS:
                _no_storage(out)
                return
        else:
            s = _storage(out)
            if s is None:
                _no_storage(out)
                return
        m = getattr(s, MARK, None)
        if m is not None and m.session is _state.session:
            n = s.nbytes()
            if n > m.nbytes or n <= m.nbytes - 512:
                resized(s, m)
            return
        if exclude:
            for e in exclude:
                if e is s:
                    return
        mark_storage(s, index)
    elif isinstance(out, (tuple, list)):
        sess = _state.session
        fresh: list[torch.UntypedStorage] = []
        for o in out:
            if not isinstance(o, Tensor):
                continue
            s = _storage(o)
            if s is None:
                _no_storage(o)
                continue
            m = getattr(s, MARK, None)
            if m is not None and m.session is sess:
                if s.nbytes() != m.nbytes:
                    resized(s, m)
                continue
            if exclude and any(s is e for e in exclude):
                continue
            if not any(s is f for f in fresh):
                fresh.append(s)
        if fresh:
            mark_storages(fresh, index)


def _no_storage(t: Tensor) -> None:
    """A storage-less result (sparse, nested) cannot carry a mark: refuse rather than let it
    quietly land on the CPU."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if t.layout is not torch.strided or t.is_nested:
        raise _state.user_error(NotImplementedError(
            f"devlab's simulated GPUs hold dense (strided) tensors only, not {t.layout} "
            "tensors; keep this tensor on the CPU (or stop the simulation)"))


def _run(func: Callable, args: tuple, kwargs: dict) -> Any:
    """func(*args, **kwargs), torch's own errors marked (_state.torch_error)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    try:
        return func(*args, **kwargs)
    except Exception as e:
        _state.torch_error(e)
        raise


def _call_on(index: int | None, func: Callable, args: tuple, kwargs: dict) -> Any:
    """Run func with current_index() == index in this thread."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    prev = getattr(tls, "index", None)
    tls.index = index
    try:
        return func(*args, **kwargs)
    except Exception as e:
        _state.torch_error(e)
        raise
    finally:
        tls.index = prev


def _mixed_error(common: int, other: str) -> RuntimeError:
    return _state.user_error(RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"cuda:{common} and {other}!"
    ))


def _tensors(args: tuple, kwargs: dict) -> list[Tensor]:
    """The tensors among an op's arguments (one level into lists and tuples)."""
    ts: list[Tensor] = []
    for a in args:
        if isinstance(a, Tensor):
            ts.append(a)
        elif isinstance(a, (list, tuple)):
            ts.extend(x for x in a if isinstance(x, Tensor))
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, Tensor):
                ts.append(a)
            elif isinstance(a, (list, tuple)):
                ts.extend(x for x in a if isinstance(x, Tensor))
    return ts


def _nonscalar(t: Tensor) -> bool:
    if type(t) in _PLAIN:
        return t.dim() != 0
    with _DisableTF():
        return t.dim() != 0


def _raise_mixed(ts: list[Tensor]) -> None:
    """Build PyTorch's TensorIterator message: the first GPU, then the first misfit."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    devs: list[tuple[int | None, Tensor]] = []
    for t in ts:
        s = _storage(t)
        m = _state.storage_mark(s) if s is not None else None
        devs.append((m.index if m is not None else None, t))
    common = next(i for i, _ in devs if i is not None)
    for i, t in devs:
        if i is None:
            if _nonscalar(t):
                raise _mixed_error(common, str(t.device))
        elif i != common:
            raise _mixed_error(common, f"cuda:{i}")


# Ops allowed to mix devices, as on real CUDA: copies, indexing with CPU indices, and
# attribute setters such as `p.data = t` (what Module._apply does across devices).
# Queries that only compare metadata (`_has_compatible_shallow_copy_type` in Module._apply)
# may look at tensors of two devices too.
_MIXED_OK_NAMES = {"__set__", "__get__", "__setitem__", "__getitem__", "index_put_",
                   "index_put", "set_", "_make_subclass", "backward", "copy_",
                   "_has_compatible_shallow_copy_type", "is_same_size", "is_set_to",
                   "swap_tensors", "_version", "register_hook"}


def _op_device(func: Callable, args: tuple, kwargs: dict) -> tuple[int | None, list | None]:
    """(simulated device the op runs on or None, storages of its unmarked inputs)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    sess = _state.session
    common = None
    bad = False
    cpu_in: list | None = None
    for t in _tensors(args, kwargs):
        try:
            if type(t) in _PLAIN:
                s = t.untyped_storage()
            else:  # past the subclass's own __torch_function__ (e.g. lazy parameters)
                with _DisableTF():
                    s = t.untyped_storage()
        except _state.STORAGE_ERRORS:
            continue
        m = getattr(s, MARK, None)
        if m is not None and m.session is sess:
            if common is None:
                common = m.index
            elif m.index != common:
                bad = True
        else:
            if cpu_in is None:
                cpu_in = [s]
            else:
                cpu_in.append(s)
            if not bad and _nonscalar(t):
                bad = True
    if common is None:
        return None, None
    if bad:
        name = getattr(func, "__name__", "")
        if name not in _MIXED_OK_NAMES:
            _raise_mixed(_tensors(args, kwargs))
    return common, cpu_in


# --- handlers for calls that need more than "same device in, same device out" -------------

def _split_copy(args: tuple, kwargs: dict) -> tuple[tuple, dict, bool]:
    """Take `copy` out of Tensor.to's arguments (torch's _parse_to refuses it)."""
    copy = bool(kwargs.pop("copy", False)) if "copy" in kwargs else False
    bools = [i for i, a in enumerate(args) if isinstance(a, bool)]
    if len(bools) == 2:  # to(device, dtype, non_blocking, copy) / to(dtype, non_blocking, copy)
        copy = args[bools[1]]
        args = args[: bools[1]] + args[bools[1] + 1:]
    return args, kwargs, copy


def _copy_to(func: Callable, t: Tensor, target: int | None, dtype: Any = None,
             non_blocking: bool = False, memory_format: Any = None) -> Tensor:
    """A fresh copy of t as a tensor of `target` (a host<->device or device<->device copy).

    Runs as one `aten::_to_copy` with current_index() == target, so a placement log sees a
    copy from a CPU tensor onto the simulated device (or, target None, back to the host).
    """
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    src = _state.index_of(t)
    if src is not None:
        _workers.wait(src)
    if target is not None:
        _workers.wait(target)
    kw: dict[str, Any] = {"device": "cpu", "dtype": dtype or t.dtype, "copy": True,
                          "non_blocking": non_blocking}
    if memory_format is not None:
        kw["memory_format"] = memory_format
    out = _call_on(target, func, (t,), kw)
    if target is not None:
        mark_out(out, target)
    return out


def _h_to(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    self = args[0]
    rest, kw_rest, copy = _split_copy(args[1:], dict(kwargs))
    other = rest[0] if rest and isinstance(rest[0], Tensor) else kw_rest.get("other")
    if rest and isinstance(rest[0], int) and not isinstance(rest[0], bool):
        rest = (torch.device("cuda", rest[0]),) + rest[1:]
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*rest, **kw_rest)
    src = _state.index_of(self)
    if isinstance(other, Tensor):
        target = _state.index_of(other)
    elif device is None:
        target = src
    else:
        target = resolve(device)
        if target == _OTHER:  # meta and other devices: torch's own business
            if src is not None:
                _workers.wait(src)
            return _run(func, args, kwargs)
    if target == src and not copy:
        kw: dict[str, Any] = {"dtype": dtype or self.dtype, "non_blocking": non_blocking}
        if memory_format is not None:
            kw["memory_format"] = memory_format
        out = _call_on(src, func, (self, "cpu"), kw) if src is not None else _run(func, (self, "cpu"), kw)
        if src is not None and out is not self:
            mark_out(out, src)
        return out
    return _copy_to(func, self, target, dtype, non_blocking, memory_format)


def _h_cuda(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    self = args[0]
    device = args[1] if len(args) > 1 else kwargs.get("device")
    non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
    memory_format = kwargs.get("memory_format")
    if device is None:
        target = checked_index(current_device())
    else:
        target = resolve(device)
        if target is None or target == _OTHER:
            raise _state.user_error(RuntimeError("Invalid device, must be cuda device"))
    if _state.index_of(self) == target:
        return self
    return _copy_to(torch.Tensor.to, self, target, None, non_blocking, memory_format)


def _h_cpu(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    self = args[0]
    if _state.index_of(self) is None:
        return _run(func, args, kwargs)
    return _copy_to(torch.Tensor.to, self, None, None, False, kwargs.get("memory_format"))


def _h_tolist(func: Callable, args: tuple, kwargs: dict) -> Any:
    # As on CUDA, the values cross to the host first: one copy the placement log can see.
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    self = args[0]
    if _state.index_of(self) is None:
        return _run(func, args, kwargs)
    return _h_cpu(Tensor.cpu, (self,), {}).tolist()


def _h_copy_(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    dst, src = args[0], args[1] if len(args) > 1 else kwargs["src"]
    i_dst, i_src = _state.index_of(dst), _state.index_of(src)
    if i_src is not None:
        _workers.wait(i_src)
    if i_dst is not None:
        _workers.wait(i_dst)
    return _call_on(i_dst, func, args, kwargs)


def _h_numpy(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    i = _state.index_of(args[0])
    if i is not None:
        raise _state.user_error(TypeError(
            f"can't convert cuda:{i} device type tensor to numpy. Use Tensor.cpu() to copy "
            "the tensor to host memory first."
        ))
    return _run(func, args, kwargs)


def _h_type(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    out = _h_generic(func, args, kwargs)
    if isinstance(out, str) and _state.index_of(args[0]) is not None:
        return out.replace("torch.", "torch.cuda.", 1)
    return out


def _h_pin_memory(func: Callable, args: tuple, kwargs: dict) -> Any:
    # Pinned host memory exists only with a CUDA runtime; a simulated machine has the page-
    # locking for free (host and "device" are the same memory), so pinning is a copy.
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    self = args[0]
    if _state.index_of(self) is not None:
        raise _state.user_error(RuntimeError(
            f"cannot pin '{self.type().replace('torch.', 'torch.cuda.', 1)}' "
            "only dense CPU tensors can be pinned"))
    return self.clone()


def _h_as_tensor(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    data = args[0] if args else kwargs.get("data", kwargs.get("obj"))
    device = kwargs.get("device")
    if device is None and _torch_device.CURRENT_DEVICE is not None:
        device = _torch_device.CURRENT_DEVICE
    target = _state.index_of(data) if device is None and isinstance(data, Tensor) else (
        resolve(device) if device is not None else None)
    if target is None or target == _OTHER:
        if isinstance(data, Tensor) and _state.index_of(data) is not None and target is None \
                and device is not None:
            return _copy_to(torch.Tensor.to, data, None, kwargs.get("dtype"))
        return _h_generic(func, args, kwargs)
    kw = dict(kwargs, device="cpu")
    if isinstance(data, Tensor):
        if _state.index_of(data) == target:
            return _call_on(target, func, args, kw)
        return _copy_to(torch.Tensor.to, data, target, kwargs.get("dtype"))
    out = _call_on(target, func, args, kw)
    if not isinstance(data, (list, tuple, int, float, bool, complex)):
        # numpy arrays and buffers are shared by as_tensor on the CPU; on a GPU they're copied.
        out = out.clone()
    mark_out(out, target)
    return out


def _h_autograd_grad(func: Callable, args: tuple, kwargs: dict) -> Any:
    # Gradients come from the C++ engine unmarked; each belongs on its input's device.
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
    out = _grad_under_mode(args, kwargs)
    if out is None:
        out = _run(func, args, kwargs)
    ins = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs or ())
    for inp, g in zip(ins, out, strict=False):
        if isinstance(g, Tensor):
            i = _state.index_of(inp)
            if i is not None:
                mark_out(g, i)
    return out


def _grad_under_mode(args: tuple, kwargs: dict) -> tuple | None:
    """torch.autograd.grad after its override check, with this mode on the stack (see
    _backward_under_mode); None if the call is not a plain one."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    mode = active_mode
    ag = torch.autograd
    make_grads = getattr(ag, "_make_grads", None)
    to_tuple = getattr(ag, "_tensor_or_tensors_to_tuple", None)
    engine = getattr(getattr(ag, "graph", None), "_engine_run_backward", None)
    known = {"grad_outputs", "retain_graph", "create_graph", "only_inputs", "allow_unused",
             "is_grads_batched", "materialize_grads"}
    if (mode is None or make_grads is None or to_tuple is None or engine is None
            or len(args) != 2 or not set(kwargs) <= known or kwargs.get("is_grads_batched")):
        return None
    outputs, inputs = args
    outputs = (outputs,) if isinstance(outputs, Tensor) else tuple(outputs)
    inputs = (inputs,) if isinstance(inputs, Tensor) else inputs
    if not isinstance(inputs, (list, tuple)):
        return None
    inputs = tuple(inputs)
    if not inputs or not all(isinstance(t, Tensor) for t in outputs + inputs):
        return None
    materialize = bool(kwargs.get("materialize_grads", False))
    allow_unused = kwargs.get("allow_unused")
    if allow_unused is None:
        allow_unused = materialize
    create_graph = bool(kwargs.get("create_graph", False))
    retain_graph = kwargs.get("retain_graph")
    if retain_graph is None:
        retain_graph = create_graph
    _push_mode(mode)
    try:
        grads = make_grads(outputs, to_tuple(kwargs.get("grad_outputs"), len(outputs)),
                           is_grads_batched=False)
        result = engine(outputs, grads, retain_graph, create_graph, inputs, allow_unused,
                        accumulate_grad=False)
        if materialize:
            result = tuple(torch.zeros_like(i, requires_grad=create_graph) if r is None else r
                           for r, i in zip(result, inputs, strict=True))
    except Exception as e:  # torch's own (a non-scalar loss...)
        _state.torch_error(e)
        raise
    finally:
        _pop_mode()
    return result


def _h_backward(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    ts = _tensors(args, kwargs)
    first = next((i for i in map(_state.index_of, ts) if i is not None), None)
    if first is None:
        return _run(func, args, kwargs)
    _workers.wait_all()
    prev = getattr(tls, "index", None)
    tls.index = first
    try:
        if not _backward_under_mode(func, args, kwargs):
            _run(func, args, kwargs)
    finally:
        tls.index = prev
    return None


def _backward_under_mode(func: Callable, args: tuple, kwargs: dict) -> bool:
    """Run a backward pass with this mode on the stack; False if the call is not a plain one.

    Torch pops a mode while it handles a call, so a backward run from the handler would run
    Python code (autograd.Function.backward, hooks, checkpoint recomputation) unrouted: a
    `torch.zeros(..., device=grad.device)` there would ask the CPU build for CUDA. So this
    does what torch.autograd.backward does after its override check, with the mode pushed.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    mode = active_mode
    ag = torch.autograd
    make_grads = getattr(ag, "_make_grads", None)
    to_tuple = getattr(ag, "_tensor_or_tensors_to_tuple", None)
    engine = getattr(getattr(ag, "graph", None), "_engine_run_backward", None)
    if mode is None or make_grads is None or to_tuple is None or engine is None:
        return False
    kw = dict(kwargs)
    if func is Tensor.backward:
        if len(args) != 1 or not set(kw) <= {"gradient", "retain_graph", "create_graph", "inputs"}:
            return False
        tensors: Any = args[0]
        grad_tensors = kw.get("gradient")
    else:
        if len(args) != 1 or not set(kw) <= {"grad_tensors", "retain_graph", "create_graph",
                                              "inputs", "grad_variables"}:
            return False
        tensors = args[0]
        grad_tensors = kw.get("grad_tensors", kw.get("grad_variables"))
    inputs = kw.get("inputs")
    if isinstance(inputs, Tensor):
        inputs_tuple: tuple = (inputs,)
    elif inputs is None:
        inputs_tuple = ()
    elif isinstance(inputs, (list, tuple)):
        inputs_tuple = tuple(inputs)
    else:
        return False
    tensors = (tensors,) if isinstance(tensors, Tensor) else tuple(tensors)
    if not all(isinstance(t, Tensor) for t in tensors + inputs_tuple):
        return False
    create_graph = bool(kw.get("create_graph", False))
    retain_graph = kw.get("retain_graph")
    if retain_graph is None:
        retain_graph = create_graph
    leaves = _leaves(tensors)
    _push_mode(mode)
    try:
        grads = make_grads(tensors, to_tuple(grad_tensors, len(tensors)), is_grads_batched=False)
        engine(tensors, grads, retain_graph, create_graph, inputs_tuple,
               allow_unreachable=True, accumulate_grad=True)
    except Exception as e:  # torch's own (a non-scalar loss...)
        _state.torch_error(e)
        raise
    finally:
        _pop_mode()
    # The engine made the gradients in C++, unmarked: they are on their leaves' devices and
    # count in those devices' memory from now on, as on CUDA.
    for leaf in leaves:
        index = _state.index_of(leaf)
        if index is not None:
            g = leaf.grad
            if g is not None:
                mark_out(g, index)
    return True


def _leaves(roots: tuple) -> list[Tensor]:
    """The leaf tensors a backward pass from `roots` accumulates gradients into."""
    leaves = []
    seen = set()
    stack = [t.grad_fn for t in roots]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)  # an AccumulateGrad node
        if var is not None:
            leaves.append(var)
        else:
            stack.extend(nxt for nxt, _ in fn.next_functions)
    return leaves


def _h_register_hook(func: Callable, args: tuple, kwargs: dict) -> Any:
    # A tensor hook receives a gradient straight from the C++ engine, unmarked: mark it as
    # living where the tensor lives before user code computes with it.
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    self, hook = args[0], args[1] if len(args) > 1 else kwargs["hook"]
    index = _state.index_of(self)
    if index is None:
        return _run(func, args, kwargs)

    def marked_hook(grad: Tensor) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        if isinstance(grad, Tensor):
            mark_out(grad, index)
        return hook(grad)

    return _run(func, (self, marked_hook), {})


def _reads_values(func: Callable) -> bool:
    """False for attribute getters (`.shape`, `.dtype`, `.grad`, ...): metadata of a queued
    op's output is known at launch, so reading it need not wait for the device."""
    return getattr(func, "__name__", None) != "__get__"


def _h_generic(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    index, cpu_in = _op_device(func, args, kwargs)
    if index is None:
        return _run(func, args, kwargs)
    if _reads_values(func):
        _workers.wait(index)
    prev = getattr(tls, "index", None)
    tls.index = index
    try:
        out = func(*args, **kwargs)
    except Exception as e:
        _state.torch_error(e)
        raise
    finally:
        tls.index = prev
    mark_out(out, index, cpu_in)
    return out


def _routed(func: Callable, args: tuple, kwargs: dict, device: Any) -> Any:
    """An op given a device (device= or the default device): run on the CPU, mark outputs."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    target = resolve(device)
    if target == _OTHER:
        return _run(func, args, kwargs)
    if target is None:
        kw = dict(kwargs, device="cpu")
        ts = _tensors(args, {})
        for i in {_state.index_of(t) for t in ts} - {None}:
            _workers.wait(i)
        return _run(func, args, kw)
    size = _factory_nbytes(func, args, kwargs)
    if size:
        _state.check_fits(target, size)
    _workers.wait(target)
    out = _call_on(target, func, args, dict(kwargs, device="cpu"))
    mark_out(out, target)
    return out


# --- asynchronous launch of heavy matrix products ------------------------------------------

_async = False

# Below this many multiply-adds a product is cheaper than the hand-off to a worker.
ASYNC_MIN_MACS = 1 << 21

# Python entry point -> the function run with out= on the worker.
_ASYNC_OPS: dict[Callable, Callable] = {
    torch.mm: torch.mm, Tensor.mm: torch.mm,
    torch.matmul: torch.matmul, Tensor.matmul: torch.matmul, Tensor.__matmul__: torch.matmul,
    torch.bmm: torch.bmm, Tensor.bmm: torch.bmm,
}


def set_asynchronous(flag: bool) -> None:
    global _async
    _async = flag


def _meta(t: Tensor) -> Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _h_async(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Launch a heavy product on its GPU's worker and return its (allocated) output at once.

    Only plain tensors that autograd will not record, and only when no dispatch mode (such as
    the placement log) is watching this thread: that mode must see the op run here.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if (not _async or kwargs or len(args) != 2 or torch._C._len_torch_dispatch_stack()
            or torch._C._len_torch_function_stack()):
        return _h_generic(func, args, kwargs)
    a, b = args
    if type(a) is not Tensor or type(b) is not Tensor or a.dim() < 1 or b.dim() < 1:
        return _h_generic(func, args, kwargs)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _h_generic(func, args, kwargs)
    if a.numel() * (b.shape[-1] if b.dim() >= 2 else 1) < ASYNC_MIN_MACS:
        return _h_generic(func, args, kwargs)
    index, _ = _op_device(func, args, kwargs)  # raises on mixed devices
    if index is None or _state.index_of(a) != _state.index_of(b):
        return _h_generic(func, args, kwargs)
    impl = _ASYNC_OPS[func]
    shape = _run(impl, (_meta(a), _meta(b)), {})  # shape and dtype errors: here, synchronously
    out = torch.empty(shape.shape, dtype=shape.dtype)
    mark_out(out, index)

    def run() -> None:
        impl(a, b, out=out)

    _workers.submit(index, run)
    return out


_SIZE_FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.rand, torch.randn, torch.full}


def _factory_nbytes(func: Callable, args: tuple, kwargs: dict) -> int:
    """Bytes a size-taking factory will allocate (0 if unknown), to refuse before allocating."""
    if func not in _SIZE_FACTORIES:
        return 0
    try:
        size = args[0] if (func is torch.full or (len(args) == 1 and not isinstance(args[0], int))) \
            else args
        if "size" in kwargs:
            size = kwargs["size"]
        n = 1
        for d in size:
            n *= int(d)
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        return n * dtype.itemsize
    except (TypeError, ValueError, IndexError, AttributeError):
        return 0


_HANDLERS: dict[Callable, Callable] = {
    Tensor.to: _h_to,
    Tensor.cuda: _h_cuda,
    Tensor.cpu: _h_cpu,
    Tensor.copy_: _h_copy_,
    Tensor.numpy: _h_numpy,
    Tensor.tolist: _h_tolist,
    Tensor.__array__: _h_numpy,
    Tensor.type: _h_type,
    Tensor.pin_memory: _h_pin_memory,
    Tensor.register_hook: _h_register_hook,
    Tensor.backward: _h_backward,
    torch.autograd.backward: _h_backward,
    torch.autograd.grad: _h_autograd_grad,
    torch.as_tensor: _h_as_tensor,
    torch.asarray: _h_as_tensor,
}
_HANDLERS.update({f: _h_async for f in _ASYNC_OPS})


def _h_plain(func: Callable, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    return _run(func, args, kwargs)


def _h_noop(func: Callable, args: tuple, kwargs: dict) -> Any:
    return None


# Calls that take a device without creating anything on it, and calls without tensors that
# every training step makes (grad mode, profiler ranges): straight through.
_HANDLERS[torch._C._nn._parse_to] = _h_plain
_HANDLERS[torch._C._set_grad_enabled] = _h_plain
for _name in ("_record_function_enter_new", "_record_function_exit"):
    _op = getattr(torch.ops.profiler, _name, None)
    for _f in (_op, getattr(_op, "_RecordFunction", None), getattr(_op, "default", None)):
        if _f is not None:
            _HANDLERS[_f] = _h_plain
# A simulated GPU has one stream per device, so there is no other stream to record on.
_HANDLERS[Tensor.record_stream] = _h_noop

_CONSTRUCTORS = frozenset(_torch_device._device_constructors())

# The instance on the starting thread's stack (set by start(), cleared by stop()).
active_mode: SimulationMode | None = None


class SimulationMode(TorchFunctionMode):
    """Routes simulated-GPU work to the CPU; one instance lives on the starting thread's stack."""

    def __init__(self) -> None:
        super().__init__()
        self.inert = False  # set by stop() from another thread, which cannot pop it

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        # Runs for every torch call in this thread: attribute getters leave early, handlers
        # take the calls that need more (moves, factories, .numpy), and every other op gets
        # its device from _guarded_op_device and runs there.
        sess = _state.session
        if kwargs is None:
            kwargs = {}
        if sess is None or self.inert:
            return func(*args, **kwargs)
        try:
            if type(func) is _MethodWrapper and func.__name__ == "__get__":
                # An attribute read (`.shape`, `.requires_grad`, `.grad`, ...): metadata, known
                # even while the tensor's op is queued. Only a tensor result may need a mark
                # (a gradient the C++ engine made).
                try:
                    out = func(*args)
                except Exception as e:
                    _state.torch_error(e)
                    raise
                if isinstance(out, Tensor):
                    st = _storage(out)
                    m = getattr(st, MARK, None) if st is not None else None
                    if m is None or m.session is not sess:
                        index = _state.index_of(args[0])
                        if index is not None:
                            mark_out(out, index)
                return out
            h = _HANDLERS.get(func)
            if h is not None:
                return h(func, args, kwargs)
            if kwargs:
                d = kwargs.get("device")
                if d is not None:
                    return _routed(func, args, kwargs, d)
            if func in _CONSTRUCTORS:
                cur = _torch_device.CURRENT_DEVICE
                if cur is not None and cur.type == "cuda":
                    return _routed(func, args, kwargs, cur)
                return _run(func, args, kwargs)
            index, cpu_in = _guarded_op_device(func, args, kwargs)
            if index is None:
                try:
                    return func(*args, **kwargs)
                except Exception as e:
                    _state.torch_error(e)
                    raise
            if (_workers._pending_total or _workers._has_error) and _reads_values(func):
                _workers.wait(index)
            prev = getattr(tls, "index", None)
            tls.index = index
            try:
                out = func(*args, **kwargs)
            except Exception as e:  # torch's own (a shape mismatch): see _state.torch_error
                _state.torch_error(e)
                raise
            finally:
                tls.index = prev
            if type(out) in _PLAIN and cpu_in is None and not _tf_stack_len():
                try:
                    st = out.untyped_storage()
                except _state.STORAGE_ERRORS:
                    _no_storage(out)
                    return out
                m = getattr(st, MARK, None)
                if m is None or m.session is not sess:
                    mark_storage(st, index)
                elif st.nbytes() > m.nbytes:
                    resized(st, m)
            else:
                mark_out(out, index, cpu_in)
            return out
        except Exception as e:
            # The user's call entered the simulation here: an error raised in torch's name
            # leaves without the simulation's frames (see _state.drop_own_frames).
            _state.drop_own_frames(e)
            raise


def _guarded_op_device(func: Callable, args: tuple, kwargs: dict) -> tuple[int | None, list | None]:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if _tf_stack_len():
        # Another mode (a DeviceContext) lies below: storage lookups would enter it.
        with _DisableTF():
            return _op_device(func, args, kwargs)
    return _op_device(func, args, kwargs)
