"""Facts about the machine devlab runs on."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def cpu_cores() -> int:
    """The CPU cores this process may use: its affinity mask where the OS has one (a container
    pinned to 2 of a host's 64 cores counts 2), and no more than its CPU quota (mybinder shows
    every core of the host but allows about one; a quota of 1.5 CPUs counts 2)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks outside Linux
        cores = os.cpu_count() or 1
    quota = cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return cores


def cpu_quota(cgroup: Path = CGROUP) -> float | None:
    """The CPUs' worth of time the cgroup allows (cgroup v2 `cpu.max`, or v1's CFS quota and
    period), or None where there is no quota or no cgroup to read."""
    try:
        v2 = cgroup / "cpu.max"
        if v2.exists():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        v1 = cgroup / "cpu" / "cpu.cfs_quota_us"
        if v1.exists():
            quota_us = int(v1.read_text())
            period_us = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
            return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):  # unreadable or malformed: no quota known
        return None
    return None


def memory_available(cgroup: Path = CGROUP) -> int | None:
    """Bytes of memory this process can still get: the machine's available memory, or less
    where a cgroup limits it (cgroup v2 `memory.max` minus `memory.current`, or v1's limit
    minus usage: Binder's 2 GB on a host with far more). None where it cannot be read."""
    try:
        import psutil

        available = int(psutil.virtual_memory().available)
    except Exception:  # no psutil reading on this platform
        available = None
    for limit_file, used_file in (("memory.max", "memory.current"),
                                  ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            limit = (cgroup / limit_file).read_text().strip()
            if limit == "max":
                break
            left = max(0, int(limit) - int((cgroup / used_file).read_text()))
        except (OSError, ValueError):
            continue
        if int(limit) < 2**60:  # v1 says "no limit" with a huge number
            available = left if available is None else min(available, left)
        break
    return available
