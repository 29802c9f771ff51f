"""Tests gated on a GPU, as libraries write them: they skip on a CPU-only machine."""

import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
HAS_CUDA_AT_IMPORT = torch.cuda.is_available()


@requires_cuda
def test_matmul_on_gpu():
    x = torch.randn(8, 8, device="cuda")
    assert x.device.type == "cuda"
    assert torch.allclose((x @ x).cpu(), x.cpu() @ x.cpu())


@pytest.mark.skipif(not HAS_CUDA_AT_IMPORT, reason="needs CUDA")
def test_module_to_gpu():
    m = torch.nn.Linear(4, 2).cuda()
    assert next(m.parameters()).is_cuda
    assert m(torch.ones(3, 4, device="cuda")).shape == (3, 2)


@requires_cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus():
    a = torch.ones(2, device="cuda:0")
    b = a.to("cuda:1")
    assert b.device.index == 1


def test_on_cpu():
    assert torch.ones(2).sum() == 2


@requires_cuda
def test_conftest_saw_cuda(cuda_when_conftest_loaded):
    assert cuda_when_conftest_loaded
