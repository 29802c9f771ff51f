"""torch.distributed and torch.nn.parallel on simulated GPUs: NCCL's process group on gloo,
DDP's buckets and futures, stores on loopback, DTensor and its RNG, DataParallel. Imports
`core`, `clock`, `mode` and `cuda`."""
