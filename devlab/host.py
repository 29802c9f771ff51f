"""Facts about the machine devlab runs on."""

from __future__ import annotations

import os


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one, so a
    container limited to 2 of a host's 64 cores counts 2)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks outside Linux
        return os.cpu_count() or 1
