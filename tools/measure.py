"""Run a command and measure what it costs: wall time and the peak RSS of its process tree.

The peak is the largest sum of resident memory over the command and all its descendants (a
Jupyter server or nbconvert and its kernel), sampled every `interval` seconds. Each process
counts its proportional share of the pages it shares (Linux's Pss), so a page shared by a
kernel and the workers it forked (a DataLoader's) counts once, as a container's memory limit
(mybinder's) charges it; where Pss cannot be read, the process's whole resident size.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

MIB = 1024 * 1024


@dataclass(frozen=True)
class Measured:
    returncode: int
    seconds: float
    peak_rss: int  # bytes
    output: str  # stdout and stderr, interleaved

    @property
    def peak_mib(self) -> float:
        return self.peak_rss / MIB


def tree_rss(proc: psutil.Process) -> int:
    """Resident bytes of `proc` and every live descendant."""
    total = 0
    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in family:
        try:
            total += _proportional(p.pid)
        except (OSError, ValueError):
            try:
                total += p.memory_info().rss
            except psutil.Error:  # ended between listing and reading
                pass
    return total


def _proportional(pid: int) -> int:
    """The process's Pss in bytes, from /proc/PID/smaps_rollup (one small read, unlike smaps);
    OSError or ValueError where there is none."""
    with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
        for line in f:
            if line.startswith(b"Pss:"):
                return int(line.split()[1]) * 1024
    raise ValueError("no Pss line")


def run_measured(cmd: list[str], *, env: Mapping[str, str], cwd: Path, timeout: float,
                 cpus: Iterable[int] | None = None, interval: float = 0.05) -> Measured:
    """Run `cmd` (pinned to `cpus`, if given), sampling its tree's RSS until it exits.

    On timeout the whole process group is killed and the result has returncode -9.
    """
    pinned = set(cpus) if cpus is not None else None

    def pin() -> None:
        if pinned:
            os.sched_setaffinity(0, pinned)

    start = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, preexec_fn=pin,
                                start_new_session=True)
        watched = psutil.Process(proc.pid)
        peak = 0
        deadline = start + timeout
        family: list[psutil.Process] = []
        while proc.poll() is None:
            peak = max(peak, tree_rss(watched))
            try:
                family = watched.children(recursive=True)
            except psutil.Error:
                pass
            if time.perf_counter() > deadline:
                _kill(proc, family)
                break
            time.sleep(interval)
        returncode = proc.wait()
        seconds = time.perf_counter() - start
        _kill(proc, family)  # a kernel left behind (kernels run in sessions of their own)
        out.seek(0)
        text = out.read().decode(errors="replace")
    return Measured(returncode, seconds, peak, text)


def _kill(proc: subprocess.Popen[bytes], family: list[psutil.Process]) -> None:
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    for p in family:
        try:
            p.kill()
        except psutil.Error:
            pass
