"""Errors the simulation raises in PyTorch's (and CUDA's) words, and tracebacks that end at the
user's line.

A CUDA error is raised in C++, so its traceback ends at the user's call. The simulation raises
in Python, several frames further in; `drop_own_frames` takes those frames out where a user's
call entered the simulation, for the errors `user_error` or `torch_error` marked. Errors not
marked (devlab's own bugs) keep their whole traceback.
"""

from __future__ import annotations

import functools
import os
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from devlab._helpers.tracebacks import devlab_file, drop_frames
from devlab.engine.gpu_model.caching_allocator import OutOfMemory
from devlab.engine.simulated.base import machine
from devlab.engine.simulated.base.session import DeviceState

_USER_ERROR = "_devlab_user_error"


def _own(filename: str) -> bool:
    """Whether `filename` is one of the simulation's own files (devlab/engine/simulated/ and
    its sub-packages)."""
    return (devlab_file(filename) or "").startswith("engine/simulated/")


own_file = _own

_E = TypeVar("_E", bound=BaseException)
_F = TypeVar("_F", bound=Callable[..., Any])


def user_error(err: _E) -> _E:
    """Mark an error the simulation raises as PyTorch would, for `drop_own_frames`."""
    setattr(err, _USER_ERROR, True)
    return err


def torch_error(err: BaseException) -> None:
    """Mark, as `user_error` does, an error torch raised in a call the simulation made for the
    user (a shape mismatch, a bad view...).

    The caller made that call and catches the error: its own frame heads the traceback. If a
    frame of the simulation lies further in (a patch torch called back into, a hook wrapper),
    the error may be devlab's own and keeps its whole traceback.
    """
    tb = err.__traceback__
    tb = tb.tb_next if tb is not None else None
    while tb is not None:
        if _own(tb.tb_frame.f_code.co_filename):
            return
        tb = tb.tb_next
    setattr(err, _USER_ERROR, True)


def drop_own_frames(err: BaseException) -> None:
    """Take the simulation's frames out of a marked error's traceback, so it ends at the user's
    line. The caller re-raises with a bare `raise`, which keeps the edited traceback on Python
    3.11+; on 3.10 the frames stay and IPython hides them (they set `__tracebackhide__`).

    A marked error keeps its mark, so an outer entry point drops its frames too (a backward
    pass whose hook, the user's code, ran out of memory on a simulated GPU).
    """
    if not getattr(err, _USER_ERROR, False):
        return
    drop_frames(err, _own)


def let_go(err: BaseException) -> None:
    """An interrupt (KeyboardInterrupt, SystemExit) leaving the simulation at an entry point:
    nothing of the interrupted call may stay alive through its traceback, which IPython keeps
    (`sys.last_traceback`). The frames further in have finished: their locals (a half-made
    output, the call's arguments) are cleared, and the simulation's own frames leave the
    traceback. A frame kept also keeps its callers (`f_back`), so the entry point drops its own
    locals too before it re-raises with a bare `raise`."""
    tb = err.__traceback__
    if tb is not None:
        traceback.clear_frames(tb.tb_next)  # the entry's own frame is still running
    setattr(err, _USER_ERROR, True)
    drop_own_frames(err)


def entry(fn: _F) -> _F:
    """Decorate a function a user's call enters the simulation through (a `torch.cuda`
    stand-in, a patched torch function): its errors leave at the user's line."""

    @functools.wraps(fn)
    def entered(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            drop_own_frames(e)
            raise
        except BaseException as e:
            let_go(e)
            args = kwargs = None  # noqa: F841 - nothing of the call stays in this frame
            raise

    return entered  # type: ignore[return-value]


# --- the errors ----------------------------------------------------------------------------

_INVALID_ORDINAL = (
    "CUDA error: invalid device ordinal\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


def invalid_ordinal() -> Exception:
    """CUDA's error for a device index that does not exist (`device="cuda:7"`)."""
    err = getattr(torch, "AcceleratorError", RuntimeError)
    return user_error(err(_INVALID_ORDINAL))


def invalid_device_id() -> AssertionError:
    """torch.cuda's error for a device it is asked about that does not exist."""
    return user_error(AssertionError("Invalid device id"))


def not_a_cuda_device(device: object) -> ValueError:
    return user_error(ValueError(f"Expected a cuda device, but got: {device}"))


def mixed_devices(common: int, other: str) -> RuntimeError:
    """PyTorch's TensorIterator message for an op given tensors of two devices."""
    return user_error(RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"cuda:{common} and {other}!"
    ))


def numpy_of_gpu_tensor(index: int) -> TypeError:
    return user_error(TypeError(
        f"can't convert cuda:{index} device type tensor to numpy. Use Tensor.cpu() to copy "
        "the tensor to host memory first."
    ))


def forked_after_init() -> RuntimeError:
    """CUDA's error in a child forked after its parent initialized CUDA
    (torch/cuda/__init__.py, `_lazy_init`)."""
    return user_error(RuntimeError(
        "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
        "you must use the 'spawn' start method"))


def not_running() -> RuntimeError:
    """A stale reference to a simulated GPU's object used after stop()."""
    return user_error(RuntimeError("devlab GPU simulation is not running"))


def not_simulated(what: str, instead: str) -> NotImplementedError:
    """Something simulated GPUs cannot do: name the limit and what to do instead."""
    return user_error(NotImplementedError(
        f"{what} is not simulated by devlab's simulated GPUs (they are the CPU); {instead}"))


def out_of_memory(dev: DeviceState, oom: OutOfMemory) -> torch.OutOfMemoryError:
    """CUDA's out-of-memory error, with the figures of the GPU's allocator (`oom`) and a note
    that says where this simulated GPU's memory comes from."""
    if dev.context:
        where = ("its capacity and CUDA context are those of the real GPU it models" +
                 ("; the limit set with devlab.config.simulate_gpus(memory_limit=...) or "
                  "set_logical_device_configuration is a per-process limit on it"
                  if dev.limit is not None else ""))
    else:
        where = ("its memory limit comes from devlab.config.simulate_gpus(memory_limit=...) or "
                 "set_logical_device_configuration")
    # The other processes on this GPU, as NVML lists them for torch's reportProcessMemoryInfo.
    others = tuple(machine.others_on_gpu(dev.index))
    return user_error(torch.OutOfMemoryError(
        f"{oom.message(os.getpid(), others)} (This GPU is simulated on the CPU; {where}.) Free tensors "
        "you no longer need (del x), and torch.cuda.empty_cache() returns what the allocator "
        "keeps cached."))
