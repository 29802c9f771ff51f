"""devlab: a Jupyter-native interactive device lab for PyTorch.

`%load_ext devlab` in a notebook; `devlab.device("/GPU:1")`, `devlab.config`,
`devlab.debugging.set_log_device_placement` and the d2l helpers from Python;
`devlab.launch(fn, *args, nprocs=2)` runs a function on ranks of torch.distributed;
`devlab.gpu_model.predict(op, shapes, dtype, gpu)` is the performance model of a named GPU;
`devlab.lesson.setup(gpus=2)` gives a lesson notebook the GPUs it needs on any machine.
"""

from __future__ import annotations

from devlab._helpers import former_names
from devlab.core import config, debugging, placement_log, timing
from devlab.core import memory_watch as memory
from devlab.core import ranks as distributed
from devlab.core.d2l import cpu, gpu, num_gpus, try_all_gpus, try_gpu
from devlab.core.inventory import device_table
from devlab.core.names import DeviceSpec, full_name
from devlab.core.placement_log import PlacementLog
from devlab.core.placement_scope import Placement, device, resolve
from devlab.core.ranks import launch
from devlab.core.timing import compare, time_on_device
from devlab.engine import gpu_model, runtime, simulated
from devlab.fronts.lab import exercises, lesson
from devlab.fronts.lab.magics import load_ipython_extension, unload_ipython_extension

former_names.install()

__version__ = "0.1.0"

config.simulate_from_environment()


def __getattr__(name: str) -> object:
    """`devlab.widgets`, the public widgets, imported on first use: they import ipywidgets and
    matplotlib, which `import devlab` does not need."""
    if name == "widgets":
        import importlib

        return importlib.import_module("devlab.fronts.lab.widgets")
    raise AttributeError(f"module 'devlab' has no attribute {name!r}")

__all__ = [
    "DeviceSpec",
    "Placement",
    "PlacementLog",
    "compare",
    "config",
    "cpu",
    "debugging",
    "device",
    "device_table",
    "distributed",
    "exercises",
    "full_name",
    "gpu",
    "gpu_model",
    "launch",
    "lesson",
    "load_ipython_extension",
    "memory",
    "num_gpus",
    "placement_log",
    "resolve",
    "runtime",
    "simulated",
    "time_on_device",
    "timing",
    "try_all_gpus",
    "try_gpu",
    "unload_ipython_extension",
    "widgets",
]
