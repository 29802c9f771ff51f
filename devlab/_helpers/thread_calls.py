"""Run a function in threads that are already running, each at its own next Python call.

Python has no way to run code in another thread; what it has is a per-thread profile function,
which that thread calls at its next call or return. CPython's C API sets one for any thread
(`_PyEval_SetProfile`, exported from 3.9 to 3.13, the way `threading.setprofile_all_threads`
does it in 3.12); this module sets a one-shot one through ctypes, which runs the function once
in that thread and takes itself off at once. A thread with a profile function of its own (a
profiler, coverage through `sys.setprofile`) is left alone: its function is read where the
calling thread's own lies in the interpreter's thread state (`_offsets`). Where the C
API is missing (another Python), nothing is arranged, and the callers say so.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable, Iterable

# Py_tracefunc: int (*)(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg)
_TRACEFUNC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                              ctypes.c_void_p)
_api = ctypes.pythonapi
_lock = threading.Lock()
_pending: dict[int, Callable[[], None]] = {}  # thread ident -> what runs there next


def _c_api() -> bool:
    """Whether this Python exports what `call_in_threads` needs (and set its signatures)."""
    names = ("_PyEval_SetProfile", "PyInterpreterState_Get", "PyInterpreterState_ThreadHead",
             "PyThreadState_Next", "PyThreadState_Get")
    if not all(hasattr(_api, n) for n in names):
        return False
    if not getattr(sys, "_is_gil_enabled", lambda: True)():
        return False  # free-threaded (3.13t): no GIL keeps the other thread still meanwhile
    _api._PyEval_SetProfile.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    _api._PyEval_SetProfile.restype = ctypes.c_int
    for name in ("PyInterpreterState_Get", "PyThreadState_Get"):
        getattr(_api, name).restype = ctypes.c_void_p
    for name in ("PyInterpreterState_ThreadHead", "PyThreadState_Next"):
        getattr(_api, name).argtypes = [ctypes.c_void_p]
        getattr(_api, name).restype = ctypes.c_void_p
    return True


def _on_event(obj: int, frame: int, what: int, arg: int) -> int:
    """The one-shot profile function, in the thread it was set for: off, then the call."""
    try:
        _api._PyEval_SetProfile(_api.PyThreadState_Get(), _OFF, None)
        with _lock:
            call = _pending.pop(threading.get_ident(), None)
        if call is not None:
            call()
    except BaseException as e:  # noqa: BLE001 - a profile function's error would be lost in C
        print(f"devlab: a call arranged for thread {threading.current_thread().name!r} "
              f"failed: {type(e).__name__}: {e}", file=sys.stderr)
    return 0


_CALLBACK = _TRACEFUNC(_on_event)  # kept alive here: a thread may call it at any time
_ON = ctypes.cast(_CALLBACK, ctypes.c_void_p)
_OFF = None  # no profile function


def _offsets() -> tuple[int, int] | None:
    """Where a thread state keeps its thread's ident and its profile object (byte offsets),
    found in this thread's own state (its ident; a profile function set for a moment); None if
    either cannot be found for sure. (`PyThreadState_GetID` is a serial number, not the ident
    `threading` uses, and no function reads another thread's profile.)"""
    if sys.getprofile() is not None:  # this thread's own (a profiler's) stays as it is
        return None

    def marker(*_: object) -> None:
        return None

    state = _api.PyThreadState_Get()
    words = 64  # these fields lie well inside the first 512 bytes in 3.9 to 3.13
    before = (ctypes.c_void_p * words).from_address(state)[:]
    sys.setprofile(marker)
    try:
        during = (ctypes.c_void_p * words).from_address(state)[:]
    finally:
        sys.setprofile(None)
    profile = [i for i in range(words) if during[i] == id(marker) and before[i] != id(marker)]
    ident = [i for i in range(words) if before[i] == threading.get_ident()]
    if len(profile) != 1 or len(ident) != 1:
        return None
    size = ctypes.sizeof(ctypes.c_void_p)
    return ident[0] * size, profile[0] * size


def call_in_threads(idents: Iterable[int], call: Callable[[int], Callable[[], None]]
                    ) -> list[int]:
    """For each running thread named in `idents` (other than this one, and without a profile
    function of its own), arrange that `call(ident)()` runs once in it at its next Python call
    or return; the idents arranged for. A thread that never runs Python again never runs it.
    Holds the GIL throughout, as the C API asks (ctypes.pythonapi keeps it)."""
    wanted = set(idents) - {threading.get_ident()}
    if not wanted or not _c_api():
        return []
    offsets = _offsets()
    if offsets is None:
        return []
    at_ident, at_profile = offsets
    done = []
    state = _api.PyInterpreterState_ThreadHead(_api.PyInterpreterState_Get())
    while state:
        ident = ctypes.c_void_p.from_address(state + at_ident).value
        own = ctypes.c_void_p.from_address(state + at_profile).value
        if ident in wanted and not own:
            with _lock:
                _pending[ident] = call(ident)
            if _api._PyEval_SetProfile(state, _ON, None) == 0:
                done.append(ident)
            else:
                with _lock:
                    _pending.pop(ident, None)
        state = _api.PyThreadState_Next(state)
    return done
