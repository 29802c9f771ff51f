"""Ops a dispatch mode sees, and the simulated GPU each one runs on.

The simulation's function mode places the ops Python calls. Torch also issues ops from C++
that no function mode sees: a backward pass's kernels, DDP's buckets and all-reduce buffers,
the flattening in a broadcast. C++ sees only CPU tensors, so the tensors it makes carry no
device. While a dispatch mode watches each op (the placement log), `run`
gives every such op the device it has on a real GPU:

- an op runs on the GPU of its first simulated input, and its fresh outputs live there;
- a copy runs where the simulation put it (`current_index()`: a move, the backward of a move),
  else on its source's GPU;
- a host tensor that C++ made for a GPU's work (an op mixing it with that GPU's tensors, or a
  copy from that GPU into it, which C++ would have refused or made across devices on a real
  machine) is that GPU's: it is marked there.

Ops inside a call the function mode placed keep the device it gave them, unless the call runs
watched (See Note [Why ops run watched], below).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from devlab.engine.aten_overloads import COPY_OPS
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.session import tls
from devlab.engine.simulated.base.storage_marks import (
    PLAIN,
    live_mark,
    mark,
    mark_of,
    mark_outputs,
    storage_of,
    tensors_of,
)

Tensor = torch.Tensor
_DisableTF = torch._C.DisableTorchFunction
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_dispatch_mode_at = torch._C._get_dispatch_stack_at  # user modes, bottom first


def _place(func: Any, args: tuple, kwargs: dict) -> tuple[int | None, list]:
    """(the device of an op torch issued from C++, the storages of its host inputs), adopting
    the host tensors it made for a GPU."""
    current = _session.current_index()
    ts = tensors_of(args, kwargs)
    storages = [storage_of(t) for t in ts]
    # A wrapper subclass (DTensor) is where its inner tensors are; its own storage is empty.
    marks = [live_mark(s) if type(t) in PLAIN else mark_of(t)
             for t, s in zip(ts, storages, strict=True)]
    first = next((m.index for m in marks if m is not None), None)
    host = [s for s, m in zip(storages, marks, strict=True) if m is None and s is not None]
    if func in COPY_OPS:
        if func is torch.ops.aten._to_copy.default:
            return (current if current is not None else first), host
        # copy_(dst, src): a host destination filled from a GPU by C++ is that GPU's buffer.
        dst_mark = marks[0] if marks else None
        src = next((m.index for m in marks[1:] if m is not None), None)
        if dst_mark is None and src is not None and current is None and ts[0].dim() != 0:
            mark([storages[0]], src)
            return src, [s for s in host if s is not storages[0]]
        return (dst_mark.index if dst_mark is not None else current), host
    if first is None:
        return current, host
    fresh = []
    for t, s, m in zip(ts, storages, marks, strict=True):
        if (m is None and s is not None and type(t) in PLAIN and t.dim() != 0
                and not any(s is f for f in fresh)):
            fresh.append(s)
    if fresh:
        mark(fresh, first)
    return first, [s for s in host if not any(s is f for f in fresh)]


def run(func: Callable, args: tuple, kwargs: dict) -> tuple[Any, int | None]:
    """Run an op a dispatch mode sees, straight to its kernel; returns (its outputs, the
    simulated GPU it ran on, or None on the host)."""
    with _DisableTF():  # its tensor reads too: a backward pass keeps the function mode pushed
        if _session.session is None or _session.calls_in_progress():
            # No simulation, or inside a call the function mode placed: its device stands.
            return func(*args, **kwargs), _session.current_index()
        index, host = _place(func, args, kwargs)
        prev = _session.current_index()
        tls.index = index
        try:
            out = func(*args, **kwargs)
        finally:
            tls.index = prev
        if index is not None and _session.session is not None:
            mark_outputs(out, index, host)
        return out, index


# Note [Why ops run watched]
# Ops inside a call the function mode placed keep the device it gave them: the call's outputs
# are marked when it returns, which costs one mark per call. Some calls must be watched, each
# op inside placed (or counted) as it returns, because the tensors it makes are read, or held,
# before the call ends:
#
# - a backward pass: the C++ engine makes its tensors where no function mode sees them. A pass
#   that hands them to Python code (an autograd Function's backward, module hooks, DTensor,
#   FSDP2, a post-accumulate-grad hook) runs under `Marking`, each op placed by its own tensors.
#   A pass all on one GPU with no Python code inside only needs its outputs counted there
#   (`OneGpu`), so what it allocates (its gradients, its formulas' temporaries) counts in the
#   GPU's allocator and peak, as on a real GPU. A pass across several GPUs (model parallel)
#   runs under `Marking` too, so each GPU's kernels count what they allocate there as they
#   run, unless a leaf is on the host or a process group runs (`autograd._watch` says why);
#   those, and a pass inside a torch.func transform, run unwatched: their gradients are
#   marked when they end (`autograd.backward`), and what they held in between is not counted.
# - a call whose inner results Python reads before it returns (`_ops.run`): a subclass's own
#   dispatch (DTensor's keeps intermediate results for the backward pass, loss parallelism's
#   total weight), saved-tensor hooks (checkpointing's read the device of what autograd saves
#   inside the call), a dispatch mode below the simulation's (selective checkpointing's sees
#   the ops inside and may keep their outputs).
# - C++ that allocates on a GPU outside any op Python calls: DDP's Reducer makes its gradient
#   buckets on its parameters' GPU (`OneGpu`, c10d's `_reducer`).


class Marking(TorchDispatchMode):
    """Runs each op it sees with `run`: its fresh outputs carry their GPU as they are made."""

    marks_simulated = True  # what marking() looks for; the placement log says it too
    supports_higher_order_operators = True  # flex_attention's backward: run and marked whole

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        return run(func, args, kwargs or {})[0]


def _marks(mode: TorchDispatchMode) -> bool:
    return getattr(mode, "marks_simulated", False)


def marking() -> contextlib.AbstractContextManager:
    """A `Marking` mode for the block, unless one that marks (the placement log) is already on
    this thread's dispatch mode stack."""
    if any(map(_marks, _get_current_dispatch_mode_stack())):
        return contextlib.nullcontext()
    return Marking()


def unmarking_mode_on_stack() -> bool:
    """Whether a dispatch mode that does not mark (selective checkpointing's, which keeps the
    outputs of the ops it sees) is on this thread's stack; the placement log alone is not."""
    for i in range(_dispatch_stack_len()):  # per op under the log: no generator, no list
        if not getattr(_dispatch_mode_at(i), "marks_simulated", False):
            return True
    return False


class OneGpu(TorchDispatchMode):
    """A backward pass all on GPU `index`, with no Python code inside (the engine's own
    kernels): each op's fresh outputs are that GPU's memory as they are made, so what the pass
    allocates (its gradients, the temporaries of its formulas) counts in the GPU's allocator
    and peak, as on a real GPU. Lighter than `Marking`: there is one device to place on.
    See Note [Why ops run watched]."""

    marks_simulated = True  # marks as it goes: marking() adds no second mode under it

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        with _DisableTF():
            out = func(*args, **(kwargs or {}))
        if _session.session is not None:
            mark_outputs(out, self.index)
        return out
