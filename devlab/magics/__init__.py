"""The IPython extension: `%load_ext devlab` registers the magics and the per-cell log."""

from __future__ import annotations

from typing import Any

from devlab import config, debugging, scope
from devlab.magics.distributed import DistributedMagics
from devlab.magics.monitoring import MonitoringMagics
from devlab.magics.placement import PlacementMagics

_state: dict[str, Any] = {}


def load_ipython_extension(ip: Any) -> None:
    """Register devlab's magics and cell hooks, and say what devices there are."""
    if _state.get("shell") is ip:
        return
    placement = PlacementMagics(ip)
    magics: list[Any] = [placement, MonitoringMagics(ip), DistributedMagics(ip)]
    for m in magics:
        ip.register_magics(m)
    ip.events.register("pre_run_cell", placement.pre_run_cell)
    ip.events.register("post_run_cell", placement.post_run_cell)
    _state.update(shell=ip, magics=magics, placement=placement)
    print(f"devlab loaded: {_device_line()}")


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
    debugging.reset()
    scope.reset_default()
    config.reset()
    _state.clear()


def _device_line() -> str:
    names = ", ".join(d.name.replace("/device:", "/") for d in config.logical_devices())
    return f"devices {names}. {config.gpu_status()} %devices shows details."
