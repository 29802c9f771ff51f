"""What a CUDA build of torch has and a CPU build lacks, where programs and launchers probe it.

Launchers and frameworks check the build before they start ranks or pick a code path: its
accelerator (`torch._C._get_accelerator()`, which FSDP2's default mesh, `init_process_group()`
without a backend and `barrier()` read: CUDA's), the clean-fork check (`torch._C._cuda_isInBadFork`, which every CUDA build has), the NCCL version
(`torch.cuda.nccl.version()`: DDP's bf16 compression hook wants 2.10+), the CUDA version
(`torch.version.cuda`, None on a CPU build). While GPUs are simulated they answer as a CUDA
build does; the NCCL version carries the suffix "simulated", as a real one may carry "+cuda12.x",
so whoever prints it sees what it is.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.cuda.nccl

from devlab.engine.simulated.base.patcher import Patcher

# What the simulated GPUs report: a recent NCCL and CUDA, not any particular build's. Code
# compares them with minimums (NCCL 2.10 for bf16 compression and AVG, CUDA 11): only that
# order matters.
NCCL_VERSION = (2, 27, 5)
NCCL_SUFFIX = "simulated"
CUDA_VERSION = "12.8"


def _get_accelerator(check: bool = False) -> torch.device:
    """The build's accelerator: CUDA, whose devices are the simulated GPUs."""
    return torch.device("cuda")


def _cuda_is_in_bad_fork() -> bool:
    """A forked child inherits the simulated GPUs whole (devlab's own launcher forks ranks
    after synchronizing them): no fork is a bad one."""
    return False


def nccl_version() -> tuple[Any, ...]:
    """`torch.cuda.nccl.version()`: (major, minor, patch, suffix), as torch returns a version
    with a suffix."""
    return (*NCCL_VERSION, NCCL_SUFFIX)


def install(p: Patcher) -> None:
    p.set(torch._C, "_get_accelerator", _get_accelerator)
    # torch.get_device_module() caches its answer to the accelerator (functools.cache): one
    # asked before the simulation began would stay torch.cpu (transformers' continuous batching
    # then made a torch.cpu.Stream), and one asked during it torch.cuda after it ended.
    torch.get_device_module.cache_clear()
    p.on_restore(torch.get_device_module.cache_clear)
    p.set(torch._C, "_cuda_isInBadFork", _cuda_is_in_bad_fork)
    p.set(torch.cuda.nccl, "version", nccl_version)
    p.set(torch.version, "cuda", CUDA_VERSION)
