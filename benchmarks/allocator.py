"""What the caching-allocator model costs per allocation (issue 27's target: at most 2 us).

Replays a mix of requests (small tensors, 1-10 MiB activations, large weights) through
`devlab.engine.gpu_model.caching_allocator.CachingAllocator`, holding a window of live blocks as
a training step does, and prints the time per allocation (one malloc and its free) and per event, the best
of several trials; with `--history`, recording each allocation's stack as
`torch.cuda.memory._record_memory_history` does.

Run: .venv/bin/python benchmarks/allocator.py [--events N] [--trials K] [--history]

Wall time on a shared machine varies with its load; instructions do not. To count them, run
the same loop under callgrind at two lengths and divide the difference by the extra events:
`valgrind --tool=callgrind --callgrind-out-file=/dev/null .venv/bin/python
benchmarks/allocator.py --events N --trials 1` ("Collected" is the count). Measured so
(torch 2.13's CPython 3.11, N = 20,000 and 60,000, the loop calling `allocate` as the
simulation does): the plain port (tests/_allocator_reference.py) took about 30k instructions per
event; the model before issue 27's second pass 20.4k; now (Note [The allocator's hot path] in
devlab/engine/gpu_model/caching_allocator/state_machine.py) 12.9k. At 12.9k, 2 us per event needs
about 6.5 instructions per nanosecond, which a loaded 2-core machine still gave (about 1.1 us
per event, best of 5). Set PYTHONHASHSEED=0 when comparing two versions: each run's import of torch (about 7
billion instructions) moves by millions with the hash seed, up to about 100 per event at
these lengths (issue 36 measured 12,878 before its split and 12,969 after so, and 12,899 and
12,891 with the loop alone and the seed fixed).

`--path` measures what a user pays per tensor: `torch.empty(1000, device="cuda:0")` made and
dropped on a simulated GPU against the same on the CPU; the allocator is a small part of the
difference (the routing of the call and the marking of the storage are most of it).
"""

from __future__ import annotations

import argparse
import sys
import time

from devlab.engine.gpu_model.caching_allocator import CachingAllocator

SIZES = (4096, 400_000, 3 << 20, 64 << 20, 1000, 12345, 768 * 1024, 12 << 20)
WINDOW = 50  # blocks alive at once
TARGET_US = 2.0


def trial(events: int, history: bool) -> float:
    """Seconds per allocation (a malloc and the free of an older block)."""
    a = CachingAllocator()
    if history:
        a.record_history("all", frames=lambda: [{"filename": __file__, "line": 0, "name": "x"}])
    held = []
    n = len(SIZES)
    allocate, free = a.allocate, a.free  # what the simulation calls per storage
    start = time.perf_counter()
    for i in range(events):
        held.append(allocate(SIZES[i % n]))
        if len(held) > WINDOW:
            free(held.pop(0))
    return (time.perf_counter() - start) / events


def per_tensor(events: int, trials: int) -> tuple[float, float]:
    """Seconds per tensor made and dropped, on the CPU and on a simulated GPU."""
    import devlab.simulated as sim
    import torch

    def best(device: str) -> float:
        times = []
        for _ in range(trials):
            start = time.perf_counter()
            for _ in range(events):
                torch.empty(1000, device=device)
            times.append((time.perf_counter() - start) / events)
        return min(times)

    cpu = best("cpu")
    sim.start(1)
    try:
        simulated = best("cuda:0")
    finally:
        sim.stop()
    return cpu, simulated


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--history", action="store_true")
    p.add_argument("--path", action="store_true",
                   help="also time a tensor's whole path on a simulated GPU")
    args = p.parse_args(argv)
    best = min(trial(args.events, args.history) for _ in range(args.trials))
    print(f"caching allocator model: {best * 1e6:.2f} us per allocation (malloc + free), "
          f"{best * 1e6 / 2:.2f} us per event, best of {args.trials} x {args.events:,}"
          f"{' with history' if args.history else ''}")
    print(f"target (issue 27): at most {TARGET_US:.1f} us per allocation event: "
          f"{'met' if best * 1e6 / 2 <= TARGET_US else 'missed'} on this machine now")
    if args.path:
        cpu, simulated = per_tensor(args.events, args.trials)
        print(f"a tensor made and dropped: {cpu * 1e6:.2f} us on the CPU, "
              f"{simulated * 1e6:.2f} us on a simulated GPU ({(simulated - cpu) * 1e6:.2f} us "
              f"more, of which the allocator's malloc + free is about {best * 1e6:.2f} us)")


if __name__ == "__main__":
    main(sys.argv[1:])
