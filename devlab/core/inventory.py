"""The device table `%devices` shows: like `nvidia-smi`, for every device devlab knows."""

from __future__ import annotations

import dataclasses
import html

import psutil
import torch

from devlab._helpers.sizes import format_bytes
from devlab.core import config
from devlab.engine import nvml_reader as nvml
from devlab.engine import simulated


@dataclasses.dataclass(frozen=True)
class DeviceRow:
    """One logical device (or a hidden physical one) and what is known of it now."""

    device_type: str
    name: str
    torch_device: str
    used: int | None
    total: int | None
    utilization: int | None
    kind: str  # "real", "simulated", "simulated, modeled T4" or "hidden"
    reserved: int | None = None  # where an allocator holds more than is used


@dataclasses.dataclass(frozen=True)
class DeviceTable:
    """Rows for every device, and a sentence on the GPUs; HTML in notebooks, text elsewhere."""

    rows: list[DeviceRow]
    status: str

    def text(self) -> str:
        header = ("type", "name", "torch", "memory", "util", "kind")
        body = [
            (r.device_type, r.name, r.torch_device, _memory(r), _util(r), r.kind) for r in self.rows
        ]
        widths = [max(len(str(row[i])) for row in [header, *body]) for i in range(len(header))]
        lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in [header, *body]]
        return "\n".join([*lines, self.status])

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ("type", "name", "torch", "memory", "util", "kind"))
        body = []
        for r in self.rows:
            style = ' style="background:#e8f0fe"' if r.kind.startswith("simulated") else ""
            cells = (r.device_type, r.name, r.torch_device, _memory(r), _util(r), r.kind)
            body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        return (
            '<table class="devlab-devices"><thead><tr>' + head + "</tr></thead><tbody>"
            + "".join(body) + f"</tbody></table><p>{html.escape(self.status)}</p>"
        )


def device_table() -> DeviceTable:
    """Every device devlab knows, without initializing the runtime."""
    rows: list[DeviceRow] = []
    logical = config.logical_devices()
    spec = simulated.model()
    simulated_kind = "simulated" if spec is None else f"simulated, modeled {spec.name}"
    for dev in logical:
        used, total, util, reserved = _reading(dev)
        rows.append(
            DeviceRow(
                dev.device_type,
                dev.full_name,
                str(dev.torch_device),
                used,
                total,
                util,
                simulated_kind if dev.simulated else "real",
                reserved,
            )
        )
    visible = {d.name for d in config.get_visible_devices()}
    for phys in config.list_physical_devices():
        if phys.name not in visible:
            rows.append(DeviceRow(phys.device_type, phys.name, "-", None, None, None, "hidden"))
    return DeviceTable(rows, " ".join(filter(None, [config.gpu_status(), physical_and_logical()])))


def physical_and_logical() -> str | None:
    """How the logical GPUs come from the physical ones, in TensorFlow's words ("1 Physical
    GPU, 2 Logical GPUs"), when they are not one for one (a split or a hidden GPU); else None.
    """
    physical = config.list_physical_devices("GPU")
    logical = config.logical_devices("GPU")
    if not physical:
        return None
    made: dict[str, list[str]] = {}
    for dev in logical:
        made.setdefault(dev.physical.name, []).append(dev.name)
    split = [f"{name} is split into {' and '.join(names)}" for name, names in made.items()
             if len(names) > 1]
    hidden = [f"{p.name} is hidden (devlab.config.set_visible_devices)" for p in physical
              if p.name not in made]
    if not split and not hidden:
        return None
    return (f"{len(physical)} Physical GPU{'s' if len(physical) != 1 else ''}, {len(logical)} "
            f"Logical GPU{'s' if len(logical) != 1 else ''}: " + "; ".join(split + hidden) + ".")


def _reading(dev: config.LogicalDevice) -> tuple[int | None, int | None, int | None, int | None]:
    """(used, total, utilisation %, reserved) as far as they are known."""
    if dev.device_type == "CPU":
        return psutil.Process().memory_info().rss, psutil.virtual_memory().total, None, None
    if dev.simulated:
        stats = simulated.memory_stats(dev.torch_device.index)
        return stats["allocated"], stats["limit"], None, stats.get("reserved")
    if dev.torch_device.type == "cuda":
        index = dev.physical.index
        info = nvml.memory_info(index)
        if info is not None:
            return info[0], info[1], nvml.utilization(index), None
        if torch.cuda.is_initialized():
            return torch.cuda.memory_allocated(index), None, None, torch.cuda.memory_reserved(index)
    return None, None, None, None


def _memory(row: DeviceRow) -> str:
    if row.used is None and row.total is None:
        return "-"
    used = "?" if row.used is None else format_bytes(row.used)
    total = "unlimited" if row.total is None else format_bytes(row.total)
    if row.reserved is not None and row.reserved != row.used:
        used += f" ({format_bytes(row.reserved)} reserved)"
    return f"{used} / {total}"


def _util(row: DeviceRow) -> str:
    return "-" if row.utilization is None else f"{row.utilization}%"

