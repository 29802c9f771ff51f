"""Stand-in for torchvision, for the conformance corpus only (put on PYTHONPATH by the runner).

It provides what the corpus's programs use and nothing else: `datasets.MNIST` and
`datasets.FashionMNIST` yielding synthetic 28x28 grey images (PIL images and int labels, like
torchvision's), and `transforms.ToTensor`, `Normalize`, `Compose`. Nothing is downloaded.
There is no `torchvision.models`: a program that needs one fails with ModuleNotFoundError. A
program that also imports torchmetrics (which imports a few `torchvision.models` names when it
finds torchvision) runs with `../standins-torchmetrics` on the path too: its `torchvision`
folder joins this package's (`extend_path`) with those names only.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

from . import datasets, transforms  # noqa: E402

__version__ = "0.0.0+devlab.standin"
__all__ = ["datasets", "transforms"]
