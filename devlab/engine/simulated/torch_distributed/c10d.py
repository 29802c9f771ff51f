"""torch.distributed on simulated GPUs: NCCL's process group, and DDP buckets by simulated GPU.

A simulated GPU's tensor is a CPU tensor in C++, so gloo can move the bytes of every collective
over simulated GPUs; what a program written for real GPUs asks of torch.distributed is answered
here:

- NCCL: torch builds an NCCL group (`init_process_group("nccl")`, `"cuda:nccl,cpu:gloo"`,
  `new_group(backend="nccl")`, DeviceMesh's groups) as `ProcessGroupNCCL(...)` when
  `is_nccl_available()` (torch 2.15 and later, through the backend plugin registered for
  "nccl", whose creator a CUDA build points at torchcomms' `ProcessGroupNCCL2`; here every NCCL
  name's plugin makes `ProcessGroupNCCL`, as `TORCH_DIST_USE_NCCL2=0` does). Both are installed
  where torch looks for them: the group is `_nccl`'s,
  with NCCL's semantics on gloo (`get_backend()` says "nccl"), and the process says once, on
  stderr, that gloo carries it. A group made with `device_id=` is bound to that device, as
  torch binds an NCCL group (torch binds the group it makes before it knows a Python group
  replaces it). NCCL's default timeout (10 minutes) is torch's for "nccl", as in a CUDA build.
- Futures of collectives run their callbacks routed, and the NCCL group's shutdown and the
  interpreter's exit wait for gloo's threads (`futures`; See Note [Why a rank waits at exit]).
- DDP's buckets: the Reducer makes them in C++, where a simulated GPU is the CPU, so a bucket
  would say `cpu`. A communication hook (`register_comm_hook`) sees its bucket on the GPU of
  the bucket's parameters, as on a real machine (PowerSGD makes its matrices there).
- DDP's Reducer never holds its process group last. Torch releases a group held from Python
  with the GIL released (gloo's teardown joins its threads, which may need the GIL to finish
  the work they completed last: its thread-local state holds Python objects, as work issued
  during backward does); the Reducer, a C++ object freed with the GIL held, would join them
  holding it, and wait for ever. The group's Python object stays alive until the Reducer is
  gone.
- `dist._compute_bucket_assignment_by_size`, with which DistributedDataParallel groups the
  gradients it all-reduces into buckets: C++ groups them by device and sees only the CPU, so a
  model spread over two simulated GPUs would share buckets between them. It groups by
  simulated GPU first, as on a real machine (one bucket never spans two GPUs).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.base.storage_marks import index_of, live_mark, mark_one, storage_of
from devlab.engine.simulated.mode.dispatch_devices import OneGpu
from devlab.engine.simulated.torch_distributed import c10d_futures as _futures


def _binding(original: Any) -> Any:
    """`_new_process_group_helper` that binds our NCCL group to its `device_id`, and gives
    it the devices its backend string names (`"cpu:gloo,cuda:nccl"`: the CPU and CUDA)."""

    @functools.wraps(original)
    def _new_process_group_helper(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        pg, store = original(*args, **kwargs)
        device_id = kwargs.get("device_id")
        from devlab.engine.simulated.torch_distributed.nccl import ProcessGroupNCCL

        if isinstance(pg, ProcessGroupNCCL):
            if device_id is not None:
                pg.bound_device_id = device_id
            backend = kwargs["backend"] if "backend" in kwargs else args[3]
            pg._devices = _devices_named(backend)
        return pg, store

    return _new_process_group_helper


def _devices_named(backend: Any) -> tuple[str, ...]:
    """The device types a backend string gives a backend ("nccl": CUDA's alone), CUDA last:
    the NCCL group's `_device_types`."""
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    named = BackendConfig(Backend(str(backend))).get_device_backend_map()
    return tuple(d for d in named if d != "cuda") + ("cuda",)


def _placed_hook(hook: Any) -> Any:
    """A DDP communication hook that first puts its bucket on its parameters' GPU."""

    @functools.wraps(hook)
    def placed(state: Any, bucket: Any) -> Any:
        params = bucket.parameters()
        index = index_of(params[0]) if params else None
        storage = storage_of(bucket.buffer())
        if index is not None and storage is not None and live_mark(storage) is None:
            mark_one(storage, index)
        return hook(state, bucket)

    return placed


def _hook_registration(original: Any) -> Any:
    @functools.wraps(original)
    def _register_comm_hook(reducer: Any, state: Any, comm_hook: Any) -> Any:
        return original(reducer, state, _placed_hook(comm_hook))

    return _register_comm_hook


def _keep(group: Any) -> None:
    """What a Reducer's finalizer calls: nothing; its finalizer lets go of `group` after."""


def _reducer(original: Any) -> Any:
    """`dist.Reducer` whose buckets are its GPU's memory, and that keeps its process group's
    Python object alive until the Reducer is freed: its finalizer runs after the C++ Reducer is
    destroyed, then lets go of the group from Python, where torch tears a group down with the
    GIL released."""

    def Reducer(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - the class it stands for
        params = args[0] if args else kwargs.get("params", [])
        places = {index_of(p) for p in params}
        if len(places) == 1 and None not in places:
            # The Reducer allocates its gradient buckets in C++, on its parameters' GPU: the
            # size of the model again. See Note [Why ops run watched] in mode/dispatch_devices.py.
            with OneGpu(places.pop()):
                reducer = original(*args, **kwargs)
        else:
            reducer = original(*args, **kwargs)
        group = args[3] if len(args) > 3 else kwargs.get("process_group")
        if group is not None:
            weakref.finalize(reducer, _keep, group)
        return reducer

    Reducer.__wrapped__ = original  # type: ignore[attr-defined]
    Reducer.__doc__ = original.__doc__
    return Reducer


def _bucketing(original: Any) -> Any:
    def compute_bucket_assignment_by_size(tensors: list[torch.Tensor],
                                          bucket_size_limits: list[int],
                                          expect_sparse_gradient: list[bool] | None = None,
                                          tensor_indices: list[int] | None = None,
                                          ) -> tuple[list[list[int]], list[int]]:
        """DDP's bucketing, one device at a time: a bucket holds one simulated GPU's tensors."""
        sparse = list(expect_sparse_gradient or [])
        indices = list(tensor_indices or [])
        places = [index_of(t) for t in tensors]
        if len(set(places)) <= 1:
            return original(tensors, bucket_size_limits, sparse, indices)
        buckets: list[tuple[int, list[int], int]] = []  # (first position, indices, limit)
        for place in dict.fromkeys(places):
            picked = [i for i, p in enumerate(places) if p == place]
            sub, limits = original([tensors[i] for i in picked], bucket_size_limits,
                                   [sparse[i] for i in picked] if sparse else [],
                                   [indices[i] for i in picked] if indices else [])
            # Without tensor_indices the C++ answer numbers the tensors it was given.
            position = {(indices[i] if indices else i): i for i in picked}
            for bucket, limit in zip(sub, limits, strict=True):
                numbered = bucket if indices else [picked[j] for j in bucket]
                buckets.append((min(position[k] for k in numbered), numbered, limit))
        buckets.sort(key=lambda b: b[0])  # as C++ orders them: by their first tensor
        return [b[1] for b in buckets], [b[2] for b in buckets]

    compute_bucket_assignment_by_size.__wrapped__ = original  # type: ignore[attr-defined]
    return compute_bucket_assignment_by_size


# The names under which torch 2.15 and later register NCCL's creators as backend plugins.
_NCCL_PLUGINS = ("NCCL", "NCCL2", "NCCL-LAZY")


def _nccl_plugins(p: Patcher, c10d: Any) -> None:
    """Torch 2.15 and later build "nccl" through a backend plugin registered from torch's own
    entry points on first use; in a CUDA build its creator makes `ProcessGroupNCCL2` (the
    torchcomms engine), which would take our options for NCCL's. On simulated GPUs "nccl",
    "nccl2" and "nccl-lazy" make `ProcessGroupNCCL`, as `_create_nccl_process_group` (and
    torch before 2.15, and `TORCH_DIST_USE_NCCL2=0`) does, and that creator records for
    itself, as torch says of it for the flight recorder. stop() puts back torch's plugins."""
    backend = c10d.Backend
    create = getattr(c10d, "_create_nccl_process_group", None)
    plugins = getattr(backend, "_plugins", None)
    ensure = getattr(backend, "_ensure_backend_registered", None)
    if create is None or plugins is None or ensure is None:
        return  # torch before 2.15: the NCCL group is made in _new_process_group_helper
    for name in _NCCL_PLUGINS:
        ensure(name.lower())  # what torch's first init_process_group("nccl") would register
        plugin = plugins.get(name)
        if plugin is not None and plugin.creator_fn is not create:
            plugins[name] = plugin._replace(creator_fn=create)
            p.on_restore(functools.partial(plugins.__setitem__, name, plugin))
    recording = getattr(c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if recording is not None:
        p.set(c10d, "_FR_SELF_RECORDING_BACKENDS", recording | {c10d.Backend.NCCL})
    split_source = getattr(c10d, "_get_split_source", None)
    if split_source is not None:
        p.set(c10d, "_get_split_source", _no_split_source(split_source))


def _no_split_source(original: Any) -> Any:
    """`_get_split_source` without our NCCL backend: a plugin's creator gets the source in a C++
    struct, which cannot hold a Python backend, and our groups are made afresh anyway (the
    split a rank outside the new group takes part in does nothing here)."""

    @functools.wraps(original)
    def _get_split_source(*args: Any, **kwargs: Any) -> Any:
        from devlab.engine.simulated.torch_distributed.nccl import NCCLBackend

        source = original(*args, **kwargs)
        return None if isinstance(source, NCCLBackend) else source

    return _get_split_source


def install(p: Patcher) -> None:
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from devlab.engine.simulated.torch_distributed.nccl import DEFAULT_TIMEOUT, ProcessGroupNCCL

    p.set(c10d, "_NCCL_AVAILABLE", True)
    for module in (c10d, dist):
        p.set(module, "ProcessGroupNCCL", ProcessGroupNCCL)
    _nccl_plugins(p, c10d)
    p.set(c10d, "default_pg_nccl_timeout", DEFAULT_TIMEOUT)
    p.set(c10d, "_new_process_group_helper", _binding(c10d._new_process_group_helper))
    p.set(dist, "_register_comm_hook", _hook_registration(dist._register_comm_hook))
    p.set(dist, "Reducer", _reducer(dist.Reducer))
    # torch.Future (torch._C.Future): what Work.get_future() returns, and torch.futures.Future's
    # base, whose methods it calls.
    for name in ("then", "add_done_callback"):
        p.set(torch._C.Future, name, _futures.routed_callbacks(getattr(torch._C.Future, name)))
    p.set(dist, "_compute_bucket_assignment_by_size",
          _bucketing(dist._compute_bucket_assignment_by_size))
