"""Starts, watches and stops the rank processes of one launch, and raises what it reports.

The parent's side of a launch: the loopback-only store the ranks meet at, each rank forked
or spawned into its own process group, their output shown as it comes, the others stopped once
one fails, SIGINT recorded rather than raised until every rank is reaped, and nothing of the
launch (process, listener, thread, descriptor, run directory) left afterwards.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from devlab._helpers.loopback import loopback_socket
from devlab.core.ranks.handoff import (
    _SPAWN,
    _payload,
    _rank_env,
    _rank_file,
    _ranks_env,
    _write_launch,
)
from devlab.core.ranks.launch_options import check_options
from devlab.core.ranks.rank_process import _die_with_parent, _prctl, _rank_main, _redirect
from devlab.core.ranks.rank_reports import Ranks, _collect, _Failure, _rebuilt_traceback, _Words
from devlab.engine import simulated
from devlab.engine.simulated.torch_distributed.fork_safety.barrier import fork_window
from devlab.engine.simulated.torch_distributed.fork_safety.quiet_window import exempt

# A rank asked to stop (another rank failed) gets this long to end before it is killed.
_STOP_GRACE = 3.0
# After the timeout, a rank's own watchdog stops it; this much later the parent kills what is
# left (a rank stuck where even that cannot run).
_KILL_GRACE = 5.0


def _run(job: tuple[Any, ...], nprocs: int, start_method: str | None, timeout: float | None,
         log: bool) -> Ranks:
    """Run the job on `nprocs` ranks: their values, or the failure raised."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    method = check_options(nprocs, start_method, timeout)
    payload = None if method == "fork" else _payload(job)
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
            _write_launch(self.run_dir, self.spec, self.payload)
            self.payload = None
        unfreeze = gc.get_freeze_count() == 0  # (a program that froze objects keeps them so)
        if self.method == "fork":
            # A forked rank must never collect this process's garbage: objects that own
            # threads here (a store's server, a process group) would join threads that do not
            # exist there; their destructors crash the rank ("Segmentation fault ...
            # Garbage-collecting"). Frozen, the objects it inherits are never collected in it.
            gc.freeze()
        # Without a timeout, forked ranks on simulated GPUs get the hang report that ranks of
        # torch's launchers get (simulated.torch_distributed.fork_safety): a rank's timeout arms
        # faulthandler, which the report's watchdog would re-arm (so these forks are exempt
        # from the quiet window that forks no launcher announces get).
        watched = self.method == "fork" and self.deadline is None and simulated.is_active()
        try:
            with fork_window(self.nprocs) if watched else exempt():
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
        out_path, err_path = _rank_file(self.run_dir, r, "out"), _rank_file(self.run_dir, r, "err")
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
                    code = _rank_main(r, str(self.run_dir), self.spec, self.job, forked=True)
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
            or not _rank_file(self.run_dir, rank.rank, "result").exists())

    def _timed_out(self, rank: _Rank) -> bool:
        """Whether the rank's watchdog stopped it (its dump is written)."""
        if self.run_dir is None:
            return False
        path = _rank_file(self.run_dir, rank.rank, "hang")
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


# Note [Why devlab starts its ranks itself]
# devlab's first launcher ran torch's elastic agent (`elastic_launch`, torchrun's) in the
# notebook's process. Its c10d rendezvous made two TCPStores listening on every interface (for
# `localhost:0` too) and a `RendezvousKeepAliveTimer` thread that unpickles what the store holds,
# and an interrupt left both behind (issue 16: code execution from the network); its clean-up
# cannot be made interrupt-safe from outside, nor its reference cycles (26 descriptors per failed
# cell) broken. Those cycles also made issue 16's segfault: they held torchelastic's TCPStore
# servers, a rank forked later inherited them, its cycle collector destroyed them, and
# `~LibUVStoreDaemon` joined a thread that existed only in the parent (`pthread_join`: SIGSEGV,
# "Garbage-collecting"; reproduced 2 of 2 times with the old launcher, gone with this one). So a
# launch here keeps no such object (the store is dropped once the ranks are reaped, nothing of a
# launch sits in a cycle), and `gc.freeze()` around the forks keeps the notebook's own garbage out
# of the ranks' collector.
