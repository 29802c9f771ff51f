"""devlab.engine.gpu_model.ops_catalog: one catalogue of per-op facts, each op listed once, which every module asks.

The expected sets below are the tables the catalogue replaced, copied from the modules that held
them (devlab/engine/aten_overloads.py, placement_log.py, simulated/clock/clock.py and roofline.py,
simulated/mode/factories.py and ops.py, gpu_model/op_costs.py) before they were deleted: the
catalogue must give every module the very facts it had.
"""

from __future__ import annotations

import pytest
import torch

from devlab.core import placement_log as _placement_log
from devlab.engine import aten_overloads as aten_ops
from devlab.engine.gpu_model import kernels, ops_catalog
from devlab.engine.gpu_model import op_costs as _gpu_ops
from devlab.engine.simulated.clock import charges as _clock
from devlab.engine.simulated.clock import roofline as _roofline
from devlab.engine.simulated.mode import device_rule as _mode_ops
from devlab.engine.simulated.mode import factories as _factories

Tensor = torch.Tensor
aten = torch.ops.aten

OLD_COPY_OPS = {aten._to_copy.default, aten.copy_.default, aten._copy_from.default,
                aten._copy_from_and_resize.default}
OLD_SYNC_OPS = {
    aten._local_scalar_dense.default: "reading a Python number: .item(), float(), int(), bool() or `if tensor:`",
    aten.nonzero.default: "nonzero: the output size depends on the values",
    aten.masked_select.default: "masked_select: the output size depends on the values",
    aten.equal.default: "torch.equal returns a Python bool",
}
OLD_COLLECTIVES = {
    "allreduce_": ("All-reduce", 0), "allreduce_coalesced_": ("All-reduce", 0),
    "broadcast_": ("Broadcast", 0), "reduce_": ("Reduce", 0),
    "allgather_": ("All-gather", 1), "_allgather_base_": ("All-gather", 1),
    "allgather_coalesced_": ("All-gather", 1),
    "allgather_into_tensor_coalesced_": ("All-gather", 1),
    "reduce_scatter_": ("Reduce-scatter", 1), "_reduce_scatter_base_": ("Reduce-scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("Reduce-scatter", 1),
    "gather_": ("Gather", 1), "scatter_": ("Scatter", 1), "alltoall_": ("All-to-all", 1),
    "alltoall_base_": ("All-to-all", 1), "send": ("Send", 0), "recv_": ("Receive", 0),
    "recv_any_source_": ("Receive", 0), "barrier": ("Barrier", 0),
    "monitored_barrier_": ("Barrier", 0)}
OLD_READS = {Tensor.item, Tensor.__bool__, Tensor.__float__, Tensor.__int__, Tensor.__index__,
             Tensor.__repr__, Tensor.__str__, Tensor.__format__}
OLD_SIZED_BY_VALUES = {torch.nonzero, Tensor.nonzero, torch.masked_select, Tensor.masked_select,
                       torch.equal, Tensor.equal}
OLD_EMPTY = {torch.empty, torch.empty_like, torch.empty_strided, torch.empty_permuted}
OLD_FROM_HOST_DATA = {torch.tensor, torch.as_tensor, torch.asarray}
OLD_SIZED = {torch.empty, torch.zeros, torch.ones, torch.rand, torch.randn, torch.full}
OLD_NO_KERNEL = {
    aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
    aten.detach.default, aten.alias.default, aten.lift_fresh.default, aten.set_.source_Storage,
    aten.set_.source_Storage_storage_offset, aten.set_.source_Tensor, aten.resize_.default,
    aten._local_scalar_dense.default, aten.is_same_size.default, aten.sym_size.int,
    aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default,
    aten._has_compatible_shallow_copy_type.default, aten.is_set_to.default,
    aten.record_stream.default}
OLD_MIXED_OK_NAMES = {
    "__setitem__", "__getitem__", "index_put_", "index_put", "set_",
    "_make_subclass", "backward", "copy_", "_has_compatible_shallow_copy_type", "is_same_size",
    "is_set_to", "swap_tensors", "_version", "register_hook"}
OLD_ADDED = {"aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::addmv"}
GEMM, SOFTMAX, LAYER_NORM, REDUCTION, EMBEDDING, COPY = (
    kernels.GEMM, kernels.SOFTMAX, kernels.LAYER_NORM, kernels.REDUCTION, kernels.EMBEDDING,
    kernels.COPY)
OLD_FAMILIES = {
    **dict.fromkeys(("mm", "addmm", "bmm", "baddbmm", "addbmm", "linear", "matmul", "dot",
                     "mv", "addmv", "conv1d", "conv2d", "conv3d", "convolution",
                     "_convolution", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                     "scaled_dot_product_attention"), GEMM),
    **dict.fromkeys(("softmax", "_softmax", "log_softmax", "_log_softmax", "cross_entropy",
                     "cross_entropy_loss", "nll_loss"), SOFTMAX),
    **dict.fromkeys(("layer_norm", "native_layer_norm", "group_norm", "native_group_norm",
                     "rms_norm", "batch_norm", "native_batch_norm", "instance_norm"),
                    LAYER_NORM),
    **dict.fromkeys(("sum", "mean", "amax", "amin", "max", "min", "norm", "linalg_vector_norm",
                     "var", "std", "var_mean", "std_mean", "argmax", "argmin", "all", "any",
                     "prod", "logsumexp", "count_nonzero", "mse_loss", "l1_loss"), REDUCTION),
    **dict.fromkeys(("embedding", "embedding_bag", "index_select", "gather", "take"),
                    EMBEDDING),
    **dict.fromkeys(("copy", "clone", "contiguous", "to", "cat", "stack", "_to_copy"), COPY),
}


def test_a_key_or_callable_listed_twice_is_refused():
    with pytest.raises(RuntimeError, match="duplicate registrations for aten::mm"):
        ops_catalog.register("aten::mm", family=ops_catalog.GEMM)
    with pytest.raises(RuntimeError, match="duplicate registrations for torch.empty"):
        ops_catalog.register("devlab::test_empty", empty=True, callables=("torch.empty",))
    with pytest.raises(RuntimeError, match="duplicate registrations for torch.tensor"):
        ops_catalog.register("devlab::test_tensor", callables=("torch.tensor",))
    with pytest.raises(TypeError, match="unknown facts"):
        ops_catalog.register("devlab::test_unknown", factory_of_factories=True)
    assert not [k for k in ops_catalog.CATALOG if k.startswith("devlab::")]


def test_the_dispatch_facts_are_the_old_tables():
    assert aten_ops.COPY_OPS == OLD_COPY_OPS
    assert aten_ops.SYNC_OPS == OLD_SYNC_OPS
    assert _roofline._NO_KERNEL == OLD_NO_KERNEL
    expected = {getattr(packet, o): kind for name, kind in OLD_COLLECTIVES.items()
                if (packet := getattr(getattr(torch.ops, "c10d", None), name, None)) is not None
                for o in packet.overloads()}
    assert _placement_log._COLLECTIVE_OPS == expected
    assert _roofline.launches_kernel(aten.mm.default)
    assert not _roofline.launches_kernel(aten.view.default)  # a view: torch's is_view


def test_the_routing_facts_are_the_old_tables():
    assert _clock._READS == OLD_READS
    assert _clock._SIZED_BY_VALUES == OLD_SIZED_BY_VALUES
    assert _clock._EMPTY == OLD_EMPTY == _factories._EMPTY
    assert _clock._FROM_HOST_DATA == OLD_FROM_HOST_DATA
    assert _factories._SIZED == OLD_SIZED
    assert _factories.CONSTRUCTORS == frozenset(torch.utils._device._device_constructors())
    assert _mode_ops._MIXED_OK_NAMES == OLD_MIXED_OK_NAMES
    for func in (Tensor.add_, Tensor.__setitem__, torch.relu_):
        assert ops_catalog.in_place(func)
    for func in (Tensor.add, torch.relu):
        assert not ops_catalog.in_place(func)


def test_the_cost_families_are_the_old_tables():
    listed = {k.removeprefix("aten::"): op.family for k, op in ops_catalog.CATALOG.items()
              if op.family is not None}
    assert listed == OLD_FAMILIES
    assert {k for k, op in ops_catalog.CATALOG.items() if op.added} == OLD_ADDED
    assert set(listed.values()) <= {GEMM, SOFTMAX, LAYER_NORM, REDUCTION, EMBEDDING, COPY}
    for name, expected in [("mm", GEMM), ("aten::addmm", GEMM), ("aten.bmm.default", GEMM),
                           ("copy_", COPY), ("aten::_to_copy", COPY), ("aten::softmax", SOFTMAX),
                           ("sum", REDUCTION), ("add_", kernels.ELEMENTWISE),
                           ("aten::empty", kernels.ELEMENTWISE), ("relu", kernels.ELEMENTWISE)]:
        assert _gpu_ops.family(name) == expected, name
    assert _gpu_ops.gemm_dims("aten::addmm", [(8,), (4, 16), (16, 8)]) == (1, 4, 8, 16, False)
    assert _gpu_ops.gemm_dims("aten::mm", [(4, 16), (16, 8)]) == (1, 4, 8, 16, False)


def test_each_callable_belongs_to_one_entry():
    paths = [p for op in ops_catalog.CATALOG.values() for p in ops_catalog._paths(op)]
    assert len(paths) == len(set(paths))
    assert all(ops_catalog._resolve(p) is not None for p in paths)


# devlab/engine/simulated/cuda/amp.py's lists (CUDA autocast's policy), before the catalogue had them.
OLD_AUTOCAST = {
    "lower": (
        "_convolution", "convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
        "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "prelu",
        "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear",
        "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
        "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
        "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
        "scaled_dot_product_attention"),
    "fp32": (
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
        "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
        "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "group_norm",
        "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
        "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
        "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
        "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
        "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits",
        "dist", "pdist", "cdist", "renorm", "logsumexp"),
    "set_dtype": (
        "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
        "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
        "sum.dim_IntList"),
    "promote": ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler",
                "index_put", "tensordot", "scatter_add"),
}


def test_the_autocast_policies_are_the_old_lists():
    expected = {}
    for policy, names in OLD_AUTOCAST.items():
        for name in names:
            base, _, overload = name.partition(".")
            packet = getattr(aten, base, None)
            op = getattr(packet, overload or "default", None) if packet is not None else None
            if op is not None:
                expected[op] = policy
    found = {op: entry.autocast for op, entry in ops_catalog.overloads("autocast").items()}
    assert found == expected
