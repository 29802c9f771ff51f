"""The engine beneath the core: real CUDA (NVML), the simulated CUDA, and the pure GPU model at the bottom."""
