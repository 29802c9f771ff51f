"""Whose frame a line is, and tracebacks that end at the user's line.

`whose(filename)` is the one rule: a frame's file is the user's (a notebook cell, their own
script), devlab's, a library's (torch, an installed package, the standard library) or
generated code's (`<frozen ...>`, `<string>`, a C++ frame). Every place that asks "is this
frame the user's?" or "is this frame devlab's?" asks it (the allocation timeline's line, the
simulation's errors, timing's errors, a rank's error frames); `devlab_file` narrows devlab's
own frames to a room of it.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from collections.abc import Callable
from functools import lru_cache
from typing import Literal

__all__ = ["Owner", "whose", "is_user_file", "devlab_file", "drop_frames"]

Owner = Literal["user", "devlab", "library", "generated"]

# devlab's own folder (above this module's _helpers/), as found and with links resolved.
_DEVLAB = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEVLAB_DIRS = tuple({os.path.normcase(_DEVLAB), os.path.normcase(os.path.realpath(_DEVLAB))})
# A notebook cell's code: IPython's `<ipython-input-3-1a2b3c>`, ipykernel's
# `/tmp/ipykernel_123/456.py`, Colab's `/tmp/ipython-input-3-456.py`.
CELL_FILE = re.compile(r"(^<ipython-input-\d+-\w+>$)|(ipykernel_\d+/\d+\.py$)"
                       r"|((^|/)ipython-input-\d+-\w+\.py$)")
# The standard library anywhere (a snapshot may come from another machine):
# .../lib/python3.11/..., .../lib64/python3.11t/..., ...\Lib\...
_STDLIB = re.compile(r"/lib(64)?/python\d+(\.\d+)?t?/|^[A-Za-z]:/[^/]*python[^/]*/Lib/",
                     re.IGNORECASE)


@lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    """This machine's directories of code that is not the user's: the standard library, the
    installed packages and torch (a source checkout of torch is not under site-packages)."""
    dirs = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(path)
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        dirs.add(os.path.dirname(torch.__file__))
    out = set()
    for d in dirs:
        out.add(os.path.normcase(os.path.abspath(d)))
        out.add(os.path.normcase(os.path.realpath(d)))
    return tuple(sorted(out))


def _paths(filename: str) -> set[str]:
    return {os.path.normcase(os.path.abspath(filename)),
            os.path.normcase(os.path.realpath(filename))}


@lru_cache(maxsize=4096)
def devlab_file(filename: str) -> str | None:
    """A file of devlab's own, as its path inside the package with `/` between folders
    (`engine/simulated/base/cuda_errors.py`, `core/timing.py`); None for any other file.
    Callers narrow by prefix: `(devlab_file(f) or "").startswith("engine/simulated/")`."""
    if not filename or filename.startswith("<"):
        return None
    for path in _paths(filename):
        for d in _DEVLAB_DIRS:
            if path.startswith(d + os.sep):
                return path[len(d) + 1:].replace(os.sep, "/")
    return None


@lru_cache(maxsize=4096)
def whose(filename: str) -> Owner:
    """Whose code a frame's file (`co_filename`, a recorded stack's `filename`) holds.

    "user": a notebook cell, code typed at Python's prompt (`<stdin>`), or a Python file that
    is none of the others. "devlab": a file of this package. "library": torch, an installed
    package (site-packages, dist-packages) or the standard library, this machine's or, by its
    path, another's. "generated": no file (`<string>`, `<eval_with_key>.3`, `<frozen ...>`) or
    not Python (a C++ frame `.cpp`, `.h`, `??`), and the empty name.
    """
    if not filename:
        return "generated"
    name = filename.replace("\\", "/")
    if CELL_FILE.search(name) or name == "<stdin>":
        return "user"
    if name.startswith("<") or not name.endswith(".py"):
        return "generated"
    if devlab_file(filename) is not None:
        return "devlab"
    if "/site-packages/" in name or "/dist-packages/" in name or _STDLIB.search(name):
        return "library"
    paths = _paths(filename)
    if any(p.startswith(d + os.sep) for p in paths for d in _library_dirs()):
        return "library"
    return "user"


def is_user_file(filename: str) -> bool:
    """Whether a frame's file is the user's code (`whose` says "user")."""
    return whose(filename) == "user"


def drop_frames(err: BaseException, own: Callable[[str], bool]) -> None:
    """Unlink from `err`'s traceback every frame whose file name `own` accepts. The caller
    re-raises with a bare `raise`, which keeps the edited traceback on Python 3.11+."""
    kept = []
    tb = err.__traceback__
    while tb is not None:
        if not own(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    for outer, inner in zip(kept, kept[1:], strict=False):
        outer.tb_next = inner
    if kept:
        kept[-1].tb_next = None
    err.__traceback__ = kept[0] if kept else None
