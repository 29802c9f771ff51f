"""Every kind of child process reports the GPUs it sees. Never imports devlab."""

import multiprocessing as mp
import sys

import torch
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader, Dataset


def count(q) -> None:
    q.put(torch.cuda.device_count())


def count_spawned(rank: int, q) -> None:
    q.put(torch.cuda.device_count())


class Counts(Dataset):
    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> int:
        return torch.cuda.device_count()


if __name__ == "__main__":
    seen = {"parent": torch.cuda.device_count()}
    for method in ("fork", "spawn", "forkserver"):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=count, args=(q,))
        p.start()
        seen[f"multiprocessing {method}"] = q.get(timeout=120)
        p.join()
    q = tmp.get_context("spawn").SimpleQueue()
    tmp.spawn(count_spawned, args=(q,), nprocs=1)
    seen["torch.multiprocessing.spawn"] = q.get()
    loader = DataLoader(Counts(), num_workers=1, multiprocessing_context="spawn")
    seen["DataLoader worker (spawn)"] = int(next(iter(loader)))
    print(seen)
    sys.stdout.flush()
