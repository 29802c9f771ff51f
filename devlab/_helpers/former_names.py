"""devlab's modules by the names they had before the layout of fronts, core and engine.

`import devlab.config`, `from devlab.memory import run_fresh` and a pickle naming
`devlab.names.DeviceSpec` keep working: each former name is the very module now at its new
place (one module object under two names, never a copy). `install()` puts the finder first on
`sys.meta_path`, so that a folder the moves left behind in an old checkout (a namespace package
to the path finder) cannot answer for a former name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

# A former dotted name (a module or a package) -> where it lives now; a name below a former
# package follows its package (the longest former prefix wins).
FORMER = {
    'devlab._tracebacks': 'devlab._helpers.tracebacks',
    'devlab.aten_ops': 'devlab.engine.aten_overloads',
    'devlab.config': 'devlab.core.config',
    'devlab.d2l': 'devlab.core.d2l',
    'devlab.debugging': 'devlab.core.debugging',
    'devlab.distributed': 'devlab.core.ranks',
    'devlab.distributed.export': 'devlab.core.ranks.script_export',
    'devlab.distributed.options': 'devlab.core.ranks.launch_options',
    'devlab.distributed.rank': 'devlab.core.ranks.rank_process',
    'devlab.distributed.reports': 'devlab.core.ranks.rank_reports',
    'devlab.distributed.wire': 'devlab.core.ranks.handoff',
    'devlab.engine.gpu_model.allocator': 'devlab.engine.gpu_model.caching_allocator',
    'devlab.engine.simulated.clock.modeled_clock': 'devlab.engine.simulated.clock.charges',
    'devlab.engine.simulated.cuda.api': 'devlab.engine.simulated.cuda.namespaces',
    'devlab.engine.simulated.torch_distributed.forks': 'devlab.engine.simulated.torch_distributed.fork_safety',
    'devlab.exercises': 'devlab.fronts.lab.exercises',
    'devlab.figures': 'devlab._helpers.figures',
    'devlab.gpu_model': 'devlab.engine.gpu_model',
    'devlab.gpu_model.allocator': 'devlab.engine.gpu_model.caching_allocator',
    'devlab.gpu_model.cufft': 'devlab.engine.gpu_model.cufft_plan_keys',
    'devlab.gpu_model.ops': 'devlab.engine.gpu_model.op_costs',
    'devlab.host': 'devlab._helpers.host',
    'devlab.inventory': 'devlab.core.inventory',
    'devlab.lesson': 'devlab.fronts.lab.lesson',
    'devlab.loopback': 'devlab._helpers.loopback',
    'devlab.magics': 'devlab.fronts.lab.magics',
    'devlab.magics.distributed': 'devlab.fronts.lab.magics.rank_magics',
    'devlab.magics.monitoring': 'devlab.fronts.lab.magics.monitoring_magics',
    'devlab.magics.placement': 'devlab.fronts.lab.magics.placement_magics',
    'devlab.memory': 'devlab.core.memory_watch',
    'devlab.memory.chart': 'devlab.core.memory_watch.memory_chart',
    'devlab.memory.fresh': 'devlab.core.memory_watch.fresh_process',
    'devlab.memory.timeline': 'devlab.core.memory_watch.allocation_timeline',
    'devlab.memory.tracing': 'devlab.core.memory_watch.allocation_trace',
    'devlab.names': 'devlab.core.names',
    'devlab.nvml': 'devlab.engine.nvml_reader',
    'devlab.ops_catalog': 'devlab.engine.gpu_model.ops_catalog',
    'devlab.placement_log': 'devlab.core.placement_log',
    'devlab.pytest_plugin': 'devlab.fronts.pytest_plugin',
    'devlab.runtime': 'devlab.engine.runtime',
    'devlab.scope': 'devlab.core.placement_scope',
    'devlab.simulated': 'devlab.engine.simulated',
    'devlab.simulated.clock.clock': 'devlab.engine.simulated.clock.charges',
    'devlab.simulated.clock.gpu_specs': 'devlab.engine.gpu_model.specs',
    'devlab.simulated.clock.timeline': 'devlab.engine.simulated.clock.step_timeline',
    'devlab.simulated.core': 'devlab.engine.simulated.base',
    'devlab.simulated.core.devices': 'devlab.engine.simulated.base.device_args',
    'devlab.simulated.core.errors': 'devlab.engine.simulated.base.cuda_errors',
    'devlab.simulated.core.fork': 'devlab.engine.simulated.base.fork_rule',
    'devlab.simulated.core.hazards': 'devlab.engine.simulated.base.hazards',
    'devlab.simulated.core.imports': 'devlab.engine.simulated.base.import_patches',
    'devlab.simulated.core.marks': 'devlab.engine.simulated.base.storage_marks',
    'devlab.simulated.core.notice': 'devlab.engine.simulated.base.notices',
    'devlab.simulated.core.requirements': 'devlab.engine.simulated.base.torch_requirements',
    'devlab.simulated.core.workers': 'devlab.engine.simulated.base.gpu_workers',
    'devlab.simulated.cuda.api': 'devlab.engine.simulated.cuda.namespaces',
    'devlab.simulated.cuda.build': 'devlab.engine.simulated.cuda.cuda_build',
    'devlab.simulated.cuda.cufft': 'devlab.engine.simulated.cuda.cufft_plans',
    'devlab.simulated.distributed': 'devlab.engine.simulated.torch_distributed',
    'devlab.simulated.distributed.forks': 'devlab.engine.simulated.torch_distributed.fork_safety',
    'devlab.simulated.distributed.futures': 'devlab.engine.simulated.torch_distributed.c10d_futures',
    'devlab.simulated.distributed.parallel': 'devlab.engine.simulated.torch_distributed.nn_parallel',
    'devlab.simulated.distributed.stores': 'devlab.engine.simulated.torch_distributed.loopback_stores',
    'devlab.simulated.mode.compile': 'devlab.engine.simulated.mode.compile_stance',
    'devlab.simulated.mode.dispatched': 'devlab.engine.simulated.mode.dispatch_devices',
    'devlab.simulated.mode.launch': 'devlab.engine.simulated.mode.async_launch',
    'devlab.simulated.mode.moves': 'devlab.engine.simulated.mode.transfers',
    'devlab.simulated.mode.ops': 'devlab.engine.simulated.mode.device_rule',
    'devlab.simulated.mode.queries': 'devlab.engine.simulated.mode.device_queries',
    'devlab.simulated.mode.tensor': 'devlab.engine.simulated.mode.tensor_properties',
    'devlab.simulated.mode.threads': 'devlab.engine.simulated.mode.thread_starts',
    'devlab.simulated.mode.wrappers': 'devlab.engine.simulated.mode.wrapper_subclasses',
    'devlab.sizes': 'devlab._helpers.sizes',
    'devlab.timing': 'devlab.core.timing',
    'devlab.widgets': 'devlab.fronts.lab.widgets',
}


def current_name(name: str) -> str | None:
    """Where the module a former name named lives now; None for a name that never moved."""
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        new = FORMER.get(".".join(parts[:i]))
        if new is not None:
            return ".".join([new, *parts[i:]])
    return None


class _Alias(importlib.abc.Loader):
    """Loads a former name as the module at its new place, leaving that module's own spec."""

    def __init__(self, current: str, former: str = "") -> None:
        self.current = current
        self.former = former
        self.module: ModuleType | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        self.module = importlib.import_module(self.current)
        self.spec = self.module.__spec__
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set the former name's spec on it
        # The former modules of this former package that are loaded already take their former
        # names now: a later import of one finds it in sys.modules, where the import system
        # would otherwise bind it on the package, over the package's own attribute of that
        # name (`devlab.memory.timeline`, a module then, is the function `timeline` now).
        below = self.former + "."
        for former, current in FORMER.items():
            if (former.startswith(below) and "." not in former[len(below):]
                    and current in sys.modules and former not in sys.modules):
                sys.modules[former] = sys.modules[current]


class FormerNames(importlib.abc.MetaPathFinder):
    """Finds a former devlab name (`FORMER`), and nothing else."""

    def find_spec(self, name: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if not name.startswith("devlab."):
            return None
        current = current_name(name)
        if current is None or current == name:
            return None
        return importlib.machinery.ModuleSpec(name, _Alias(current, name))


def install() -> None:
    """Put the finder first on sys.meta_path, once per process."""
    if not any(isinstance(f, FormerNames) for f in sys.meta_path):
        sys.meta_path.insert(0, FormerNames())
