"""What the simulated machine's register of GPU use costs: a simulated op with and without this
process publishing its GPU use (the register's thread looks every 50 ms), and one pynvml query
and one `nvidia-smi` run on simulated GPUs.

    PYTHONPATH=. python benchmarks/nvml_register.py [--ops 3000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
import uuid


def _per_op(torch, x, ops: int) -> float:
    start = time.perf_counter()
    for _ in range(ops):
        x.add_(1.0)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / ops * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ["DEVLAB_SIMULATED_MACHINE"] = f"bench-{uuid.uuid4().hex[:8]}"
    import pynvml
    import torch

    import devlab
    from devlab.engine.simulated.base import machine

    devlab.config.simulate_gpus(1, model="T4")
    x = torch.zeros(16, device="cuda")
    _per_op(torch, x, args.ops)  # warm-up
    publishing = [_per_op(torch, x, args.ops) for _ in range(args.repeats)]
    # (Stopping the publisher below also removes the nvidia-smi launcher: it is timed first.)
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    start = time.perf_counter()
    for _ in range(200):
        pynvml.nvmlDeviceGetMemoryInfo(h)
    query = (time.perf_counter() - start) / 200 * 1e3
    start = time.perf_counter()
    subprocess.run(["nvidia-smi"], capture_output=True, check=True)
    smi = time.perf_counter() - start
    print(f"pynvml nvmlDeviceGetMemoryInfo: {query:.3f} ms per call; nvidia-smi: {smi:.2f} s")
    publisher = next(p for p in machine._publishers if p.pid == os.getpid())
    machine.unpublish(publisher)
    quiet = [_per_op(torch, x, args.ops) for _ in range(args.repeats)]
    print(f"simulated add_ on a modeled T4: {statistics.median(publishing):.2f} µs/op publishing, "
          f"{statistics.median(quiet):.2f} µs/op not (median of {args.repeats} x {args.ops})")
    devlab.simulated.stop()


if __name__ == "__main__":
    main()
