"""Stand-in for torchvision, for the conformance corpus only (put on PYTHONPATH by the runner).

It provides what the corpus's programs use and nothing else: `datasets.MNIST` and
`datasets.FashionMNIST` yielding synthetic 28x28 grey images (PIL images and int labels, like
torchvision's), and `transforms.ToTensor`, `Normalize`, `Compose`. Nothing is downloaded.
There is no `torchvision.models`: a program that needs one fails with ModuleNotFoundError.
"""

from . import datasets, transforms

__version__ = "0.0.0+devlab.standin"
__all__ = ["datasets", "transforms"]
