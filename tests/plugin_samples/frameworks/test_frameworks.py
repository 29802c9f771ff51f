"""unittest's CUDA gates and PyTorch's own device-generic tests, unmodified."""

import unittest

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase


class TestUnittestGate(unittest.TestCase):
    @unittest.skipIf(not torch.cuda.is_available(), "CUDA not available")
    def test_cuda_sum(self):
        x = torch.arange(6.0, device="cuda")
        self.assertEqual(x.sum().item(), 15.0)
        self.assertTrue(x.is_cuda)


class TestDeviceGeneric(TestCase):
    def test_add(self, device):
        x = torch.ones(3, device=device)
        self.assertEqual((x + x).device.type, torch.device(device).type)
        self.assertEqual((x + x).sum().item(), 6.0)


instantiate_device_type_tests(TestDeviceGeneric, globals())
