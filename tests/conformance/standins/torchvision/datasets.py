"""Synthetic stand-ins for torchvision's MNIST and FashionMNIST (see the package docstring).

Same per-sample shapes and types as torchvision: a 28x28 mode-"L" PIL image and an int label in
0..9; `.data` is a uint8 tensor [N, 28, 28] and `.targets` an int64 tensor [N]. Fewer samples:
TRAIN_SAMPLES and TEST_SAMPLES. Each class is a fixed random blob pattern plus noise, so models
learn something; the values come from numpy's RandomState with a fixed seed per dataset and
split, so they are identical in every run and take nothing from torch's random generator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image

TRAIN_SAMPLES = 1280
TEST_SAMPLES = 400


class _SyntheticDigits(torch.utils.data.Dataset):
    """A synthetic 10-class, 28x28 grey image dataset with torchvision's dataset interface."""

    classes: list[str] = [str(i) for i in range(10)]
    _seed = 0

    def __init__(self, root: Any = None, train: bool = True,
                 transform: Callable | None = None, target_transform: Callable | None = None,
                 download: bool = False) -> None:
        self.root = root
        self.train = train
        self.transform = transform
        self.target_transform = target_transform
        n = TRAIN_SAMPLES if train else TEST_SAMPLES
        rng = np.random.RandomState(self._seed * 2 + (0 if train else 1))
        protos = np.random.RandomState(self._seed).rand(10, 28, 28) ** 4 * 255
        labels = rng.randint(0, 10, size=n)
        noise = rng.normal(0.0, 40.0, size=(n, 28, 28))
        images = np.clip(protos[labels] + noise, 0, 255).astype(np.uint8)
        self.data = torch.from_numpy(images)
        self.targets = torch.from_numpy(labels.astype(np.int64))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        img: Any = Image.fromarray(self.data[index].numpy())
        target: Any = int(self.targets[index])
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target


class MNIST(_SyntheticDigits):
    """Stand-in for torchvision.datasets.MNIST (synthetic, see the module docstring)."""

    _seed = 1


class FashionMNIST(_SyntheticDigits):
    """Stand-in for torchvision.datasets.FashionMNIST (synthetic, see the module docstring)."""

    classes = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
               "Sneaker", "Bag", "Ankle boot"]
    _seed = 2
