"""Data parallel from a notebook: run a function, or a cell, on N ranks of torch.distributed.

`launch` runs `fn` on N rank processes started as `torchrun --standalone` starts its workers:
each has torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_RUN_ID...), so the function calls `dist.init_process_group(...)` as a script
under torchrun does (gloo on the CPU and on simulated GPUs, NCCL on real ones). devlab starts
the processes itself instead of running torch's elastic agent in the notebook's process: that
agent's rendezvous listens on every interface and keeps a thread that unpickles what it reads
from its store, and its clean-up cannot be made safe against an interrupt from outside. What
devlab adds around the ranks:

- loopback only: this process holds the one store the ranks' `env://` rendezvous joins
  (torch's TCPStore on a socket devlab binds to 127.0.0.1 before torch sees it), and each rank's
  gloo and NCCL bind to the loopback interface (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME). Nothing
  a launch starts listens beyond this machine, and nothing in this process reads its store.
- processes: fork where it is safe (Linux, and no real CUDA initialized in this process: a
  forked child inherits the notebook's functions, variables and simulated GPUs), spawn
  otherwise, carrying the function and its arguments with cloudpickle. Spawned ranks see the
  same simulated GPUs through `DEVLAB_SIMULATE_GPUS`. Each rank leads its own process group,
  so whatever it starts is stopped with it.
- output: each rank's stdout and stderr appear as they come, each line labelled `[rankN]`.
- errors: a rank that fails re-raises its own exception here, with a traceback through the
  user's own lines (rebuilt from the rank's frames), the other ranks' failures as notes; a
  rank that ends without a word (`os._exit`, a signal, a crash) is a RankError naming it.
- time: with `timeout`, a rank not done by then is stopped; the TimeoutError says where it was.
- hygiene: however a launch ends (the ranks' return, an error, the timeout, an interrupt, a
  second interrupt while it cleans up), afterwards no rank or process a rank started is
  alive, and no listening socket, thread or file descriptor of the launch is left in this
  process. An interrupt is taken in at once but acted on by the launch itself, which stops
  the ranks and then raises KeyboardInterrupt.
- `placement_log=True`: each rank's placement log, collectives with their bytes included.

Return values travel back with cloudpickle; tensors on simulated GPUs arrive on the same
simulated GPU of this process, as `torch.load` puts them.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import faulthandler
import gc
import marshal
import math
import multiprocessing
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

import torch

from devlab import placement_log, simulated
from devlab.host import cpu_cores, memory_available
from devlab.loopback import loopback_socket

__all__ = ["Export", "RankError", "Ranks", "check_options", "default_start_method",
           "export_script", "launch", "run", "run_code"]

START_METHODS = ("fork", "spawn")
# A rank asked to stop (another rank failed) gets this long to end before it is killed.
_STOP_GRACE = 3.0
# After the timeout, a rank's own watchdog stops it; this much later the parent kills what is
# left (a rank stuck where even that cannot run).
_KILL_GRACE = 5.0
# faulthandler takes at most this many seconds (~31 years): a longer timeout is never reached.
_WATCHDOG_MAX = 1e9
# What each rank costs this process while it runs: two descriptors for its output, one or two
# for its connections to the store (torch's env:// rendezvous, a group's own client), with room.
_FDS_PER_RANK = 4
_FDS_SPARE = 32  # for whatever else this process opens meanwhile
# The least memory a rank takes: its own pages (USS) once it has joined gloo, measured on Linux
# with torch 2.13: a forked rank 4.4 MB (it shares the rest with this process), a spawned one,
# which imports torch afresh, 152 MB.
_RANK_MEMORY = {"fork": 4 * 2**20, "spawn": 150 * 2**20}
_HERE = os.path.abspath(__file__)
_SIMULATION_ENV = ("DEVLAB_SIMULATE_GPUS", "DEVLAB_SIMULATE_GPU_MEMORY_MB")


class RankError(RuntimeError):
    """A rank failed without an exception that could be carried back as itself."""


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

    Each rank is a process with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT...): `fn` calls `dist.init_process_group(...)` itself, as under
    torchrun. `start_method`: "fork" or "spawn" (default: fork where safe). `timeout`
    (seconds): stop the ranks then and raise TimeoutError saying where each was.
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


# --- the parent's side ----------------------------------------------------------------------------


def _run(job: tuple[Any, ...], nprocs: int, start_method: str | None, timeout: float | None,
         log: bool, carried: Callable[[], tuple[Any, ...]]) -> Ranks:
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    method = check_options(nprocs, start_method, timeout)
    payload = None if method == "fork" else _payload(carried)
    if simulated.is_active():
        simulated.synchronize()  # a forked rank must find every queued product finished
    deadline = None if timeout is None else time.time() + timeout
    spec = {"run_id": uuid.uuid4().hex, "deadline": deadline, "log": log, "nprocs": nprocs,
            "env": _ranks_env(method), "parent": os.getpid()}
    with _Interrupts() as interrupts:  # from here until all is cleaned up, SIGINT is recorded
        launch = _Launch(job, payload, spec, method, interrupts)
        try:
            launch.start()
            launch.watch()
        except BaseException as e:  # noqa: BLE001 - the launch ends cleanly whatever happened
            launch.fault = e
        finally:
            launch.close()
        outcome = _collect(launch, timeout)
        launch.remove()
        launch = None  # nothing of the launch stays reachable from a traceback through here
    if interrupts.happened and not (isinstance(outcome, _Failure)
                                    and isinstance(outcome.exception, KeyboardInterrupt)):
        outcome = _Failure(KeyboardInterrupt("the ranks were stopped"))  # during clean-up
    if isinstance(outcome, _Failure):
        exc = outcome.exception
        if outcome.frames:
            exc = exc.with_traceback(_rebuilt_traceback(outcome.frames))
        elif not outcome.fault:
            # No line of the user's to show, and the frames are devlab's: IPython shows the
            # error's own words, as for a mistake in an argument.
            exc._render_traceback_ = _Words(exc)
        outcome = None
        try:
            raise exc
        finally:
            exc = None  # the traceback's frames reach this one: no cycle through its locals
    return outcome


class _Words:
    """IPython's `_render_traceback_` for a rank failure with no frame of the user's: the
    exception's type, message and notes (no reference to the exception: no cycle)."""

    def __init__(self, exc: BaseException) -> None:
        self.lines = [f"{type(exc).__name__}: {exc}", *getattr(exc, "__notes__", ())]

    def __call__(self) -> list[str]:
        return self.lines


def _payload(carried: Callable[[], tuple[Any, ...]]) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps(carried())
    except Exception as e:
        raise TypeError(f"spawned ranks cannot be sent the function and its arguments: "
                        f"{type(e).__name__}: {e} (forked ranks need no pickling: "
                        "start_method='fork')") from None


def _ranks_env(method: str) -> dict[str, str]:
    """Environment every rank gets on top of this process's: talk over loopback only, and see
    the simulated GPUs of this process (a spawned rank and every process a rank starts)."""
    addr, interface = _loopback()
    env = {"MASTER_ADDR": addr, "GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}
    if simulated.is_active():
        env["DEVLAB_SIMULATE_GPUS"] = str(simulated.device_count())
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


class _Interrupts:
    """While inside, SIGINT (a kernel interrupt, Ctrl-C) is recorded instead of raised, so
    starting and cleaning up always finish; the launch checks `happened` and stops. On exit
    the previous handler is back, and KeyboardInterrupt is the launch's to raise."""

    def __init__(self) -> None:
        self.happened = False
        self._previous: Any = None

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous is not None:  # None: a handler not set from Python, left alone
                self._previous = signal.signal(signal.SIGINT, self._record)
        return self

    def _record(self, signum: int, frame: Any) -> None:
        self.happened = True

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


@dataclasses.dataclass
class _Rank:
    """One rank process, as the parent sees it."""

    rank: int
    pid: int = 0
    popen: subprocess.Popen | None = None
    out: BinaryIO | None = None
    err: BinaryIO | None = None
    partial: dict[str, bytes] = dataclasses.field(default_factory=lambda: {"out": b"", "err": b""})
    status: tuple[str, int] | None = None  # ("exit", code) or ("signal", number), once ended
    stopped: bool = False  # the parent asked it to stop (another rank failed, or an interrupt)
    reaped: bool = False


class _Launch:
    """The ranks of one launch, the store they meet at and their output: started, watched and
    closed by `_run`. `close` is complete whatever state `start` or `watch` stopped in."""

    def __init__(self, job: tuple[Any, ...], payload: bytes | None, spec: dict[str, Any],
                 method: str, interrupts: _Interrupts) -> None:
        self.job, self.payload, self.spec, self.method = job, payload, spec, method
        self.interrupts = interrupts
        self.nprocs: int = spec["nprocs"]
        self.deadline: float | None = spec["deadline"]
        self.run_dir: Path | None = None
        self.store: Any = None
        self.listener: socket.socket | None = None
        self.ranks: list[_Rank] = []
        self.fault: BaseException | None = None
        self.timed_out = False
        self._stop_asked: float | None = None

    # starting

    def start(self) -> None:
        _prctl()
        self.run_dir = Path(tempfile.mkdtemp(prefix="devlab-ranks-"))
        # The store's socket now, its server (a thread) only once every rank is forked: a
        # rank forked while that thread accepted a connection inherited glibc's resolver lock
        # locked (the server names each peer with getnameinfo) and hung for good in its own
        # getnameinfo, connecting to the store (3 ranks: 5 launches in 300 hung; none in 1300
        # this way). A rank that connects before the server starts waits in the backlog.
        self.listener = loopback_socket(self.spec["env"]["MASTER_ADDR"])
        self.spec["env"]["MASTER_PORT"] = str(self.listener.getsockname()[1])
        if self.payload is not None:
            (self.run_dir / "job").write_bytes(self.payload)
            self.payload = None
            (self.run_dir / "spec").write_bytes(_dumps(self.spec))
        unfreeze = gc.get_freeze_count() == 0  # (a program that froze objects keeps them so)
        if self.method == "fork":
            # A forked rank must never collect this process's garbage: objects that own
            # threads here (a store's server, a process group) would join threads that do not
            # exist there; their destructors crash the rank ("Segmentation fault ...
            # Garbage-collecting"). Frozen, the objects it inherits are never collected in it.
            gc.freeze()
        try:
            for r in range(self.nprocs):
                if self.interrupts.happened:
                    break
                self._start_rank(r)
        finally:
            if self.method == "fork" and unfreeze:
                gc.unfreeze()
        self.store = _store_on(self.listener)
        self.listener = None

    def _start_rank(self, r: int) -> None:
        try:
            self._start(r)
        except OSError as e:  # EAGAIN: no more processes; EMFILE...
            raise RuntimeError(f"could not start rank {r} of {self.nprocs}: {e}") from e

    def _start(self, r: int) -> None:
        assert self.run_dir is not None
        rank = _Rank(r)
        self.ranks.append(rank)
        out_path, err_path = self.run_dir / f"rank{r}.out", self.run_dir / f"rank{r}.err"
        out_path.touch()
        err_path.touch()
        rank.out, rank.err = open(out_path, "rb"), open(err_path, "rb")  # noqa: SIM115
        if self.method == "fork":
            inherited = [f.fileno() for other in self.ranks for f in (other.out, other.err) if f]
            inherited.append(self.listener.fileno())
            pid = os.fork()
            if pid == 0:  # the rank: it never returns into the code that forked it
                code = 1
                try:
                    os.setsid()
                    _die_with_parent(self.spec["parent"])
                    _redirect(out_path, err_path, close=inherited)
                    code = _rank_main(r, str(self.run_dir), self.spec, self.job)
                finally:
                    os._exit(code)
            rank.pid = pid
        else:
            env = dict(os.environ)
            for key, value in _rank_env(self.spec, r).items():
                if value:
                    env[key] = value
                else:
                    env.pop(key, None)
            with open(out_path, "ab") as out, open(err_path, "ab") as err:
                rank.popen = subprocess.Popen(
                    [sys.executable, "-c", _SPAWN.format(path=sys.path), str(self.run_dir), str(r)],
                    env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                    start_new_session=True, close_fds=True)
            rank.pid = rank.popen.pid

    # watching

    def watch(self) -> None:
        """Until every rank has ended: show their output, stop the others once one fails,
        kill what the timeout's watchdog left, stop everything at an interrupt."""
        pause = 0.005
        while True:
            self._pump()
            if self.interrupts.happened:
                self._signal(signal.SIGKILL)
                return
            running = [r for r in self.ranks if self._ended(r) is None]
            if not running:
                return
            # A rank its own watchdog stopped leaves the others to theirs (they share its
            # deadline), so that each says where it was; the kill below ends what cannot.
            failed = any(self.failed(r) and not self._timed_out(r) for r in self.ranks)
            now = time.monotonic()
            if failed and self._stop_asked is None:
                self._stop_asked = now
                self._signal(signal.SIGTERM, running)
            elif self._stop_asked is not None and now - self._stop_asked > _STOP_GRACE:
                self._signal(signal.SIGKILL, running)
            if self.deadline is not None and time.time() > self.deadline + _KILL_GRACE:
                self.timed_out = True
                self._signal(signal.SIGKILL, running)
            time.sleep(pause)
            pause = min(0.05, pause * 1.5)

    def failed(self, rank: _Rank) -> bool:
        """Whether the rank has ended without its result (an error, os._exit(0), a signal)."""
        return rank.status is not None and (
            rank.status != ("exit", 0) or self.run_dir is None
            or not (self.run_dir / f"rank{rank.rank}.result").exists())

    def _timed_out(self, rank: _Rank) -> bool:
        """Whether the rank's watchdog stopped it (its dump is written)."""
        if self.run_dir is None:
            return False
        path = self.run_dir / f"rank{rank.rank}.hang"
        return path.exists() and path.stat().st_size > 0

    def _ended(self, rank: _Rank) -> tuple[str, int] | None:
        """How the rank ended, or None while it runs; never reaps it (so its pid, which is
        its process group's id, cannot be reused before the group is killed)."""
        if rank.status is not None or not rank.pid:
            return rank.status
        try:
            if hasattr(os, "waitid"):
                info = os.waitid(os.P_PID, rank.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                if info is None:
                    return None
                killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
                rank.status = ("signal" if killed else "exit", info.si_status)
            else:  # no waitid: reap, and leave its group alone afterwards
                pid, status = os.waitpid(rank.pid, os.WNOHANG)
                if pid == 0:
                    return None
                rank.reaped = True
                rank.status = (("signal", os.WTERMSIG(status)) if os.WIFSIGNALED(status)
                               else ("exit", os.waitstatus_to_exitcode(status)))
        except ChildProcessError:
            rank.status = ("exit", -1)
        return rank.status

    def _signal(self, sig: int, ranks: list[_Rank] | None = None) -> None:
        """Send sig to each rank's process group (the rank and what it started), then to the
        rank itself (a rank not yet its group's leader)."""
        for rank in self.ranks if ranks is None else ranks:
            if not rank.pid or rank.reaped:
                continue
            rank.stopped = rank.stopped or rank.status is None
            for kill in (os.killpg, os.kill):
                try:
                    kill(rank.pid, sig)
                except OSError:
                    pass

    def _pump(self, final: bool = False) -> None:
        """Show what the ranks wrote since last time, each whole line labelled [rankN]."""
        for rank in self.ranks:
            for name, stream, target in (("out", rank.out, sys.stdout), ("err", rank.err, sys.stderr)):
                if stream is None:
                    continue
                *lines, rest = (rank.partial[name] + stream.read()).split(b"\n")
                if final and rest:
                    lines.append(rest)
                    rest = b""
                rank.partial[name] = rest
                text = "".join(f"[rank{rank.rank}] {line.decode(errors='replace')}\n"
                               for line in lines)
                if text and target is not None:
                    target.write(text)
                    target.flush()

    # ending

    def close(self) -> None:
        """Kill every rank's process group, reap the ranks, show their last output, close
        the files, and drop the store (its server thread and listening socket end with it)."""
        self._signal(signal.SIGKILL)
        for rank in self.ranks:
            self._reap(rank)
        _wait_for_groups([rank.pid for rank in self.ranks if rank.pid])
        try:
            self._pump(final=True)
        except Exception:  # noqa: S110 - output is shown on a best-effort basis; clean-up is not
            pass
        for rank in self.ranks:
            for f in (rank.out, rank.err):
                if f is not None:
                    f.close()
            rank.out = rank.err = None
            rank.popen = None
        self.store = None
        if self.listener is not None:  # the launch ended before the store's server started
            self.listener.close()
            self.listener = None

    def _reap(self, rank: _Rank) -> None:
        if not rank.pid or rank.reaped:
            return
        until = time.monotonic() + 10
        while True:
            try:
                pid, status = os.waitpid(rank.pid, os.WNOHANG)
            except ChildProcessError:
                break
            if pid:
                if rank.status is None:
                    rank.status = (("signal", os.WTERMSIG(status)) if os.WIFSIGNALED(status)
                                   else ("exit", os.waitstatus_to_exitcode(status)))
                break
            if time.monotonic() > until:  # stuck in the kernel even after SIGKILL
                return
            time.sleep(0.005)
        if rank.popen is not None and rank.status is not None:  # reaped here, not by Popen
            kind, n = rank.status
            rank.popen.returncode = -n if kind == "signal" else n
        rank.reaped = True

    def remove(self) -> None:
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None


def _wait_for_groups(groups: list[int], within: float = 5.0) -> None:
    """Wait until the processes left in these process groups (what the ranks started, killed
    with them) have ended; a group whose leader is reaped and has no member is gone at once."""
    until = time.monotonic() + within
    while groups and time.monotonic() < until:
        groups = [g for g in groups if _group_alive(g)]
        if groups:
            time.sleep(0.01)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    import psutil

    for proc in psutil.process_iter(["status"]):  # members not yet ended (zombies have)
        try:
            if os.getpgid(proc.pid) == group and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            continue
    return False


def _store_on(sock: socket.socket) -> Any:
    """torch's TCPStore server on that socket; the store owns and closes it from then on."""
    from torch.distributed import TCPStore

    addr, port = sock.getsockname()[:2]
    # torch's older server (not libuv's): libuv keeps a pipe open in the process for good
    store = TCPStore(addr, port, None, True, timedelta(seconds=300), wait_for_workers=False,
                     master_listen_fd=sock.fileno(), use_libuv=False)
    sock.detach()
    return store


def _dumps(obj: Any) -> bytes:
    import cloudpickle

    return cloudpickle.dumps(obj)


# A spawned rank: a fresh interpreter with this process's module path.
_SPAWN = ("import sys; sys.path[:] = {path!r}; from devlab.distributed import _spawned_rank; "
          "_spawned_rank(sys.argv[1], int(sys.argv[2]))")


def _rank_env(spec: dict[str, Any], rank: int) -> dict[str, str]:
    """torchrun's environment for one of its workers, with devlab's loopback settings."""
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


# --- what a launch brings back ------------------------------------------------------------------


@dataclasses.dataclass
class _Failure:
    """What a launch raises: the exception, and the rank's frames its traceback is rebuilt
    from (None: the exception keeps its own)."""

    exception: BaseException
    frames: list[tuple[str, int, str]] | None = None
    fault: bool = False  # the launch's own failure: its traceback is devlab's, and shown


def _collect(launch: _Launch, timeout: float | None) -> Ranks | _Failure:
    """What each rank left in the run directory: the ranks' values, or the exception to raise
    (the first failure, the others as notes)."""
    import cloudpickle

    run_dir, nprocs = launch.run_dir, launch.nprocs
    fault, launch.fault = launch.fault, None
    if run_dir is None:  # the launch failed before it had a run directory
        return (_Failure(fault, fault=True) if fault is not None
                else _Failure(RankError("the ranks did not start")))
    errors: dict[int, dict[str, Any]] = {}
    for r in range(nprocs):
        path = run_dir / f"rank{r}.error"
        if path.exists():
            errors[r] = _load_error(path.read_bytes())
    hung = {r: frames for r in range(nprocs)  # (a rank waiting for the others has returned)
            if (frames := _hang_frames(run_dir, r)) is not None
            and not (run_dir / f"rank{r}.result").exists()}
    if launch.interrupts.happened:
        exc: BaseException = KeyboardInterrupt("the ranks were stopped")
        for r in sorted(errors, key=lambda r: errors[r]["time"]):
            _note(exc, f"rank {r} had failed: {errors[r]['summary']}")
        return _Failure(exc)
    if hung or launch.timed_out:
        return _timeout_error(hung, errors, nprocs, timeout)
    silent = {rank.rank: rank.status for rank in launch.ranks
              if not rank.stopped and rank.rank not in errors and launch.failed(rank)}
    # What failed first: an exception of the rank's own; else a rank that ended without a word
    # (os._exit, a signal), which its peers then lose ("Connection closed by peer"); else those.
    own = {r: info for r, info in errors.items() if not _lost_peer(info)}
    if own:
        return _first_error(own, nprocs, errors, silent)
    if silent:
        return _silent_error(silent, errors, nprocs)
    if errors:
        return _first_error(errors, nprocs, errors, silent)
    if fault is not None:
        return _Failure(fault, fault=True)  # the launch itself failed
    values, logs = [], []
    for r in range(nprocs):
        path = run_dir / f"rank{r}.result"
        if not path.exists():
            status = launch.ranks[r].status if r < len(launch.ranks) else None
            return _Failure(RankError(f"rank {r} of {nprocs} ended without a result "
                                      f"({_how(status)})"))
        try:
            value, records = cloudpickle.loads(path.read_bytes())
        except Exception as e:
            return _Failure(RankError(f"the value rank {r} of {nprocs} returned cannot be "
                                      f"rebuilt here: {type(e).__name__}: {e}"))
        values.append(value)
        logs.append(None if records is None else placement_log.PlacementLog.from_records(records))
    return Ranks(values, logs, launch.method)


def _how(status: tuple[str, int] | None) -> str:
    if status is None:
        return "it did not start"
    kind, n = status
    if kind == "signal":
        try:
            name = signal.Signals(n).name
        except ValueError:
            name = f"signal {n}"
        return f"killed by {name} (signal {n})"
    return f"exit code {n}"


def _silent_error(silent: dict[int, tuple[str, int]], errors: dict[int, dict[str, Any]],
                  nprocs: int) -> _Failure:
    """Ranks that ended without returning or raising: os._exit(n), a signal, a crash in C."""
    first = min(silent)
    kind, n = silent[first]
    if kind == "signal":
        why = f"was killed by {_how(silent[first]).removeprefix('killed by ')}"
    else:
        why = (f"ended with exit code {n} without returning or raising (os._exit({n}) ends a "
               "process at once; so does a crash in C code, shown in the rank's stderr)")
    exc = RankError(f"rank {first} of {nprocs} {why}")
    for r in sorted(silent)[1:]:
        _note(exc, f"rank {r} also ended: {_how(silent[r])}")
    for r in sorted(errors, key=lambda r: errors[r]["time"]):
        _note(exc, f"rank {r} failed: {errors[r]['summary']}")
    return _Failure(exc)


def _load_error(data: bytes) -> dict[str, Any]:
    import cloudpickle

    try:
        info = cloudpickle.loads(data)
    except Exception as e:  # written by the rank, so only the exception itself can fail here
        info = {"exception": None, "frames": [], "time": math.inf, "text": "",
                "summary": f"(an error that cannot be read here: {type(e).__name__}: {e})",
                "why": f"{type(e).__name__}: {e}"}
    return info


def _lost_peer(info: dict[str, Any]) -> bool:
    """Whether a rank's error says it lost a peer (gloo's and the store's words), which is what
    another rank's ending does to it."""
    return re.search(r"(closed|reset) by peer|Broken pipe|Connection refused",
                     info["summary"]) is not None


def _first_error(candidates: dict[int, dict[str, Any]], nprocs: int,
                 errors: dict[int, dict[str, Any]],
                 silent: dict[int, tuple[str, int]]) -> _Failure:
    """The rank error that happened first among candidates, with the rank's traceback; the
    others (errors and silent endings) as notes."""
    first = min(candidates, key=lambda r: candidates[r]["time"])
    info = errors[first]
    exc = info["exception"]
    if not isinstance(exc, BaseException):
        exc = RankError(info["summary"])
        _note(exc, f"(raised on rank {first} of {nprocs}; the exception itself could not be "
                   f"sent back: {info.get('why', 'it cannot be pickled')})")
    else:
        _note(exc, f"(raised on rank {first} of {nprocs})")
    for r in sorted(errors, key=lambda r: errors[r]["time"]):
        if r != first:
            _note(exc, f"rank {r} failed after it: {errors[r]['summary']}")
    for r in sorted(silent):
        _note(exc, f"rank {r} also ended: {_how(silent[r])}")
    return _Failure(exc, info["frames"])


def _timeout_error(hung: dict[int, list[tuple[str, int, str]]],
                   errors: dict[int, dict[str, Any]], nprocs: int,
                   timeout: float | None) -> _Failure:
    lines = []
    for r, frames in hung.items():
        where = _where(frames)
        lines.append(f"rank {r} was at {where}" if where else f"rank {r}")
    many = len(hung) != 1
    ranks = "the ranks" if not hung else (
        f"rank{'s' if many else ''} {', '.join(str(r) for r in hung)} of {nprocs}")
    exc = TimeoutError(
        f"{ranks} did not finish within {timeout:g} s and {'were' if many else 'was'} stopped"
        + (": " + "; ".join(lines) if lines else ""))
    for r in sorted(errors, key=lambda r: errors[r]["time"]):
        _note(exc, f"rank {r} failed: {errors[r]['summary']}")
    return _Failure(exc, next(iter(hung.values()), []))


def _where(frames: list[tuple[str, int, str]]) -> str:
    if not frames:
        return ""
    import linecache

    filename, lineno, name = frames[-1]
    line = linecache.getline(filename, lineno).strip()
    where = f"line {lineno}" + (f": {line}" if line else "")
    if os.path.abspath(filename) == _HERE:
        where = f"devlab's launcher ({name}, {where})"
    return where


def _note(exc: BaseException, text: str) -> None:
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(text)


def _rebuilt_traceback(frames: list[tuple[str, int, str]]) -> types.TracebackType | None:
    """A real traceback through (filename, line, function) frames of another process: IPython
    then shows the user's lines from this process's line cache, as for a local error.

    Each entry's frame keeps its caller (f_back), and so this frame: none of its locals may
    hold the traceback when it returns, or the two would make a cycle only the collector frees.
    """
    chain: list[types.TracebackType | None] = [None]
    for filename, lineno, name in reversed(frames):
        entry = _traceback_at(filename, lineno, name)
        if entry is not None:
            entry.tb_next = chain[0]
            chain[0] = entry
        entry = None
    return chain.pop()


def _traceback_at(filename: str, lineno: int, name: str) -> types.TracebackType | None:
    """One traceback entry at filename:lineno in a function called `name` (this frame keeps
    no reference to it, so the entry's frame and this one make no cycle)."""
    try:
        code = compile("\n" * (lineno - 1) + "raise __devlab_frame__()", filename, "exec")
        code = code.replace(co_name=name)
        if hasattr(code, "co_qualname"):
            code = code.replace(co_qualname=name)
        exec(code, {"__devlab_frame__": _Frame, "__name__": "__rank__"})
    except _Frame as marker:
        return marker.__traceback__.tb_next if marker.__traceback__ else None
    except Exception:  # a frame that cannot be rebuilt is left out
        return None
    return None


class _Frame(Exception):
    """Raised at a rebuilt frame's line, to make a traceback entry there."""


def _hang_frames(run_dir: Path, rank: int) -> list[tuple[str, int, str]] | None:
    """Where rank's main thread was when its watchdog stopped it (None: it did not time out)."""
    path = run_dir / f"rank{rank}.hang"
    if not path.exists() or not path.stat().st_size:
        return None
    try:
        main = (run_dir / f"rank{rank}.thread").read_text().strip()
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
    """The frames inside the user's code: after the last frame of this module."""
    last = max((i for i, f in enumerate(frames) if os.path.abspath(f[0]) == _HERE), default=-1)
    return frames[last + 1:]


# --- a rank's side -----------------------------------------------------------------------------------


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
    import cloudpickle

    code = 1
    try:
        spec = cloudpickle.loads((Path(run_dir) / "spec").read_bytes())
        _die_with_parent(spec["parent"])
        job = cloudpickle.loads((Path(run_dir) / "job").read_bytes())
        code = _rank_main(rank, run_dir, spec, job)
    finally:
        os._exit(code)


def _rank_main(rank: int, run_dir: str, spec: dict[str, Any], job: tuple[Any, ...]) -> int:
    """What every rank process runs, with stdout and stderr already its files; the process's
    exit code (0: a result is written; 1: an error is)."""
    global _watchdog_file
    out = Path(run_dir)
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
    (out / f"rank{rank}.thread").write_text(f"{threading.main_thread().ident:#x}")
    if spec["deadline"] is not None:
        _watchdog_file = open(out / f"rank{rank}.hang", "w")  # noqa: SIM115
        faulthandler.dump_traceback_later(
            min(_WATCHDOG_MAX, max(0.01, spec["deadline"] - time.time())), exit=True,
            file=_watchdog_file)
    if "OMP_NUM_THREADS" not in os.environ:  # the ranks share this machine's cores
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(max(1, cpu_cores() // local))
    code = 1
    try:
        try:
            value, records = _run_job(job, spec["log"])
        except SystemExit as e:
            if e.code not in (None, 0):
                raise
            value, records = None, None  # sys.exit(0) ends a rank as a success, as in a script
        try:
            data = _dumps((value, records))
        except Exception as e:
            raise RankError(f"rank {rank} returned a {type(value).__name__}, which cannot be "
                            f"pickled to send it back: {type(e).__name__}: {e}") from None
        _write_whole(out / f"rank{rank}.result", data)
        code = 0
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
        _write_error(out / f"rank{rank}.error", e)
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
    if isinstance(code, bytes):  # spawned: compiled code travels marshalled
        code = marshal.loads(code)
        value = None if value is None else marshal.loads(value)
        namespace = {"__name__": "__main__", "__builtins__": builtins, **namespace}
    exec(code, namespace)
    return None if value is None else eval(value, namespace)


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


def _write_whole(path: Path, data: bytes) -> None:
    """Write the file whole or not at all: a rank killed while writing (the others are stopped
    once one fails) leaves no half-written result or error for the parent to misread."""
    part = path.with_name(path.name + ".part")
    part.write_bytes(data)
    os.replace(part, path)


def _load(data: bytes) -> Any:
    import cloudpickle

    return cloudpickle.loads(data)


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
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"cannot write the script to {str(path)!r}: the folder {str(folder)!r} "
                         "does not exist")
    if path.is_dir():
        raise ValueError(f"cannot write the script to {str(path)!r}: it is a folder")
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
    try:
        path.write_text(text)
    except OSError as e:
        raise ValueError(f"cannot write the script to {str(path)!r}: "
                         f"{e.strerror or type(e).__name__}") from None
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

