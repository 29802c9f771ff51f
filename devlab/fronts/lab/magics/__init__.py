"""The IPython extension: `%load_ext devlab` registers the magics and the per-cell log.

`%unload_ext devlab` removes them and returns torch to normal: the log off, the default
device reset, every setting forgotten, any simulation stopped. `%reload_ext devlab` (IPython
unloads, re-imports the package, loads) registers the magics and hooks again and keeps the
session as it was: the running simulation and the tensors on it, settings, the default device,
the placement log's switch, --limit and --file.
"""

from __future__ import annotations

import sys
from typing import Any

from devlab.core import config, debugging
from devlab.core import placement_scope as scope
from devlab.fronts.lab.magics.monitoring_magics import MonitoringMagics
from devlab.fronts.lab.magics.placement_magics import PlacementMagics
from devlab.fronts.lab.magics.rank_magics import DistributedMagics

_state: dict[str, Any] = {}


def load_ipython_extension(ip: Any) -> None:
    """Register devlab's magics and cell hooks, and say what devices there are."""
    if _state.get("shell") is ip:
        return
    placement = PlacementMagics(ip)
    kept = _state.pop("kept", None)
    if kept is not None:  # %reload_ext: the log's --limit and --file carry over
        placement.limit, placement.file = kept.limit, kept.file
    else:
        # Loaded again after %unload_ext (which stopped the simulation): the environment's
        # simulated GPUs (Binder's DEVLAB_SIMULATE_GPUS) come back, as in a new kernel.
        config.simulate_from_environment()
    magics: list[Any] = [placement, MonitoringMagics(ip), DistributedMagics(ip)]
    for m in magics:
        ip.register_magics(m)
    ip.events.register("pre_run_cell", placement.pre_run_cell)
    ip.events.register("post_run_cell", placement.post_run_cell)
    _state.update(shell=ip, magics=magics, placement=placement)
    print(f"devlab {'reloaded' if kept is not None else 'loaded'}: {_device_line()}")


def unload_ipython_extension(ip: Any) -> None:
    """Remove every magic, hook, mode, patch and thread devlab added; torch is as before."""
    if _state.get("shell") is not ip:
        return
    placement: PlacementMagics = _state["placement"]
    ip.events.unregister("pre_run_cell", placement.pre_run_cell)
    ip.events.unregister("post_run_cell", placement.post_run_cell)
    for m in _state["magics"]:
        for kind, names in m.magics.items():
            for name in names:
                ip.magics_manager.magics[kind].pop(name, None)
        ip.magics_manager.registry.pop(type(m).__name__, None)
    _state.clear()
    if _reloading(ip):
        _state["kept"] = placement  # load_ipython_extension follows at once
        return
    debugging.reset()
    scope.reset_default()
    config.reset()


def _reloading(ip: Any) -> bool:
    """Whether IPython's `%reload_ext` is what unloads the extension (it calls unload, then
    load): the unload is then only the first half of a reload."""
    reload_extension = getattr(type(ip.extension_manager), "reload_extension", None)
    code = getattr(reload_extension, "__code__", None)
    frame = sys._getframe(1)
    while frame is not None and code is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _device_line() -> str:
    names = ", ".join(d.name.replace("/device:", "/") for d in config.logical_devices())
    return f"devices {names}. {config.gpu_status()} %devices shows details."
