"""DTensor on simulated GPUs: its random numbers, and the shapes it propagates.

DTensor's random ops run through its RNG tracker, whose CUDA offsets a simulated GPU (drawing
from the CPU's generator) keeps in its own way: `_dtensor_rng`.

DTensor propagates shardings on fake tensors it makes for the mesh's device
(`_op_schema._rebuild_tensor_from_dtensor_meta`), inside its own dispatch, where the
simulation's mode is not on the stack (torch pops a mode while it handles a call): a fake CUDA
tensor there cannot take a random op's decomposition on a CPU build. Only their shapes, strides
and dtypes are read, so on a mesh of simulated GPUs they are fake CPU tensors.

`F.scaled_dot_product_attention` picks its kernel by device in C++, which sees the CPU: given
DTensors it runs the CPU's flash kernel, for which DTensor registers no sharding strategy (on
CUDA it runs CUDA's flash kernel, which has one). The simulation registers, for the CPU kernel
and its backward, the strategies DTensor has for CUDA's: all replicated, sharded by heads
(tensor parallelism), or by batch.

torch.distributed.tensor takes seconds to import, so these are replaced when a program imports
it (a finder on `sys.meta_path`), not when the simulation starts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.import_patches import when_imported
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.torch_distributed import dtensor_rng as _dtensor_rng

RANDOM = "torch.distributed.tensor._random"
DISPATCH = "torch.distributed.tensor._dispatch"
OP_SCHEMA = "torch.distributed.tensor._op_schema"
TENSOR = "torch.distributed.tensor"


def _fake_on_cpu(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def _rebuild_tensor_from_dtensor_meta(arg: Any) -> Any:
        if _session.session is None or arg.mesh.device_type != "cuda" or arg.tensor_meta is None:
            return original(arg)
        import torch

        meta = arg.tensor_meta
        return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="cpu")

    return _rebuild_tensor_from_dtensor_meta


def _attention_strategies(outputs: int) -> Callable[[Any], Any]:
    """DTensor's strategies for CUDA's flash attention, for an op with `outputs` outputs."""

    def strategy(op_schema: Any) -> Any:
        from torch.distributed.tensor._op_schema import OpStrategy
        from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
        from torch.distributed.tensor.placement_types import Replicate, Shard

        tensors = outputs + sum(isinstance(a, OpStrategy) for a in op_schema.args_schema)
        choices = [[Replicate()] * tensors, [Shard(1)] * tensors, [Shard(0)] * tensors]
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema,
                                               choices, input_index=outputs)

    return strategy


def install(p: Patcher) -> None:
    def patch_fakes(module: ModuleType) -> None:
        # (also while the simulation starts, before its session exists: a module imported
        # already is patched then)
        current = getattr(module, "_rebuild_tensor_from_dtensor_meta", None)
        if current is not None:
            p.set(module, "_rebuild_tensor_from_dtensor_meta", _fake_on_cpu(current))

    def register_attention(module: ModuleType) -> None:
        import torch
        from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

        propagator = module.DTensor._op_dispatcher.sharding_propagator
        aten = torch.ops.aten
        for op, outputs, static in (
                (aten._scaled_dot_product_flash_attention_for_cpu.default, 2, 3),
                (aten._scaled_dot_product_flash_attention_for_cpu_backward.default, 3, 6)):
            if op in propagator.op_strategy_funcs:
                continue
            propagator.register_op_strategy(op, _attention_strategies(outputs),
                                            RuntimeSchemaInfo(static, ["scale"]))
            p.on_restore(functools.partial(_unregister, propagator, op))

    for name, patch in ((RANDOM, functools.partial(_dtensor_rng.patch_random, p)),
                        (DISPATCH, functools.partial(_dtensor_rng.patch_dispatch, p)),
                        (OP_SCHEMA, patch_fakes), (TENSOR, register_attention)):
        when_imported(p, name, patch)


def _unregister(propagator: Any, op: Any) -> None:
    propagator.op_strategy_funcs.pop(op, None)
    propagator.op_to_schema_info.pop(op, None)
    propagator.propagate_op_sharding.cache_clear()
