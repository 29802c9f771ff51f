"""The three torchvision transforms the corpus uses, with torchvision's semantics."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, img: Any) -> Any:
        for t in self.transforms:
            img = t(img)
        return img


class ToTensor:
    """PIL image or HxW(xC) uint8 array -> float tensor CxHxW in [0, 1]."""

    def __call__(self, pic: Any) -> torch.Tensor:
        arr = np.array(pic, copy=True)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        t = torch.from_numpy(arr).permute(2, 0, 1).contiguous()
        if t.dtype == torch.uint8:
            return t.to(torch.float32).div(255)
        return t.to(torch.float32)


class Normalize:
    """(tensor - mean) / std per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        self.mean = list(mean)
        self.std = list(std)
        self.inplace = inplace

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype, device=tensor.device).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=tensor.dtype, device=tensor.device).view(-1, 1, 1)
        if self.inplace:
            return tensor.sub_(mean).div_(std)
        return (tensor - mean) / std
