"""Ranks forked or spawned while GPUs are simulated: safe forks, and a report for hangs.

A child forked while a thread of its parent holds glibc's resolver lock (a c10d store server
thread naming a peer) hangs in its first connect: the hazard, and how to tell it is present, are
in `fork_hazard`. Three mechanisms are built around it; begin with the one you need:

- `barrier`: the ranks torch's launchers fork (`torch.multiprocessing.start_processes`, which
  torch elastic, Lightning and accelerate use) wait until all are forked (`fork_window`);
- `quiet_window`: forks no launcher announces, beside a store server thread, wait until the
  parent has stopped forking;
- `hang_report`: every rank of a launch, forked or spawned, is watched; once none makes
  progress for `hang_timeout()` seconds (`set_hang_timeout`, DEVLAB_HANG_TIMEOUT), each says
  where it waits and exits with HANG_EXIT.

`install` is what starting the simulation calls: it patches start_processes and opens quiet
windows until the simulation stops.
"""

from __future__ import annotations

import sys
from types import ModuleType

from devlab.engine.simulated.base.import_patches import when_imported
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.torch_distributed.fork_safety import quiet_window as _quiet_window
from devlab.engine.simulated.torch_distributed.fork_safety.barrier import barriered, fork_window
from devlab.engine.simulated.torch_distributed.fork_safety.fork_hazard import (
    BARRIER_WAIT,
    STORE_THREAD,
    store_thread_running,
)
from devlab.engine.simulated.torch_distributed.fork_safety.hang_report import (
    DEFAULT_HANG_TIMEOUT,
    HANG_ENV,
    HANG_EXIT,
    IDLE_SHARE,
    hang_timeout,
    reset_hang_timeout,
    set_hang_timeout,
)
from devlab.engine.simulated.torch_distributed.fork_safety.quiet_window import (
    QUIET,
    QUIET_SLOTS,
    exempt,
)

__all__ = ["BARRIER_WAIT", "DEFAULT_HANG_TIMEOUT", "HANG_ENV", "HANG_EXIT", "IDLE_SHARE", "QUIET",
           "QUIET_SLOTS", "STORE_THREAD", "exempt", "fork_window", "hang_timeout", "install",
           "reset_hang_timeout", "set_hang_timeout", "store_thread_running"]


def install(p: Patcher) -> None:
    """Patch start_processes (the barrier, the spawned ranks' watchdog) and open quiet windows,
    until `p` restores."""
    _quiet_window._unannounced = True

    def unannounced_off() -> None:
        _quiet_window._unannounced = False

    p.on_restore(unannounced_off)

    def patch(module: ModuleType) -> None:
        spawn = sys.modules["torch.multiprocessing.spawn"]
        ours = barriered(spawn.start_processes)
        # torch.multiprocessing's name (elastic, Lightning, accelerate) and spawn.py's own
        # (mp.spawn calls it there)
        p.set(spawn, "start_processes", ours)
        p.set(module, "start_processes", ours)

    when_imported(p, "torch.multiprocessing", patch)
