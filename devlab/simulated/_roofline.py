"""What one op costs on a modeled GPU: the roofline model.

An op's kernel costs its launch latency plus the longer of its compute (FLOPs over the GPU's
peak for the op's dtype) and its memory traffic (bytes read and written over the memory
bandwidth). FLOPs come from torch's own rules (`torch.utils.flop_counter`: matrix products,
convolutions, attention); other ops are memory traffic only. Ops that launch no kernel (views,
allocation, metadata) cost nothing.

The simulation costs each torch call its routing mode sees (`_clock.Charges`): a dispatch mode
would see every aten op, but costs more per op than the whole simulation may. `op_time` costs
one aten op (benchmarks/gpu_model.py sets the model beside published measurements with it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import flop_registry

from ._gpu_specs import GpuSpec

aten = torch.ops.aten
Tensor = torch.Tensor
F = torch.nn.functional

LAUNCH, COMPUTE, MEMORY = "launch-bound", "compute-bound", "memory-bound"


class OpTime(NamedTuple):
    """One kernel's modeled time on one GPU, in seconds, and why. (A tuple: one is made for
    every op on a modeled GPU.)"""

    op: str
    device: int
    launch: float
    compute: float
    memory: float
    flops: int
    nbytes: int
    sync: float = 0.0  # the round trip of the host's wait, for a copy to the host

    @property
    def work(self) -> float:
        """The device's busy time: the longer of compute and memory traffic."""
        return max(self.compute, self.memory)

    @property
    def total(self) -> float:
        return self.launch + self.work + self.sync

    @property
    def bound(self) -> str:
        """What limits it: the launch, the arithmetic, or the memory traffic."""
        if self.launch + self.sync >= self.work:
            return LAUNCH
        return COMPUTE if self.compute >= self.memory else MEMORY


def peak_flops(spec: GpuSpec, dtype: torch.dtype) -> float:
    """FLOP/s of matrix arithmetic in `dtype`: tensor cores for float16 and bfloat16 (and for
    float32 when torch allows TF32 matmuls), CUDA cores otherwise."""
    if dtype == torch.float16:
        return spec.fp16_tflops * 1e12
    if dtype == torch.bfloat16:
        return (spec.bf16_tflops or spec.fp32_tflops) * 1e12
    if dtype == torch.float32 and spec.tf32_tflops and torch.backends.cuda.matmul.allow_tf32:
        return spec.tf32_tflops * 1e12
    return spec.fp32_tflops * 1e12


def kernel(spec: GpuSpec, index: int, name: str, flops: int, nbytes: int,
           dtype: torch.dtype) -> OpTime:
    """The roofline time of one kernel of `flops` in `dtype` moving `nbytes`."""
    return OpTime(name, index, spec.launch_latency_us * 1e-6,
                  flops / peak_flops(spec, dtype) if flops else 0.0,
                  nbytes / (spec.memory_bandwidth_gbs * 1e9), flops, nbytes)


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


def traffic(args: tuple, kwargs: dict, out: Any) -> tuple[int, torch.dtype, int]:
    """(bytes an op reads and writes, the dtype it computes in, how many of its tensor inputs
    need gradients): it runs for every op on a modeled GPU."""
    read, dtype, grads = _tensors((*args, *kwargs.values()) if kwargs else args)
    written, out_dtype, _ = _tensors((out,))
    return read + written, dtype or out_dtype or torch.float32, grads


# --- one aten op ------------------------------------------------------------------------------

_NO_KERNEL = frozenset({
    aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
    aten.detach.default, aten.alias.default, aten.lift_fresh.default, aten.set_.source_Storage,
    aten.set_.source_Storage_storage_offset, aten.set_.source_Tensor, aten.resize_.default,
    aten._local_scalar_dense.default, aten.is_same_size.default, aten.sym_size.int,
    aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default,
    aten._has_compatible_shallow_copy_type.default, aten.is_set_to.default,
    aten.record_stream.default,
})


def launches_kernel(func: Any) -> bool:
    return func not in _NO_KERNEL and not func.is_view


def _shape(v: Any) -> Any:
    if isinstance(v, Tensor):
        return v.shape
    if isinstance(v, (list, tuple)):
        return type(v)(_shape(x) for x in v)
    return v


def aten_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of an aten op by torch's own rules (0 where torch has none)."""
    formula = flop_registry.get(func.overloadpacket)
    if formula is None:
        return 0
    # torch's wrapper maps tensors to shapes with pytree; the raw rule takes them directly.
    rule = getattr(formula, "__wrapped__", formula)
    try:
        return int(rule(*(_shape(a) for a in args), out_shape=_shape(out),
                        **{k: _shape(v) for k, v in kwargs.items()}))
    except Exception:  # a rule that does not take this overload's arguments
        return 0


def op_time(spec: GpuSpec, index: int, func: Any, args: tuple, kwargs: dict, out: Any) -> OpTime:
    """The modeled time of one aten op's kernel on GPU `index` of kind `spec`."""
    nbytes, dtype, _ = traffic(args, kwargs, out)
    name = str(func.overloadpacket).replace("aten.", "aten::")
    return kernel(spec, index, name, aten_flops(func, args, kwargs, out), nbytes, dtype)


# --- one torch call -------------------------------------------------------------------------

_mm_rule = getattr(flop_counter.mm_flop, "__wrapped__", flop_counter.mm_flop)


def _matmul_flops(a: Tensor, out: Tensor) -> int:
    """A product's FLOPs by torch's mm rule: each of its out.numel() outputs is a dot product
    over the contraction dimension, a's last."""
    k = a.shape[-1] if a.dim() else 1
    n = out.shape[-1] if out.dim() else 1
    return _mm_rule((out.numel() // (n or 1), k), (k, n))


def _product_flops(args: tuple, kwargs: dict, out: Tensor) -> int:
    return _matmul_flops(args[0], out)


def _added_product_flops(args: tuple, kwargs: dict, out: Tensor) -> int:
    return _matmul_flops(args[1], out)


def _conv_flops(args: tuple, kwargs: dict, out: Tensor) -> int:
    x, w = args[0], args[1] if len(args) > 1 else kwargs["weight"]
    return int(flop_counter.conv_flop_count(x.shape, w.shape, out.shape, transposed=False))


def _sdpa_flops(args: tuple, kwargs: dict, out: Tensor) -> int:
    q, k, v = (args + tuple(kwargs.get(n) for n in ("query", "key", "value")))[:3]
    return int(flop_counter.sdpa_flop_count(q.shape, k.shape, v.shape))


# torch call -> FLOPs (torch's rules, through the aten op the call becomes).
_FLOPS: dict[Callable, Callable[[tuple, dict, Tensor], int]] = {
    **dict.fromkeys((torch.mm, Tensor.mm, torch.matmul, Tensor.matmul, Tensor.__matmul__,
                     torch.bmm, Tensor.bmm, F.linear),
                    _product_flops),
    **dict.fromkeys((torch.addmm, Tensor.addmm, torch.baddbmm, Tensor.baddbmm),
                    _added_product_flops),
    **dict.fromkeys((F.conv1d, F.conv2d, F.conv3d), _conv_flops),
    F.scaled_dot_product_attention: _sdpa_flops,
}


def call_flops(func: Callable, args: tuple, kwargs: dict, out: Any) -> int:
    rule = _FLOPS.get(func)
    if rule is None or not isinstance(out, Tensor):
        return 0
    try:
        return int(rule(args, kwargs, out))
    except Exception:  # arguments of a form the rule does not read: arithmetic unknown
        return 0


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
