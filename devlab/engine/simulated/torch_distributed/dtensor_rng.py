"""DTensor's random numbers on simulated GPUs: what CUDA's RNG tracker promises, on the CPU's
generator.

On CUDA, DTensor's `OffsetBasedRNGTracker` runs a random op on a DTensor (FSDP2's
`reset_parameters`, dropout on a sharded activation) with every rank's CUDA generator at one
seed, each shard at its own offset in the philox stream (its linear index among the shards
times the shard's size), then moves every rank's offset past the whole tensor. What a program
can observe of it: ranks that hold the same shard (replicas) draw the same numbers, ranks that
hold different shards draw different ones, and afterwards every rank's generator is in the same
state. (The shards are not the slices of the same op on one GPU: CUDA's kernels give each
thread its own philox subsequence, so the numbers depend on the launch.)

A simulated GPU draws from the CPU's generator (mt19937), which has no offsets. The same
promises, kept on it: a DTensor random op draws one number below 2**63 - 1 from the generator
(as every rank's generator is in the same state, every rank draws the same), runs with the
generator seeded from that number and the shard's offset, which torch's tracker computes
(`shard_seed`), then leaves the generator as it was just after the draw. A user's generator
(`generator=`) gives the number instead and is advanced by it, as DTensor advances it.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch

from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.mode.routing import routing

_MASK = (1 << 64) - 1


def shard_seed(number: int, offset: int) -> int:
    """The seed of a shard at `offset` of an op whose draw from the generator was `number`
    (splitmix64 of the two: seeds of nearby offsets share no structure)."""
    z = (number + 0x9E3779B97F4A7C15 * (offset + 1)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


@contextlib.contextmanager
def shard_stream(offset: int, generator: torch.Generator | None = None) -> Iterator[None]:
    """Run a DTensor random op's local part as the shard at `offset` (see the module)."""
    default = torch.default_generator
    number = int(torch.randint((1 << 63) - 1, (1,), generator=generator or default, device="cpu"))
    after = default.get_state()
    default.manual_seed(shard_seed(number, offset))
    try:
        yield
    finally:
        default.set_state(after)


def _tracker(base: type) -> type:
    """torch's OffsetBasedRNGTracker, whose regions on a mesh of simulated GPUs are
    `shard_stream`s at the offsets torch computes."""

    class OffsetBasedRNGTracker(base):  # type: ignore[misc, valid-type]
        __doc__ = base.__doc__

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # DTensor makes its tracker inside its own dispatch, where the simulation's mode
            # is off the stack: the state it broadcasts goes to a simulated GPU.
            with routing():
                super().__init__(*args, **kwargs)

        def _distribute_region(self, spec: Any, generator: torch.Generator | None = None
                               ) -> contextlib.AbstractContextManager[None]:
            if _session.session is None or spec.mesh.device_type != "cuda":
                return super()._distribute_region(spec, generator)
            if not self.distribute_region_enabled:
                return contextlib.nullcontext()
            return shard_stream(self._start_offset(spec), generator)

        def _start_offset(self, spec: Any) -> int:
            """The offset torch gives this rank's shard (torch >= 2.13 computes it in
            `_compute_rng_offsets`, earlier ones only inside `_set_pre_op_offset`, which both
            call on a state whose `offset` they read and set)."""
            state = types.SimpleNamespace(offset=torch.zeros(1, dtype=torch.int64, device="cpu"))
            self._set_pre_op_offset(state, spec)
            return int(state.offset)

    OffsetBasedRNGTracker.__module__ = base.__module__
    OffsetBasedRNGTracker.__qualname__ = base.__qualname__
    return OffsetBasedRNGTracker


def _rng_op(original: Callable[..., Any]) -> Callable[..., Any]:
    """DTensor's `run_dtensor_rng_op` (its path for a CUDA shard without a user generator)."""

    @functools.wraps(original)
    def run_dtensor_rng_op(start_offset_incr: int, end_offset_incr: int, op: Callable[..., Any],
                           *args: Any, **kwargs: Any) -> Any:
        if _session.session is None:
            return original(start_offset_incr, end_offset_incr, op, *args, **kwargs)
        with shard_stream(int(start_offset_incr)):
            return op(*args, **kwargs)

    return run_dtensor_rng_op


def patch_random(p: Patcher, module: ModuleType) -> None:
    """torch.distributed.tensor._random: its tracker class, and no tracker of ours left after.
    (Called while the simulation starts, before its session exists, or once it runs.)"""
    ours = _tracker(module.OffsetBasedRNGTracker)
    p.set(module, "OffsetBasedRNGTracker", ours)

    def forget() -> None:
        if isinstance(module._rng_tracker, ours):
            module._rng_tracker = None

    p.on_restore(forget)


def patch_dispatch(p: Patcher, module: ModuleType) -> None:
    """torch.distributed.tensor._dispatch: the op it runs a CUDA shard's random op through."""
    if hasattr(module, "run_dtensor_rng_op"):  # torch >= 2.13; earlier ones use the tracker's
        p.set(module, "run_dtensor_rng_op", _rng_op(module.run_dtensor_rng_op))
