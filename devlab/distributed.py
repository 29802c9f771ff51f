"""Data parallel from a notebook: run a function, or a cell, on N ranks of torch.distributed.

devlab invents no engine: `launch` runs `fn` on torch's own elastic launcher (the in-process
form of `torchrun --standalone`), one process per rank with RANK, WORLD_SIZE, MASTER_ADDR...
set, so the function calls `dist.init_process_group(...)` as a script under torchrun does
(gloo on the CPU and on simulated GPUs, NCCL on real ones). What devlab adds is what a
notebook needs around it:

- processes: fork where it is safe (Linux, and no real CUDA initialized in this process: a
  forked child inherits the notebook's functions, variables and simulated GPUs), spawn
  otherwise, carrying the function and its arguments with cloudpickle. Spawned ranks see the
  same simulated GPUs through `DEVLAB_SIMULATE_GPUS`.
- output: each rank's stdout and stderr appear as they come, each line labelled `[rankN]`.
- errors: a rank that fails re-raises its own exception here, with a traceback through the
  user's own lines (rebuilt from the rank's frames), the other ranks' failures as notes.
- time: with `timeout`, a rank not done by then is stopped; the TimeoutError says where it was.
- hygiene: afterwards no rank process is left, and the signal handlers, environment variables
  and logger levels torch's launcher changes in this process are as before.
- `placement_log=True`: each rank's placement log, collectives with their bytes included.

Return values travel back with cloudpickle; tensors on simulated GPUs arrive on the same
simulated GPU of this process, as `torch.load` puts them.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import faulthandler
import io
import logging
import marshal
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from devlab import placement_log, simulated
from devlab.host import cpu_cores

__all__ = ["Export", "RankError", "Ranks", "check_options", "default_start_method",
           "export_script", "launch", "run", "run_code"]

START_METHODS = ("fork", "spawn", "forkserver")
# After the timeout, a rank's own watchdog stops it; this much later the parent kills what is
# left (a rank stuck where even that cannot run).
_KILL_GRACE = 5.0
_HERE = os.path.abspath(__file__)
_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing",
            "torchelastic-events-null")
_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
                 if hasattr(signal, n))
_ENV_KEYS = ("DEVLAB_SIMULATE_GPUS", "DEVLAB_SIMULATE_GPU_MEMORY_MB",
             "TORCHELASTIC_SIGNALS_TO_HANDLE")

# Jobs for forked ranks, by run id: a forked child finds its job here, unpickled.
_JOBS: dict[str, tuple[Any, ...]] = {}


class RankError(RuntimeError):
    """A rank failed with an exception that could not be carried back as itself."""


@dataclasses.dataclass
class Ranks:
    """What `run` and `run_code` bring back: one entry per rank, in rank order."""

    values: list[Any]
    logs: list[placement_log.PlacementLog | None]
    start_method: str


# --- the API ------------------------------------------------------------------------------------


def launch(fn: Callable[..., Any], *args: Any, nprocs: int = 2, start_method: str | None = None,
           timeout: float | None = None) -> list[Any]:
    """Run `fn(*args)` on `nprocs` ranks of torch.distributed and return each rank's return
    value, in rank order.

    Each rank is a process started by torch's elastic launcher with RANK, LOCAL_RANK,
    WORLD_SIZE, MASTER_ADDR and MASTER_PORT set: `fn` calls `dist.init_process_group(...)`
    itself, as under torchrun. `start_method`: "fork" or "spawn" (default: fork where safe).
    `timeout` (seconds): stop the ranks then and raise TimeoutError saying where each was.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    return run(fn, args, nprocs=nprocs, start_method=start_method, timeout=timeout).values


def run(fn: Callable[..., Any], args: tuple = (), kwargs: dict[str, Any] | None = None, *,
        nprocs: int = 2, start_method: str | None = None, timeout: float | None = None,
        placement_log: bool = False) -> Ranks:
    """`launch` with keyword arguments for `fn`, and each rank's placement log (`placement_log`)."""
    if not callable(fn):
        raise TypeError(f"fn must be a function to run on every rank, got {type(fn).__name__}")
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    job = ("call", fn, tuple(args), dict(kwargs or {}))
    return _run(job, nprocs, start_method, timeout, placement_log, carried=lambda: job)


def run_code(code: types.CodeType, value: types.CodeType | None, namespace: dict[str, Any], *,
             nprocs: int = 2, start_method: str | None = None, timeout: float | None = None,
             placement_log: bool = False) -> Ranks:
    """Execute compiled code (a notebook cell: `code`, then the expression `value` if any) on
    `nprocs` ranks, each in its own copy of `namespace`; the values are `value`'s per rank.

    Forked ranks copy the whole namespace; spawned ranks get the names the code uses that can
    be pickled (the others are named on stderr).
    """
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame

    def carried() -> tuple[Any, ...]:
        ns = _picklable_namespace(namespace, code, value)
        return ("code", marshal.dumps(code), None if value is None else marshal.dumps(value), ns)

    job = ("code", code, value, namespace)
    return _run(job, nprocs, start_method, timeout, placement_log, carried)


def default_start_method() -> str:
    """"fork" where a forked rank is safe (Linux, no real CUDA initialized here), else "spawn"."""
    if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
        return "spawn"  # macOS's system libraries are not fork-safe; Windows has no fork
    if not simulated.is_active() and torch.cuda.is_initialized():
        return "spawn"  # CUDA cannot be used in a child forked after it was initialized
    return "fork"


# --- the parent's side ----------------------------------------------------------------------------


def check_options(nprocs: Any, start_method: Any, timeout: Any) -> str:
    """The start method to use; a ValueError naming what is wrong with an option."""
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs is the number of ranks, a whole number of at least 1; "
                         f"got {nprocs!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0):
        raise ValueError(f"timeout is a number of seconds greater than 0 (or None), got {timeout!r}")
    method = default_start_method() if start_method is None else start_method
    if method not in START_METHODS or method not in multiprocessing.get_all_start_methods():
        known = [m for m in START_METHODS if m in multiprocessing.get_all_start_methods()]
        raise ValueError(f"start_method {start_method!r} is not one of {known} on this machine")
    if not torch.distributed.is_available():
        raise RuntimeError(f"this build of torch ({torch.__version__}) has no torch.distributed")
    return method


def _run(job: tuple[Any, ...], nprocs: int, start_method: str | None, timeout: float | None,
         log: bool, carried: Callable[[], tuple[Any, ...]]) -> Ranks:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    method = check_options(nprocs, start_method, timeout)
    import cloudpickle

    run_id = uuid.uuid4().hex
    payload = None if method == "fork" else cloudpickle.dumps(carried())
    run_dir = Path(tempfile.mkdtemp(prefix="devlab-ranks-"))
    deadline = None if timeout is None else time.time() + timeout
    spec = {"run_id": run_id, "deadline": deadline, "log": log}
    if simulated.is_active():
        simulated.synchronize()  # a forked rank must find every queued product finished
    _JOBS[run_id] = job
    killer = None if deadline is None else _Killer(run_dir, deadline + _KILL_GRACE)
    failed: BaseException | None = None
    try:
        with _process_state_kept(), _children_env(method), _streams_with_descriptors():
            _elastic(nprocs, method, run_id, run_dir, spec, payload)
    except BaseException as e:  # the ranks' own errors are read from run_dir below
        failed = e
    finally:
        _JOBS.pop(run_id, None)
        if killer is not None:
            killer.cancel()
        _kill_left(run_dir)
    try:
        return _collect(run_dir, nprocs, method, timeout, failed)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _elastic(nprocs: int, method: str, run_id: str, run_dir: Path, spec: dict[str, Any],
             payload: bytes | None) -> None:
    """torchrun --standalone --nproc-per-node N, in this process."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # A stopped rank gets 3 s to exit before it is killed; torch 2.11's LaunchConfig has no
    # such field, and gives its default (30 s).
    quick = ({"shutdown_timeout": 3}
             if any(f.name == "shutdown_timeout" for f in dataclasses.fields(LaunchConfig))
             else {})
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=run_id,
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
        monitor_interval=0.05, start_method=method, **quick,
        logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "torchelastic"), redirects=Std.ALL,
                                    tee=Std.ALL),
        log_line_prefix_template="[rank${rank}] ")
    elastic_launch(config, _rank_main)(str(run_dir), spec, payload)


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """Keep what torch's launcher changes in this process: signal handlers (it installs its
    own), TORCHELASTIC_SIGNALS_TO_HANDLE, and its loggers, quiet while it runs (its failures
    are reported as the ranks' own errors)."""
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in _SIGNALS} if main else {}
    levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for s, h in handlers.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def _children_env(method: str) -> Iterator[None]:
    """Environment variables the ranks (and processes they start) inherit while launching:
    the simulated GPUs of this process, for ranks and their children that start afresh."""
    saved = {k: os.environ.get(k) for k in _ENV_KEYS}
    try:
        if simulated.is_active():
            os.environ["DEVLAB_SIMULATE_GPUS"] = str(simulated.device_count())
            limits = {simulated.memory_stats(i)["limit"] for i in range(simulated.device_count())}
            if len(limits) > 1 and method != "fork":
                raise ValueError(
                    "the simulated GPUs have different memory limits, and spawned ranks take "
                    "theirs from DEVLAB_SIMULATE_GPU_MEMORY_MB, one limit for all: use "
                    "start_method='fork', or one limit for every GPU")
            (limit,) = limits if len(limits) == 1 else (None,)
            if limit is not None:
                os.environ["DEVLAB_SIMULATE_GPU_MEMORY_MB"] = str(limit // (1024 * 1024))
            else:
                os.environ.pop("DEVLAB_SIMULATE_GPU_MEMORY_MB", None)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _DescriptorStream(io.TextIOBase):
    """A stream that writes to `inner` and names descriptor `fd` as its own."""

    def __init__(self, inner: Any, fd: int) -> None:
        self.inner, self.fd = inner, fd

    def write(self, text: str) -> int:
        return self.inner.write(text)

    def flush(self) -> None:
        self.inner.flush()

    def fileno(self) -> int:
        return self.fd


@contextlib.contextmanager
def _streams_with_descriptors() -> Iterator[None]:
    """torch's launcher sends a rank's output to its log file by redirecting the descriptor
    `sys.stdout.fileno()`, in the parent's stream a forked rank inherits. A notebook kernel's
    stream may have none (ipykernel under pytest): while launching, such a stream names 1
    (2 for stderr), and writes still go to it (the ranks' labelled lines, into the cell)."""
    saved = sys.stdout, sys.stderr
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):
            setattr(sys, name, _DescriptorStream(stream, fd))
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


class _Killer:
    """Kill the ranks still running at `when` (their own watchdog should have stopped them)."""

    def __init__(self, run_dir: Path, when: float) -> None:
        self._timer = threading.Timer(max(0.0, when - time.time()), _kill_left, (run_dir,))
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()


def _kill_left(run_dir: Path) -> None:
    """SIGKILL every rank process of this run that is still alive (and still our child)."""
    import psutil

    me = os.getpid()
    for pidfile in run_dir.glob("rank*.pid"):
        try:
            pid = int(pidfile.read_text().split()[0])
            proc = psutil.Process(pid)
            if proc.ppid() == me:
                proc.kill()
                proc.wait(10)
        except (ValueError, IndexError, OSError, psutil.Error):
            continue


def _collect(run_dir: Path, nprocs: int, method: str, timeout: float | None,
             failed: BaseException | None) -> Ranks:
    """Read what each rank left in run_dir; raise the failure that came first."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    import cloudpickle

    hung = {r: _hang_frames(run_dir, r) for r in range(nprocs)}
    hung = {r: frames for r, frames in hung.items() if frames is not None}
    errors = {}
    for r in range(nprocs):
        path = run_dir / f"rank{r}.error"
        if path.exists():
            errors[r] = cloudpickle.loads(path.read_bytes())
    if hung:
        _raise_timeout(hung, errors, nprocs, timeout)
    if errors:
        _raise_first(errors, nprocs)
    if isinstance(failed, KeyboardInterrupt) or _is_signal(failed, "SIGINT"):
        raise KeyboardInterrupt("the ranks were stopped") from None
    if failed is not None and not any(run_dir.glob("rank*.result")):
        raise failed  # the launch itself failed (no rank got to run the job)
    values, logs = [], []
    for r in range(nprocs):
        path = run_dir / f"rank{r}.result"
        if not path.exists():
            why = f"{type(failed).__name__}: {failed}" if failed is not None else "no result"
            raise RankError(f"rank {r} of {nprocs} ended without a result ({why})")
        value, records = cloudpickle.loads(path.read_bytes())
        values.append(value)
        logs.append(None if records is None else placement_log.PlacementLog.from_records(records))
    return Ranks(values, logs, method)


def _is_signal(e: BaseException | None, name: str) -> bool:
    sig = getattr(e, "sigval", None)
    return sig is not None and getattr(sig, "name", "") == name


def _raise_first(errors: dict[int, dict[str, Any]], nprocs: int) -> None:
    """Raise the rank error that happened first, with the rank's traceback; the others as notes."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    order = sorted(errors, key=lambda r: errors[r]["time"])
    first = order[0]
    info = errors[first]
    exc = info["exception"]
    if not isinstance(exc, BaseException):
        exc = RankError(info["text"])
    _note(exc, f"(raised on rank {first} of {nprocs})")
    for r in order[1:]:
        _note(exc, f"rank {r} failed after it: {errors[r]['summary']}")
    raise exc.with_traceback(_rebuilt_traceback(info["frames"]))


def _raise_timeout(hung: dict[int, list[tuple[str, int, str]]],
                   errors: dict[int, dict[str, Any]], nprocs: int, timeout: float | None) -> None:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    lines = []
    for r, frames in hung.items():
        where = _where(frames)
        lines.append(f"rank {r} was at {where}" if where else f"rank {r}")
    ranks = ", ".join(str(r) for r in hung)
    exc = TimeoutError(
        f"rank{'s' if len(hung) > 1 else ''} {ranks} of {nprocs} did not finish within "
        f"{timeout:g} s and {'were' if len(hung) > 1 else 'was'} stopped: " + "; ".join(lines))
    for r in sorted(errors, key=lambda r: errors[r]["time"]):
        _note(exc, f"rank {r} failed: {errors[r]['summary']}")
    raise exc.with_traceback(_rebuilt_traceback(next(iter(hung.values()))))


def _where(frames: list[tuple[str, int, str]]) -> str:
    if not frames:
        return ""
    import linecache

    filename, lineno, _ = frames[-1]
    line = linecache.getline(filename, lineno).strip()
    return f"line {lineno}" + (f": {line}" if line else "")


def _note(exc: BaseException, text: str) -> None:
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(text)


def _rebuilt_traceback(frames: list[tuple[str, int, str]]) -> types.TracebackType | None:
    """A real traceback through (filename, line, function) frames of another process: IPython
    then shows the user's lines from this process's line cache, as for a local error."""
    tb = None
    for filename, lineno, name in reversed(frames):
        try:
            code = compile("\n" * (lineno - 1) + "raise __devlab_frame__()", filename, "exec")
            code = code.replace(co_name=name)
            if hasattr(code, "co_qualname"):
                code = code.replace(co_qualname=name)
            exec(code, {"__devlab_frame__": _Frame, "__name__": "__rank__"})
        except _Frame as marker:
            frame_tb = marker.__traceback__.tb_next if marker.__traceback__ else None
        except Exception:  # a frame that cannot be rebuilt is left out
            continue
        if frame_tb is not None:
            frame_tb.tb_next = tb
            tb = frame_tb
    return tb


class _Frame(Exception):
    """Raised at a rebuilt frame's line, to make a traceback entry there."""


def _hang_frames(run_dir: Path, rank: int) -> list[tuple[str, int, str]] | None:
    """Where rank's main thread was when its watchdog stopped it (None: it did not time out)."""
    path = run_dir / f"rank{rank}.hang"
    if not path.exists() or not path.stat().st_size:
        return None
    try:
        main = (run_dir / f"rank{rank}.pid").read_text().split()[1]
    except (OSError, IndexError):
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
    return _users_frames(frames)


def _users_frames(frames: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    """The frames inside the user's code: after the last frame of this module."""
    last = max((i for i, f in enumerate(frames) if os.path.abspath(f[0]) == _HERE), default=-1)
    return frames[last + 1:]


# --- a rank's side -----------------------------------------------------------------------------------


_watchdog_file: Any = None


def _rank_main(run_dir: str, spec: dict[str, Any], payload: bytes | None) -> None:
    """What every rank process runs (torch's launcher calls it with RANK... set)."""
    global _watchdog_file
    import cloudpickle

    out = Path(run_dir)
    rank = int(os.environ["RANK"])
    # A forked rank inherits the handlers torch's launcher set in the parent: a rank stopped
    # with SIGTERM just ends, and Ctrl-C (SIGINT) is a KeyboardInterrupt, as in a script.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if payload is None:  # forked: a rank uses the simulated GPUs it inherited, as if spawned
        simulated.reset_after_fork_for_rank()
    (out / f"rank{rank}.pid").write_text(f"{os.getpid()} {threading.main_thread().ident:#x}")
    _own_streams()
    if spec["deadline"] is not None:
        _watchdog_file = open(out / f"rank{rank}.hang", "w")  # noqa: SIM115
        faulthandler.dump_traceback_later(max(0.01, spec["deadline"] - time.time()), exit=True,
                                          file=_watchdog_file)
    if "OMP_NUM_THREADS" not in os.environ:  # the ranks share this machine's cores
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(max(1, cpu_cores() // local))
    try:
        job = _JOBS[spec["run_id"]] if payload is None else cloudpickle.loads(payload)
        if spec["log"]:
            with placement_log.capture() as log:
                value = _run_job(job)
            records = log.records()
        else:
            value, records = _run_job(job), None
        (out / f"rank{rank}.result").write_bytes(cloudpickle.dumps((value, records)))
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
        _write_error(out / f"rank{rank}.error", e)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # torch's launcher then stops the other ranks
    finally:
        faulthandler.cancel_dump_traceback_later()
        _finish_process_group()
        sys.stdout.flush()
        sys.stderr.flush()


def _own_streams() -> None:
    """Send this rank's stdout and stderr, Python's and C's, to the log files torch's launcher
    tails (labelled [rankN] in the parent).

    The launcher redirected the descriptor `sys.stdout.fileno()` names. In a rank forked from a
    notebook kernel that is the kernel's copy of the terminal's, not 1 (the kernel captures 1
    and 2 for its cells), and sys.stdout is the kernel's stream, which only the kernel may use.
    """
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            redirected = getattr(sys, name).fileno()
        except (AttributeError, OSError, ValueError):
            redirected = fd
        if redirected != fd:
            os.dup2(redirected, fd)
        setattr(sys, name, open(fd, "w", buffering=1, closefd=False, errors="replace"))  # noqa: SIM115


def _run_job(job: tuple[Any, ...]) -> Any:
    kind = job[0]
    if kind == "call":
        _, fn, args, kwargs = job
        return fn(*args, **kwargs)
    _, code, value, namespace = job
    if isinstance(code, bytes):  # spawned: compiled code travels marshalled
        code = marshal.loads(code)
        value = None if value is None else marshal.loads(value)
        namespace = {"__name__": "__main__", "__builtins__": builtins, **namespace}
    exec(code, namespace)
    return None if value is None else eval(value, namespace)


def _write_error(path: Path, e: BaseException) -> None:
    import cloudpickle

    frames = _users_frames([(f.filename, f.lineno or 0, f.name)
                            for f in traceback.extract_tb(e.__traceback__)])
    summary = "".join(traceback.format_exception_only(type(e), e)).strip()
    info = {"exception": e, "frames": frames, "time": time.time(), "summary": summary,
            "text": "".join(traceback.format_exception(type(e), e, e.__traceback__))}
    try:
        data = cloudpickle.dumps(info)
        cloudpickle.loads(data)  # an exception that pickles but cannot be rebuilt is text too
    except Exception:
        info["exception"] = None
        data = cloudpickle.dumps(info)
    path.write_bytes(data)


def _finish_process_group() -> None:
    """Destroy a default process group the rank left open (torch warns at exit otherwise)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: S110 - the rank's own result is already written
        pass


# --- namespaces and scripts --------------------------------------------------------------------


_IPYTHON_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "open"}


def _names_used(*codes: types.CodeType | None) -> set[str]:
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


@dataclasses.dataclass
class Export:
    """What `export_script` wrote: the file, the imports it added, names it could not."""

    path: Path
    imports: list[str]
    missing: list[str]
    nprocs: int

    def text(self) -> str:
        lines = [f"Wrote {self.path}: torchrun --standalone --nproc-per-node {self.nprocs} "
                 f"{self.path.name}",
                 f"  on simulated GPUs: DEVLAB_SIMULATE_GPUS={self.nprocs} torchrun --standalone "
                 f"--nproc-per-node {self.nprocs} {self.path.name}"]
        if self.missing:
            lines.append("  defined in the notebook, not in the script (add them to it): "
                         + ", ".join(self.missing))
        return "\n".join(lines)

    __repr__ = text


def export_script(source: str, path: str | Path, namespace: dict[str, Any],
                  nprocs: int = 2) -> Export:
    """Write a cell's Python source as a script for `torchrun`: the cell, after import lines
    for the modules and importable objects of `namespace` it uses. Names defined only in the
    notebook are reported (`Export.missing`), not guessed."""
    path = Path(path)
    if path.suffix != ".py":
        raise ValueError(f"the script's name should end in .py, got {str(path)!r}")
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"the cell is not plain Python (line {e.lineno}: {e.msg}); a script "
                         "cannot hold IPython syntax such as %magics or !commands") from None
    code = compile(tree, str(path), "exec")
    assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                and isinstance(n.ctx, (ast.Store, ast.Del))}
    assigned |= {a.asname or a.name.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assigned |= {n.name for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    imports, missing = [], []
    for name in sorted(_names_used(code) - assigned - set(dir(builtins))):
        if name not in namespace:
            continue
        line = _import_line(name, namespace[name])
        if line is None:
            missing.append(name)
        else:
            imports.append(line)
    header = ["# Written by devlab's %%distributed --export from a notebook cell.",
              f"# Run: torchrun --standalone --nproc-per-node {nprocs} {path.name}"]
    text = "\n".join(header + [""] + imports + ([""] if imports else []) + [source.rstrip(), ""])
    path.write_text(text)
    return Export(path, imports, missing, nprocs)


def _import_line(name: str, obj: Any) -> str | None:
    if isinstance(obj, types.ModuleType):
        module = obj.__name__
        if module == name:
            return f"import {module}"
        parent, _, leaf = module.rpartition(".")
        return f"from {parent} import {leaf}" if parent and leaf == name else \
            f"import {module} as {name}"
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "." in qualname \
            or "<" in qualname or module not in sys.modules \
            or getattr(sys.modules[module], qualname, None) is not obj:
        return None
    return f"from {module} import {qualname}" + (f" as {name}" if qualname != name else "")

