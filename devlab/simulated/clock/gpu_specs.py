"""The real GPUs a simulated GPU can be modeled on: `devlab.gpu_model.specs`, where every
number is cited (docs/gpu-models.md)."""

from devlab.gpu_model.specs import ALIASES, SPECS, GpuSpec, gpu

__all__ = ["ALIASES", "SPECS", "GpuSpec", "gpu"]
