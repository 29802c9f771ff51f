"""Backward passes on simulated GPUs.

Torch pops a mode while the mode handles a call, so a backward pass started from the handler
would run its Python code (autograd.Function.backward, hooks, checkpoint recomputation)
unrouted: a `torch.zeros(..., device=grad.device)` there would ask a CPU build of torch for
CUDA. So `backward` and `grad` do what torch.autograd.backward/grad do after their override
check, with the simulation's mode pushed again. The C++ engine makes gradients unmarked; they
are marked with their tensors' devices, where CUDA would have made them; when Python code
sees them before the pass ends, as the engine makes them (`_dispatched.marking`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import _pop_mode, _push_mode

from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base import storage_marks as _marks
from devlab.engine.simulated.base.session import tls
from devlab.engine.simulated.base.storage_marks import index_of
from devlab.engine.simulated.clock.charges import BACKWARD_KEY as _BACKWARD
from devlab.engine.simulated.mode import device_rule as _ops
from devlab.engine.simulated.mode import dispatch_devices as _dispatched
from devlab.engine.simulated.mode.routing import SimulationMode

Tensor = torch.Tensor
_ag = torch.autograd
_DisableTF = torch._C.DisableTorchFunction

_BACKWARD_KW = {"gradient", "retain_graph", "create_graph", "inputs"}
_AUTOGRAD_BACKWARD_KW = {"grad_tensors", "retain_graph", "create_graph", "inputs",
                         "grad_variables"}
_GRAD_KW = {"grad_outputs", "retain_graph", "create_graph", "only_inputs", "allow_unused",
            "is_grads_batched", "materialize_grads"}


def _as_tuple(ts: Any) -> tuple | None:
    """A tensor or a sequence of tensors as a tuple (None: something else)."""
    if isinstance(ts, Tensor):
        return (ts,)
    if isinstance(ts, (list, tuple)) and all(isinstance(t, Tensor) for t in ts):
        return tuple(ts)
    return None


def route_copy_backward(out: Tensor, source: int | None, target: int | None) -> None:
    """`out` is a copy from `source` to `target` (None: the host): its gradient goes back from
    `target` to `source`. C++ sees one CPU device and passes the gradient through uncopied, so
    the copy's backward node copies it, running with `current_index()` = `source` (the copy's
    destination, for the placement log), and charges a modeled clock for the copy."""
    node = out.grad_fn
    if node is None:
        return
    saved: list[int | None] = []

    def before(grad_outputs: Any) -> None:
        saved.append(_session.current_index())
        tls.index = source

    def after(grad_inputs: tuple, grad_outputs: tuple) -> tuple | None:
        try:
            sess = _session.session
            if sess is None:
                return None
            for g in grad_inputs:
                if isinstance(g, Tensor):
                    sess.charges.copy(target, source, g.nbytes, False, "aten::_to_copy")
            if not any(isinstance(g, Tensor) and index_of(g) != source for g in grad_inputs):
                return None
            with _DisableTF():
                return tuple(_to_copy(g) if isinstance(g, Tensor) and index_of(g) != source
                             else g for g in grad_inputs)
        finally:
            tls.index = saved.pop() if saved else None

    node.register_prehook(before)
    node.register_hook(after)


def _to_copy(g: Tensor) -> Tensor:
    """A copy of g made on `current_index()`, marked there (or left on the host)."""
    out = torch.ops.aten._to_copy.default(g)
    index = _session.current_index()
    if index is not None:
        _marks.mark_outputs(out, index)
    return out


def _engine(roots: tuple, grad_roots: Any, retain_graph: bool | None, create_graph: bool,
            inputs: tuple, allow_unused: bool, accumulate_grad: bool,
            watched: bool | int) -> tuple:
    """Run the autograd engine with a simulation mode on this thread's stack (`watched`: True,
    and the marking dispatch mode; a GPU index, and the one-GPU mode; See Note [Why ops run
    watched] in `dispatched`)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if retain_graph is None:
        retain_graph = create_graph
    _push_mode(SimulationMode())
    try:
        grads = _ag._make_grads(roots, _ag._tensor_or_tensors_to_tuple(grad_roots, len(roots)),
                                is_grads_batched=False)
        with (_dispatched.marking() if watched is True
              else _dispatched.OneGpu(watched) if watched is not False
              else contextlib.nullcontext()):
            return _ag.graph._engine_run_backward(
                roots, grads, retain_graph, create_graph, inputs, allow_unused,
                accumulate_grad=accumulate_grad)
    except Exception as e:  # torch's own (a non-scalar loss...)
        _errors.torch_error(e)
        raise
    finally:
        _pop_mode()


def backward(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Tensor.backward and torch.autograd.backward."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    first = next((i for i in map(index_of, _marks.tensors_of(args, kwargs)) if i is not None),
                 None)
    if first is None:
        return _ops.call(None, func, args, kwargs)
    known = _BACKWARD_KW if func is Tensor.backward else _AUTOGRAD_BACKWARD_KW
    roots = _as_tuple(args[0]) if len(args) == 1 else None
    inputs = kwargs.get("inputs")
    inputs_tuple = () if inputs is None else _as_tuple(inputs)
    if roots is None or inputs_tuple is None or not set(kwargs) <= known:
        # Not a form torch.autograd.backward takes: let torch say what is wrong.
        return _ops.call(first, func, args, kwargs)
    _workers.wait_all()
    grad_roots = (kwargs.get("gradient") if func is Tensor.backward
                  else kwargs.get("grad_tensors", kwargs.get("grad_variables")))
    leaves, nodes = _graph(roots)
    _take_backward_workspace(nodes, first)
    charges = _begin()
    try:
        _engine(roots, grad_roots, kwargs.get("retain_graph"),
                bool(kwargs.get("create_graph", False)), inputs_tuple, allow_unused=True,
                accumulate_grad=True, watched=_watch(leaves, nodes, first))
        for leaf in leaves:
            index = index_of(leaf)
            if index is not None and leaf.grad is not None:
                _marks.mark_outputs(leaf.grad, index)
    except BaseException:  # an error or an interrupt: its collectives are not charged
        charges.backward_failed()
        raise
    _charge(nodes)
    return None


def grad(func: Callable, args: tuple, kwargs: dict) -> Any:
    """torch.autograd.grad: gradients on their inputs' devices."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
    outputs = _as_tuple(args[0]) if args else None
    inputs_tuple = _as_tuple(inputs)
    if (len(args) != 2 or outputs is None or not inputs_tuple or not set(kwargs) <= _GRAD_KW
            or kwargs.get("is_grads_batched")):
        out = _ops.call(None, func, args, kwargs)
    else:
        materialize = bool(kwargs.get("materialize_grads", False))
        allow_unused = kwargs.get("allow_unused")
        create_graph = bool(kwargs.get("create_graph", False))
        leaves, nodes = _graph(outputs)
        first = next((i for i in map(index_of, outputs) if i is not None), None)
        if first is not None:
            _take_backward_workspace(nodes, first)
        charges = _begin()
        try:
            out = _engine(outputs, kwargs.get("grad_outputs"), kwargs.get("retain_graph"),
                          create_graph, inputs_tuple,
                          allow_unused=materialize if allow_unused is None else allow_unused,
                          accumulate_grad=False, watched=_watch(leaves, nodes, first))
        except BaseException:  # an error or an interrupt: its collectives are not charged
            charges.backward_failed()
            raise
        _charge(nodes)
        if materialize:
            out = tuple(torch.zeros_like(i, requires_grad=create_graph) if r is None else r
                        for r, i in zip(out, inputs_tuple, strict=True))
    for inp, g in zip(inputs_tuple or (), out, strict=False):
        i = index_of(inp)
        if isinstance(g, Tensor) and i is not None:
            _marks.mark_outputs(g, i)
    return out


_AccumulateGrad = torch._C._functions.AccumulateGrad  # a leaf's node
_functorch_level = torch._C._functorch.peek_interpreter_stack  # None outside torch.func
_PythonNode = torch.autograd.function.BackwardCFunction  # an autograd Function's node


def _graph(roots: tuple) -> tuple[list[Tensor], list[Any]]:
    """The leaf tensors a backward pass from `roots` accumulates gradients into, and the
    graph's other nodes."""
    leaves, nodes = [], []
    seen = set()
    stack = [(t.grad_fn, 0) for t in roots]  # as next_functions holds them: (node, input)
    while stack:
        fn = stack.pop()[0]
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if type(fn) is _AccumulateGrad:
            leaves.append(fn.variable)
        else:
            nodes.append(fn)
            stack.extend(fn.next_functions)
    return leaves, nodes


def _python_inside(leaves: list[Tensor], nodes: list[Any]) -> bool:
    """Whether a backward pass over this graph hands gradients the C++ engine makes to Python
    code before it ends: an autograd Function's backward (module backward hooks, DTensor, FSDP2
    and flex_attention are such Functions) or a leaf's post-accumulate-grad hook (See Note
    [Why ops run watched] in `dispatched`)."""
    return (any(isinstance(n, _PythonNode) for n in nodes)
            or any(leaf._post_accumulate_grad_hooks for leaf in leaves))


def _watch(leaves: list[Tensor], nodes: list[Any], first: int | None) -> bool | int:
    """How a backward pass runs (See Note [Why ops run watched] in `dispatched`): True
    when Python code receives its gradients or the pass spans several GPUs, with no host leaf
    and no process group (each op placed by its own tensors as it is made), the GPU's index
    when it is all on one GPU, else False."""
    if _python_inside(leaves, nodes):
        return True
    if first is not None and _functorch_level() is None:
        # (Inside a torch.func transform the pass's tensors are the transform's wrappers,
        # which neither mode unwraps: such a pass runs unwatched, as before.)
        where = [index_of(leaf) for leaf in leaves]
        if all(i == first for i in where):
            return first
        if None not in where and not _distributed():
            return True  # model parallel: what each GPU's kernels allocate counts there
        # (A leaf on the host: the copy's backward would be placed on a GPU by `Marking`,
        # whose copies go where the simulation put them. A process group running: DDP's
        # buckets, marked on their GPUs, would be all-reduced on each GPU's communication
        # stream at once, where the modeled clock (issue 28) charges them one after the
        # other on the current GPU's, sharing the one link. Such passes run unwatched.)
    return False


def _distributed() -> bool:
    """Whether this process runs a torch.distributed process group."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized()


# The autograd nodes whose backward runs matrix products (cuBLAS on a GPU): MmBackward0,
# AddmmBackward0 (nn.Linear), BmmBackward0, ...
_node_runs_cublas: dict[type, bool] = {}


def _take_backward_workspace(nodes: list[Any], first: int) -> None:
    """A backward pass with matrix products: on each GPU they run on, cuBLAS's workspace for
    autograd's device thread there, whose handle is not the host's (CublasHandlePool.cpp keys
    workspaces by handle and stream), at the pass's start, while the forward's tensors are
    all still held (on a GPU, at the GPU's first product in the pass: its place in the pass
    is not modeled). CUDA's out-of-memory, before the pass begins, where it does not fit."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    sess = _session.session
    if sess is None:
        return
    devices = sess.devices
    taken: set[int] = set()
    for node in nodes:
        kind = type(node)
        runs = _node_runs_cublas.get(kind)
        if runs is None:
            op = kind.__name__.removesuffix("0").removesuffix("Backward").lower()
            runs = _node_runs_cublas[kind] = op in _ops.CUBLAS_NAMES
        if not runs:
            continue
        index = _node_device(node, first)
        if index in taken or not 0 <= index < len(devices):
            continue
        taken.add(index)
        dev = devices[index]
        if dev.backward_workspace is None:
            with _session.lock:
                oom = dev.take_workspace(backward=True)
            if oom is not None:
                raise _errors.out_of_memory(dev, oom)


def _node_device(node: Any, first: int) -> int:
    """The GPU a product's backward node runs on: its modeled kernels' (with a model), else
    the pass's first GPU. (Not its saved operands': reading one runs saved-tensor hooks, a
    checkpoint's recomputation among them, before the pass.)"""
    costs = node.metadata.get(_BACKWARD)
    return costs[0].device if costs else first


def _begin() -> Any:
    """A backward pass starts: the session's charges (collectives launched inside it, DDP's
    buckets, are placed by `_charge` after it)."""
    charges = _session.session.charges  # type: ignore[union-attr]
    charges.begin_backward()
    return charges


def _charge(nodes: list[Any]) -> None:
    """With a modeled GPU, charge its clock for the backward kernels of these nodes."""
    sess = _session.session
    if sess is not None:
        sess.charges.backward(nodes)


def register_hook(func: Callable, args: tuple, kwargs: dict) -> Any:
    """A tensor hook receives a gradient straight from the C++ engine, unmarked: mark it as
    living where the tensor lives before user code computes with it."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    self, hook = args[0], args[1] if len(args) > 1 else kwargs["hook"]
    index = index_of(self)
    if index is None:
        return _ops.call(None, func, args, kwargs)

    def marked_hook(grad: Tensor) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        if isinstance(grad, Tensor) and _session.session is not None:
            _marks.mark_outputs(grad, index)
        return hook(grad)

    return _ops.call(None, func, (self, marked_hook), {})


HANDLERS: dict[Callable, Callable] = {
    Tensor.backward: backward,
    torch.autograd.backward: backward,
    torch.autograd.grad: grad,
    Tensor.register_hook: register_hook,
}


# Note [Gradients a hook on a C++ node receives]
# The C++ engine makes a backward pass's gradients unmarked; whether Python code sees them on
# their GPU depends on how the pass runs (`_watch`; See Note [Why ops run watched]). A pass all
# on one GPU (`OneGpu`) or across GPUs with no leaf on the host and no process group running
# (`Marking`), outside torch.func's transforms, marks each op's outputs as it returns, so every
# hook inside it receives gradients on their GPU. The other passes run unwatched, for the reasons `_watch` gives, and mark only
# their leaves' gradients when they end; the Python code found in the graph is still served: an
# autograd Function's backward or a leaf's post-accumulate-grad hook makes the pass watched
# (`_python_inside`), a tensor's hook gets its gradient marked (`register_hook`). A hook
# registered by hand on a C++ node (`t.grad_fn.register_prehook`, `register_hook`) is neither:
# in an unwatched pass (say, from a leaf on the host) its gradients say `cpu`, with the right
# values, unless the placement log, whose dispatch mode marks every op, is on.
