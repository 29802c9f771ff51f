"""torch.save and torch.load across simulated GPUs: a saved storage is tagged with its GPU
(`cuda:N`), and loading puts it back on that simulated GPU (or where `map_location` says), as
torch does with real CUDA storages."""

from __future__ import annotations

from typing import Any

import torch
import torch.serialization as _ser

from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base import storage_marks as _marks
from devlab.engine.simulated.base.patcher import Patcher


def _untyped(obj: Any) -> Any:
    if isinstance(obj, torch.storage.TypedStorage):
        # Its public untyped() warns that TypedStorage is deprecated; torch's own
        # serialization reads the attribute too.
        return obj._untyped_storage
    return obj


def _tag(obj: Any) -> str | None:
    m = _marks.live_mark(_untyped(obj))
    return f"cuda:{m.index}" if m is not None else None


def _restore(obj: Any, location: str) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if _session.session is None or not (location == "cuda" or location.startswith("cuda:")):
        return None
    try:
        return _restore_on(obj, location)
    except Exception as e:  # torch.load entered the simulation here
        _errors.drop_own_frames(e)
        raise
    except BaseException as e:
        _errors.let_go(e)
        obj = None  # noqa: F841
        raise


def _restore_on(obj: Any, location: str) -> Any:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    sess = _session.session
    assert sess is not None
    i = _session.current_device() if location == "cuda" else int(location.split(":", 1)[1])
    if i >= sess.count:
        raise _errors.user_error(RuntimeError(
            f"Attempting to deserialize object on CUDA device {i} but "
            f"torch.cuda.device_count() is {sess.count}. Please use torch.load with "
            "map_location to map your storages to an existing device."
        ))
    s = _untyped(obj)
    if _marks.live_mark(s) is None:  # fresh from the file: it now lives on GPU i
        _marks.mark([s], i)
    return obj


# Before torch's own taggers (cpu is priority 10): a marked storage is really a CPU one.
_PRIORITY = 1


def install(p: Patcher) -> None:
    _ser.register_package(_PRIORITY, _tag, _restore)
    entry = next(e for e in _ser._package_registry if e[1] is _tag)
    p.on_restore(lambda: _ser._package_registry.remove(entry))
