"""CUDA_VISIBLE_DEVICES hides simulated GPUs as it hides real ones: in the test process and in
a child alike, while the machine's count reaches the child unchanged."""

import os
import subprocess
import sys

import pytest
import torch


def _child_count() -> int:
    code = "import torch; print(torch.cuda.device_count())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_process_and_its_child_see_the_same_gpus():
    assert torch.cuda.device_count() == _child_count() == int(os.environ["EXPECT_GPUS"])
    assert os.environ["DEVLAB_SIMULATE_GPUS"] == os.environ["EXPECT_MACHINE"]
    torch.ones(2, device=f"cuda:{torch.cuda.device_count() - 1}")


def test_a_child_told_to_see_none_sees_none():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    code = "import torch; print(torch.cuda.is_available())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split()[-1] == "False"
