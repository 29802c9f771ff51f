"""The d2l "GPUs" chapter's exercises and the TensorFlow guide's experiments, as functions.

Each returns a result with `.data` (plain Python), an HTML table naming the devices it ran
on (simulated GPUs are said to be CPU-backed) and `.plot()` (a matplotlib figure). Each runs
on whatever devices exist, simulated GPUs included, and takes sizes and repeats so it can
run small.

1. `matmul_cpu_vs_gpu`: a matrix product on the CPU and a GPU across sizes; the crossover.

A claim (a crossover, which version is faster, a speed-up's cause) is stated only when the
measurements it rests on were steady (`devlab.timing.TimingResult.steady`); a measurement
that was not is taken again, at most `RETRIES` more times, and otherwise the result says it
was too noisy to call and how to run it again.
2. `parameters_on_device`: reading and writing parameters on a device; copies and syncs.
3. `norm_logging`: 1000 norms read with `.item()` each step vs moved to the host once.
4. `two_gpu_scaling`: two products on two GPUs at once vs in turn on one; speed-up vs 2x.
"""

from __future__ import annotations

from devlab.fronts.lab.exercises._common import (
    RETRIES,
    SIMULATED_WARNING,
    DeviceInfo,
    ExerciseResult,
    Progress,
)
from devlab.fronts.lab.exercises.matmul import MatmulResult, crossover_size, matmul_cpu_vs_gpu
from devlab.fronts.lab.exercises.norm_logging import NormLoggingResult, norm_logging
from devlab.fronts.lab.exercises.parameters import ParametersResult, parameters_on_device
from devlab.fronts.lab.exercises.scaling import NeedsTwoGPUs, ScalingResult, two_gpu_scaling

__all__ = [
    "RETRIES",
    "SIMULATED_WARNING",
    "DeviceInfo",
    "ExerciseResult",
    "MatmulResult",
    "NeedsTwoGPUs",
    "NormLoggingResult",
    "ParametersResult",
    "Progress",
    "ScalingResult",
    "crossover_size",
    "matmul_cpu_vs_gpu",
    "norm_logging",
    "parameters_on_device",
    "two_gpu_scaling",
]
