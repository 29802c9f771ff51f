"""The corpus runner's observer in the processes a multi-process program starts (the ranks that
`torch.multiprocessing.spawn` or torchrun start). It reads; it changes nothing the program does.

Python imports `sitecustomize` at start-up from the import path, and the runner puts this folder
on PYTHONPATH. Without CONFORMANCE_OBSERVE in the environment it does nothing; the runner sets
that variable (to a folder) only after its own process has started, just before it runs a
program with ranks, so only the processes the program starts are observed.

In such a process, once the program has imported torch, two global optimizer hooks are
registered (`torch.optim.optimizer.register_optimizer_step_pre_hook` and `..._post_hook`,
public API). Before the process's first optimizer step the pre-hook records the rank
(`torch.distributed.get_rank()`) and the optimizer's parameters: the weights training starts
from, after DDP's broadcast from rank 0 (a DTensor parameter gathered whole, every rank taking
part, as each steps its optimizer at the same time). The post-hook keeps a reference to the
optimizer last stepped, whose parameters are read at exit: the weights training ended with
(DTensor parameters are gathered after each step instead, while the group lives). At exit the
process writes `<pid>.json` in the folder: rank, whether devlab's simulated GPUs were used, each
GPU's peak bytes (`memory_stats(i)["peak"]`), the initial and final parameters (flattened, in
the optimizer's order), and any error of the observer itself.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_FOLDER = os.environ.get("CONFORMANCE_OBSERVE")


def _parameters(optimizer: Any) -> list[float]:
    return [v for group in optimizer.param_groups for p in group["params"]
            for v in _whole(p).detach().reshape(-1).tolist()]


def _whole(p: Any) -> Any:
    """A parameter's whole value: a DTensor's (FSDP2, tensor parallelism) gathered from the
    ranks, a collective every rank makes in its own hook at the same step."""
    if not _sharded(p):
        return p
    import torch

    with torch.no_grad():
        return p.full_tensor()


def _sharded(p: Any) -> bool:
    return callable(getattr(p, "full_tensor", None))


class _Observer:
    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.record: dict[str, Any] = {"pid": os.getpid(), "rank": None, "steps": 0,
                                       "initial": None, "final": None, "errors": []}
        self.optimizer: Any = None

    def pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.record["steps"]:
            return
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                self.record["rank"] = dist.get_rank()
                self.record["world_size"] = dist.get_world_size()
            self.record["initial"] = _parameters(optimizer)
        except Exception as e:
            self.record["errors"].append(f"pre-step: {type(e).__name__}: {e}")

    def post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.record["steps"] += 1
        self.optimizer = optimizer
        if any(_sharded(p) for group in optimizer.param_groups for p in group["params"]):
            # gathered now, while the process group lives (at exit it is gone)
            try:
                self.record["final"] = _parameters(optimizer)
            except Exception as e:
                self.record["errors"].append(f"post-step: {type(e).__name__}: {e}")
            self.optimizer = None

    def start(self) -> None:
        """Called once torch is imported."""
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        register_optimizer_step_pre_hook(self.pre_step)
        register_optimizer_step_post_hook(self.post_step)

    def write(self) -> None:
        """At exit: the record, with the simulation's numbers, as <pid>.json."""
        import json

        record = self.record
        if self.optimizer is not None:
            try:
                record["final"] = _parameters(self.optimizer)
            except Exception as e:
                record["errors"].append(f"final: {type(e).__name__}: {e}")
        devlab = sys.modules.get("devlab")
        if devlab is None and not record["steps"]:
            return
        if devlab is not None:
            try:
                sim = devlab.simulated
                record["simulated"] = bool(sim.is_active())
                record["is_used"] = bool(sim.is_used())
                record["peak"] = [int(sim.memory_stats(i)["peak"])
                                  for i in range(sim.device_count())]
            except Exception as e:
                record["errors"].append(f"simulation: {type(e).__name__}: {e}")
        path = os.path.join(self.folder, f"{os.getpid()}.json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)


if _FOLDER:
    import atexit

    _observer = _Observer(_FOLDER)
    atexit.register(_observer.write)
    if "torch" in sys.modules:
        _observer.start()
    else:
        # devlab's start-up hook waits for torch the same way (its finder is on the path, as
        # devlab is): this one goes first and wraps the hook's wrapper.
        from _devlab_autostart import AfterTorch

        sys.meta_path.insert(0, AfterTorch(_observer.start))
