"""Recording every allocation and free of a stretch of code on the GPUs (`AllocationTrace`),
through torch's own `torch.cuda.memory._record_memory_history` and `_snapshot`: a real GPU's
caching allocator records them, and so does a simulated GPU's model of it, with the Python
stack behind each. What it recorded becomes one `AllocationTimeline` per GPU
(`devlab.core.memory_watch.allocation_timeline`)."""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Any

import torch

from devlab.core.memory_watch.allocation_timeline import AllocationTimeline, timeline

__all__ = ["AllocationTrace", "DEFAULT_MAX_ENTRIES", "trace_for"]

# Events kept per GPU: a long cell's oldest go first, as torch's ring buffer drops them.
DEFAULT_MAX_ENTRIES = 100_000


class AllocationTrace:
    """`with AllocationTrace([0]) as trace: ...` records the GPUs' allocations and frees in
    the block; `trace.timelines` then holds one `AllocationTimeline` per GPU index given.

    Recording is switched off when the block ends, however it ends (an error, an interrupt),
    and was off before it: torch keeps one recorder per process, so a recording the program
    started itself is ended too.
    """

    def __init__(self, devices: list[int], max_entries: int = DEFAULT_MAX_ENTRIES,
                 save: str | None = None) -> None:
        if not devices:
            raise ValueError("AllocationTrace records GPUs: give at least one GPU index")
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self.devices = list(devices)
        self.max_entries = max_entries
        self.save = save
        self.timelines: list[AllocationTimeline] = []
        self.snapshot: dict[str, Any] | None = None
        self._recording = False

    def start(self) -> None:
        """Begin recording (a fresh history: what came before is not in it)."""
        torch.cuda.memory._record_memory_history(
            "all", context="all", stacks="python", max_entries=self.max_entries,
            clear_history=True)
        self._recording = True

    def stop(self) -> list[AllocationTimeline]:
        """End recording and read what it saw into one timeline per GPU."""
        if not self._recording:
            return self.timelines
        try:
            self.snapshot = torch.cuda.memory._snapshot()
        finally:
            self._recording = False
            torch.cuda.memory._record_memory_history(None)
        self.timelines = [timeline(self.snapshot, d) for d in self.devices]
        return self.timelines

    def __enter__(self) -> AllocationTrace:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.stop()
        else:
            # An error: end the recording, keep what it saw, let the error go on.
            try:
                self.stop()
            except Exception:  # the cell's own error matters more than a lost timeline
                print("devlab: the allocation trace could not be read", file=sys.stderr)

    def finish(self) -> list[AllocationTimeline]:
        """`stop()`, and write the snapshot to `save` when one was given."""
        timelines = self.stop()
        if self.save is not None and timelines:
            timelines[0].save_snapshot(self.save)
        return timelines


def trace_for(readers: list[Any], save: str | None = None) -> AllocationTrace:
    """The trace of the GPUs among a sampler's readers (`%%memwatch --trace`); an error that
    says what to watch when none is a GPU, or when `save`'s folder does not exist."""
    devices = [r.index for r in readers if isinstance(getattr(r, "index", None), int)]
    if not devices:
        labels = ", ".join(r.label for r in readers)
        raise ValueError(f"--trace records a GPU's allocations, and the watched devices "
                         f"({labels}) have none: watch a GPU, e.g. --device /GPU:0")
    if save is not None:
        folder = os.path.dirname(os.path.abspath(save))
        if not os.path.isdir(folder):
            raise ValueError(f"--save {save}: the folder {folder} does not exist")
    return AllocationTrace(devices, save=save)
