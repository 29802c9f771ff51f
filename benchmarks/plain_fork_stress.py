"""Ranks a program forks itself beside a torch.distributed store server: how many hang?

Run: .venv/bin/python benchmarks/plain_fork_stress.py [--runs N] [--no-simulation]

The process hosts a real TCPStore server (its `pt_tcpstore_uv` thread names every peer that
connects with getnameinfo, under glibc's resolver lock) and, N times, forks four children with
`multiprocessing`'s fork context in a loop; each connects a TCPStore client (its own
getnameinfo). A child that has not ended 5 s later inherited the resolver lock held, and is
killed. With simulated GPUs (the default), devlab's quiet window holds the children until the
parent stops forking; `--no-simulation` shows torch alone. Prints runs, children, hung, seconds
(this machine's, under its load: not a figure about any GPU).
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import time

import torch.distributed as dist

import devlab

CHILDREN = 4


def _child(port: int) -> None:
    client = dist.TCPStore("127.0.0.1", port, is_master=False,
                           timeout=datetime.timedelta(seconds=30))
    client.set(f"child-{os.getpid()}", "here")
    os._exit(0)  # nothing of the parent's to tear down


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--no-simulation", action="store_true", help="torch alone")
    args = parser.parse_args()
    if not args.no_simulation:
        devlab.simulated.start(2)
        devlab.simulated.set_hang_timeout(None)  # count hangs here, not the report's exits
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    fork = multiprocessing.get_context("fork")
    hung = 0
    start = time.monotonic()
    for _ in range(args.runs):
        children = [fork.Process(target=_child, args=(store.port,)) for _ in range(CHILDREN)]
        for child in children:
            child.start()
        for child in children:
            child.join(5)
            if child.is_alive():
                hung += 1
                child.kill()
                child.join()
    print(f"{'torch alone' if args.no_simulation else 'simulated'}: runs {args.runs}, "
          f"children {CHILDREN * args.runs}, hung {hung}, {time.monotonic() - start:.0f} s",
          flush=True)
    os._exit(0)  # the store's server thread would outlive a hung child's kill otherwise


if __name__ == "__main__":
    main()
