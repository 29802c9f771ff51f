"""Exercise 2: reading and writing model parameters on a device, and what each way costs.

Each operation runs once under the placement log; its copies between devices (and their
bytes) and its host syncs are what the log recorded, not what the operation should do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from devlab._helpers.sizes import format_bytes
from devlab.core import placement_log
from devlab.core import placement_scope as scope
from devlab.fronts.lab.exercises._common import (
    ExerciseResult,
    Progress,
    check_positive,
    default_gpu,
    device_info,
)


class ParametersResult(ExerciseResult):
    """Per operation: copies between devices, bytes copied, host syncs, ops run."""

    def _draw(self, fig: Any) -> None:
        ops = self.data["operations"]
        labels = [op["operation"] for op in ops]
        ys = list(range(len(ops)))
        ax1, ax2 = fig.subplots(1, 2, sharey=True)
        ax1.barh(ys, [op["bytes"] / 1024 for op in ops], color="C1")
        ax1.set_yticks(ys, labels, fontsize=8)
        ax1.invert_yaxis()
        ax1.set_xlabel("KiB copied between devices")
        ax2.barh(ys, [op["syncs"] for op in ops], color="C3")
        ax2.set_xlabel("host syncs")
        ax2.xaxis.get_major_locator().set_params(integer=True)
        fig.suptitle(f"parameters on {self.devices[0].label}: what each access costs", fontsize=10)


def _operations(net: nn.Sequential, host_state: dict[str, torch.Tensor], host_weight: torch.Tensor
                ) -> list[tuple[str, str, Callable[[], Any]]]:
    """(name, code, call): the usual ways to read and write parameters."""
    layer = net[0]

    def sgd_step() -> None:
        with torch.no_grad():
            for p in net.parameters():
                p -= 0.01 * p.grad

    return [
        ("state_dict()", "net.state_dict()", lambda: net.state_dict()),
        ("state_dict to host", "{k: v.cpu() for k, v in net.state_dict().items()}",
         lambda: {k: v.cpu() for k, v in net.state_dict().items()}),
        ("load_state_dict from host", "net.load_state_dict(host_state)",
         lambda: net.load_state_dict(host_state)),
        ("read .data", "w = net[0].weight.data", lambda: layer.weight.data),
        ("write .data on device", "net[0].weight.data.mul_(0.5)", lambda: layer.weight.data.mul_(0.5)),
        ("write .data from host", "net[0].weight.data.copy_(host_weight)",
         lambda: layer.weight.data.copy_(host_weight)),
        ("no_grad SGD update", "with torch.no_grad(): p -= 0.01 * p.grad  (every p)", sgd_step),
        (".item() of one weight", "net[0].weight[0, 0].item()", lambda: layer.weight[0, 0].item()),
        (".item() of a sum", "net[0].weight.sum().item()", lambda: layer.weight.sum().item()),
        ("repr() / print", "repr(net[0].bias)", lambda: repr(layer.bias)),
    ]


def parameters_on_device(
    device: str | torch.device | None = None,
    *,
    inputs: int = 64,
    hidden: int = 256,
    outputs: int = 10,
    progress: bool | None = None,
) -> ParametersResult:
    """Make an MLP on `device` (default: the first GPU, simulated ones included, else the
    CPU), then read and write its parameters in the usual ways, each under the placement log.
    """
    check_positive(inputs=inputs, hidden=hidden, outputs=outputs)
    info = device_info(device if device is not None else default_gpu())
    with scope.device(info.full_name):
        net = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, outputs))
        # Gradients for the SGD update, made outside the log.
        net(torch.randn(8, inputs)).square().mean().backward()
    host_state = {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}
    host_weight = torch.randn(hidden, inputs)
    operations = _operations(net, host_state, host_weight)
    measured: list[dict[str, Any]] = []
    with Progress(len(operations), "parameters", progress) as bar:
        for name, code, call in operations:
            with placement_log.capture() as log:
                call()
            s = log.summary()
            measured.append({
                "operation": name,
                "code": code,
                "copies": s.copies,
                "bytes": s.copied_bytes,
                "syncs": s.syncs,
                "ops": sum(s.ops_per_device.values()),
                "ops_per_device": dict(s.ops_per_device),
                "copy_lines": [e.text() for e in log.events if e.kind == "copy"],
            })
            bar.step(name)
    n_params = sum(p.numel() for p in net.parameters())
    headers = ["operation", "code", "copies", "bytes copied", "host syncs", "ops"]
    rows = [[m["operation"], m["code"], str(m["copies"]), format_bytes(m["bytes"]), str(m["syncs"]),
             str(m["ops"])] for m in measured]
    notes = [f"Model: Linear({inputs}, {hidden}) → ReLU → Linear({hidden}, {outputs}), "
             f"{n_params:,} parameters, on {info.name}. Copies, bytes and host syncs are what "
             "the placement log recorded for each line of code."]
    if info.torch_device.type == "cpu":
        notes.append("On the CPU the parameters already live in host memory: nothing is copied "
                     "and the host never waits. Run with a GPU (or simulate_gpus(2)) to see the "
                     "costs.")
    else:
        # Said from what was measured, so the sentence cannot disagree with the table.
        free = [m["operation"] for m in measured if not m["copies"] and not m["syncs"]]
        copying = [m["operation"] for m in measured if m["copies"]]
        waiting = [m["operation"] for m in measured if m["syncs"]]
        if free:
            notes.append("Stayed on the device (no copy, no wait): " + ", ".join(free) + ".")
        if copying:
            notes.append("Copied between host and device: " + ", ".join(copying) + ".")
        if waiting:
            notes.append("Made the host wait for the device: " + ", ".join(waiting) + ".")
    data = {"device": info.to_dict(), "devices": [info.to_dict()], "parameters": n_params,
            "operations": measured}
    return ParametersResult(f"Parameters on {info.label}: copies and host syncs per access",
                            [info], data, headers, rows, notes)
