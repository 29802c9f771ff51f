"""The modeled clock of simulated GPUs that carry a performance model of a named real GPU: pure
bookkeeping of queues, launches, kernels' ends and the host's time (the simulation binds it to
torch in `devlab.engine.simulated.clock.charges`).

One timeline: the host's time, and for each GPU the time each of its streams will be done (the
default stream, the streams a program makes, NCCL's communication stream). Launching a kernel
costs the host the launch latency; the kernel starts on its GPU when both the host has launched
it and the GPU is free, and runs for the time the GPU model gives it (`kernels`). So ops queue
asynchronously, and two GPUs with two queues work at the same time. This is the first of the
model's two ways of timing (`TIMING`): ops queued back to back; one op timed alone on an idle
GPU shows more (its floor), which `explain()` lists beside it. A copy runs over the host link
(PCIe) or between GPUs; a blocking copy to or from the host makes the host wait for it. A host
sync (`.item()`, printing, `.cpu()`, `synchronize()`) makes the host wait until the GPU's queue
is done, and pays the round trip of waking up (nothing if the GPU was already idle). Events
read the time at which a stream reaches them.

The host's time (See Note [The host's modeled time]) runs at the wall clock's pace while the
program is outside the simulation (its Python, sleeps, data loading, waits for another
process) and by the modeled costs inside it (`Clock.enter`/`leave` bracket each call on a
simulated GPU and each wait for one), never at the CPU's time to compute the values.

Streams (See Note [Streams on the modeled clock]): each stream of a GPU keeps its own position;
work queued on a stream starts after the stream's earlier work and what it was made to wait
for (`wait_for`: `wait_stream`, `wait_event`). Kernels of one GPU use its compute one at a time,
whichever stream queued them; copies between the host and a GPU use its copy engine, so a copy
on one stream overlaps kernels on another, which is what streams are for. The clock knows no
thread and no torch: its callers name the stream (`stream`, or `streams`: each GPU's stream by
index, the thread's current ones), and a GPU they do not name runs on its default stream, 0.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

from devlab._helpers.sizes import format_bytes
from devlab.engine.gpu_model.kernels import COMPUTE as COMPUTE_BOUND
from devlab.engine.gpu_model.kernels import (
    COPY,
    LAUNCH,
    MEMORY,
    QUEUED,
    Kernel,
    kernel_seconds,
    memory_bound,
)
from devlab.engine.gpu_model.links import host_copy
from devlab.engine.gpu_model.specs import GpuSpec

TIMING = QUEUED  # what the clock's times are: ops queued back to back
# DEVLAB_HOST_CLOCK: what the host's modeled time follows outside the simulation (Note [The
# host's modeled time]): "wall" (the default), or "modeled": the host moves by the modeled costs
# alone, as if the program's own Python took no time. Then modeled times do not depend on this
# machine's speed: what a test of the model's arithmetic, or a page that must print the same
# figures on every run, needs.
HOST_CLOCK = "DEVLAB_HOST_CLOCK"
_HOST_CLOCKS = ("wall", "modeled")


def _still() -> float:
    return 0.0


def host_wall_clock(env: dict[str, str] | None = None) -> Callable[[], float]:
    """The wall clock DEVLAB_HOST_CLOCK gives the host's time (`time.perf_counter`, or one that
    stands still for "modeled")."""
    value = (os.environ if env is None else env).get(HOST_CLOCK, "wall").strip().lower() or "wall"
    if value not in _HOST_CLOCKS:
        raise ValueError(f"{HOST_CLOCK}={value!r}: expected 'wall' (the host's time follows "
                         "the wall clock outside the simulation) or 'modeled' (only the modeled "
                         "costs move it)")
    return time.perf_counter if value == "wall" else _still

# A span's stream, and what it is (`Span.kind`).
COMPUTE, COMM = "compute", "comm"
KERNEL, COPY_SPAN, COLLECTIVE = "kernel", "copy", "collective"
WAIT_RANKS = "waits for the slowest rank"  # on the comm stream: another rank came later
WAIT_COMM = "waits for a collective"  # on the compute stream: work.wait(), a blocking call
WAIT_HOST = "waits for the host"  # on the compute stream: idle until the host launched the work


class Span(NamedTuple):
    """What one GPU's stream did from `start` to `end` (modeled seconds from the simulation's
    start), recorded while a timeline watches."""

    device: int  # the simulated GPU's index
    stream: str  # COMPUTE (its queue) or COMM (NCCL's stream)
    kind: str  # KERNEL, COPY_SPAN, COLLECTIVE, WAIT_RANKS, WAIT_COMM or WAIT_HOST
    name: str
    start: float
    end: float


class OpTime(NamedTuple):
    """One kernel or copy as the modeled clock charges it, in seconds, and why. (A tuple: one
    is made for every op on a modeled GPU.)"""

    op: str
    device: int
    launch: float  # the host's launch latency
    compute: float  # the model's arithmetic time (whole waves of tiles at the achieved rate)
    memory: float  # the model's memory time (achieved bandwidth), or a copy's link time
    flops: int
    nbytes: int
    sync: float = 0.0  # the round trip of the host's wait, for a copy to the host
    floor: float = 0.0  # the GPU-side fixed cost of a kernel
    kernel: Kernel | None = None  # the model's terms (None for copies over a link)

    @property
    def work(self) -> float:
        """The longer of compute and memory traffic."""
        return kernel_seconds(0.0, self.compute, self.memory)

    @property
    def gpu(self) -> float:
        """The device's busy time: its floor plus the longer of compute and memory."""
        return kernel_seconds(self.floor, self.compute, self.memory)

    @property
    def total(self) -> float:
        return self.launch + self.gpu + self.sync

    @property
    def alone(self) -> float | None:
        """What this kernel shows timed alone with CUDA events on an idle GPU."""
        return self.kernel.alone if self.kernel is not None else None

    @property
    def bound(self) -> str:
        """What limits it when ops are queued: the launch, the arithmetic, or the memory."""
        if self.launch + self.sync >= self.gpu:
            return LAUNCH
        return COMPUTE_BOUND if self.compute >= self.memory else MEMORY


def kernel_time(spec: GpuSpec, index: int, name: str, k: Kernel) -> OpTime:
    """The model's kernel `k`, named `name`, on GPU `index`, as the clock charges it."""
    return OpTime(name, index, spec.launch_latency_us * 1e-6, k.compute, k.memory, k.flops,
                  k.nbytes, 0.0, k.floor, k)


class Clock:
    """Modeled time, in seconds from the simulation's start: the host's, and when each GPU's
    queue is done.

    `queues[i]` is the queue simulated GPU i runs on: its own, unless it is one of several
    logical GPUs made of one physical GPU (`set_logical_device_configuration`), which share
    that GPU's one queue, as logical devices of a real GPU share its compute."""

    def __init__(self, spec: GpuSpec, count: int, queues: list[int] | None = None) -> None:
        self.spec = spec
        # Re-entrant: See Note [The clock's lock, entered again by its own thread].
        self.lock = threading.RLock()
        # The wall clock (seconds) the host's time follows outside the simulation.
        self.wall = host_wall_clock()
        self.reset(count, queues)
        # While `explain` or a timeline watches: every charge, in order, and when each
        # stream ran it.
        self.recording: list[OpTime] | None = None
        self.spans: list[Span] | None = None
        self._launch = spec.launch_latency_us * 1e-6
        self._sync = spec.sync_latency_us * 1e-6
        self._held = 0  # calls inside the simulation now (`enter` minus `leave`), all threads
        self._modeled_only = 0  # blocks in `hold`: the host's own work is not its time either

    # Note [The clock's lock, entered again by its own thread]
    # A section under `lock` may allocate (a side stream's key, a `Span`, an `OpTime`, the
    # tuple CPython 3.11 makes for a call of `max`), and an allocation may start Python's
    # cyclic garbage collector, on the thread that holds the lock; so may a call on CPython
    # 3.12 and later, which collects at its eval breaker. The collector runs finalizers there:
    # a `__del__` or `weakref.finalize` of an object in a reference cycle that touches a
    # simulated GPU (`torch.cuda.synchronize()`, an event, an op) calls the clock again. With a
    # plain lock that thread waited for itself for ever (a lesson's cell that never ends); the
    # lock is re-entrant, so the nested call runs at once. It must not be lost to the section
    # it interrupts, so no section writes back a value it read before a point where the
    # collector may start: between a section's first read of the state it changes and its
    # last write there is no allocation and no call (the wall clock is read first; `_kernels`
    # and `copy` make their keys first, and `_kernels` reads the host's time afresh for each
    # kernel and writes it before its record; `collective` and `join` set the streams before
    # their spans; `reset` makes its lists, then sets them; the wall clock's last exit,
    # `_left`, never moves back). One exception: while a timeline or a profile watches,
    # `_kernels` writes the host's time after the kernels' spans, as before, because a
    # profile's spans note the host's time before the launches (`profiler_kineto._Spans`), and
    # a call nested at a span there loses what it added to the host's time. A nested call then sees either what the section had not touched yet
    # or what it has written, and whatever it changes stays: the two calls are one order or
    # the other, and no stream moves back (a section that reads several
    # streams and writes only the host's time from a fresh comparison, `sync`, may count part
    # of a nested call's work: a wait between the two orders'). The one nested caller that would
    # move the host's time halfway through a section outside the simulation (`record`'s, the
    # profiler's, a `reset`) is a storage's free, and a free the collector makes charges
    # nothing (See Note [A free the garbage collector makes] in
    # simulated/base/storage_marks.py). Without a collection nothing changes: the same
    # arithmetic in the same order (`a if a >= b else b` for `max(a, b)`: the same float), so
    # every modeled time is what the plain lock gave (tests/test_clock_reentry.py; the cost:
    # docs/op-cost.md, "The fifth pass: the clock").

    # Note [The host's modeled time]
    # On a GPU machine the host's time passes whatever the host does; the simulation adds one
    # thing a GPU machine does not have: the CPU computing the GPU's values. So the host's
    # modeled time `host` is the wall clock with the simulation's own time cut out: `enter`
    # (a call on a simulated GPU begins: an op, a copy, a backward pass, a sync, an event)
    # adds the wall time since the last `leave` (the program's own: its Python, a sleep, a
    # data loader's wait, another process), and inside the call only the modeled costs move it
    # (each launch, each wait for the GPU). A kernel then starts at the later of its launch on
    # the host's time and its stream's previous end, so a GPU waits for a slow host (an input
    # stall is an idle gap) and a loop of small ops is launch-bound, as on a GPU. Calls nest
    # (a backward pass's hooks, a handler's inner ops), so `_held` counts them and only the
    # outermost pair reads the wall clock: one perf_counter read on the way in and one out.
    # With threads placing work at once, the time while any of them is inside is cut out.
    # What still counts as host time: the mode's entry (torch's override dispatch, about a
    # microsecond a call) and attribute reads (`.shape`), which bypass the bracket.

    def enter(self) -> None:
        """The host enters the simulation: the wall time since it left passes on its clock."""
        now = self.wall()
        with self.lock:
            if not self._held:
                gap = now - self._left
                if gap > 0.0:
                    self.host += gap
            self._held += 1

    def was_inside(self, since: float) -> None:
        """`enter()` at wall time `since` (read then) and `leave()` now, in one hold of the
        lock: for a call whose own work between them charges nothing and calls nothing that
        enters (a storage's free, under the session's lock: `storage_marks._release`). A thread
        reading the wall clock, then taking the lock only after others came and went, is one
        order of `enter` and `leave`, so every time is one they give."""
        with self.lock:
            now = self.wall()  # first: Note [The clock's lock, entered again by its own thread]
            if not self._held:
                gap = since - self._left
                if gap > 0.0:
                    self.host += gap
                if now > self._left:  # (a call nested at the read has left later)
                    self._left = now

    def host_work(self, seconds: float) -> None:
        """The host computed for `seconds` inside a call (an op on host tensors): host time."""
        with self.lock:
            if self._held and not self._modeled_only:
                self.host += seconds

    def hold(self) -> None:
        """Until `release`, the host's time moves by the modeled costs alone (as with
        DEVLAB_HOST_CLOCK=modeled): `simulated.modeled_host()`."""
        self.enter()
        with self.lock:
            self._modeled_only += 1

    def release(self) -> None:
        with self.lock:
            self._modeled_only = max(0, self._modeled_only - 1)
        self.leave()

    def leave(self) -> None:
        """The host leaves the simulation: its clock follows the wall clock from now."""
        with self.lock:
            self._leave()

    def _leave(self) -> None:
        """`leave`'s work; the caller holds the lock."""
        held = self._held
        if held > 1:
            self._held = held - 1
            return
        # The wall clock first, then the state (Note [The clock's lock, entered again by its
        # own thread]): a call nested at the read finds the host still inside.
        now = self.wall()
        self._held = 0
        if now > self._left:  # (after a nested call that left later: never back)
            self._left = now

    # Note [Streams on the modeled clock]
    # `free[q]` is when GPU q's default stream is done; `side[(i, id)]` when simulated GPU i's
    # stream `id` (a stream a program made) is; `compute[q]` when GPU q's compute is free.
    # A kernel starts once the host launched it, its stream is done with earlier work, and
    # the GPU's compute is free: a real GPU may run small kernels of two streams at once, but
    # kernels that fill the GPU, the ones the model times, run one after the other. Copies
    # between the host and a GPU use the copy engine, not the compute. A program using only
    # the default stream is timed as with one queue per GPU (compute is never later than
    # free). The values are the CPU's, computed in program order: they are what a correctly
    # synchronized program gives; where a program forgot a wait, a GPU's result is undefined
    # and nothing here imitates the race.

    def reset(self, count: int, queues: list[int] | None = None) -> None:
        """Start again at 0 with `count` idle GPUs (reconfigured before first use)."""
        queue = list(range(count)) if queues is None else list(queues)
        if len(queue) != count:
            raise ValueError(f"queues has {len(queue)} entries for {count} simulated GPUs")
        n = max(queue) + 1
        free, busy, compute, comm = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
        side: dict[tuple[int, int], float] = {}
        # Made first, then set: See Note [The clock's lock, entered again by its own thread].
        with self.lock:
            left = self.wall()  # the wall clock's time for host == 0
            self.queue = queue
            self.free, self.busy, self.compute, self.side = free, busy, compute, side
            self.comm = comm  # when each GPU's communication stream (NCCL's own) is done
            self.host = 0.0
            self._left = left

    def _pos(self, index: int, stream: int) -> float:
        """When stream `stream` of simulated GPU `index` is done (the caller holds the lock)."""
        return self.free[self.queue[index]] if stream == 0 else self.side.get((index, stream), 0.0)

    def kernel(self, t: OpTime, streams: Mapping[int, int] | None = None) -> None:
        """A kernel of cost `t`, launched after the host's earlier work, on its GPU's stream in
        `streams` (none there: the default stream)."""
        self.kernels((t,), 0, streams)

    def kernels(self, ts: tuple[OpTime, ...] | list[OpTime], stream: int = 0,
                streams: Mapping[int, int] | None = None) -> None:
        """Kernels launched one after the other, on `stream`, or, with `streams`, each on its
        GPU's stream there (a GPU not in it: its default stream)."""
        with self.lock:
            self._kernels(ts, stream, streams)

    def kernel_and_leave(self, t: OpTime) -> None:
        """`kernel(t)` on its GPU's default stream, then `leave()`, in one hold of the lock:
        the mode's fast path, the last thing of a call (Note [The mode's fast path] in
        simulated/mode/routing.py). One thread's two sections back to back are one order of
        the two calls, so every time is what they give."""
        with self.lock:
            self._kernels((t,), 0, None)
            self._leave()

    def _kernels(self, ts: tuple[OpTime, ...] | list[OpTime], stream: int,
                 streams: Mapping[int, int] | None) -> None:
        """`kernels`' work; the caller holds the lock."""
        free, busy, queue, recording = self.free, self.busy, self.queue, self.recording
        compute, side, spans = self.compute, self.side, self.spans
        if spans is not None:  # a timeline or a profile watches: the host's time at the end
            host = self.host  # (a profile's spans note the host's time before the launches)
        for t in ts:
            device = queue[t.device]
            work = kernel_seconds(t.floor, t.compute, t.memory)
            sid = streams.get(t.device, 0) if streams is not None else stream
            key = (t.device, sid) if sid else None  # made before the state is read
            # From here to the host's write, nothing the garbage collector may start at (no
            # allocation, no call): See Note [The clock's lock, entered again by its own
            # thread]. (`max(a, b)` is a call, and makes a tuple in CPython 3.11.)
            if spans is None:
                host = self.host + t.launch
            else:
                host += t.launch
            at = free[device] if not sid else side[key] if key in side else 0.0
            busy_until = compute[device]
            ready = at if at >= busy_until else busy_until
            start = host if host > ready else ready
            end = compute[device] = start + work
            if sid:
                side[key] = end
            else:
                free[device] = end
            busy[device] += work
            if spans is None:
                self.host = host
                if recording is not None:
                    recording.append(t)
                continue
            if recording is not None:
                recording.append(t)
            if host > ready:  # the GPU idled until the host launched this kernel
                spans.append(Span(t.device, COMPUTE, WAIT_HOST, WAIT_HOST, ready, host))
            spans.append(Span(t.device, COMPUTE, KERNEL, t.op, start, start + work))
        if spans is not None:
            self.host = host

    def copy(self, src: int | None, dst: int | None, nbytes: int, blocking: bool,
             op: str = "copy", pinned: bool = False,
             streams: Mapping[int, int] | None = None) -> None:
        """A copy between the host (None) and a GPU, or between two GPUs; `pinned`: the host's
        side is pinned memory (the link's rate; pageable memory is staged: `links.host_copy`);
        on each GPU end, its stream in `streams` (none there: the default stream)."""
        spec = self.spec
        where = (f"GPU:{src}→GPU:{dst}" if src is not None and dst is not None else
                 f"host→GPU:{dst}" if src is None else f"GPU:{src}→host")
        shown = src if src is not None else dst  # the GPU `explain` names
        src_i, dst_i = src, dst
        src = None if src is None else self.queue[src]
        dst = None if dst is None else self.queue[dst]
        within = None
        fixed = 0.0  # a copy over the host link: its copy engine's time per copy (links.py)
        if src is not None and dst is not None:
            ends = [src, dst] if src != dst else [src]
            if src == dst:  # within one GPU's memory: a copy kernel reads, then writes
                within = kernel_time(spec, shown, op, memory_bound(spec, COPY, 2 * nbytes))
                seconds = within.gpu
            else:
                seconds = nbytes / (spec.peer_link_gbs * 1e9)
        else:
            ends = [src if src is not None else dst]
            fixed, link = host_copy(spec, nbytes, pinned)
            seconds = fixed + link
        # On each GPU end, the caller's stream there (a copy between two GPUs runs on the
        # source's and waits for the destination's, as the copy kernels do).
        sides = [(i, streams.get(i, 0) if streams is not None else 0)
                 for i in dict.fromkeys((src_i, dst_i)) if i is not None]
        # The one or two ends, as the streams' keys (a side stream's is its `side` key): made
        # here, so that from the reads to the writes under the lock nothing allocates (See
        # Note [The clock's lock, entered again by its own thread]).
        first = sides[0]
        second = sides[1] if len(sides) > 1 else None
        waited = self._sync if blocking and dst is None else 0.0
        waits = blocking and (src is None or dst is None)
        compute_at = ends[0] if within is not None else None  # a copy kernel: the compute
        other = ends[1] if len(ends) > 1 else None
        with self.lock:
            self.host += self._launch
            side = self.side  # (`in`, not `get`: a call, where 3.12 may collect)
            ready = (self.free[self.queue[first[0]]] if not first[1] else
                     side[first] if first in side else 0.0)
            if second is not None:
                at = (self.free[self.queue[second[0]]] if not second[1] else
                      side[second] if second in side else 0.0)
                if at > ready:
                    ready = at
            if compute_at is not None:
                busy_until = self.compute[compute_at]
                if busy_until > ready:
                    ready = busy_until
            host = self.host
            start = host if host >= ready else ready
            end = start + seconds
            if compute_at is not None:
                self.compute[compute_at] = end
            if first[1]:
                self.side[first] = end
            else:
                self.free[self.queue[first[0]]] = end
            if second is not None:
                if second[1]:
                    self.side[second] = end
                else:
                    self.free[self.queue[second[0]]] = end
            self.busy[ends[0]] += seconds  # type: ignore[index]
            if other is not None:
                self.busy[other] += seconds
            if waits:
                # cudaMemcpy from pageable host memory, or to the host: the host waits for it
                # (and wakes up after a copy to the host, as after any sync).
                self.host = end + waited
            name = f"{op} ({where})"
            if self.spans is not None:
                if start > ready:  # the GPU idled until the host launched this copy
                    self.spans.extend(
                        Span(g, COMPUTE, WAIT_HOST, WAIT_HOST, ready, start)
                        for g in dict.fromkeys(i for i in (src_i, dst_i) if i is not None))
                self.spans.extend(
                    Span(g, COMPUTE, COPY_SPAN, name, start, end)
                    for g in dict.fromkeys(i for i in (src_i, dst_i) if i is not None))
            if self.recording is not None:
                self.recording.append(within._replace(op=name) if within is not None else
                                      OpTime(name, shown, self._launch, 0.0,  # type: ignore[arg-type]
                                             link if fixed else seconds, 0, nbytes,
                                             waited, fixed))

    def launch_collective(self, index: int) -> float:
        """The host launches a collective on GPU `index`: when its communication stream could
        start it (NCCL's stream first waits for the work queued before it, and for its own
        earlier collectives)."""
        with self.lock:
            q = self.queue[index]
            self.host += self._launch
            return max(self.host, self.free[q], self.comm[q])

    def collective(self, index: int, start: float, seconds: float, join: bool,
                   record: OpTime | None = None, ready: float | None = None) -> float:
        """A collective on GPU `index`'s communication stream from `start` (every rank's
        agreed start) for `seconds`; `join`: the GPU's queue waits for it (a blocking
        collective, or a work waited on); `ready`: when this rank alone could have started
        it (a timeline shows the wait for the others). Returns its end."""
        end = start + seconds
        with self.lock:  # the state first, then the timeline's spans (Note [The clock's
            # lock, entered again by its own thread])
            q = self.queue[index]
            self.comm[q] = end
            was = self.free[q]
            joins = join and end > was
            if joins:
                self.free[q] = end
            spans = self.spans
            if spans is not None and record is not None:
                if ready is not None and start > ready:
                    spans.append(Span(index, COMM, WAIT_RANKS, WAIT_RANKS, ready, start))
                spans.append(Span(index, COMM, COLLECTIVE,
                                  f"{record.op}: {format_bytes(record.nbytes)}", start, end))
            if joins and spans is not None:
                spans.append(Span(index, COMPUTE, WAIT_COMM, WAIT_COMM, was, end))
            if record is not None and self.recording is not None:
                self.recording.append(record)
            return end

    def join(self, index: int, until: float | None = None) -> None:
        """GPU `index`'s queue waits for its communication stream (to `until`, else all
        of it): what `work.wait()` does on a CUDA stream."""
        with self.lock:
            q = self.queue[index]
            end = self.comm[q] if until is None else until
            was = self.free[q]
            if end > was:
                self.free[q] = end  # before the span (as `collective`)
                if self.spans is not None:
                    self.spans.append(Span(index, COMPUTE, WAIT_COMM, WAIT_COMM, was, end))

    def ready(self, index: int) -> float:
        """When GPU `index`'s queue is done (its compute stream)."""
        with self.lock:
            return self.free[self.queue[index]]

    def sync(self, index: int | None = None) -> None:
        """The host waits for every stream of GPU `index` (every GPU's if None), its
        communication stream too. Waking up after the GPU finishes costs the sync round trip;
        a GPU already idle answers at once."""
        with self.lock:
            if index is None:
                done = max(max(self.free), max(self.comm), *self.side.values())
            else:
                q = self.queue[index]
                done = max(self.free[q], self.comm[q],
                           *(t for (i, _), t in self.side.items() if self.queue[i] == q))
            if done > self.host:
                self.host = done + self._sync

    def sync_stream(self, index: int, stream: int) -> None:
        """The host waits for one stream of GPU `index` (`Stream.synchronize`)."""
        with self.lock:
            done = self._pos(index, stream)
            if done > self.host:
                self.host = done + self._sync

    def host_wait(self, until: float) -> None:
        """The host waits until the GPU reaches `until` (`Event.synchronize`)."""
        with self.lock:
            if until > self.host:
                self.host = until + self._sync

    def reached(self, index: int, stream: int = 0) -> float:
        """When GPU `index`'s `stream` reaches work enqueued now (an Event's time)."""
        with self.lock:
            return max(self._pos(index, stream), self.host)

    def wait_for(self, index: int, stream: int, until: float) -> None:
        """Stream `stream` of GPU `index` starts later work no earlier than `until`."""
        key = (index, stream)  # made before the lock, as `_kernels`' keys
        with self.lock:
            if stream == 0:
                if until > self.free[self.queue[index]]:
                    self.free[self.queue[index]] = until
            elif until > (self.side[key] if key in self.side else 0.0):
                self.side[key] = until

    def done(self, until: float) -> bool:
        """Whether work ending at `until` has ended by the host's time now (an event query)."""
        with self.lock:
            return until <= self.host

    def poll(self, until: float) -> bool:
        """An event's or stream's query: whether work ending at `until` has ended by the
        host's time now. A query is a driver call the host pays as it pays an op's launch, so
        a loop polling an unfinished event moves the host's time on and ends, as on a GPU."""
        with self.lock:
            if until <= self.host:
                return True
            self.host += self._launch
            return False

    def now(self) -> float:
        """The host's modeled time as last charged (`catch_up` first for the time now)."""
        with self.lock:
            return self.host

    def catch_up(self) -> float:
        """The host's modeled time now: the wall time since it last left the simulation passes
        first (what `simulated.modeled_time()` answers)."""
        self.enter()
        self.leave()
        return self.now()


    def begin_capture(self) -> tuple:
        """A CUDA graph's capture starts: from now the kernels charged are recorded, not run
        (the host still pays each launch: capturing one costs about as much). Returns the
        state `end_capture` puts back."""
        with self.lock:
            state = (list(self.free), list(self.busy), list(self.comm), list(self.compute),
                     dict(self.side), self.recording, self.spans)
            self.recording, self.spans = [], None  # a timeline shows the replays, not this
            return state

    def end_capture(self, state: tuple) -> tuple[OpTime, ...]:
        """The capture begun with `state` ends: the GPUs' queues are as before it (nothing it
        recorded ran); returns the kernels and copies it recorded, in order."""
        with self.lock:
            recorded = tuple(self.recording or ())
            (self.free, self.busy, self.comm, self.compute, self.side, self.recording,
             self.spans) = state
            return recorded

    def replay(self, ts: tuple[OpTime, ...], streams: Mapping[int, int] | None = None) -> None:
        """A CUDA graph of kernels `ts` is launched: the host pays ONE launch for the graph,
        then its kernels run back to back on their GPU, each with its GPU-side cost (its floor
        included: a graph removes the host's launches, not the kernels' own time)."""
        if not ts:
            return
        first = ts[0]._replace(launch=self._launch)
        self.kernels((first, *(t._replace(launch=0.0) for t in ts[1:])), 0, streams)
