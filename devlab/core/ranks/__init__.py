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

The package's modules, one job each: `options` (the options, checked before anything starts),
`launcher` (the parent's side: starting, watching and stopping the ranks), `rank` (what runs
inside a rank process), `reports` (what a launch brings back: the values, or the failure it
raises), `wire` (everything that crosses between the parent and its ranks), `export`
(`export_script`). Each imports only those below it; this module, the API, imports them.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from devlab.core.ranks.handoff import _call_job, _code_job
from devlab.core.ranks.launch_options import (  # %%distributed's choices
    START_METHODS as START_METHODS,
)
from devlab.core.ranks.launch_options import check_options, default_start_method
from devlab.core.ranks.launcher import _run
from devlab.core.ranks.rank_reports import RankError, Ranks
from devlab.core.ranks.script_export import Export, export_script

__all__ = ["Export", "RankError", "Ranks", "check_options", "default_start_method",
           "export_script", "launch", "run", "run_code"]

# The public names defined in the modules below are this module's, as they always were: a
# traceback prints devlab.distributed.RankError, and pickles and export_script's import lines
# name them here.
for _public in (Export, RankError, Ranks, check_options, default_start_method, export_script):
    _public.__module__ = __name__
del _public


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
    return _run(_call_job(fn, args, kwargs), nprocs, start_method, timeout, placement_log)


def run_code(code: types.CodeType, value: types.CodeType | None, namespace: dict[str, Any], *,
             nprocs: int = 2, start_method: str | None = None, timeout: float | None = None,
             placement_log: bool = False) -> Ranks:
    """Execute compiled code (a notebook cell: `code`, then the expression `value` if any) on
    `nprocs` ranks, each in its own copy of `namespace`; the values are `value`'s per rank.

    Forked ranks copy the whole namespace; spawned ranks get the names the code uses that can
    be pickled (the others are named on stderr).
    """
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    return _run(_code_job(code, value, namespace), nprocs, start_method, timeout, placement_log)
