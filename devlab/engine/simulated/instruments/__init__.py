"""The instruments people watch a GPU with, made to see the simulated GPUs: the top layer of
the simulation (torch.profiler's CUDA activity, NVML and nvidia-smi), over the clock, the mode,
the CUDA API and torch.distributed on them."""
