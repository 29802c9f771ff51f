"""What runs inside a rank process, from its start (forked or spawned) to its exit code.

A rank takes torchrun's environment, writes its output to its own files, arms its watchdog
(with a timeout), runs the job (under a placement log when asked), writes its value or its
error back, waits until every rank has returned, and ends.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from devlab._helpers.host import cpu_cores
from devlab.core import placement_log
from devlab.core.ranks.handoff import (
    _rank_env,
    _rank_file,
    _read_job,
    _read_spec,
    _result,
    _write_error,
    _write_main_thread,
    _write_whole,
)
from devlab.core.ranks.rank_reports import RankError
from devlab.engine import simulated

# faulthandler takes at most this many seconds (~31 years): a longer timeout is never reached.
_WATCHDOG_MAX = 1e9

_watchdog_file: Any = None


def _redirect(out_path: Path, err_path: Path, close: list[int]) -> None:
    """A forked rank's descriptors: stdin from /dev/null, stdout and stderr to its files, and
    none of the parent's copies of the other ranks' output."""
    for fd in close:
        try:
            os.close(fd)
        except OSError:
            pass
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(out_path, os.O_WRONLY | os.O_APPEND)
    err = os.open(err_path, os.O_WRONLY | os.O_APPEND)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)


def _prctl() -> Any:
    """libc's prctl, looked up in the parent: a forked child of a process with threads should
    not go through the dynamic loader's locks."""
    global _PRCTL
    if _PRCTL is None and sys.platform == "linux":
        import ctypes

        try:
            _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _PRCTL = False
    return _PRCTL


_PRCTL: Any = None


def _die_with_parent(parent: int) -> None:
    """Have Linux kill this rank if the process that started it dies (a kernel killed or
    restarted mid-launch): its clean-up cannot run then, and no rank may outlive it."""
    prctl = _prctl()
    if not prctl:
        return
    prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the request was made
        os._exit(1)


def _spawned_rank(run_dir: str, rank: int) -> None:
    """A spawned rank's start: its job and the launch's spec from the run directory."""
    code = 1
    try:
        spec = _read_spec(run_dir)
        _die_with_parent(spec["parent"])
        job = _read_job(run_dir)
        code = _rank_main(rank, run_dir, spec, job)
    finally:
        os._exit(code)


def _rank_main(rank: int, run_dir: str, spec: dict[str, Any], job: tuple[Any, ...],
               forked: bool = False) -> int:
    """What every rank process runs, with stdout and stderr already its files; the process's
    exit code (0: a result is written; 1: an error is). `forked`: a child of the launching
    process (one thread of torch's: below)."""
    global _watchdog_file
    # A forked rank inherits this process's SIGINT recorder: Ctrl-C (SIGINT) is a
    # KeyboardInterrupt, as in a script, and a rank stopped with SIGTERM just ends.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # A forked rank uses the simulated GPUs it inherited, as a spawned one would (the parent
    # finished their queued work before forking); nothing to do in a spawned rank.
    simulated.reset_after_fork_for_rank()
    for key, value in _rank_env(spec, rank).items():
        if value:
            os.environ[key] = value
        else:
            os.environ.pop(key, None)
    # The notebook kernel's streams belong to the kernel: the rank writes to its own files.
    sys.stdout = open(1, "w", buffering=1, closefd=False, errors="replace")  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="replace")  # noqa: SIM115
    _write_main_thread(run_dir, rank)
    if spec["deadline"] is not None:
        _watchdog_file = open(_rank_file(run_dir, rank, "hang"), "w")  # noqa: SIM115
        faulthandler.dump_traceback_later(
            min(_WATCHDOG_MAX, max(0.01, spec["deadline"] - time.time())), exit=True,
            file=_watchdog_file)
    if "OMP_NUM_THREADS" not in os.environ:  # the ranks share this machine's cores
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        # A forked rank keeps one thread: GNU OpenMP (a CPU build of torch's) does not survive
        # a fork once the parent has used its threads, and the child's first parallel op waits
        # for ever (DataLoader's forked workers take one thread for the same reason).
        torch.set_num_threads(1 if forked else max(1, cpu_cores() // local))
    code = 1
    try:
        try:
            value, records = _run_job(job, spec["log"])
        except SystemExit as e:
            if e.code not in (None, 0):
                raise
            value, records = None, None  # sys.exit(0) ends a rank as a success, as in a script
        try:
            data = _result(value, records)
        except Exception as e:
            raise RankError(f"rank {rank} returned a {type(value).__name__}, which cannot be "
                            f"pickled to send it back: {type(e).__name__}: {e}") from None
        _write_whole(_rank_file(run_dir, rank, "result"), data)
        code = 0
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
        _write_error(_rank_file(run_dir, rank, "error"), e)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    if code == 0:
        _wait_for_every_rank(spec)
        _finish_process_group()
    faulthandler.cancel_dump_traceback_later()
    return code


def _wait_for_every_rank(spec: dict[str, Any]) -> None:
    """Return once every rank has returned (or when this one is stopped: another failed).

    A rank that ends while a peer is still connecting to it (gloo's connectFullMesh in a
    `new_group` its peer has not finished) fails that peer with "Connection closed by peer";
    so no rank ends before all have returned. The count is kept in the launch's store.
    """
    from torch.distributed import TCPStore

    key = f"devlab/{spec['run_id']}/returned"
    try:
        store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                         timedelta(days=365))
        if store.add(key, 1) >= spec["nprocs"]:
            store.set(key + "/all", "1")
        else:
            store.wait([key + "/all"])
    except Exception:  # noqa: S110 - the result is written; the parent decides what comes next
        pass


def _run_job(job: tuple[Any, ...], log: bool) -> tuple[Any, list[Any] | None]:
    if not log:
        return _call(job), None
    with placement_log.capture() as recorded:
        value = _call(job)
    return value, recorded.records()


def _call(job: tuple[Any, ...]) -> Any:
    kind = job[0]
    if kind == "call":
        _, fn, args, kwargs = job
        return fn(*args, **kwargs)
    _, code, value, namespace = job
    exec(code, namespace)
    return None if value is None else eval(value, namespace)


def _finish_process_group() -> None:
    """Destroy a default process group the rank left open (torch warns at exit otherwise)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: S110 - the rank's own result is already written
        pass
