"""A data-parallel training step as PyTorch's DistributedDataParallel runs it: gradients
bucketed, each bucket all-reduced on a communication stream of its own as soon as it is ready,
overlapping the rest of the backward pass (Li et al., "PyTorch Distributed: Experiences on
Accelerating Data Parallel Training", VLDB 2020, sections 3.2.3 and 4.2; torch's
`torch/csrc/distributed/c10d/reducer.cpp`).

- **Buckets.** From the second iteration on, DDP's reducer has rebuilt its buckets in the order
  the gradients became ready in the first backward pass; a bucket is closed once it holds at
  least its limit: the first `dist._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB), every later one
  `bucket_cap_mb` (25 MiB by default) (`_compute_bucket_assignment_by_size`). The first
  iteration, unless `static_graph` or `find_unused_parameters` is set, has all parameters in
  one bucket (torch 2.13, `BucketCapacityConfig.compute_bucket_size_limits`:
  "only one ALL-REDUCE is inserted after all the gradients of the whole graph are computed").
- **Launch.** A bucket's all-reduce is launched when the last of its gradients is written and
  every earlier bucket has been launched: the reducer launches buckets in order
  (`Reducer::mark_bucket_ready`, "buckets are reduced in sequence").
- **Overlap.** All-reduces run one after another on the communication stream, beside the
  backward pass's kernels; the optimizer starts when the backward pass and the last all-reduce
  are both done. Compute and communication are taken not to slow each other.

Pure: a function of the gradients' ready times and sizes, GPUs and topology, with each
all-reduce's time from `collectives.collective_time`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from devlab.engine.gpu_model.collectives import CollectiveTime, collective_time
from devlab.engine.gpu_model.links import Topology
from devlab.engine.gpu_model.specs import GpuSpec

MiB = 1024 * 1024
FIRST_BUCKET_BYTES = 1 * MiB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
BUCKET_CAP_BYTES = 25 * MiB  # DistributedDataParallel(bucket_cap_mb=25)


@dataclass(frozen=True, slots=True)
class Bucket:
    """One bucket's all-reduce on the communication stream (seconds from the backward's
    start)."""

    index: int
    gradients: int  # how many gradients it holds
    nbytes: int
    ready: float  # its last gradient is written
    start: float  # its all-reduce starts: ready, and the previous bucket's done
    collective: CollectiveTime

    @property
    def end(self) -> float:
        return self.start + self.collective.seconds


@dataclass(frozen=True, slots=True)
class StepTime:
    """One data-parallel training step's modeled time and its parts (seconds)."""

    forward: float
    backward: float
    optimizer: float
    buckets: tuple[Bucket, ...]

    @property
    def communication(self) -> float:
        """All the all-reduces' time, hidden or not."""
        return sum(b.collective.seconds for b in self.buckets)

    @property
    def exposed(self) -> float:
        """Communication the backward pass does not hide: what data parallelism adds."""
        last = self.buckets[-1].end if self.buckets else 0.0
        return max(0.0, last - self.backward)

    @property
    def hidden(self) -> float:
        """Share of the communication that overlaps the backward pass (1.0 when there is
        none)."""
        total = self.communication
        return 1.0 - self.exposed / total if total else 1.0

    @property
    def seconds(self) -> float:
        return self.forward + self.backward + self.exposed + self.optimizer


def bucket_sizes(gradient_bytes: Sequence[int], first_bucket_bytes: int = FIRST_BUCKET_BYTES,
                 bucket_cap_bytes: int = BUCKET_CAP_BYTES) -> list[list[int]]:
    """DDP's buckets, as lists of gradient indices, for gradients in the order given (the
    order they become ready): each closed once it holds at least its limit."""
    for name, value in (("first_bucket_bytes", first_bucket_bytes),
                        ("bucket_cap_bytes", bucket_cap_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number of bytes, 1 or more; got {value!r}")
    out: list[list[int]] = []
    current: list[int] = []
    size, limit = 0, first_bucket_bytes
    for i, nbytes in enumerate(gradient_bytes):
        current.append(i)
        size += nbytes
        if size >= limit:
            out.append(current)
            current, size, limit = [], 0, bucket_cap_bytes
    if current:
        out.append(current)
    return out


def data_parallel_step(gradients: Sequence[tuple[float, int]], ranks: int,
                       topology: str | Topology | None = None, *, forward: float,
                       backward: float, optimizer: float = 0.0,
                       gpu_name: str | GpuSpec | None = None,
                       first_bucket_bytes: int = FIRST_BUCKET_BYTES,
                       bucket_cap_bytes: int = BUCKET_CAP_BYTES,
                       first_iteration: bool = False) -> StepTime:
    """One DDP training step on `ranks` GPUs: `gradients` are (seconds after the backward
    pass starts when the gradient is written, bytes), one per parameter; `forward`,
    `backward` and `optimizer` are one GPU's times for them (the kernel model's). Returns the
    step with its buckets' all-reduces overlapping the backward pass (`first_iteration`: the
    first step's single bucket)."""
    for name, value in (("forward", forward), ("backward", backward), ("optimizer", optimizer)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a time in seconds, 0 or more; got {value!r}")
    checked = []
    for i, item in enumerate(gradients):
        try:
            ready, nbytes = item
        except (TypeError, ValueError):
            raise ValueError(f"gradient {i} must be (ready seconds, bytes); got {item!r}") from None
        if not isinstance(ready, (int, float)) or not 0 <= ready <= backward * (1 + 1e-9):
            raise ValueError(f"gradient {i} is ready at {ready!r} s: it must be within the "
                             f"backward pass, 0 to {backward} s")
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"gradient {i} has {nbytes!r} bytes: a whole number, 0 or more")
        checked.append((float(ready), nbytes))
    checked.sort(key=lambda g: g[0])  # the rebuilt buckets follow the order of readiness
    sizes = [n for _, n in checked]
    groups = ([list(range(len(checked)))] if first_iteration and checked else
              bucket_sizes(sizes, first_bucket_bytes, bucket_cap_bytes))
    buckets: list[Bucket] = []
    free = 0.0  # when the communication stream is next free
    for index, members in enumerate(groups):
        nbytes = sum(checked[i][1] for i in members)
        ready = max(checked[i][0] for i in members)
        reduce = collective_time("all_reduce", nbytes, ranks, topology, gpu_name=gpu_name)
        start = max(ready, free)
        bucket = Bucket(index, len(members), nbytes, ready, start, reduce)
        free = bucket.end
        buckets.append(bucket)
    return StepTime(float(forward), float(backward), float(optimizer), tuple(buckets))


def evenly_ready(gradient_bytes: Sequence[int], backward: float) -> list[tuple[float, int]]:
    """(ready seconds, bytes) for `data_parallel_step`, when all that is known of a backward
    pass is its length: the gradients, in the order the backward pass writes them (last
    layer first), written at even intervals through it, the last at its end."""
    if not isinstance(backward, (int, float)) or isinstance(backward, bool) or backward < 0:
        raise ValueError(f"backward must be a time in seconds, 0 or more; got {backward!r}")
    sizes = list(gradient_bytes)
    return [(backward * (i + 1) / len(sizes), n) for i, n in enumerate(sizes)]
