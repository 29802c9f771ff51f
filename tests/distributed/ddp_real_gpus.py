"""A DDP training script written for real GPUs, as PyTorch's DDP tutorial writes one: NCCL,
`torch.cuda.set_device(rank)`, `model.to(rank)`, `DDP(device_ids=[rank])`, a checkpoint saved
on GPU 0 and loaded with `map_location` onto each rank's GPU, barriers. It never imports devlab.

    python ddp_real_gpus.py OUT            starts 2 ranks with torch.multiprocessing.spawn
    torchrun ... ddp_real_gpus.py OUT      one rank per process (RANK, LOCAL_RANK from torchrun)

Each rank prints one line: its rank, its GPU, the GPU count, and its trained weights.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS, BATCH = 5, 16


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 1, generator=g)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def train(rank: int, local_rank: int, world_size: int, checkpoint: str) -> None:
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(local_rank)
    net = model().to(local_rank)
    ddp = DDP(net, device_ids=[local_rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    X, y = data()
    for _ in range(STEPS):
        opt.zero_grad()
        out = ddp(X.chunk(world_size)[rank].to(local_rank))
        nn.functional.mse_loss(out, y.chunk(world_size)[rank].to(local_rank)).backward()
        opt.step()
    if rank == 0:
        torch.save(net.state_dict(), checkpoint)
    dist.barrier(device_ids=[local_rank])
    state = torch.load(checkpoint, map_location={"cuda:0": f"cuda:{local_rank}"})
    assert all(t.device == torch.device("cuda", local_rank) for t in state.values()), state
    net.load_state_dict(state)
    dist.barrier()
    weights = torch.cat([p.detach().flatten() for p in net.parameters()])
    sys.stdout.write(f"rank {rank} on {weights.device} of {torch.cuda.device_count()} GPUs "
                     f"backend {dist.get_backend()} weights {weights.cpu().tolist()}\n")
    sys.stdout.flush()
    dist.destroy_process_group()


def spawned(rank: int, world_size: int, checkpoint: str) -> None:
    train(rank, rank, world_size, checkpoint)


if __name__ == "__main__":
    checkpoint = sys.argv[1]
    if "RANK" in os.environ:  # started by torchrun
        train(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),
              int(os.environ["WORLD_SIZE"]), checkpoint)
    else:
        os.environ.setdefault("MASTER_ADDR", "localhost")
        os.environ.setdefault("MASTER_PORT", "12355")
        world_size = torch.cuda.device_count()
        mp.spawn(spawned, args=(world_size, checkpoint), nprocs=world_size, join=True)
