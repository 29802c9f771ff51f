"""A performance model of named real GPUs: (op, shapes, dtype, GPU) -> time, from public
specifications (`specs`) and what GPUs achieve (`calibration`), by per-op-family rules
(`kernels`), and the clock that queues them on a GPU's streams and the host's time
(`modeled_clock`). Pure: it imports no simulation and runs no op, so it is validated on tables
of measured kernels (benchmarks/gpu_model.py, docs/gpu-models.md).
"""

from __future__ import annotations

from devlab.engine.gpu_model.band import Band
from devlab.engine.gpu_model.calibration import CALIBRATION, Calibration
from devlab.engine.gpu_model.kernels import ALONE, QUEUED, Kernel, gemm, memory_bound, peak_tflops
from devlab.engine.gpu_model.op_costs import family, predict
from devlab.engine.gpu_model.specs import ALIASES, SPECS, GpuSpec, gpu

__all__ = ["ALIASES", "ALONE", "CALIBRATION", "QUEUED", "SPECS", "Band", "Calibration", "GpuSpec",
           "Kernel", "family", "gemm", "gpu", "memory_bound", "models", "peak_tflops",
           "predict"]


def models() -> list[str]:
    """The GPUs the model knows, by key (`gpu(name)` also takes the aliases)."""
    return list(SPECS)

from devlab.engine.gpu_model.collectives import (  # noqa: E402  (collectives: issue 28)
    OPS,
    CollectiveTime,
    algbw_to_busbw,
    bus_factor,
    busbw_to_algbw,
    coalesced_time,
    collective_time,
)
from devlab.engine.gpu_model.links import (  # noqa: E402
    HOST_COPY_LATENCY_US,
    PAGEABLE_FRACTION,
    TOPOLOGIES,
    HostCopy,
    Topology,
    default_topology,
    host_copy,
    host_copy_gbs,
    topologies,
    topology,
)

__all__ += ["OPS", "TOPOLOGIES", "CollectiveTime", "Topology", "algbw_to_busbw", "bus_factor",
            "busbw_to_algbw", "coalesced_time", "collective_time", "default_topology",
            "topologies", "topology", "PAGEABLE_FRACTION", "host_copy_gbs", "HOST_COPY_LATENCY_US",
            "HostCopy", "host_copy"]
from devlab.engine.gpu_model.data_parallel import (  # noqa: E402
    StepTime,
    bucket_sizes,
    data_parallel_step,
    evenly_ready,
)

__all__ += ["StepTime", "bucket_sizes", "data_parallel_step", "evenly_ready"]
