"""What one op costs on a modeled GPU: the roofline model.

An op's kernel costs its launch latency plus the longer of its compute (FLOPs over the GPU's
peak for the op's dtype) and its memory traffic (bytes read and written over the memory
bandwidth). FLOPs come from torch's own rules (`torch.utils.flop_counter`: matrix products,
convolutions, attention); other ops are memory traffic only. Ops that launch no kernel (views,
allocation, metadata) cost nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

from ._gpu_specs import GpuSpec

aten = torch.ops.aten

LAUNCH, COMPUTE, MEMORY = "launch-bound", "compute-bound", "memory-bound"

# Ops that allocate or describe tensors without running a kernel.
_NO_KERNEL = frozenset({
    aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
    aten.detach.default, aten.alias.default, aten.lift_fresh.default, aten.set_.source_Storage,
    aten.set_.source_Storage_storage_offset, aten.set_.source_Tensor, aten.resize_.default,
    aten._local_scalar_dense.default, aten.is_same_size.default, aten.sym_size.int,
    aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default,
    aten._has_compatible_shallow_copy_type.default, aten.is_set_to.default,
    aten.record_stream.default,
})


@dataclasses.dataclass(frozen=True)
class OpTime:
    """One kernel's modeled time on one GPU, in seconds, and why."""

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


def launches_kernel(func: Any) -> bool:
    return func not in _NO_KERNEL and not func.is_view


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


def _tensor_bytes(values: Any) -> tuple[int, torch.dtype | None]:
    total, dtype = 0, None
    for v in values:
        if isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
            dtype = dtype or v.dtype
        elif isinstance(v, (list, tuple)):
            for t in v:
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
                    dtype = dtype or t.dtype
    return total, dtype


def flops_of(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of an aten op by torch's own rules (0 where torch has none)."""
    formula = flop_registry.get(func.overloadpacket)
    if formula is None:
        return 0
    try:
        return int(formula(*args, out_val=out, **kwargs))
    except Exception:  # a rule that does not take this overload's arguments
        return 0


def op_time(spec: GpuSpec, index: int, func: Any, args: tuple, kwargs: dict, out: Any) -> OpTime:
    """The modeled time of one kernel on GPU `index` of kind `spec`."""
    read, dtype = _tensor_bytes(args)
    extra, _ = _tensor_bytes(kwargs.values())
    written, out_dtype = _tensor_bytes(out if isinstance(out, (list, tuple)) else (out,))
    nbytes = read + extra + written
    flops = flops_of(func, args, kwargs, out)
    dtype = dtype or out_dtype or torch.float32
    return OpTime(
        op=str(func.overloadpacket).replace("aten.", "aten::"),
        device=index,
        launch=spec.launch_latency_us * 1e-6,
        compute=flops / peak_flops(spec, dtype) if flops else 0.0,
        memory=nbytes / (spec.memory_bandwidth_gbs * 1e9),
        flops=flops,
        nbytes=nbytes,
    )
