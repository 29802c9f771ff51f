"""What one op costs on a modeled GPU: the simulation's side of `devlab.gpu_model`.

The model is a pure function of (op, shapes, dtype, GPU) (`devlab.gpu_model`); this module
only reads those from a torch call or an aten op that ran on a simulated GPU: the op's name,
its tensors' shapes and bytes, the dtype it computes in (float32 as TF32 when torch allows TF32
matmuls and the GPU has it), and which inputs need gradients. `OpTime` (the pure clock's,
`devlab.engine.gpu_model.modeled_clock`) is one kernel (or copy) as the modeled clock charges
it: the host's launch latency, then the model's kernel time on the GPU, queued behind the GPU's
earlier work.

The simulation costs each torch call its routing mode sees (`charges.Charges`; See Note [Why the
clock charges torch calls]). `op_time` costs
one aten op (benchmarks/gpu_model.py sets the model beside published measurements with it).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain
from typing import Any, NamedTuple

import torch

from devlab.engine.gpu_model import gemm, memory_bound
from devlab.engine.gpu_model.kernels import COMPUTE, EMBEDDING, GEMM, LAUNCH, MEMORY
from devlab.engine.gpu_model.modeled_clock import OpTime, kernel_time
from devlab.engine.gpu_model.op_costs import BACKWARD_BYTES, family, gemm_backward, gemm_dims
from devlab.engine.gpu_model.ops_catalog import added, overloads
from devlab.engine.gpu_model.specs import GpuSpec

__all__ = ["COMPUTE", "LAUNCH", "MEMORY", "OpTime", "bytes_bound", "call_cost", "call_name",
           "launches_kernel", "op_time", "signature", "store", "traffic"]

Tensor = torch.Tensor
F = torch.nn.functional


def model_dtype(spec: GpuSpec, dtype: torch.dtype) -> str:
    """The dtype the model costs a product in: float32 runs as TF32 when torch allows TF32
    matmuls and the GPU has TF32 tensor cores."""
    if dtype == torch.float32:
        return "tf32" if spec.tf32_tflops and torch.backends.cuda.matmul.allow_tf32 else "float32"
    return _DTYPES.get(dtype, "float32")


_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64"}


_op = kernel_time  # the model's kernel as the clock charges it


# What an op of one kind and shape costs on one GPU, finished (`OpTime`): the same ops come back
# every training step, and this path runs for every op on a modeled GPU, so a plain dict keyed
# by the GPU's name, the device, the op's name and its shape is the cheapest lookup (the
# session's spec is always one of the model's own, so its name identifies it).
_costs: dict[tuple, Any] = {}


def store(key: tuple, value: Any, cache: dict = _costs) -> Any:
    """`cache[key] = value`, in a cache kept to a bounded size (cleared when full); returns
    `value`."""
    if len(cache) > 65536:
        cache.clear()
    cache[key] = value
    return value


def _memory(spec: GpuSpec, index: int, name: str, kind: str, nbytes: int) -> OpTime:
    key = (spec.name, index, name, kind, nbytes)
    cost = _costs.get(key)
    if cost is None:
        cost = store(key, _op(spec, index, name, memory_bound(spec, kind, nbytes)))
    return cost


def _tensors(values: Any) -> tuple[int, torch.dtype | None, int]:
    """(bytes, first dtype, how many need gradients) of the tensors among `values`, one level
    into lists and tuples."""
    total, dtype, grads = 0, None, 0
    for v in values:
        if isinstance(v, Tensor):
            total += v.nbytes
            if dtype is None:
                dtype = v.dtype
            grads += v.requires_grad
        elif isinstance(v, (list, tuple)):
            for t in v:
                if isinstance(t, Tensor):
                    total += t.nbytes
                    if dtype is None:
                        dtype = t.dtype
                    grads += t.requires_grad
    return total, dtype, grads


def signature(args: tuple, kwargs: dict, out: Any) -> tuple:
    """What an op's cost can depend on among its arguments and outputs: each tensor's type,
    shape, dtype and whether it needs a gradient, in order; of a list or tuple of tensors (a
    foreach op's, `cat`'s), what `traffic` reads of it: its length, bytes, first dtype and how
    many need gradients; and the strings among them (keywords' names). Equal signatures of one
    op on one GPU cost the same, so a training step's ops, which come back every step, are
    costed once."""
    key: list = []
    add = key.append
    for v in (*args, out, *chain.from_iterable(kwargs.items())) if kwargs else (*args, out):
        if isinstance(v, Tensor):
            add((type(v), v.shape, v.dtype, v.requires_grad))
        elif isinstance(v, (list, tuple)):
            add((len(v), *_tensors(v)))
        else:
            add(v if type(v) is str else None)
    return tuple(key)


def traffic(args: tuple, kwargs: dict, out: Any) -> tuple[int, torch.dtype, int]:
    """(bytes an op reads and writes, the dtype it computes in, how many of its tensor inputs
    need gradients): it runs for every op on a modeled GPU."""
    read, dtype, grads = _tensors((*args, *kwargs.values()) if kwargs else args)
    if isinstance(out, Tensor):  # `_tensors((out,))`'s answer for one tensor, without its call
        return read + out.nbytes, dtype or out.dtype, grads
    written, out_dtype, _ = _tensors((out,))
    return read + written, dtype or out_dtype or torch.float32, grads


class Backward(NamedTuple):
    """What a forward call leaves for its backward: enough to cost its gradient kernels."""

    op: str
    device: int
    dims: tuple | None  # a product's (batch, m, n, k, batched); None for a memory-bound op
    dtype: str
    itemsize: int
    family: str
    nbytes: int  # a memory-bound op's bytes; a product's output bytes
    count: int  # memory-bound: inputs that need a gradient; product: other inputs (a bias)
    operands: tuple[bool, bool] = (False, False)  # a product: which operand needs a gradient


def call_cost(spec: GpuSpec, index: int, func: Callable, args: tuple, kwargs: dict, out: Any,
              nbytes: int, dtype: torch.dtype, grads: int, name: str | None = None
              ) -> tuple[OpTime, Backward | None]:
    """The kernel of one torch call on GPU `index` (its tensors' bytes, dtype and the inputs
    needing gradients as `traffic` found them), and what its backward will cost."""
    name = name or call_name(func)
    kind = _family(func, name)
    if kind == GEMM and isinstance(out, Tensor):
        tensors = _tensor_args(args, kwargs)
        shapes = tuple(tuple(t.shape) for t in tensors)
        itemsize = out.element_size()
        mdtype = model_dtype(spec, dtype)
        key = (spec.name, index, name, shapes, tuple(out.shape), mdtype, itemsize)
        found = _costs.get(key)
        if found is None:
            found = store(key, _product(spec, index, name, shapes, out, mdtype, itemsize))
        dims, cost = found
        if dims is not None:
            back = None
            if grads:
                first = 1 if added(name) else 0  # addmm(bias, a, b): the bias is not an operand
                a, b = tensors[first], tensors[first + 1]
                operands = (a.requires_grad, b.requires_grad)
                back = Backward(name, index, dims, mdtype, itemsize, GEMM, out.nbytes,
                                grads - sum(operands), operands)
            return cost, back
        kind = "element-wise"  # arguments of a form the product rule does not read
    elif kind == EMBEDDING and isinstance(out, Tensor):
        # A lookup reads the rows it gathers (and the indices), not the whole table.
        nbytes = 2 * out.nbytes + sum(t.nbytes for t in _tensor_args(args, kwargs)
                                      if not t.is_floating_point())
    cost = _memory(spec, index, name, kind, nbytes)
    back = Backward(name, index, None, "", 0, kind, nbytes, grads) if grads else None
    return cost, back


def _product(spec: GpuSpec, index: int, name: str, shapes: tuple, out: Tensor, dtype: str,
             itemsize: int) -> tuple[tuple | None, OpTime | None]:
    """(batch, m, n, k, batched) and the kernel of a product or convolution call, or
    (None, None) if its arguments are not the tensors the rule reads."""
    if len(shapes) < 2 + added(name):
        return None, None
    try:
        dims = gemm_dims(name, shapes, tuple(out.shape))
    except (IndexError, ValueError, ZeroDivisionError):
        return None, None
    return dims, _op(spec, index, name, gemm(spec, *dims[:4], dtype, itemsize, dims[4]))


def backward_costs(spec: GpuSpec, back: Backward) -> list[OpTime]:
    """The gradient kernels of one forward call (one per input that needs a gradient)."""
    key = (spec.name, back)
    costs = _costs.get(key)
    if costs is None:
        costs = store(key, _backward_costs(spec, back))
    return costs


def _backward_costs(spec: GpuSpec, back: Backward) -> list[OpTime]:
    name = f"{back.op} (backward)"
    if back.dims is not None:
        grad_a, grad_b = gemm_backward(spec, *back.dims[:4], back.dtype, back.itemsize,
                                       back.dims[4], 2)
        costs = [_op(spec, back.device, name, k) for k, need in
                 ((grad_a, back.operands[0]), (grad_b, back.operands[1])) if need]
        # A bias's gradient sums the output's gradient over its rows.
        return costs + [_memory(spec, back.device, name, "reduction", back.nbytes)] * back.count
    nbytes = int(back.nbytes * BACKWARD_BYTES.get(back.family, 1.0))
    return [_memory(spec, back.device, name, back.family, nbytes)] * back.count


def memory_cost(spec: GpuSpec, index: int, name: str, nbytes: int,
                kind: str = "element-wise") -> OpTime:
    """A memory-bound kernel moving `nbytes` (a factory's fill, a copy within one GPU)."""
    return _memory(spec, index, name, kind, nbytes)


# --- which rule a torch call follows, and its shapes -------------------------------------------

_families: dict[Any, str] = {}


def _family(func: Callable, name: str) -> str:
    kind = _families.get(func)
    if kind is None:
        kind = _families[func] = family(name)
    return kind


def bytes_bound(func: Callable) -> bool:
    """Whether `call_cost` costs a call of `func` by its bytes and its inputs needing gradients
    alone (a memory-bound family's): not a product's or a lookup's, which read the shapes."""
    return _family(func, call_name(func)) not in (GEMM, EMBEDDING)


def _tensor_args(args: tuple, kwargs: dict) -> list[Tensor]:
    tensors = [a for a in args if isinstance(a, Tensor)]
    if kwargs:
        tensors += [v for k, v in kwargs.items() if isinstance(v, Tensor) and k != "out"]
    return tensors


_names: dict[Any, str] = {}


def call_name(func: Callable) -> str:
    """The aten op a torch call becomes, by name (`aten::matmul`, `aten::_foreach_add_`)."""
    name = _names.get(func)
    if name is None:
        raw = getattr(func, "__name__", None) or str(func)
        if raw.startswith("__") and raw.endswith("__"):  # Tensor.__matmul__ -> matmul
            raw = raw[2:-2]
        name = _names[func] = f"aten::{raw}"
    return name


# --- one aten op ------------------------------------------------------------------------------

_NO_KERNEL = frozenset(overloads("no_kernel"))


def launches_kernel(func: Any) -> bool:
    return func not in _NO_KERNEL and not func.is_view


def op_time(spec: GpuSpec, index: int, func: Any, args: tuple, kwargs: dict, out: Any) -> OpTime:
    """The modeled time of one aten op's kernel on GPU `index` of kind `spec`."""
    nbytes, dtype, _ = traffic(args, kwargs, out)
    name = str(func.overloadpacket).replace("aten.", "aten::")
    return call_cost(spec, index, func, args, kwargs, out, nbytes, dtype, 0, name)[0]
