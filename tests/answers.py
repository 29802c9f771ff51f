"""Comparing what two runs of one program answered (the equivalence tests' one rule)."""

from __future__ import annotations

from typing import Any

import torch


def same(x: Any, y: Any) -> bool:
    """Equal, tensors by their values and dtype, NaN where NaN (sqrt of a negative); lists,
    tuples and dicts item by item."""
    if isinstance(x, torch.Tensor):
        return (isinstance(y, torch.Tensor) and x.dtype == y.dtype
                and torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num()))
    if isinstance(x, float) and x != x:
        return isinstance(y, float) and y != y
    if isinstance(x, (list, tuple)):
        return (type(x) is type(y) and len(x) == len(y)
                and all(same(a, b) for a, b in zip(x, y, strict=True)))
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    return x == y
