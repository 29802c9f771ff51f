"""CUDA's API as a program sees it: `torch.cuda` and `torch.accelerator` (devices, streams,
events, memory, RNG), autocast for "cuda", and what a CUDA build has. Imports `core`, `clock`
and `mode`."""
