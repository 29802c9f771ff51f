"""What devlab knows about each op, in one catalogue: every op listed once, with its facts.

Which ops copy between devices, make the host wait (and why), hand the host a Python value,
are sized by their values, are collectives (and which argument they send), leave memory
unwritten, take a size, are made from host data, launch no kernel, may mix devices, which
cost family of `devlab.gpu_model` they follow, and CUDA autocast's policy for them. The placement log, the simulation's mode and
clock, and the GPU model all ask this module; none keeps a table of its own.

The rule for keys: an entry is keyed by the op's name, one way, as torch writes it,

- an aten or c10d op by its qualified name, `namespace::name` (`aten::_to_copy`,
  `c10d::allreduce_`), as `OpOverload.name()` writes the default overload; `overloads` names
  the overloads its dispatch facts (copy, host_sync, no_kernel, collective, autocast) hold for,
  when not all; the torch functions and Tensor methods the routing mode meets as this op are
  listed in its entry (`callables`, Python paths such as `torch.Tensor.nonzero`);
- a torch callable that is no aten op (`torch.tensor`, `torch.Tensor.__repr__`) by its Python
  path.

`register` refuses a key, or a callable, listed twice (at import, as torch/utils/
flop_counter.py's `register_flop_formula` refuses a duplicate). Facts torch itself keeps are
asked of torch, not copied here: which ops are views (`OpOverload.is_view`), which functions
take a `device=` (`torch.utils._device._device_constructors()`, `factories()`). An op listed
nowhere has no fact (`NOTHING`): element-wise, a kernel, one device.

This module imports nothing but the standard library, so that `devlab.gpu_model` (pure
Python) may ask it too; `overloads`, `callables` and `factories` import torch when first
called. The family names are `devlab.engine.gpu_model.kernels`' (tests/test_ops_catalog.py checks).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Op:
    """One op's facts (false or empty: the fact does not hold)."""

    key: str
    family: str | None = None  # its cost family in devlab.gpu_model (None: element-wise)
    added: bool = False  # a product plus a tensor (addmm's bias): its first tensor is no operand
    copy: bool = False  # copies a tensor, between devices too
    empty: bool = False  # makes a tensor and leaves its memory unwritten
    sized: bool = False  # a factory whose first arguments are the size (its bytes known before)
    from_host_data: bool = False  # makes a tensor from host data (lists, arrays)
    reads: bool = False  # hands the host a Python value read from the device: a copy, a wait
    sized_by_values: bool = False  # its output's size depends on the values: the host waits
    host_sync: str = ""  # why the host waits for the device at this op (the placement log's words)
    no_kernel: bool = False  # metadata only: no kernel runs
    collective: str = ""  # a collective's name in a log line
    sends: int = 0  # a collective's argument holding the tensors this process sends
    mixes_devices: bool = False  # may take tensors of two devices, as on CUDA
    in_place: bool = False  # writes its input, beside aten's rule (a name ending in `_`)
    autocast: str = ""  # CUDA autocast's policy for it, where CPU autocast's differs (amp.py)
    cublas: bool = False  # runs cuBLAS: a GPU's first such op allocates cuBLAS's workspace
    overloads: tuple[str, ...] | None = None  # the overloads its dispatch facts hold for
    callables: tuple[str, ...] = ()  # the torch functions and methods that are this op

    @property
    def name(self) -> str:
        """The bare name: `aten::set_` and `torch.Tensor.set_` are `set_`."""
        return self.key.split("::")[-1].split(".")[-1]


NOTHING = Op("")
CATALOG: dict[str, Op] = {}
_CALLABLE_OWNER: dict[str, str] = {}  # a callable's Python path -> the key of its entry
_FACTS = frozenset(f.name for f in fields(Op)) - {"key"}


def register(*keys: str, **facts: Any) -> None:
    """List each of `keys` with these facts. Raises RuntimeError on a key, or a callable,
    already listed."""
    unknown = set(facts) - _FACTS
    if unknown:
        raise TypeError(f"register: unknown facts {sorted(unknown)}")
    for key in keys:
        if key in CATALOG:
            raise RuntimeError(f"duplicate registrations for {key}")
        op = Op(key, **facts)
        for path in _paths(op):
            if path in _CALLABLE_OWNER:
                raise RuntimeError(f"duplicate registrations for {path} "
                                   f"(in {_CALLABLE_OWNER[path]} and {key})")
        for path in _paths(op):
            _CALLABLE_OWNER[path] = key
        CATALOG[key] = op


def _paths(op: Op) -> tuple[str, ...]:
    """The Python paths of the torch callables that are `op`."""
    return op.callables if "::" in op.key else (op.key, *op.callables)


def get(name: str) -> Op:
    """The entry of `name` (a key), or NOTHING."""
    return CATALOG.get(name, NOTHING)


def _entry(bare: str) -> Op:
    return CATALOG.get(f"aten::{bare}", NOTHING)


def _bare(name: str) -> str:
    """`mm` of `mm`, `aten::mm`, `aten.mm` or `aten::mm.default`."""
    return name.removeprefix("aten::").removeprefix("aten.").split(".")[0]


def family(name: str) -> str | None:
    """The cost family of the op named `name` (`mm`, `aten::mm`, `aten.mm.default`), else of
    the op it is the in-place form of (`add_` follows `add`); None: no family listed."""
    bare = _bare(name)
    found = _entry(bare).family
    return found if found is not None else _entry(bare.rstrip("_")).family


def added(name: str) -> bool:
    """Whether the product named `name` (`addmm`, `aten::addmm`) adds a tensor to it: its first
    tensor argument is no operand."""
    return _entry(_bare(name)).added


def names(fact: str) -> frozenset[str]:
    """The bare names (`Op.name`) of the ops and callables with `fact`."""
    found: set[str] = set()
    for op in CATALOG.values():
        if getattr(op, fact):
            found.add(op.name)
            found.update(p.rsplit(".", 1)[-1] for p in op.callables)
    return frozenset(found)


def overloads(fact: str) -> dict[Any, Op]:
    """Every aten and c10d overload with `fact` -> its entry (the overloads this torch build
    has; c10d's only where it has torch.distributed)."""
    import torch

    found: dict[Any, Op] = {}
    for op in CATALOG.values():
        if not getattr(op, fact) or "::" not in op.key:
            continue
        namespace, name = op.key.split("::")
        packet = getattr(getattr(torch.ops, namespace, None), name, None)
        if packet is None:
            continue
        for overload in op.overloads if op.overloads is not None else packet.overloads():
            func = getattr(packet, overload, None)
            if func is not None:  # an overload this torch build lacks
                found[func] = op
    return found


def callables(fact: str) -> frozenset[Any]:
    """The torch functions and Tensor methods with `fact`."""
    return frozenset(_resolve(p) for op in CATALOG.values() if getattr(op, fact)
                     for p in _paths(op))


def _resolve(path: str) -> Any:
    module, _, rest = path.partition(".")
    obj: Any = importlib.import_module(module)
    for part in rest.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(f"{obj.__name__}.{part}")
    return obj


def factories() -> frozenset[Any]:
    """The torch functions that take a `device=`, as torch lists them for its default device."""
    import torch.utils._device as torch_device

    return frozenset(torch_device._device_constructors())


def in_place(func: Any) -> bool:
    """Whether a torch call writes its input: aten's rule (a name ending in `_`; Python's
    `__dunder__` methods end so too), or listed (`Tensor.__setitem__`)."""
    return getattr(func, "__name__", "")[-1:] == "_" or func in _written()


_in_place: frozenset[Any] | None = None


def _written() -> frozenset[Any]:
    global _in_place
    if _in_place is None:
        _in_place = callables("in_place")
    return _in_place


# --- the catalogue ------------------------------------------------------------------------------
# Cost families (devlab/engine/gpu_model/kernels.py's names): products and convolutions follow the tile
# rule; the others move their bytes at their family's achieved bandwidth; any op not listed is
# element-wise.
GEMM, SOFTMAX, LAYER_NORM, REDUCTION, EMBEDDING, COPY = (
    "matrix product", "softmax", "layer norm", "reduction", "embedding", "copy")
# CUDA autocast's policy for an op CPU autocast passes through (devlab/engine/simulated/cuda/amp.py
# registers it): run in the low dtype, in float32, in float32 unless given a dtype, or in the
# widest input dtype. Lists: aten/src/ATen/autocast_mode.h (AT_FORALL_LOWER_PRECISION_FP,
# AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_PROMOTE) and autocast_mode.cpp; an
# entry's `overloads` names the overloads the policy is for (default: `default`).
LOWER, FP32, SET_DTYPE, PROMOTE = "lower", "fp32", "set_dtype", "promote"
_DEFAULT = ("default",)


def _aten(*names: str) -> tuple[str, ...]:
    return tuple(f"aten::{n}" for n in names)


register(*_aten("mm", "bmm", "linear", "matmul", "mv"), family=GEMM, autocast=LOWER,
         overloads=_DEFAULT, cublas=True)
register(*_aten("conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d",
                "scaled_dot_product_attention"), family=GEMM, autocast=LOWER, overloads=_DEFAULT)
register(*_aten("conv_transpose2d", "conv_transpose3d"), family=GEMM, autocast=LOWER,
         overloads=("input",))
register("aten::dot", family=GEMM, autocast=PROMOTE, overloads=_DEFAULT, cublas=True)
register(*_aten("addmm", "baddbmm", "addbmm", "addmv"), family=GEMM, added=True, autocast=LOWER,
         overloads=_DEFAULT, cublas=True)
# `cross_entropy` is no aten op: the name the clock gives torch.nn.functional.cross_entropy.
register(*_aten("_softmax", "_log_softmax", "cross_entropy", "cross_entropy_loss"),
         family=SOFTMAX)
register(*_aten("softmax", "log_softmax"), family=SOFTMAX, autocast=SET_DTYPE,
         overloads=("int",))
register("aten::nll_loss", family=SOFTMAX, autocast=FP32, overloads=_DEFAULT)
register(*_aten("rms_norm", "native_group_norm", "batch_norm", "native_batch_norm",
                "instance_norm"), family=LAYER_NORM)
register(*_aten("layer_norm", "native_layer_norm", "group_norm"), family=LAYER_NORM,
         autocast=FP32, overloads=_DEFAULT)
register(*_aten("mean", "amax", "amin", "max", "min", "norm", "var", "std", "var_mean",
                "std_mean", "argmax", "argmin", "all", "any", "count_nonzero"), family=REDUCTION)
register(*_aten("mse_loss", "l1_loss", "logsumexp"), family=REDUCTION, autocast=FP32,
         overloads=_DEFAULT)
register("aten::linalg_vector_norm", family=REDUCTION, autocast=SET_DTYPE, overloads=_DEFAULT)
register("aten::prod", family=REDUCTION, autocast=SET_DTYPE, overloads=("default", "dim_int"))
register("aten::sum", family=REDUCTION, autocast=SET_DTYPE,
         overloads=("default", "dim_IntList"))
register(*_aten("embedding", "embedding_bag", "index_select", "gather", "take"),
         family=EMBEDDING)
register(*_aten("copy", "clone", "contiguous", "to", "cat", "stack"), family=COPY)
# Element-wise ops (no family) with a policy of CUDA autocast's.
register(*_aten("conv_tbc", "prelu", "addr", "einsum", "linalg_vecdot", "chain_matmul",
                "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
                "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
                "_scaled_dot_product_flash_attention"), autocast=LOWER, overloads=_DEFAULT)
register(*_aten("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2",
                "log1p", "reciprocal", "rsqrt", "sinh", "tan", "softplus", "cosine_similarity",
                "poisson_nll_loss", "cosine_embedding_loss", "nll_loss2d",
                "hinge_embedding_loss", "kl_div", "smooth_l1_loss", "huber_loss",
                "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
                "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits",
                "dist", "pdist", "cdist", "renorm"), autocast=FP32, overloads=_DEFAULT)
register("aten::pow", autocast=FP32, overloads=("Tensor_Scalar", "Tensor_Tensor", "Scalar"))
register("aten::frobenius_norm", autocast=FP32, overloads=("dim",))
register("aten::nuclear_norm", autocast=FP32, overloads=("default", "dim"))
register(*_aten("cumprod", "cumsum"), autocast=SET_DTYPE, overloads=_DEFAULT)
register("aten::linalg_matrix_norm", autocast=SET_DTYPE, overloads=("default", "str_ord"))
register(*_aten("addcdiv", "addcmul", "atan2", "bilinear", "cross", "grid_sampler", "tensordot",
                "scatter_add"), autocast=PROMOTE, overloads=_DEFAULT)

# Copies between devices (the placement log's copy lines; the simulation's device of a copy).
register("aten::_to_copy", family=COPY, copy=True, overloads=("default",))
register("aten::copy_", copy=True, mixes_devices=True, overloads=("default",))
register("aten::_copy_from", "aten::_copy_from_and_resize", copy=True, overloads=("default",))

# Factories: memory left unwritten (See Note [Why empty memory reads as zeros] in
# devlab/engine/simulated/mode/factories.py), sized ones, and tensors made from host data.
register("aten::empty", empty=True, sized=True, no_kernel=True, overloads=("memory_format",),
         callables=("torch.empty",))
register("aten::empty_like", empty=True, no_kernel=True, overloads=("default",),
         callables=("torch.empty_like",))
register("aten::empty_strided", empty=True, no_kernel=True, overloads=("default",),
         callables=("torch.empty_strided",))
register("aten::empty_permuted", empty=True, callables=("torch.empty_permuted",))
register("aten::zeros", sized=True, callables=("torch.zeros",))
register("aten::ones", sized=True, callables=("torch.ones",))
register("aten::rand", sized=True, callables=("torch.rand",))
register("aten::randn", sized=True, callables=("torch.randn",))
register("aten::full", sized=True, callables=("torch.full",))
register("torch.tensor", "torch.as_tensor", "torch.asarray", from_host_data=True)

# The host waits: a Python value read from the device (a copy to the host), or an output whose
# size the values decide (the kernel, then the host learns the size).
register("aten::_local_scalar_dense", reads=True, no_kernel=True, overloads=("default",),
         host_sync="reading a Python number: .item(), float(), int(), bool() or `if tensor:`",
         callables=("torch.Tensor.item", "torch.Tensor.__bool__", "torch.Tensor.__float__",
                    "torch.Tensor.__int__", "torch.Tensor.__index__"))
register("torch.Tensor.__repr__", "torch.Tensor.__str__", "torch.Tensor.__format__", reads=True)
register("aten::nonzero", sized_by_values=True, overloads=("default",),
         host_sync="nonzero: the output size depends on the values",
         callables=("torch.nonzero", "torch.Tensor.nonzero"))
register("aten::masked_select", sized_by_values=True, overloads=("default",),
         host_sync="masked_select: the output size depends on the values",
         callables=("torch.masked_select", "torch.Tensor.masked_select"))
register("aten::equal", sized_by_values=True, overloads=("default",),
         host_sync="torch.equal returns a Python bool", callables=("torch.equal", "torch.Tensor.equal"))

# Metadata only: no kernel runs (views are torch's `OpOverload.is_view`).
register("aten::detach", "aten::alias", "aten::lift_fresh", "aten::resize_",
         "aten::sym_numel", "aten::sym_storage_offset", "aten::record_stream",
         no_kernel=True, overloads=("default",))
register("aten::sym_size", "aten::sym_stride", no_kernel=True, overloads=("int",))
register("aten::set_", no_kernel=True, mixes_devices=True,
         overloads=("source_Storage", "source_Storage_storage_offset", "source_Tensor"))
# Queries that only compare metadata (`_has_compatible_shallow_copy_type` in Module._apply) may
# look at tensors of two devices.
register("aten::_has_compatible_shallow_copy_type", "aten::is_same_size", "aten::is_set_to",
         no_kernel=True, mixes_devices=True, overloads=("default",))

# Allowed to mix devices, as on real CUDA: copies and indexing with host indices. (Attribute
# setters such as `p.data = t` never reach the routing mode.) Matched by bare name.
register("aten::index_put_", mixes_devices=True)
register("aten::index_put", mixes_devices=True, autocast=PROMOTE, overloads=_DEFAULT)
register("torch.Tensor.__setitem__", mixes_devices=True, in_place=True)
register("torch.Tensor.__getitem__", "torch.Tensor._make_subclass", "torch.Tensor.backward",
         "torch.utils.swap_tensors", "torch.Tensor._version", "torch.Tensor.register_hook",
         mixes_devices=True)

# Collectives (c10d's ops, every overload): their name in a log line and the argument holding
# the tensors this process sends.
for _label, _sends, _names in (
        ("All-reduce", 0, ("allreduce_", "allreduce_coalesced_")),
        ("Broadcast", 0, ("broadcast_",)), ("Reduce", 0, ("reduce_",)),
        ("All-gather", 1, ("allgather_", "_allgather_base_", "allgather_coalesced_",
                           "allgather_into_tensor_coalesced_")),
        ("Reduce-scatter", 1, ("reduce_scatter_", "_reduce_scatter_base_",
                               "reduce_scatter_tensor_coalesced_")),
        ("Gather", 1, ("gather_",)), ("Scatter", 1, ("scatter_",)),
        ("All-to-all", 1, ("alltoall_", "alltoall_base_")), ("Send", 0, ("send",)),
        ("Receive", 0, ("recv_", "recv_any_source_")), ("Barrier", 0, ("barrier",
                                                                      "monitored_barrier_"))):
    register(*(f"c10d::{n}" for n in _names), collective=_label, sends=_sends)
del _label, _sends, _names
