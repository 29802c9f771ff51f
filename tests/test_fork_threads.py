"""A child forked while GPUs are simulated computes, whatever its parent computed before.

GNU OpenMP, which a CPU build of torch computes with (every simulated op included), does not
survive a fork once the parent has used its threads: the child's first parallel op waits for
ever on threads it does not have. So a rank that torch elastic forks (accelerate's
`notebook_launcher`, Lightning's `ddp_notebook`) or that a program forks with `multiprocessing`
hung at its first large product once the notebook had multiplied a large matrix. Each case runs
in a fresh interpreter whose parent has used OpenMP's threads first.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(
    torch.get_num_threads() < 2, reason="one CPU thread: OpenMP starts no threads to lose")

PARENT = """
import os, sys
import torch
import devlab

a = torch.randn(1000, 1000)
for _ in range(3):
    a @ a  # the parent's OpenMP threads are now in use
assert torch.get_num_threads() >= 2
devlab.simulated.start(2)
devlab.simulated.set_hang_timeout(20)  # a hang ends the launch with the ranks' stacks


def work(i):
    b = torch.randn(1000, 1000, device=f"cuda:{i}")
    c = torch.randn(1000, 1000)
    total = (b @ b).sum().item() + (c @ c).sum().item()
    print(f"rank {i} threads {torch.get_num_threads()} finite {total == total}", flush=True)
"""


def run(body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PARENT + textwrap.dedent(body)],
                          capture_output=True, text=True, timeout=120)


def test_ranks_torch_elastic_forks_compute_after_the_parent_used_openmp() -> None:
    done = run("""
        import torch.multiprocessing as mp
        mp.start_processes(work, nprocs=2, start_method="fork")
        print("launch ended", flush=True)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} threads 1 finite True" in done.stdout
    assert "launch ended" in done.stdout


def test_a_process_forked_with_multiprocessing_computes_after_the_parent_used_openmp() -> None:
    done = run("""
        import multiprocessing
        p = multiprocessing.get_context("fork").Process(target=work, args=(1,))
        p.start()
        p.join(60)
        print("exit code", p.exitcode, flush=True)
        print("parent threads", torch.get_num_threads(), flush=True)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 1 threads 1 finite True" in done.stdout
    assert "exit code 0" in done.stdout
    # The parent keeps its own threads (two or more, as it asserted first): only the child
    # takes one.
    parent = re.search(r"parent threads (\d+)", done.stdout)
    assert parent is not None and int(parent.group(1)) >= 2, done.stdout
