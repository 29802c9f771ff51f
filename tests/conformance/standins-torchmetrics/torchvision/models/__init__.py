"""Stand-in for the names torchmetrics imports from `torchvision.models` when it finds torchvision
(for the conformance corpus only; put on PYTHONPATH by the runner beside `standins/`).

torchmetrics, which Lightning imports, checks only that a `torchvision` is importable and then
imports `resnet50`, `vgg16` and `VGG16_Weights` at its own import, for image metrics that load
pretrained networks. The corpus's torchvision stand-in has no models, so a program that imports
Lightning and the stand-in (Lightning's Fabric MNIST example) gets this module: every name is
there, and using one raises ModuleNotFoundError naming it. No program here builds a model from
torchvision.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise ModuleNotFoundError(
            f"torchvision.models.{name} is not in the conformance corpus's torchvision stand-in")

    missing.__name__ = name
    return missing
