"""How long `devlab.memory.run_fresh` takes (a lesson 02 cell runs it twice): the whole call,
against a bare interpreter importing what the new process needs. Prints seconds; wall time
on this machine, nothing about a GPU.

    PYTHONPATH=. .venv/bin/python benchmarks/run_fresh.py
"""

from __future__ import annotations

import subprocess
import sys
import time

import torch

from devlab.core.memory_watch import run_fresh


def four_blocks() -> None:
    blocks = []
    for _ in range(4):
        blocks.append(torch.ones(8, 1024, 1024, device="cuda"))  # 32 MiB
        time.sleep(0.05)


def main(repeats: int = 3) -> None:
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import devlab.config, devlab.core.memory_watch.fresh_process"],
                       check=True)
        bare = time.perf_counter() - t
        timings = []
        for growth in (True, False):
            t = time.perf_counter()
            run_fresh(four_blocks, model="T4", growth=growth)
            timings.append(time.perf_counter() - t)
        print(f"import only {bare:.2f} s | run_fresh growth on {timings[0]:.2f} s, "
              f"off {timings[1]:.2f} s (fn itself sleeps 0.20 s)")


if __name__ == "__main__":
    main()
