"""The processes a test starts see the same simulated GPUs: a subprocess, mp.spawn on NCCL,
and torchrun."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

requires_two = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_subprocess_sees_the_gpus():
    out = subprocess.run([sys.executable, "-c",
                          "import torch; print(torch.cuda.is_available(), torch.cuda.device_count())"],
                         capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["True", str(torch.cuda.device_count())]


def _rank(rank: int, world: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    t = torch.full((2,), float(rank + 1), device=f"cuda:{rank}")
    dist.all_reduce(t)
    assert t.tolist() == [3.0, 3.0]
    dist.destroy_process_group()


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@requires_two
def test_spawn_nccl_all_reduce():
    mp.spawn(_rank, args=(2, _free_port()), nprocs=2, join=True)


@requires_two
def test_torchrun_nccl(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        torch.cuda.set_device(rank)
        t = torch.ones(2, device="cuda") * (rank + 1)
        dist.all_reduce(t)
        assert t.tolist() == [3.0, 3.0], t
        print("rank", rank, "ok", torch.cuda.get_device_name())
        dist.destroy_process_group()
    """))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", str(script)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count(" ok ") == 2
