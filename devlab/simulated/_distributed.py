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
- DDP's buckets: the Reducer makes them in C++, where a simulated GPU is the CPU, so a bucket
  would say `cpu`. A communication hook (`register_comm_hook`) sees its bucket on the GPU of
  the bucket's parameters, as on a real machine (PowerSGD makes its matrices there).
- Futures of collectives (`work.get_future().then(callback)`, as DDP's hooks chain them): a
  callback runs on the thread that completes the future, often gloo's own C++ thread, which
  the simulation does not route; tensors made there would land on the host (PowerSGD keeps its
  error feedback so). `Future.then` and `add_done_callback` run their callbacks routed, as the
  calling thread's work is. That thread lets go of a callback only after completing the future
  it chained; a callback may hold a group's last reference (PowerSGD's holds its group), and a
  gloo thread that tears down its own group aborts the process. `settle()`, which the NCCL
  group's shutdown calls, waits until torch has let go of every callback that ran.
- At exit, Python finalizes only after gloo's threads are done with Python (`quiet_at_exit`):
  one that takes the GIL during finalization aborts the process, where NCCL, which runs
  callbacks on the caller's thread, never does.
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

import atexit
import functools
import os
import threading
import time
import weakref
from typing import Any

import torch

from . import _session
from ._marks import index_of, live_mark, mark_one, storage_of
from ._patcher import Patcher


def _binding(original: Any) -> Any:
    """`_new_process_group_helper` that binds our NCCL group to its `device_id`."""

    @functools.wraps(original)
    def _new_process_group_helper(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        pg, store = original(*args, **kwargs)
        device_id = kwargs.get("device_id")
        from ._nccl import ProcessGroupNCCL

        if device_id is not None and isinstance(pg, ProcessGroupNCCL):
            pg.bound_device_id = device_id
        return pg, store

    return _new_process_group_helper


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


# One entry per future's callback that has run and that torch still holds (see settle()); a
# list, as append and pop are atomic under the GIL on whichever thread. A forked child has none
# of the threads that would let go of its parent's.
_unreleased: list[None] = []
os.register_at_fork(after_in_child=_unreleased.clear)


class _Released:
    """Kept by one routed callback alone: counted in `_unreleased` from the callback's first run
    until torch lets go of the callback (and so of this)."""

    __slots__ = ("ran",)

    def __init__(self) -> None:
        self.ran = False

    def run(self) -> None:
        if not self.ran:
            self.ran = True
            _unreleased.append(None)

    def __del__(self) -> None:
        if self.ran:
            _unreleased.pop()


def settle(within: float = 5.0) -> None:
    """Wait, with the GIL released, until torch has let go of every future's callback that has
    run (the thread that ran one lets go of it after completing the future it chained, so the
    caller may go on meanwhile). Bounded: a callback kept alive elsewhere only delays this."""
    deadline = time.monotonic() + within
    while _unreleased and time.monotonic() < deadline:
        time.sleep(0.001)


def _running_threads() -> int:
    """How many other threads of this process are running or runnable (Linux: their state in
    /proc; elsewhere 0, nothing to read)."""
    me = str(threading.get_native_id())
    running = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tasks:
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        if stat[stat.rfind(b")") + 2:][:1] == b"R":
            running += 1
    return running


def quiet_at_exit(within: float = 1.0) -> None:
    """At interpreter exit, before Python finalizes: let gloo's threads finish with Python.

    A collective's future completes on a gloo thread, which then runs its callbacks and frees
    what the collective held, some of it Python objects. A thread that takes the GIL once
    Python has begun to finalize is made to exit on the spot (Python 3.11's runtime), the C++
    frames it unwinds end in std::terminate, and the process aborts ("terminate called without
    an active exception"), though the program had finished: plain gloo on the CPU does so too.
    NCCL completes a future as its work is queued and runs callbacks on the caller's thread, so
    a CUDA program never meets this. Wait, with the GIL released, for every callback that ran
    to be let go (`settle`), then until no other thread has been running for a few checks in a
    row (gloo's idle threads sleep). Bounded: a thread busy elsewhere only delays the exit."""
    settle(within)
    deadline = time.monotonic() + within
    calm = 0
    while calm < 3 and time.monotonic() < deadline:
        time.sleep(0.002)
        calm = calm + 1 if _running_threads() == 0 else 0


_quiet_registered = threading.Event()


def register_quiet_at_exit() -> None:
    """Call `quiet_at_exit` at interpreter exit (once per process; a forked child registers
    its own when it makes a group)."""
    if not _quiet_registered.is_set():
        _quiet_registered.set()
        atexit.register(quiet_at_exit)


def _routed_callbacks(original: Any) -> Any:
    """`Future.then`/`add_done_callback` whose callback runs routed on whatever thread."""

    @functools.wraps(original)
    def chained(self: Any, callback: Any) -> Any:
        released = _Released()

        @functools.wraps(callback)
        def routed(fut: Any) -> Any:
            released.run()
            if _session.session is None or _session.is_routed():
                return callback(fut)
            from . import _threads

            with _threads.routing():
                return callback(fut)

        return original(self, routed)

    return chained


def _keep(group: Any) -> None:
    """What a Reducer's finalizer calls: nothing; its finalizer lets go of `group` after."""


def _reducer(original: Any) -> Any:
    """`dist.Reducer` that keeps its process group's Python object alive until the Reducer is
    freed: its finalizer runs after the C++ Reducer is destroyed, then lets go of the group
    from Python, where torch tears a group down with the GIL released."""

    def Reducer(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - the class it stands for
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
        from ._nccl import NCCLBackend

        source = original(*args, **kwargs)
        return None if isinstance(source, NCCLBackend) else source

    return _get_split_source


def install(p: Patcher) -> None:
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from ._nccl import DEFAULT_TIMEOUT, ProcessGroupNCCL

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
        p.set(torch._C.Future, name, _routed_callbacks(getattr(torch._C.Future, name)))
    p.set(dist, "_compute_bucket_assignment_by_size",
          _bucketing(dist._compute_bucket_assignment_by_size))
