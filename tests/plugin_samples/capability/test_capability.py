"""Tests written for a library's Ampere-and-newer paths, gated on CUDA only: on a real T4 they
fail (no native bf16, no flash attention, no fp8 matmul), on an H100 they pass; with the plugin,
`--gpu-model T4` and `--gpu-model H100` answer the same."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_native_bf16():
    assert torch.cuda.is_bf16_supported(including_emulation=False)


@cuda
def test_flash_attention_forward():
    q = torch.randn(2, 4, 64, 32, device="cuda", dtype=torch.float16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert out.shape == q.shape


@cuda
def test_fp8_matmul():
    a = torch.randn(16, 32, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(16, 32, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0, device="cuda")
    assert torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16).shape == (16, 16)
