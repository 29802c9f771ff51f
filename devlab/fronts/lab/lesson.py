"""A lesson states the GPUs it needs, and `setup` gives them to it however the GPUs appeared.

A lesson notebook calls `setup` once, at its top: `lab = devlab.lesson.setup(gpus=2,
model="T4")`. Whatever the machine, the lesson then has `gpus` logical GPUs, and its cells use
`lab.gpus` (torch devices) or TensorFlow names (`/GPU:1`), never a literal `"cuda:1"`:

- no GPU: devlab simulates them (`config.simulate_gpus`), with the lesson's memory and model;
- simulated GPUs already running (`DEVLAB_SIMULATE_GPUS`, a Binder image or a teacher; or an
  earlier notebook in the same kernel): kept, and given the lesson's memory and timing model
  if the runtime has not started yet;
- real GPUs: used as they are (devlab never simulates beside a real GPU);
- fewer GPUs than the lesson uses (Colab's one T4): the first is split into logical GPUs, as
  the TensorFlow guide simulates several GPUs on one. On a real GPU they are all the same
  CUDA device (`cuda:0`), sharing its compute and memory; simulated, each is its own device,
  and with a timing model they share one queue;
- more: the extra ones are hidden (`config.set_visible_devices`), so names and counts are the
  lesson's; a one-GPU lesson whose `separate_gpus` cells need a second CUDA device keeps a
  second real one for them.

It prints one line saying what it did. Where something the lesson needs cannot be had (the
runtime has started, so settings are fixed; a real GPU has no timing model; one real GPU
split in two is still one CUDA device), it adds a line naming the cells affected, taken from
`cells`, and what to do. It never fails silently, and never raises for a machine it can work
with. Cells named under "model" and "separate_gpus" carry the notebook tag `raises-exception`,
so that where they cannot run, Jupyter's Run All goes on past them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import torch

from devlab.core import config
from devlab.engine import nvml_reader as nvml
from devlab.engine import runtime, simulated

_MIB = 1024 * 1024

# What `cells` may describe, by the requirement the cells depend on.
CELL_KEYS = {
    "gpus": "cells that need all the lesson's GPUs",
    "memory_limit": "cells that need each GPU to have the lesson's memory",
    "model": "cells that need GPU times modeled on the lesson's GPU",
    "separate_gpus": "cells that need two GPUs that are separate CUDA devices (cuda:0 and "
                     "cuda:1): they do not run on one real GPU split into logical GPUs",
}

RESTART = ("To get them, restart the kernel (Jupyter: Kernel > Restart Kernel; Colab: Runtime > "
           "Restart session) and run this notebook from the top.")
CPU_RUNTIME = ("A runtime without a GPU (in Colab: Runtime > Change runtime type > CPU) runs them "
               "on simulated GPUs.")


@dataclasses.dataclass(frozen=True)
class Lesson:
    """What `setup` gave a lesson: read `gpus` for the torch devices its cells use."""

    wanted: int
    model: str | None
    memory_limit: int | None
    said: str
    notes: tuple[str, ...] = ()

    @property
    def gpus(self) -> list[torch.device]:
        """The torch device of each logical GPU, in order (`cuda:0` twice on a split real GPU)."""
        return [d.torch_device for d in config.logical_devices("GPU")]

    @property
    def names(self) -> list[str]:
        """The logical GPUs' TensorFlow names (`/GPU:0`, `/GPU:1`), for magics and `devlab.device`."""
        return [d.name.replace("/device:", "/") for d in config.logical_devices("GPU")]

    @property
    def times(self) -> str:
        """Where the GPU times the lesson's cells show come from, in words: measured on real
        GPUs, or modeled (on which GPU), or neither (simulated without a timing model)."""
        if not simulated.is_active():
            return "measured with CUDA events on the real GPUs"
        spec = simulated.model()
        if spec is None:
            return ("simulated without a timing model: CPU time, nothing a GPU would show "
                    "(devlab.lesson.setup(model=\"T4\") models one)")
        # NCCL's model times what passes between GPUs: named where there is a second one.
        nccl = " and NCCL's tuning model" if simulated.device_count() > 1 else ""
        return f"modeled on {spec.full_name} (from its specifications{nccl}, not measured)"

    def __str__(self) -> str:
        return "\n".join((self.said, *self.notes))

    def __repr__(self) -> str:
        pairs = ", ".join(f"{n} -> {d}" for n, d in zip(self.names, self.gpus, strict=True))
        return f"Lesson({pairs or 'no GPU'})"


def setup(gpus: int = 1, *, memory_limit: int | None = None, model: str | None = None,
          cells: Mapping[str, str] | None = None) -> Lesson:
    """Give a lesson `gpus` GPUs, whatever this machine has, and say in one line what was done.

    `memory_limit` (MB) is the memory of each simulated GPU, and of each part of a GPU split
    for the lesson (by default an equal share of the GPU); `model` ("T4", ...) the real GPU whose
    timing simulated GPUs model. `cells` says which of the lesson's cells depend on what
    (keys: `CELL_KEYS`), so that where it cannot be had the line names them. Call it before
    any work is placed on a GPU; called again (a re-run), it changes nothing that is in use.
    """
    _check(gpus, memory_limit, cells)
    cells = dict(cells or {})
    if model is not None:
        model = simulated.gpu_spec(model).name  # an unknown name fails here, naming the models
    started = runtime.is_initialized() or simulated.is_used()
    did: list[str] = []
    notes: list[str] = []

    if simulated.is_active():
        did.append(_simulated_origin())
        _match_simulation(memory_limit, model, started, cells, did, notes)
    elif config.list_physical_devices("GPU"):
        real = config.list_physical_devices("GPU")
        did.append(f"{len(real)} real GPU{'s' if len(real) != 1 else ''} ({_real_names(real)})")
        if model is not None:
            notes.append(
                f"Times on a real GPU are measured, not modeled on the {model}"
                + (f"; {_will_not_run(cells['model'], 'a modeled GPU')} {CPU_RUNTIME}"
                   if "model" in cells else "."))
    else:
        config.simulate_gpus(gpus, memory_limit=memory_limit, model=model)
        did.append(f"no GPU here, so devlab simulates {gpus}")

    _arrange(gpus, memory_limit, started, cells, did, notes)

    logical = config.logical_devices("GPU")
    pairs = ", ".join(f"{d.name.replace('/device:', '/')} = {d.torch_device}" for d in logical)
    said = f"devlab.lesson: {'; '.join(did)}. GPUs: {pairs or 'none'}{_kind()}."
    lesson = Lesson(gpus, model, memory_limit, said, tuple(notes))
    print(lesson)
    return lesson


def _kind() -> str:
    """What the GPUs are, for the end of the line."""
    if not simulated.is_active():
        return ""
    spec = simulated.model()
    if spec is None:
        return " (simulated, CPU-backed: values are real, speeds say nothing about a real GPU)"
    return (f" (simulated, CPU-backed: values are real; GPU times are modeled from "
            f"{spec.full_name} specifications, not measured)")


def _check(gpus: int, memory_limit: int | None, cells: Mapping[str, str] | None) -> None:
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus is the number of GPUs the lesson uses, a whole number of at "
                         f"least 1; got {gpus!r}.")
    if memory_limit is not None:
        config.LogicalDeviceConfiguration(memory_limit=memory_limit)  # checks it, in its words
    unknown = sorted(set(cells or {}) - set(CELL_KEYS))
    if unknown:
        raise ValueError(f"cells has unknown keys {unknown}; the keys are {sorted(CELL_KEYS)} "
                         "(the requirement the cells depend on).")


def _will_not_run(cells: str, need: str) -> str:
    """`cells` need `need`, so they will not run; they carry the raises-exception tag, so
    Jupyter's Run All goes on past them."""
    they = "they" if _s(cells) == "" else "it"
    return (f"{cells} need{_s(cells)} {need}, so {they} will not run here (Run All goes on past "
            f"{'them' if they == 'they' else 'it'}).")


def _s(words: str) -> str:
    """'s' for a verb after `words`, unless they name several things ('cells', 'a and b')."""
    return "" if " and " in words or words.rstrip().endswith("s") else "s"


# -- simulated GPUs already running ---------------------------------------------------------

def _simulated_origin() -> str:
    n = len(config.list_physical_devices("GPU"))
    env = os.environ.get("DEVLAB_SIMULATE_GPUS", "").strip()
    where = f"from DEVLAB_SIMULATE_GPUS={env}" if env else "set up earlier in this kernel"
    return f"{n} simulated GPU{'s' if n != 1 else ''} {where}"


def _simulated_memory_mb() -> int | None:
    total = config.get_device_details(config.list_physical_devices("GPU")[0]).get("total_memory")
    return None if total is None else total // _MIB


def _match_simulation(memory_limit: int | None, model: str | None, started: bool,
                      cells: dict[str, str], did: list[str], notes: list[str]) -> None:
    """Give the running simulation the lesson's model and memory, while that can change."""
    spec = simulated.model()
    have_model = spec.name if spec is not None else None
    have_memory = _simulated_memory_mb()
    wrong_model = model is not None and have_model != model
    wrong_memory = memory_limit is not None and have_memory != memory_limit
    if not (wrong_model or wrong_memory):
        return
    if not started:
        count = len(config.list_physical_devices("GPU"))
        memory = memory_limit if memory_limit is not None else (
            have_memory if have_model is None else None)  # a model's memory goes with it
        config.simulate_gpus(count, memory_limit=memory, model=model or have_model)
        given = [f"the {model} timing model" if wrong_model else "",
                 f"{memory_limit} MB each" if wrong_memory else ""]
        did.append(f"given {' and '.join(g for g in given if g)}, as this lesson uses "
                   "(restarted before first use)")
        return
    fixed = "The GPUs in this kernel are already in use, so their settings cannot change"
    if wrong_model:
        has = f"model the {have_model}" if have_model else "have no timing model"
        affected = cells.get("model", "the GPU times below")
        notes.append(f"{fixed}: they {has}, not the {model} this lesson uses, so {affected} "
                     f"will not show the {model}'s times. {RESTART}")
    if wrong_memory:
        has = f"{have_memory} MB" if have_memory is not None else "no memory limit"
        affected = cells.get("memory_limit", "the memory figures below")
        notes.append(f"{fixed}: each has {has}, not the {memory_limit} MB this lesson uses, so "
                     f"{affected} will differ from the text. {RESTART}")


# -- as many GPUs as the lesson uses ----------------------------------------------------------

def _arrange(gpus: int, memory_limit: int | None, started: bool, cells: dict[str, str],
             did: list[str], notes: list[str]) -> None:
    """Hide GPUs beyond `gpus`, or split the first GPU when there are fewer."""
    visible = config.get_visible_devices("GPU")
    keep = gpus
    if "separate_gpus" in cells and gpus < 2 and len(visible) >= 2 and not visible[1].simulated:
        # A one-GPU lesson (the TensorFlow guide's split) whose DDP cells need a second CUDA
        # device: on a machine that has one (Kaggle's two T4s) those cells run on it, and the
        # guide's split of the first GPU then makes three logical GPUs, as TensorFlow's does there.
        keep = 2
        did.append(f"{visible[1].name.replace('/physical_device:', '')} kept visible for "
                   f"{cells['separate_gpus']} (one CUDA device per rank)")
    if len(visible) > keep:
        extra = ", ".join(g.name.replace("/physical_device:", "") for g in visible[keep:])
        if started:
            notes.append(f"This lesson uses {keep} GPU{'s' if keep != 1 else ''}; {extra} "
                         "stay visible (the GPUs are already in use), so device counts and "
                         f"names below may differ from the text. {RESTART}")
        else:
            config.set_visible_devices(visible[:keep], "GPU")
            did.append(f"{extra} hidden (set_visible_devices): this lesson uses {keep}")
    logical = config.logical_devices("GPU")
    if len(logical) < gpus:
        if started:
            affected = cells.get("gpus", "the cells that use more")
            notes.append(f"This lesson uses {gpus} GPUs and this kernel has {len(logical)}, in "
                         f"use already, so {affected} will not run. {RESTART}")
            return
        first = visible[0]
        parts = gpus - len(logical) + 1
        each = memory_limit if memory_limit is not None else _share(first, parts)
        config.set_logical_device_configuration(
            first, [config.LogicalDeviceConfiguration(memory_limit=each)] * parts)
        names = " and ".join(d.name.replace("/device:", "/") for d in config.logical_devices("GPU"))
        did.append(f"{first.name.replace('/physical_device:', '')} split into {parts} logical "
                   f"GPUs of {each} MB each ({names}), as the TensorFlow guide runs multi-GPU "
                   "code on one GPU")
        if first.simulated:
            did.append("they share its compute: a split GPU adds none")
        else:
            did.append(f"all are cuda:{first.index}, sharing its compute and memory")
    if "separate_gpus" in cells and _real_cuda_devices() < 2:
        real = len(config.list_physical_devices("GPU"))
        # More real GPUs than the lesson uses, hidden above while in use elsewhere: the ranks
        # these cells start inherit that.
        has = ("this machine has one real GPU" if real < 2 else
               f"this lesson shows only one of this machine's {real} real GPUs")
        said = _will_not_run(cells["separate_gpus"], "two separate CUDA devices (cuda:0 and "
                             f"cuda:1), and {has}")
        notes.append(f"{said[0].upper()}{said[1:]} {CPU_RUNTIME}")


def _share(gpu: config.PhysicalDevice, parts: int) -> int:
    """MB for each of `parts` logical GPUs made of `gpu`: an equal share of its memory."""
    if gpu.simulated:
        total = config.get_device_details(gpu).get("total_memory")
        if total is None:  # a simulated GPU without a limit has the host's memory
            import psutil

            total = psutil.virtual_memory().total
    else:
        # NVML: asking torch would initialize CUDA, after which GPUs can no longer be split.
        info = nvml.memory_info(gpu.index)
        total = info[1] if info is not None else parts * 1024 * _MIB
    return max(1, total // _MIB // parts)


def _real_cuda_devices() -> int:
    """How many separate CUDA devices two GPUs can be here: simulated logical GPUs are each
    their own device, a real GPU's logical GPUs are all its one."""
    if simulated.is_active():
        return 2
    return len(config.get_visible_devices("GPU"))


def _real_names(gpus: list[config.PhysicalDevice]) -> str:
    names = []
    for gpu in gpus:
        details = nvml.device_details(gpu.index) if not gpu.simulated else {}
        short = gpu.name.replace("/physical_device:", "/")
        name = (details or {}).get("device_name")
        names.append(f"{short}: {name}" if name else short)
    return ", ".join(names)
