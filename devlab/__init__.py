"""devlab: a Jupyter-native interactive device lab for PyTorch."""

from __future__ import annotations

__version__ = "0.1.0"
