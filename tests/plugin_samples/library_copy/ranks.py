"""The ranks of test_copied.py's gather test, in a module of their own: mp.spawn starts each
rank in a fresh interpreter, which imports the module of the function it runs, and a rank of
the copy needs only the copy (test_copied.py imports the installed Lightning too: 6.6 s of CPU
time per rank, against 2.2 s for torch and the copy)."""

import importlib
import os

import torch
import torch.distributed as dist

DISTRIBUTED = {"lightning": "lightning.fabric.utilities.distributed",
               "copy": "copied_lightning.distributed"}


def gather_rank(rank, world, port, source, device):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)
    on = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(rank)
    mine = torch.full((rank + 1, 2), float(rank), device=on)  # uneven: padded, then trimmed
    gathered = importlib.import_module(DISTRIBUTED[source])._gather_all_tensors(mine)
    assert [g.tolist() for g in gathered] == [[[0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]]
    dist.destroy_process_group()
