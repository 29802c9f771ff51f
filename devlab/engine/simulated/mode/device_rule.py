"""How an op runs on a simulated GPU: the device rule, the call, and the marks on its outputs.

The device rule is FakeTensor's `_find_common_device` for simulated GPUs: an op runs where its
tensors are; tensors of two GPUs, or a GPU tensor with a host tensor that is not a 0-dim
scalar, are PyTorch's "Expected all tensors to be on the same device" error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from devlab.engine.gpu_model import ops_catalog
from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import hazards as _hazards
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.session import tls
from devlab.engine.simulated.base.storage_marks import (
    MARK,
    PLAIN,
    STORAGE_ERRORS,
    mark,
    mark_of,
    mark_outputs,
    storage_of,
    tensors_of,
    transformed_storage,
    wrapped_mark,
)
from devlab.engine.simulated.mode import dispatch_devices as _dispatched

Tensor = torch.Tensor
_OpOverload = torch._ops.OpOverload
_DisableTF = torch._C.DisableTorchFunction
_tf_stack_len = torch._C._len_torch_function_stack
_saved_tensor_hooks = torch._C._autograd._top_saved_tensors_default_hooks

# Ops allowed to mix devices, as on real CUDA (copies, indexing with host indices, metadata
# queries), by name: devlab.engine.gpu_model.ops_catalog's `mixes_devices`.
_MIXED_OK_NAMES = ops_catalog.names("mixes_devices")


def _nonscalar(t: Tensor) -> bool:
    if type(t) in PLAIN:
        return t.dim() != 0
    with _DisableTF():
        return t.dim() != 0


def common_device(func: Callable, args: tuple, kwargs: dict, plain_lookup: bool = True
                  ) -> tuple[int | None, list | None, bool]:
    """(the simulated GPU the op runs on, or None for the host; the storages of its host
    inputs, which an output may alias; whether a wrapper subclass, a DTensor, holds its device).
    Raises PyTorch's mixed-device error. `plain_lookup`: no torch function mode is on the
    stack, so plain tensors' storages are read directly."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    sess = _session.session
    common = None
    bad = False
    wrapped = False
    host: list | None = None
    for t in tensors_of(args, kwargs):
        try:
            if plain_lookup and type(t) in PLAIN:
                s = t.untyped_storage()
            else:  # past every mode and the subclass's own __torch_function__
                with _DisableTF():
                    s = t.untyped_storage()
        except STORAGE_ERRORS:
            s = transformed_storage(t)
            if s is not None:
                m = getattr(s, MARK, None)
            elif type(t) in PLAIN:
                continue
            else:
                m = None
        else:
            m = getattr(s, MARK, None)
        if (m is None or m.session is not sess) and type(t) not in PLAIN:
            m = wrapped_mark(t)  # a DTensor: where its local shard lives
            if m is None and s is None:
                continue
            wrapped = wrapped or m is not None
        if m is not None and m.session is sess:
            if common is None:
                common = m.index
            elif m.index != common:
                bad = True
        else:
            if host is None:
                host = [s]
            else:
                host.append(s)
            if not bad and _nonscalar(t):
                bad = True
    if common is None:
        return None, None, False
    if bad and getattr(func, "__name__", "") not in _MIXED_OK_NAMES:
        if not (type(func) is _OpOverload and _adopt(tensors_of(args, kwargs), common)):
            _raise_mixed(tensors_of(args, kwargs))
    return common, host, wrapped


def _adopt(ts: list[Tensor], common: int) -> bool:
    """An aten op called from Python (an `OpOverload`) is torch's own code at work inside a
    subclass's dispatch or a backward pass (DTensor, functional collectives' tensors), on
    tensors C++ made for the GPU's work, which carry no mark: they are that GPU's. Marks them
    and says True, unless tensors of two GPUs meet (then the op fails as on CUDA)."""
    fresh: list[torch.UntypedStorage] = []
    for t in ts:
        m = mark_of(t)
        if m is not None:
            if m.index != common:
                return False
            continue
        s = storage_of(t)
        if s is not None and _nonscalar(t) and not any(s is f for f in fresh):
            fresh.append(s)
    if fresh:
        mark(fresh, common)
    return True


def _raise_mixed(ts: list[Tensor]) -> None:
    """PyTorch's TensorIterator message: the first GPU, then the first misfit."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    devs = []
    for t in ts:
        m = mark_of(t)
        devs.append((m.index if m is not None else None, t))
    common = next(i for i, _ in devs if i is not None)
    for i, t in devs:
        if i is None:
            if _nonscalar(t):
                raise _errors.mixed_devices(common, str(t.device))
        elif i != common:
            raise _errors.mixed_devices(common, f"cuda:{i}")


def call(index: int | None, func: Callable, args: tuple, kwargs: dict,
         watched: bool = False) -> Any:
    """func(*args, **kwargs) executing on simulated GPU `index` (None: the host), so
    `current_index()` names it; torch's own errors are marked to end at the user's line.
    `tls.calls` counts these calls in progress: ops inside one were placed (`_dispatched`),
    unless the call is `watched`, each op inside then placed by its own tensors (See Note
    [Why ops run watched] in `dispatched`)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    prev = _session.current_index()
    tls.index = index
    counted = not watched
    if counted:
        tls.calls = _session.calls_in_progress() + 1
    try:
        return func(*args, **kwargs)
    except Exception as e:
        _errors.torch_error(e)
        raise
    finally:
        tls.index = prev
        if counted:
            tls.calls -= 1


def placement(func: Callable, args: tuple, kwargs: dict
              ) -> tuple[int | None, list | None, bool]:
    """`common_device`, read past a mode that lies below the simulation's (a DeviceContext),
    which storage lookups and `dim()` would otherwise enter."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if _tf_stack_len():
        with _DisableTF():
            return common_device(func, args, kwargs, False)
    return common_device(func, args, kwargs)


# The ops that run cuBLAS (`ops_catalog`'s `cublas`): a GPU's first one allocates its workspace.
CUBLAS_NAMES = _CUBLAS_NAMES = ops_catalog.names("cublas")
_runs_cublas: dict[Callable, bool] = {}


def _uses_cublas(func: Callable) -> bool:
    """Whether this torch call is one of those ops (`Tensor.__matmul__` is `matmul`)."""
    used = _runs_cublas.get(func)
    if used is None:
        name = getattr(func, "__name__", "")
        if name in ("__matmul__", "__rmatmul__"):
            name = "matmul"
        used = _runs_cublas[func] = name in _CUBLAS_NAMES
    return used


def take_workspace(func: Callable, index: int) -> None:
    """cuBLAS's workspace on GPU `index` if `func` runs cuBLAS and the GPU has none yet (CUDA's
    out-of-memory where it does not fit). Every path a product takes asks here (this module's
    `run`, `launch.launch`), so each GPU takes it once: torch keeps one workspace per (cuBLAS
    handle, stream); devlab takes one per GPU for the host's threads whatever the stream (not
    modeled: a side stream's own, another thread's), and one for autograd's device thread
    (`autograd._take_backward_workspace`)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if not _uses_cublas(func):
        return
    dev = _session.session.devices[index]  # type: ignore[union-attr]
    if dev.workspace is not None:
        return
    with _session.lock:
        oom = dev.take_workspace()
    if oom is not None:
        raise _errors.out_of_memory(dev, oom)


def run(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Run an op where the device rule puts it, and mark its fresh outputs there."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    index, host, wrapped = placement(func, args, kwargs)
    if index is None:
        # The host's own work (a data loader's collate, preprocessing): its time is the
        # host's, at the wall clock's pace (Note [The host's modeled time] in gpu_model/modeled_clock.py).
        sess = _session.session
        clock = sess.charges.clock if sess is not None else None
        if clock is None:
            return call(None, func, args, kwargs)
        began = clock.wall()
        try:
            return call(None, func, args, kwargs)
        finally:
            clock.host_work(clock.wall() - began)
    _workers.wait(index)  # the op may read a queued op's output
    if (wrapped or _saved_tensor_hooks(False) is not None
            or (torch._C._len_torch_dispatch_stack() and _dispatched.unmarking_mode_on_stack())):
        # A subclass's dispatch, saved-tensor hooks, a dispatch mode below ours: each inner
        # op's outputs are marked as it returns. See Note [Why ops run watched].
        with _dispatched.marking():
            out = call(index, func, args, kwargs, watched=True)
    else:
        out = call(index, func, args, kwargs)
    fresh = mark_outputs(out, index, host)
    if _hazards.tracking or _hazards.armed:
        note_streams(func, index, args, kwargs)
    take_workspace(func, index)
    # A GPU op: a session runs. A modeled GPU's clock is charged for it.
    _session.session.charges.call(func, args, kwargs, out, index, fresh)  # type: ignore[union-attr]
    return out


# GPU calls that copy a value to the host and wait for it on the current stream, as `.item()`
# does (a blocking cudaMemcpy, then that stream's synchronize).
_HOST_READS = frozenset({Tensor.item, Tensor.__bool__, Tensor.__float__, Tensor.__int__,
                         Tensor.__index__, Tensor.__complex__})


def note_streams(func: Callable, index: int, args: tuple, kwargs: dict) -> None:
    """Tell `hazards` which stream this GPU op was queued on and which tensors' blocks it used
    (a block used on a stream other than its own must outlive that stream's work), and that a
    host read waited for the stream (only asked once a program copies non-blocking to the
    host or leaves the default stream)."""
    stream = _session.current_stream(index)
    if func in _HOST_READS:
        _hazards.host_waited(index, stream)
        return
    if not _hazards.tracking:
        return
    blocks = []
    for t in tensors_of(args, kwargs):
        m = mark_of(t)
        if m is not None and getattr(m, "block", None) is not None:
            blocks.append(m.block)
    _hazards.used_on(index, stream, blocks)
