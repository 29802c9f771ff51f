"""A launch's options, checked before anything starts.

The rank count (against this process's open-file limit and the memory available), the start
method (fork where it is safe) and the timeout.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
from typing import Any

import torch

from devlab._helpers.host import memory_available
from devlab.engine import simulated

START_METHODS = ("fork", "spawn")
# What each rank costs this process while it runs: two descriptors for its output, one or two
# for its connections to the store (torch's env:// rendezvous, a group's own client), with room.
_FDS_PER_RANK = 4
_FDS_SPARE = 32  # for whatever else this process opens meanwhile
# The least memory a rank takes: its own pages (USS) once it has joined gloo, measured on Linux
# with torch 2.13: a forked rank 4.4 MB (it shares the rest with this process), a spawned one,
# which imports torch afresh, 152 MB.
_RANK_MEMORY = {"fork": 4 * 2**20, "spawn": 150 * 2**20}


def default_start_method() -> str:
    """"fork" where a forked rank is safe (Linux, no real CUDA initialized here), else "spawn"."""
    if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
        return "spawn"  # macOS's system libraries are not fork-safe
    if not simulated.is_active() and torch.cuda.is_initialized():
        return "spawn"  # CUDA cannot be used in a child forked after it was initialized
    return "fork"


def check_options(nprocs: Any, start_method: Any, timeout: Any) -> str:
    """The start method to use; a ValueError naming what is wrong with an option, checked
    before anything starts (including whether this machine has room for `nprocs` ranks)."""
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs is the number of ranks, a whole number of at least 1; "
                         f"got {nprocs!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout < math.inf):
        raise ValueError(f"timeout is a number of seconds greater than 0 (or None), got {timeout!r}")
    if os.name != "posix":
        raise RuntimeError("devlab runs ranks on Linux and macOS (process groups, fork or "
                           f"spawn), not on {sys.platform}")
    if start_method == "forkserver":
        raise ValueError("start_method 'forkserver' is not offered: its server process would "
                         f"outlive the launch; use one of {list(_methods())}")
    method = default_start_method() if start_method is None else start_method
    if method not in _methods():
        raise ValueError(f"start_method {start_method!r} is not one of {list(_methods())} on "
                         "this machine")
    if not torch.distributed.is_available():
        raise RuntimeError(f"this build of torch ({torch.__version__}) has no torch.distributed")
    _check_room(nprocs, method)
    return method


def _methods() -> tuple[str, ...]:
    return tuple(m for m in START_METHODS if m in multiprocessing.get_all_start_methods())


def _check_room(nprocs: int, method: str) -> None:
    """Refuse a rank count this process or machine cannot hold, naming the tighter limit,
    before any rank starts (a launch that runs out of descriptors half-way fails with a raw
    OSError)."""
    import resource

    limits = []
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:
        used = _open_descriptors()
        limits.append((max(0, (soft - used - _FDS_SPARE) // _FDS_PER_RANK),
                       f"each rank needs about {_FDS_PER_RANK} open files in this process (its "
                       f"output and its connections to the store), and this process may open "
                       f"{soft} (ulimit -n), {used} of them open now"))
    available = memory_available()
    if available is not None:
        need = _RANK_MEMORY[method]
        limits.append((available // need,
                       f"a {method}ed rank takes at least {need // 2**20} MB of memory of its "
                       f"own, and {available // 2**20} MB are available"))
    if limits:
        room, why = min(limits)
        if nprocs > room:
            raise ValueError(f"nprocs={nprocs} is more ranks than this machine can run here: "
                             f"{why}; at most {room} ranks")


def _open_descriptors() -> int:
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder)) - 1  # less the one the listing itself opened
        except OSError:
            continue
    return 0
