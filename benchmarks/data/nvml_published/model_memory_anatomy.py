"""Hugging Face transformers' docs, "Model training anatomy" (docs/source/en/model_memory_anatomy.md,
https://huggingface.co/docs/transformers/model_memory_anatomy), as run on a Tesla V100-SXM2 16 GB
(driver 460.91.03, CUDA 11.2, the docs' nvidia-smi table of Tue Jan 11 2022) and published with
its output:

    >>> print_gpu_utilization()
    GPU memory occupied: 0 MB.
    >>> torch.ones((1, 1)).to("cuda")
    >>> print_gpu_utilization()
    GPU memory occupied: 1343 MB.
    >>> model = AutoModelForSequenceClassification.from_pretrained("google-bert/bert-large-uncased").to("cuda")
    >>> print_gpu_utilization()
    GPU memory occupied: 2631 MB.

and nvidia-smi: `2631MiB / 16160MiB` for the board, `2629MiB` for the process.

The docs' code follows unchanged, except one line: the model is built from bert-large-uncased's
configuration (its config.json's values, written out) with `from_config` instead of
`from_pretrained`, since there is no network here for its weights. The model's class, its
parameters' shapes, their order and their dtype (float32) are the same, so is every allocation
`.to("cuda")` makes; only the values differ (random instead of trained).
"""

# ruff: noqa: F403, F405, E402  (the published code, kept as published)
from pynvml import *


def print_gpu_utilization():
    nvmlInit()
    handle = nvmlDeviceGetHandleByIndex(0)
    info = nvmlDeviceGetMemoryInfo(handle)
    print(f"GPU memory occupied: {info.used//1024**2} MB.")


print_gpu_utilization()

import torch

torch.ones((1, 1)).to("cuda")
print_gpu_utilization()

from transformers import AutoModelForSequenceClassification, BertConfig

# google-bert/bert-large-uncased's config.json (the one change: see above).
config = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24,
                    num_attention_heads=16, intermediate_size=4096, hidden_act="gelu",
                    hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                    max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02,
                    layer_norm_eps=1e-12, pad_token_id=0)
model = AutoModelForSequenceClassification.from_config(config).to("cuda")
print_gpu_utilization()
