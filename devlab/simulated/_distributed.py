"""torch.distributed on simulated GPUs: NCCL becomes gloo, and DDP buckets by simulated GPU.

A simulated GPU's tensor is a CPU tensor in C++, and gloo reduces CPU tensors, so collectives
over simulated GPUs run on gloo unchanged. What a program written for real GPUs asks of
torch.distributed is answered here:

- `init_process_group("nccl")` (or `"cuda:nccl,cpu:gloo"`, or `new_group(backend="nccl")`): a
  CPU build of torch has no NCCL, so NCCL is replaced by gloo and the process says so once,
  in one line on stderr.
- `dist._compute_bucket_assignment_by_size`, with which DistributedDataParallel groups the
  gradients it all-reduces into buckets: C++ groups them by device and sees only the CPU, so a
  model spread over two simulated GPUs would share buckets between them. It groups by
  simulated GPU first, as on a real machine (one bucket never spans two GPUs).
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

import torch

from ._marks import index_of
from ._patcher import Patcher

NOTICE = ("devlab: simulated GPUs have no NCCL (a CPU build of torch has none), so "
          "torch.distributed runs on gloo instead: the same collectives, on the CPU.")
_told = threading.Event()


def gloo_for_nccl(backend: Any) -> Any:
    """The backend string with every NCCL replaced by gloo (`"nccl"` -> `"gloo"`,
    `"cuda:nccl,cpu:gloo"` -> `"cuda:gloo,cpu:gloo"`); anything else unchanged."""
    if not isinstance(backend, str) or "nccl" not in backend.lower():
        return backend
    parts = []
    for part in backend.split(","):
        device, sep, name = part.rpartition(":")
        parts.append(f"{device}{sep}{'gloo' if name.strip().lower() == 'nccl' else name}")
    return ",".join(parts)


def _tell_once() -> None:
    if not _told.is_set():
        _told.set()
        print(NOTICE, file=sys.stderr, flush=True)


def _with_gloo(original: Any, position: int) -> Any:
    """`original` with its backend argument (keyword `backend`, or positional `position`)
    mapped through `gloo_for_nccl`."""

    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
        if "backend" in kwargs:
            mapped = gloo_for_nccl(kwargs["backend"])
            if mapped is not kwargs["backend"]:
                kwargs["backend"] = mapped
                _tell_once()
        elif len(args) > position:
            mapped = gloo_for_nccl(args[position])
            if mapped is not args[position]:
                args = (*args[:position], mapped, *args[position + 1:])
                _tell_once()
        return original(*args, **kwargs)

    return patched


def _bucketing(original: Any) -> Any:
    def compute_bucket_assignment_by_size(tensors: list[torch.Tensor],
                                          bucket_size_limits: list[int],
                                          expect_sparse_gradient: list[bool] | None = None,
                                          tensor_indices: list[int] | None = None,
                                          ) -> tuple[list[list[int]], list[int]]:
        """DDP's bucketing, one device at a time: a bucket holds one simulated GPU's tensors."""
        sparse = list(expect_sparse_gradient or [])
        indices = list(tensor_indices or [])
        places = [index_of(t) for t in tensors]
        if len(set(places)) <= 1:
            return original(tensors, bucket_size_limits, sparse, indices)
        buckets: list[tuple[int, list[int], int]] = []  # (first position, indices, limit)
        for place in dict.fromkeys(places):
            picked = [i for i, p in enumerate(places) if p == place]
            sub, limits = original([tensors[i] for i in picked], bucket_size_limits,
                                   [sparse[i] for i in picked] if sparse else [],
                                   [indices[i] for i in picked] if indices else [])
            # Without tensor_indices the C++ answer numbers the tensors it was given.
            position = {(indices[i] if indices else i): i for i in picked}
            for bucket, limit in zip(sub, limits, strict=True):
                numbered = bucket if indices else [picked[j] for j in bucket]
                buckets.append((min(position[k] for k in numbered), numbered, limit))
        buckets.sort(key=lambda b: b[0])  # as C++ orders them: by their first tensor
        return [b[1] for b in buckets], [b[2] for b in buckets]

    compute_bucket_assignment_by_size.__wrapped__ = original  # type: ignore[attr-defined]
    return compute_bucket_assignment_by_size


def install(p: Patcher) -> None:
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    # Programs call both names (`dist.init_process_group`, and c10d's own module).
    for name, position in (("init_process_group", 0), ("new_group", 2)):
        patched = _with_gloo(getattr(c10d, name), position)
        for module in (c10d, dist):
            p.set(module, name, patched)
    p.set(dist, "_compute_bucket_assignment_by_size",
          _bucketing(dist._compute_bucket_assignment_by_size))
