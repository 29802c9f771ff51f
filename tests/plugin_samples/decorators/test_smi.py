"""A gate some suites use: `nvidia-smi` on PATH, and the GPUs it lists."""

import shutil
import subprocess

import pytest
import torch


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="nvidia-smi not found")
def test_nvidia_smi_lists_the_gpus():
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=300, check=True)
    rows = [line.split(", ", 1) for line in out.stdout.splitlines()]
    assert [int(i) for i, _ in rows] == list(range(torch.cuda.device_count()))
    assert all(name for _, name in rows)
    assert torch.zeros(2, device=f"cuda:{len(rows) - 1}").is_cuda
