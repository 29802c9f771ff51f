"""Data files that corpus programs read, generated into a run's temporary folder.

Each generator takes the folder the program runs in and writes what the program expects there.
Values come from numpy's RandomState with fixed seeds: every run sees the same bytes, and
nothing is taken from torch's random generator.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np

CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # 65, as shakespeare_char


def nanogpt_char(folder: Path) -> None:
    """data/synthetic_char/{train,val}.bin (uint16 token ids) and meta.pkl, as nanoGPT's
    data/shakespeare_char/prepare.py writes them: 20000 training and 4000 validation tokens
    over a 65-character vocabulary, drawn from a fixed random bigram table so there is
    something to learn."""
    out = folder / "data" / "synthetic_char"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(1234)
    vocab = len(CHARS)
    table = rng.dirichlet(np.full(vocab, 0.1), size=vocab)
    cum = table.cumsum(axis=1)

    def sample(n: int) -> np.ndarray:
        ids = np.empty(n, dtype=np.uint16)
        cur = 0
        for i, u in enumerate(rng.rand(n)):
            cur = min(int(np.searchsorted(cum[cur], u)), vocab - 1)
            ids[i] = cur
        return ids

    sample(20000).tofile(out / "train.bin")
    sample(4000).tofile(out / "val.bin")
    meta = {"vocab_size": vocab, "itos": dict(enumerate(CHARS)),
            "stoi": {c: i for i, c in enumerate(CHARS)}}
    with open(out / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)


GENERATORS: dict[str, Callable[[Path], None]] = {"nanogpt_char": nanogpt_char}
