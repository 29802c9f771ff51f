"""What a launch reports: each rank's value (`Ranks`), or the one failure it raises.

The failure is a rank's own exception (the earliest; a `RankError` with its text when it
cannot be carried back as itself), else a rank that ended without a word, else what its peers
lost, else the timeout, the interrupt or the launch's own fault; the others are notes. Its
traceback is rebuilt from the rank's frames, so IPython shows the user's own lines.
"""

from __future__ import annotations

import dataclasses
import linecache
import re
import signal
import types
from typing import Any

from devlab.core import placement_log
from devlab.core.ranks.handoff import (
    _hang_frames,
    _in_launcher,
    _load_error,
    _rank_file,
    _read_result,
)
from devlab.engine.simulated.torch_distributed.fork_safety.hang_report import HANG_ENV, HANG_EXIT


class RankError(RuntimeError):
    """A rank failed without an exception that could be carried back as itself."""


@dataclasses.dataclass
class Ranks:
    """What `run` and `run_code` bring back: one entry per rank, in rank order."""

    values: list[Any]
    logs: list[placement_log.PlacementLog | None]
    start_method: str


@dataclasses.dataclass
class _Failure:
    """What a launch raises: the exception, and the rank's frames its traceback is rebuilt
    from (None: the exception keeps its own)."""

    exception: BaseException
    frames: list[tuple[str, int, str]] | None = None
    fault: bool = False  # the launch's own failure: its traceback is devlab's, and shown


class _Words:
    """IPython's `_render_traceback_` for a rank failure with no frame of the user's: the
    exception's type, message and notes (no reference to the exception: no cycle)."""

    def __init__(self, exc: BaseException) -> None:
        self.lines = [f"{type(exc).__name__}: {exc}", *getattr(exc, "__notes__", ())]

    def __call__(self) -> list[str]:
        return self.lines


def _collect(launch: Any, timeout: float | None) -> Ranks | _Failure:
    """What each rank left in the run directory of `launch` (a closed `launcher._Launch`): the
    ranks' values, or the exception to raise (the first failure, the others as notes)."""
    run_dir, nprocs = launch.run_dir, launch.nprocs
    fault, launch.fault = launch.fault, None
    if run_dir is None:  # the launch failed before it had a run directory
        return (_Failure(fault, fault=True) if fault is not None
                else _Failure(RankError("the ranks did not start")))
    errors: dict[int, dict[str, Any]] = {}
    for r in range(nprocs):
        path = _rank_file(run_dir, r, "error")
        if path.exists():
            errors[r] = _load_error(path.read_bytes())
    hung = {r: frames for r in range(nprocs)  # (a rank waiting for the others has returned)
            if (frames := _hang_frames(run_dir, r)) is not None
            and not _rank_file(run_dir, r, "result").exists()}
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
        if not _rank_file(run_dir, r, "result").exists():
            status = launch.ranks[r].status if r < len(launch.ranks) else None
            return _Failure(RankError(f"rank {r} of {nprocs} ended without a result "
                                      f"({_how(status)})"))
        try:
            value, records = _read_result(run_dir, r)
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
    elif n == HANG_EXIT:
        why = (f"was stopped by devlab's hang report (exit code {n}): no rank made progress "
               f"for the hang timeout ({HANG_ENV}, devlab.simulated.set_hang_timeout); its "
               "stderr above shows where it waited")
    else:
        why = (f"ended with exit code {n} without returning or raising (os._exit({n}) ends a "
               "process at once; so does a crash in C code, shown in the rank's stderr)")
    exc = RankError(f"rank {first} of {nprocs} {why}")
    for r in sorted(silent)[1:]:
        _note(exc, f"rank {r} also ended: {_how(silent[r])}")
    for r in sorted(errors, key=lambda r: errors[r]["time"]):
        _note(exc, f"rank {r} failed: {errors[r]['summary']}")
    return _Failure(exc)


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
    filename, lineno, name = frames[-1]
    line = linecache.getline(filename, lineno).strip()
    where = f"line {lineno}" + (f": {line}" if line else "")
    if _in_launcher(filename):
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
