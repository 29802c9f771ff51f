"""The corpus runner's observer in the processes a multi-process program runs as its ranks. It
reads; it changes nothing the program does.

Python imports `sitecustomize` at start-up from the import path, and the runner puts this folder
on PYTHONPATH. Without CONFORMANCE_OBSERVE in the environment it does nothing; the runner sets
that variable (to a folder) only after its own process has started, just before it runs a
program with ranks, so the processes the program starts are observed (the ranks that
`torch.multiprocessing.spawn`, torchrun, `fabric run` or `accelerate launch` start, a Jupyter
kernel the runner starts). A program whose own process is rank 0 (Lightning's `Trainer` started
from a script runs rank 0 in the script's process and starts the others) is observed by the
runner calling `observe()` itself.

In an observed process, once the program has imported torch, two global optimizer hooks are
registered (`torch.optim.optimizer.register_optimizer_step_pre_hook` and `..._post_hook`,
public API). Before the process's first optimizer step the pre-hook records the rank
(`torch.distributed.get_rank()`) and the optimizer's parameters: the weights training starts
from, after DDP's broadcast from rank 0 (a DTensor parameter, an FSDP1 flat parameter's
shard, or with FSDP1's `use_orig_params=True` an original parameter's part of one, gathered
whole, every rank taking part, as each steps its optimizer at the same time). The post-hook keeps a reference to the
optimizer last stepped, whose parameters are read at exit: the weights training ended with
(sharded parameters are gathered after each step instead, while the group lives). At exit the
process writes `<pid>.json` in the folder: rank, whether devlab's simulated GPUs were used, each
GPU's peak bytes (`memory_stats(i)["peak"]`), the initial and final parameters (flattened, in
the optimizer's order; beyond `LIMIT` numbers, each parameter's digest), the RANK its launcher
gave it, the observed process it was forked from (if any), and any error of the observer itself.

A process forked from an observed one (the ranks of Lightning's `ddp_notebook` and accelerate's
`notebook_launcher`, forked from a kernel) is a process of its own: it starts a new record, and
writes it when it ends, also where it ends with `os._exit` after multiprocessing's own exit
handlers (a multiprocessing child never runs `atexit`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

_FOLDER = os.environ.get("CONFORMANCE_OBSERVE")


# Beyond this many numbers (torchtitan's debug Llama 3 has 6.2 million) a record keeps each
# parameter's SHA-256 instead: the ranks are checked for exact equality, which digests show as
# well, and a record of all the numbers of every rank took a minute to write and read. A CPU
# replay needs the numbers; the programs replayed have far fewer.
LIMIT = 4_000_000


def _parameters(optimizer: Any) -> list[float] | list[str]:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    gathered: dict[int, Any] = {}  # an FSDP1 flat parameter gathered once for all its views
    views = _flat_of_views() if any(_view_of_flat(p) for p in params) else {}
    whole = [_whole(p, views, gathered).detach() for p in params]
    if sum(p.numel() for p in whole) <= LIMIT:
        return [v for p in whole for v in p.reshape(-1).tolist()]
    import hashlib

    import torch

    return ["sha256:" + hashlib.sha256(p.cpu().contiguous().reshape(-1).view(torch.uint8)
                                       .numpy().tobytes()).hexdigest() for p in whole]


def _whole(p: Any, views: dict[int, tuple[Any, int]] | None = None,
           gathered: dict[int, Any] | None = None) -> Any:
    """A parameter's whole value: a DTensor's (FSDP2, tensor parallelism) or an FSDP1 flat
    parameter's gathered from the ranks, a collective every rank makes in its own hook at the
    same step. With FSDP1's `use_orig_params=True` the optimizer holds the original
    parameters, each a view of its rank's part of the flat parameter (flattened, possibly
    empty): its flat parameter (`views`) is gathered whole (once, into `gathered`) and the
    parameter's own stretch cut out of it."""
    import torch

    views = views if views is not None else {}
    gathered = gathered if gathered is not None else {}
    with torch.no_grad():
        if id(p) in views:
            flat, index = views[id(p)]
            if id(flat) not in gathered:
                gathered[id(flat)] = _gather_flat(flat)
            return gathered[id(flat)][_stretch(flat, index)]
        if not _sharded(p):
            return p
        if _flat_shard(p):
            return _gather_flat(p)
        return p.full_tensor()


def _flat_shard(p: Any) -> bool:
    """An FSDP1 FlatParameter holding this rank's shard: the ranks' shards, each padded to one
    size, concatenated in rank order and cut to the unpadded size, are the flat parameter,
    which is the wrapped module's parameters flattened in their order. Known by its sizes, as
    FSDP sets them for a sharded strategy: it holds its sharded size, which is less than the
    padded unsharded size (a shard of a one-element flat parameter holds as many numbers as
    the unpadded whole, so the unpadded size cannot tell)."""
    if not getattr(p, "_is_flat_param", False):
        return False
    sharded = getattr(p, "_sharded_size", None)
    padded = getattr(p, "_padded_unsharded_size", None)
    return (sharded is not None and padded is not None
            and getattr(p, "_unpadded_unsharded_size", None) is not None
            and p.numel() == sharded.numel() < padded.numel())


def _stretch(flat: Any, index: int) -> slice:
    """Where original parameter `index` lies in its whole flat parameter: with
    `use_orig_params=True` FSDP aligns each parameter's start, with padding between them
    (`_is_padding_mask` marks those entries of `_numels_with_padding`)."""
    start = 0
    for numel, padding in zip(flat._numels_with_padding, flat._is_padding_mask, strict=True):
        if not padding:
            if index == 0:
                return slice(start, start + numel)
            index -= 1
        start += numel
    raise IndexError(f"the flat parameter has no parameter {index}")


def _view_of_flat(p: Any) -> bool:
    """An original parameter FSDP1 flattened (`use_orig_params=True` keeps it as a view)."""
    return bool(getattr(p, "_fsdp_flattened", False)) and not getattr(p, "_is_flat_param",
                                                                         False)


def _flat_of_views() -> dict[int, tuple[Any, int]]:
    """Each original parameter of a sharded FSDP1 flat parameter with `use_orig_params=True`
    (by id): its flat parameter and its index there. FSDP keeps no map from a parameter to its
    flat parameter, but each flat parameter lists its original parameters (`_params`)."""
    import gc

    flat_module = sys.modules.get("torch.distributed.fsdp._flat_param")
    if flat_module is None:
        return {}
    found: dict[int, tuple[Any, int]] = {}
    for obj in gc.get_objects():
        if isinstance(obj, flat_module.FlatParameter) and _flat_shard(obj) and obj._params:
            for index, param in enumerate(obj._params):
                found[id(param)] = (obj, index)
    return found


def _gather_flat(p: Any) -> Any:
    import torch
    import torch.distributed as dist

    shard = p.detach()
    if shard.device.type == "cpu":  # CPU offload: NCCL gathers GPU tensors only
        shard = shard.to(torch.device("cuda", torch.cuda.current_device()))
    whole = shard.new_empty(shard.numel() * dist.get_world_size())
    dist.all_gather_into_tensor(whole, shard.contiguous())
    return whole[:p._unpadded_unsharded_size.numel()].cpu()


def _sharded(p: Any) -> bool:
    return callable(getattr(p, "full_tensor", None)) or _flat_shard(p)


class _Observer:
    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._new_record()

    def _new_record(self, parent: int | None = None) -> None:
        self.record: dict[str, Any] = {"pid": os.getpid(), "parent": parent, "rank": None,
                                       "steps": 0, "initial": None, "final": None, "errors": []}
        self.optimizer: Any = None
        self.written = False

    def pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.record["steps"]:
            return
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                self.record["rank"] = dist.get_rank()
                self.record["world_size"] = dist.get_world_size()
            import torch

            # the seed this process's generator started from (a replay of ranks that draw
            # unseeded, each from its own, draws theirs)
            self.record["seed"] = torch.initial_seed()
            self.record["initial"] = _parameters(optimizer)
        except Exception as e:
            self.record["errors"].append(f"pre-step: {type(e).__name__}: {e}")

    def post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.record["steps"] += 1
        self.optimizer = optimizer
        if any(_sharded(p) or _view_of_flat(p)
               for group in optimizer.param_groups for p in group["params"]):
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

    def forked(self) -> None:
        """In a child just forked: a new process, a new record (the hooks are inherited), which
        names the observed process it was forked from."""
        self._new_record(parent=self.record["pid"])

    def multiprocessing_child(self) -> None:
        """In a multiprocessing child (after its own after-fork handlers cleared the parent's
        finalizers): write the record when the child runs its exit handlers."""
        from multiprocessing import util

        util.Finalize(None, self.write, exitpriority=100)

    def write(self) -> None:
        """At exit (once per process): the record, with the simulation's numbers, as
        <pid>.json."""
        import json

        if self.written or self.record["pid"] != os.getpid():
            return
        self.written = True
        record = self.record
        if self.optimizer is not None:
            try:
                record["final"] = _parameters(self.optimizer)
            except Exception as e:
                record["errors"].append(f"final: {type(e).__name__}: {e}")
        # The rank a launcher gave the process, for one that never stepped an optimizer.
        record["env_rank"] = os.environ.get("RANK")
        # Which launch of a program launched twice in one folder (the runner's relaunch).
        record["launch"] = os.environ.get("CONFORMANCE_LAUNCH")
        devlab = sys.modules.get("devlab")
        # A process without torch is no rank's: a tool a rank ran, such as the nvidia-smi that
        # accelerate asks about the GPUs (it inherits RANK, and stubs devlab's packages).
        if (devlab is None or "torch" not in sys.modules) and not record["steps"]:
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


def observe(folder: str) -> _Observer:
    """Observe this process (and the processes forked from it), writing records in `folder`."""
    import atexit
    from multiprocessing import util

    observer = _Observer(folder)
    atexit.register(observer.write)
    os.register_at_fork(after_in_child=observer.forked)
    util.register_after_fork(observer, _Observer.multiprocessing_child)
    if "torch" in sys.modules:
        observer.start()
    else:
        # devlab's start-up hook waits for torch the same way (its finder is on the path, as
        # devlab is): this one goes first and wraps the hook's wrapper.
        from _devlab_autostart import AfterTorch

        sys.meta_path.insert(0, AfterTorch(observer.start))
    return observer


if _FOLDER and __name__ == "sitecustomize":  # not when the runner loads this file itself
    observe(_FOLDER)
