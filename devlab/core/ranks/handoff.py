"""Everything that crosses between a launch and its ranks, in one place.

A launch and its ranks share nothing but these:

- the command a spawned rank starts with (`_SPAWN`), and the environment every rank gets:
  torchrun's (`_rank_env`) over the launch's own (`_ranks_env`: loopback only, the simulated
  GPUs of this process);
- in the run directory (a temporary folder): `spec` (the launch: run id, deadline, rank count,
  environment, the parent's pid) and `job` (what to run: `("call", fn, args, kwargs)` or
  `("code", code, value, namespace)`), written for spawned ranks (a forked rank inherits both);
- `rankN.out`, `rankN.err`: the rank's stdout and stderr;
- `rankN.result` (its value and placement-log records) or `rankN.error` (its exception, or the
  exception's text when it does not pickle, with its frames in the user's code and the time),
  each written whole or not at all;
- `rankN.thread` (its main thread's id) and `rankN.hang` (faulthandler's dump when its
  watchdog stopped it).

Everything is pickled with cloudpickle (functions by value); a cell's code travels marshalled,
with the names it uses that pickle.
"""

from __future__ import annotations

import builtins
import marshal
import math
import os
import re
import socket
import sys
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any

from devlab.engine import simulated

# A spawned rank: a fresh interpreter with the parent's module path, started with this code
# and the run directory and rank as its arguments.
_SPAWN = ("import sys; sys.path[:] = {path!r}; from devlab.core.ranks.rank_process import _spawned_rank; "
          "_spawned_rank(sys.argv[1], int(sys.argv[2]))")

# The folder of devlab's launcher (this package): a frame there is not the user's.
_PACKAGE = os.path.dirname(os.path.abspath(__file__))

_IPYTHON_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "open"}


def _rank_file(run_dir: str | Path, rank: int, kind: str) -> Path:
    """One of a rank's files in the run directory: out, err, result, error, thread, hang."""
    return Path(run_dir) / f"rank{rank}.{kind}"


def _in_launcher(filename: str) -> bool:
    """Whether a frame's file is one of devlab's launcher (this package's modules)."""
    return os.path.dirname(os.path.abspath(filename)) == _PACKAGE


def _dumps(obj: Any) -> bytes:
    import cloudpickle

    return cloudpickle.dumps(obj)


def _load(data: bytes) -> Any:
    import cloudpickle

    return cloudpickle.loads(data)


def _write_whole(path: Path, data: bytes) -> None:
    """Write the file whole or not at all: a rank killed while writing (the others are stopped
    once one fails) leaves no half-written result or error for the parent to misread."""
    part = path.with_name(path.name + ".part")
    part.write_bytes(data)
    os.replace(part, path)


# --- the launch and its job ----------------------------------------------------------------------


def _call_job(fn: Any, args: tuple, kwargs: dict[str, Any] | None) -> tuple[Any, ...]:
    return ("call", fn, tuple(args), dict(kwargs or {}))


def _code_job(code: types.CodeType, value: types.CodeType | None,
              namespace: dict[str, Any]) -> tuple[Any, ...]:
    return ("code", code, value, namespace)


def _payload(job: tuple[Any, ...]) -> bytes:
    """The job as a spawned rank gets it: a function and its arguments pickled by value; a
    cell's code marshalled, with the names it uses that pickle (the others named on stderr)."""
    import cloudpickle

    try:
        if job[0] == "code":
            _, code, value, namespace = job
            job = ("code", marshal.dumps(code), None if value is None else marshal.dumps(value),
                   _picklable_namespace(namespace, code, value))
        return cloudpickle.dumps(job)
    except Exception as e:
        raise TypeError(f"spawned ranks cannot be sent the function and its arguments: "
                        f"{type(e).__name__}: {e} (forked ranks need no pickling: "
                        "start_method='fork')") from None


def _write_launch(run_dir: Path, spec: dict[str, Any], payload: bytes) -> None:
    """What a spawned rank reads at its start: its job and the launch's spec."""
    (run_dir / "job").write_bytes(payload)
    (run_dir / "spec").write_bytes(_dumps(spec))


def _read_spec(run_dir: str) -> dict[str, Any]:
    return _load((Path(run_dir) / "spec").read_bytes())


def _read_job(run_dir: str) -> tuple[Any, ...]:
    """A spawned rank's job, as a forked rank has it: a cell's code compiled, in a namespace of
    its own holding the names carried."""
    job = _load((Path(run_dir) / "job").read_bytes())
    if job[0] == "code":
        _, code, value, namespace = job
        job = _code_job(marshal.loads(code), None if value is None else marshal.loads(value),
                        {"__name__": "__main__", "__builtins__": builtins, **namespace})
    return job


def _names_used(*codes: types.CodeType | None) -> set[str]:
    """The global names compiled code uses, its nested functions' and classes' included."""
    names: set[str] = set()
    stack = [c for c in codes if c is not None]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        names.update(c.co_freevars)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


def _picklable_namespace(namespace: dict[str, Any], *codes: types.CodeType | None
                         ) -> dict[str, Any]:
    """The names the code uses, from `namespace`, that can be pickled; the others are named on
    stderr (a spawned rank starts with none of the notebook's objects)."""
    import cloudpickle

    carried, left = {}, []
    for name in sorted(_names_used(*codes)):
        if name not in namespace or name.startswith("_") or name in _IPYTHON_NAMES:
            continue
        try:
            cloudpickle.dumps(namespace[name])
            carried[name] = namespace[name]
        except Exception as e:
            left.append(f"{name} ({type(e).__name__})")
    if left:
        print("devlab: not carried to the spawned ranks (cannot be pickled): " + ", ".join(left),
              file=sys.stderr)
    return carried


def _ranks_env(method: str) -> dict[str, str]:
    """Environment every rank gets on top of this process's: talk over loopback only, and see
    the simulated GPUs of this process (a spawned rank and every process a rank starts)."""
    addr, interface = _loopback()
    env = {"MASTER_ADDR": addr, "GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}
    if simulated.is_active():
        env["DEVLAB_SIMULATE_GPUS"] = str(simulated.device_count())
        spec = simulated.model()  # the modeled GPU and its machine (empty: none)
        env["DEVLAB_SIMULATE_GPU_MODEL"] = spec.name if spec is not None else ""
        env["DEVLAB_SIMULATE_GPU_TOPOLOGY"] = simulated.topology() or ""
        limits = {simulated.memory_stats(i)["limit"] for i in range(simulated.device_count())}
        if len(limits) > 1 and method != "fork":
            raise ValueError(
                "the simulated GPUs have different memory limits, and spawned ranks take "
                "theirs from DEVLAB_SIMULATE_GPU_MEMORY_MB, one limit for all: use "
                "start_method='fork', or one limit for every GPU")
        (limit,) = limits if len(limits) == 1 else (None,)
        if limit is not None:
            env["DEVLAB_SIMULATE_GPU_MEMORY_MB"] = str(limit // (1024 * 1024))
        else:
            env["DEVLAB_SIMULATE_GPU_MEMORY_MB"] = ""  # none: a rank drops the parent's value
    return env


def _loopback() -> tuple[str, str]:
    """This machine's loopback address, and the name of the interface that holds it (what
    gloo and NCCL take to bind there, rather than to the address the hostname resolves to)."""
    import psutil

    for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        for name, addrs in psutil.net_if_addrs().items():
            if any(a.family == family and a.address.split("%")[0] == addr for a in addrs):
                return addr, name
    raise RuntimeError("this machine has no loopback interface (127.0.0.1 or ::1), and devlab's "
                       "ranks talk over loopback only")


def _rank_env(spec: dict[str, Any], rank: int) -> dict[str, str]:
    """torchrun's environment for one of its workers, with devlab's loopback settings (an
    empty value: the variable is removed)."""
    n = str(spec["nprocs"])
    return {
        **spec["env"],
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "ROLE_NAME": "default", "WORLD_SIZE": n, "LOCAL_WORLD_SIZE": n, "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": n, "TORCHELASTIC_RUN_ID": spec["run_id"],
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        # every rank, rank 0 included, joins the store this process holds, as under torchrun
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }


# --- what a rank sends back ----------------------------------------------------------------------


def _result(value: Any, records: list[Any] | None) -> bytes:
    """A rank's value and its placement log's records (None without one), pickled."""
    return _dumps((value, records))


def _read_result(run_dir: str | Path, rank: int) -> tuple[Any, list[Any] | None]:
    return _load(_rank_file(run_dir, rank, "result").read_bytes())


def _write_error(path: Path, e: BaseException) -> None:
    """The rank's exception for the parent: itself if it pickles and unpickles, else its text;
    its frames inside the user's code; when it happened."""
    try:
        frames = _users_frames([(f.filename, f.lineno or 0, f.name)
                                for f in traceback.extract_tb(e.__traceback__)])
    except Exception:
        frames = []
    try:
        summary = "".join(traceback.format_exception_only(type(e), e)).strip()
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    except Exception as bad:  # an exception whose str() itself fails
        summary = text = f"{type(e).__qualname__} (its message cannot be shown: {bad!r})"
    info = {"exception": e, "frames": frames, "time": time.time(), "summary": summary,
            "text": text}
    try:
        data = _dumps(info)
        _load(data)  # an exception that pickles but cannot be rebuilt is text too
    except BaseException as bad:  # noqa: BLE001 - pickling runs the exception's own code
        info["exception"] = None
        info["why"] = f"{type(bad).__name__}: {bad}"
        data = _dumps(info)
    _write_whole(path, data)


def _load_error(data: bytes) -> dict[str, Any]:
    """What `_write_error` wrote: exception (None: it could not be sent), frames, time,
    summary, text, and why the exception itself is missing."""
    import cloudpickle

    try:
        info = cloudpickle.loads(data)
    except Exception as e:  # written by the rank, so only the exception itself can fail here
        info = {"exception": None, "frames": [], "time": math.inf, "text": "",
                "summary": f"(an error that cannot be read here: {type(e).__name__}: {e})",
                "why": f"{type(e).__name__}: {e}"}
    return info


def _write_main_thread(run_dir: str | Path, rank: int) -> None:
    """Which thread is the rank's main one, for reading its watchdog's dump."""
    _rank_file(run_dir, rank, "thread").write_text(f"{threading.main_thread().ident:#x}")


def _hang_frames(run_dir: Path, rank: int) -> list[tuple[str, int, str]] | None:
    """Where rank's main thread was when its watchdog stopped it (None: it did not time out)."""
    path = _rank_file(run_dir, rank, "hang")
    if not path.exists() or not path.stat().st_size:
        return None
    try:
        main = _rank_file(run_dir, rank, "thread").read_text().strip()
    except OSError:
        main = ""
    frames: list[tuple[str, int, str]] = []
    block = None
    for line in path.read_text(errors="replace").splitlines():
        head = re.match(r"(?:Current thread|Thread) (0x[0-9a-f]+)", line)
        if head:
            block = int(head.group(1), 16) == int(main, 16) if main else block is None
            continue
        m = re.match(r'\s+File "(.*)", line (\d+) in (.*)', line)
        if m and block:
            frames.append((m.group(1), int(m.group(2)), m.group(3)))
    frames.reverse()  # faulthandler lists the innermost call first
    # Outside the user's code (before their function, or freeing what it left as it returns):
    # where in the launcher, rather than nowhere.
    return _users_frames(frames) or frames[-1:]


def _users_frames(frames: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    """The frames inside the user's code: after the last frame of devlab's launcher."""
    last = max((i for i, f in enumerate(frames) if _in_launcher(f[0])), default=-1)
    return frames[last + 1:]
