"""transformers' GPU gates (`require_torch_gpu`, `require_torch_multi_gpu`,
`require_torch_accelerator`, which read `torch_device` and `torch.cuda.device_count()` when
testing_utils is imported) on a tiny model built from its config (no download)."""

import unittest

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.testing_utils import (
    backend_device_count,
    require_torch_accelerator,
    require_torch_bf16,
    require_torch_gpu,
    require_torch_multi_gpu,
    torch_device,
)


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=32, vocab_size=64)
    return GPT2LMHeadModel(config).eval()


class GatedTests(unittest.TestCase):
    @require_torch_gpu
    def test_gpt2_on_gpu_matches_cpu(self):
        model = tiny_gpt2()
        ids = torch.randint(0, 64, (2, 10))
        with torch.no_grad():
            expected = model(ids).logits
            got = model.to(torch_device)(ids.to(torch_device)).logits
        self.assertEqual(got.device.type, "cuda")
        torch.testing.assert_close(got.cpu(), expected)

    @require_torch_multi_gpu
    def test_two_gpus(self):
        self.assertGreaterEqual(backend_device_count(torch_device), 2)
        model = tiny_gpt2().to("cuda:1")
        out = model.generate(torch.zeros(1, 3, dtype=torch.long, device="cuda:1"),
                             max_new_tokens=4, do_sample=False, pad_token_id=0)
        self.assertEqual(out.device, torch.device("cuda", 1))
        self.assertEqual(out.shape, (1, 7))

    @require_torch_accelerator
    def test_on_an_accelerator(self):
        self.assertEqual(torch_device, "cuda")
        x = torch.ones(4, device=torch_device)
        self.assertEqual(x.sum().item(), 4.0)

    @require_torch_gpu
    @require_torch_bf16  # transformers tries a bf16 matmul on torch_device to decide
    def test_bf16_forward(self):
        model = tiny_gpt2().to(torch_device, torch.bfloat16)
        with torch.no_grad():
            logits = model(torch.arange(8, device=torch_device)[None]).logits
        self.assertEqual((logits.dtype, logits.device.type), (torch.bfloat16, "cuda"))
