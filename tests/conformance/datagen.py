"""Data files that corpus programs read, generated into a run's temporary folder.

Each generator takes the folder the program runs in and writes what the program expects there.
Values come from numpy's RandomState with fixed seeds: every run sees the same bytes, and
nothing is taken from torch's random generator. A checkpoint a program loads is made by the
program itself (torchtitan's seed checkpoint, from its own fixed seed).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
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


# torchtitan reads its tokenizer and its test text from tests/assets/ under the folder it runs in
# (--model.hf_assets_path and the "c4_test" dataset's defaults); neither is in its wheel.
TITAN_ASSETS = Path("tests") / "assets"
TITAN_BOS, TITAN_EOS = "<|begin_of_text|>", "<|end_of_text|>"
TITAN_WORDS = 2000  # the vocabulary with BOS and EOS: 2002 (the debug model's embedding: 2048)
TITAN_SEQ_LEN = 64  # --training.seq_len of the corpus's runs
TITAN_SEED = "seed"  # the seed checkpoint's --checkpoint.folder
# where torchtitan writes it (under its dump folder, ./outputs) and the runs load it from
TITAN_SEED_STEP = f"outputs/{TITAN_SEED}/step-0"


def torchtitan_assets(folder: Path) -> None:
    """What torchtitan's debug Llama 3 reads, and the seed checkpoint both runs start from.

    The tokenizer is a word-level one (one token per space-separated word) and the text two
    documents of `TITAN_SEQ_LEN - 1` words: with BOS and EOS each is exactly one training
    sequence. So one process taking both as a batch of 2 trains on what two data-parallel ranks
    take, one each (the dataset's split gives rank r the r-th half), at every step.

    The seed checkpoint is torchtitan's own way to start differently parallelized runs from one
    set of weights (`--checkpoint.create_seed_checkpoint`, one process, weights made on the CPU
    from --debug.seed 0); torchtitan needs a GPU for it, so it runs on one simulated GPU."""
    tok = folder / TITAN_ASSETS / "tokenizer"
    tok.mkdir(parents=True, exist_ok=True)
    words = [f"w{i}" for i in range(TITAN_WORDS)]
    vocab = {TITAN_BOS: 0, TITAN_EOS: 1, **{w: i + 2 for i, w in enumerate(words)}}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": TITAN_EOS},
    }
    (tok / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    (tok / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": TITAN_BOS, "eos_token": TITAN_EOS}), encoding="utf-8")
    text = folder / TITAN_ASSETS / "c4_test"
    text.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(4321)
    docs = [" ".join(words[i] for i in rng.randint(0, TITAN_WORDS, TITAN_SEQ_LEN - 1))
            for _ in range(2)]
    (text / "data.json").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs),
                                    encoding="utf-8")
    env = {**os.environ, "DEVLAB_SIMULATE_GPUS": "1"}
    made = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "1", "-m", "torchtitan.train", *TITAN_MODEL,
                           "--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
                           "--checkpoint.folder", TITAN_SEED, "--training.steps", "1"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=240)
    if made.returncode:
        raise RuntimeError("torchtitan could not make its seed checkpoint:\n"
                           + "\n".join((made.stdout + made.stderr).splitlines()[-30:]))


# The model, its seed and its precision, as every torchtitan run of the corpus gives them (fp32
# parameters: FSDP's default bf16 ones would make the runs differ by more than their order of
# summation).
TITAN_MODEL = ("--model.name", "llama3", "--model.flavor", "debugmodel", "--debug.seed", "0",
               "--training.mixed_precision_param", "float32")


GENERATORS: dict[str, Callable[[Path], None]] = {"nanogpt_char": nanogpt_char,
                                                  "torchtitan_assets": torchtitan_assets}
