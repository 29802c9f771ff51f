"""The torch internals simulated GPUs stand on, checked before a simulation starts.

The simulation replaces parts of torch and calls a few of its private functions. A torch
release may rename any of them; rather than run with a piece silently missing (a backward pass
without routing, say), start() refuses and names the torch version and what is missing.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from importlib import metadata

import torch

# (module, attribute path) for everything private, or replaced, that the simulation uses.
REQUIRED: tuple[tuple[str, str], ...] = (
    ("torch.overrides", "_push_mode"),
    ("torch.overrides", "_pop_mode"),
    ("torch.overrides", "_get_current_function_mode_stack"),
    ("torch._C", "DisableTorchFunction"),
    ("torch._C", "_len_torch_function_stack"),
    ("torch._C", "_len_torch_dispatch_stack"),
    ("torch._C", "_dispatch_tls_local_include_set"),
    ("torch._C", "_dispatch_tls_local_exclude_set"),
    ("torch._C", "_is_any_autocast_enabled"),
    ("torch._C", "_functorch.peek_interpreter_stack"),
    ("torch._C", "_group_tensors_by_device_and_dtype"),
    ("torch._C", "_nn._parse_to"),
    ("torch._C", "TensorBase.device"),
    ("torch._C", "TensorBase.get_device"),
    ("torch._C", "TensorBase.is_pinned"),
    ("torch._C", "_storage_Use_Count"),
    ("torch.utils._device", "DeviceContext.__torch_function__"),
    ("torch.utils._device", "CURRENT_DEVICE"),
    ("torch.utils._device", "_device_constructors"),
    ("torch._C", "_functions.AccumulateGrad"),
    ("torch.autograd", "_make_grads"),
    ("torch.autograd", "_tensor_or_tensors_to_tuple"),
    ("torch.autograd.graph", "_engine_run_backward"),
    ("torch._ops", "OpOverload"),
    ("torch.serialization", "register_package"),
    ("torch.serialization", "_package_registry"),
    ("torch.amp.autocast_mode", "autocast.__enter__"),
    ("torch._C", "_dispatch_has_kernel_for_dispatch_key"),
    ("torch._C", "_ExcludeDispatchKeyGuard"),
    ("torch.library", "Library._destroy"),
    ("torch.cuda", "_lazy_init"),
    ("torch.cuda", "_is_in_bad_fork"),
    ("torch.nn.parallel._functions", "Scatter"),
    ("torch.nn.parallel._functions", "Gather"),
    ("torch.nn.parallel._functions", "Broadcast"),
    ("torch.nn.parallel.scatter_gather", "Scatter"),
    ("torch.nn.parallel.comm", "broadcast_coalesced"),
    ("torch.nn.parallel.data_parallel", "parallel_apply"),
    ("torch.nn.parallel.parallel_apply", "get_a_var"),
    ("torch._utils", "ExceptionWrapper"),
    ("threading", "Thread._bootstrap_inner"),
    # CUDA graphs (cuda/graphs.py): torch.cuda.graph and make_graphed_callables look these up,
    # and a replay runs its ops below autograd with every mode off.
    ("torch.cuda.graphs", "graph_pool_handle"),
    ("torch.cuda.graphs", "make_graphed_callables"),
    ("torch._C", "_AutoDispatchBelowADInplaceOrView"),
    ("torch.utils._python_dispatch", "_disable_current_modes"),
    ("torch._C", "StorageBase._cdata"),
)


def missing() -> list[str]:
    """The required names this Python and torch lack."""
    out = []
    for module, path in REQUIRED:
        try:
            obj: object = importlib.import_module(module)
            for part in path.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            out.append(f"{module}.{path}")
    return out


def claimed_torch() -> str | None:
    """The torch requirement devlab's metadata claims (the tested range), if installed."""
    try:
        reqs = metadata.requires("devlab") or []
    except metadata.PackageNotFoundError:
        return None
    for r in reqs:
        name = r.split(";")[0].strip()
        if name.startswith("torch") and name[5:6] in ("<", ">", "=", "!", "~", " ", ""):
            return name
    return None


_warned = threading.Event()


def check() -> None:
    """Refuse to simulate on a torch that lacks what the simulation uses; warn once on a torch
    outside the range devlab is tested with."""
    gone = missing()
    claimed = claimed_torch()
    tested = f"devlab is tested with {claimed}" if claimed else "see devlab's pyproject.toml"
    if gone:
        raise RuntimeError(
            f"devlab cannot simulate GPUs with torch {torch.__version__}: it relies on torch "
            f"internals this version lacks ({', '.join(gone)}). {tested}; install a tested "
            "torch, or use devlab without simulated GPUs.")
    if claimed and not _warned.is_set() and not _within(torch.__version__, claimed):
        _warned.set()
        warnings.warn(f"devlab's simulated GPUs are untested with torch {torch.__version__} "
                      f"({tested}).", stacklevel=3)


def _within(version: str, requirement: str) -> bool:
    try:
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:  # packaging comes with pip and setuptools; without it, do not guess
        return True
    base = Version(Version(version).base_version)
    return Requirement(requirement).specifier.contains(base, prereleases=True)
