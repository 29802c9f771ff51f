"""What the exercises share: which devices they ran on, the result object, the progress bar."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from html import escape
from typing import Any

import torch

from devlab._helpers.host import cpu_cores
from devlab.core import config, d2l
from devlab.core import placement_scope as scope
from devlab.engine import simulated
from devlab.engine.gpu_model import QUEUED

# A measurement that was not steady (`TimingResult.steady`) is taken again at most this many
# more times before the exercise says it is too noisy to call.
RETRIES = 2

SIMULATED_WARNING = (
    "Simulated GPUs are CPU-backed: their tensors live in host memory and every value is "
    "computed by the CPU, so their speeds say nothing about a real GPU."
)


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """One device an exercise ran on: its TensorFlow name, torch device and what it really is."""

    name: str  # short TensorFlow name: "CPU:0", "GPU:1"
    full_name: str  # "/job:localhost/replica:0/task:0/device:GPU:1"
    torch_device: torch.device
    simulated: bool
    description: str
    modeled: str | None = None  # the real GPU whose specifications give its times
    model: str | None = None  # its short name ("T4")

    @property
    def label(self) -> str:
        """For tables and charts: "GPU:0 (simulated)", "GPU:0 (modeled T4)"."""
        if self.model:
            return f"{self.name} (modeled {self.model})"
        return f"{self.name} (simulated)" if self.simulated else self.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "full_name": self.full_name,
            "torch_device": str(self.torch_device),
            "simulated": self.simulated,
            "description": self.description,
            "modeled": self.modeled,
        }


def device_info(device: str | torch.device) -> DeviceInfo:
    """Resolve a device name (TensorFlow or torch) to the device work runs on, and describe it."""
    placement = scope.resolve(device)
    logical = placement.logical
    short = logical.name.replace("/device:", "")
    if logical.device_type == "CPU":
        description = f"CPU ({cpu_cores()} cores)"
    elif logical.simulated:
        spec = simulated.model()
        if spec is not None:
            description = (f"simulated GPU, CPU-backed; times modeled from {spec.full_name} "
                           "specifications, not measured")
            return DeviceInfo(short, logical.full_name, placement.device, True, description,
                              spec.full_name, spec.name)
        description = "simulated GPU, CPU-backed"
    elif logical.torch_device.type == "cuda":
        # Only reached for real CUDA devices, where asking the name is cheap and honest.
        description = f"real GPU: {torch.cuda.get_device_name(logical.torch_device)}"
    else:
        description = str(logical.torch_device)
    return DeviceInfo(short, logical.full_name, placement.device, logical.simulated, description)


def default_gpu() -> torch.device:
    """d2l's `try_gpu()`: the first GPU (real or simulated), else the CPU."""
    return d2l.try_gpu()


def load_average() -> float | None:
    """The 1-minute load average (runnable processes), where the OS reports one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def busy_note(load: float | None, steady: bool = False) -> str | None:
    """A warning when other work competed for the CPU while timing, else None. `steady`: the
    measurements the result's claims rest on were steady all the same."""
    cores = cpu_cores()
    if load is None or load <= cores:
        return None
    busy = f"The machine was busy while timing (1-minute load average {load:.1f} on {cores} cores)"
    if steady:
        return f"{busy}, but the measurements the results rest on were steady."
    return (f"{busy}: the times include waiting for CPU time. Run again on a quieter machine "
            "before drawing conclusions.")


def no_gpu_note() -> str:
    return f"No GPU to compare with. {config.gpu_status()}"


# --- the result object ---------------------------------------------------------------------


@dataclasses.dataclass
class ExerciseResult:
    """What an exercise measured: `.data` (plain Python), an HTML table, and `.plot()`.

    Subclasses fill `headers`/`rows` (display strings) and draw their chart in `_draw`.
    """

    title: str
    devices: list[DeviceInfo]
    data: dict[str, Any]
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def simulated(self) -> bool:
        """Whether any device it ran on was a simulated GPU."""
        return any(d.simulated for d in self.devices)

    @property
    def modeled(self) -> str | None:
        """The real GPU whose specifications gave the simulated GPUs' times, if any."""
        return next((d.modeled for d in self.devices if d.modeled), None)

    def warning(self) -> str:
        """What a reader must know about the simulated devices (empty if none)."""
        if self.modeled:
            names = ", ".join(d.name for d in self.devices if d.modeled)
            return (f"Times on {names} are modeled from {self.modeled} specifications, not "
                    f"measured (devlab.gpu_model; ops {QUEUED}). Their values are computed by "
                    "this machine's CPU.")
        return SIMULATED_WARNING if self.simulated else ""

    def ran_on(self) -> str:
        """One line naming every device, and what each one really is."""
        return "Ran on: " + "; ".join(
            f"{d.name} = torch {d.torch_device} ({d.description})" for d in self.devices
        )

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left'>{escape(h)}</th>" for h in self.headers)
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{escape(c)}</td>" for c in row) + "</tr>"
            for row in self.rows
        )
        parts = [
            f"<div class='devlab-exercise'><b>{escape(self.title)}</b>",
            f"<div class='devlab-devices'>{escape(self.ran_on())}</div>",
        ]
        if self.simulated:
            kind = "Modeled" if self.modeled else "Simulated"
            parts.append(
                "<div class='devlab-simulated' style='background:#fff3cd;padding:2px 4px'>"
                f"<b>{kind}:</b> {escape(self.warning())}</div>"
            )
        parts.append(
            f"<table class='devlab-exercise-table'><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>"
        )
        parts.extend(f"<p style='margin:2px 0'>{escape(n)}</p>" for n in self.notes)
        parts.append("</div>")
        return "".join(parts)

    def __str__(self) -> str:
        widths = [max(len(r[i]) for r in [self.headers, *self.rows]) for i in range(len(self.headers))]
        lines = [self.title, self.ran_on()]
        if self.simulated:
            lines.append(("Modeled: " if self.modeled else "Simulated: ") + self.warning())
        for row in [self.headers, *self.rows]:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        lines.extend(self.notes)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def plot(self) -> Any:
        """A matplotlib `Figure` of the result (shown as an image when it is a cell's value)."""
        from matplotlib.figure import Figure

        from devlab._helpers.figures import ensure_figure_formatter

        # A bare Figure rather than pyplot's: it is shown once, as the cell's value, and
        # never leaks into a later cell's output.
        ensure_figure_formatter()
        fig = Figure(figsize=(7, 3.6), dpi=100)
        self._draw(fig)
        if self.modeled:
            fig.text(0.01, 0.01, f"GPU times modeled from {self.modeled} specifications, "
                     "not measured", fontsize=7, color="#a06000")
        elif self.simulated:
            fig.text(0.01, 0.01, "simulated GPUs: CPU-backed, not GPU speeds",
                     fontsize=7, color="#a06000")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        return fig

    def _draw(self, fig: Any) -> None:
        raise NotImplementedError


def format_seconds(t: float | None) -> str:
    from devlab.core.timing import format_seconds as fmt

    return "—" if t is None else fmt(t)


# --- progress bar --------------------------------------------------------------------------


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where a widget can show), False in plain Python."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


class Progress:
    """A progress bar for long runs: an `IntProgress` in a notebook, silent elsewhere.

    Built from core ipywidgets only (`IntProgress`, `Label`, `HBox`), so it works on
    ipywidgets 7.7 (Colab) and 8. `show=None` means "when in a notebook".
    """

    def __init__(self, total: int, description: str, show: bool | None = None) -> None:
        self.total = max(1, int(total))
        self.done = 0
        self.widget: Any = None
        if show is None:
            show = in_notebook()
        if show:
            import ipywidgets

            self._bar = ipywidgets.IntProgress(value=0, min=0, max=self.total,
                                               description=description[:20])
            self._label = ipywidgets.Label(value="")
            self.widget = _progress_box()(children=[self._bar, self._label])
            self.widget.display_live()

    def step(self, label: str = "", n: int = 1) -> None:
        """`n` more steps are done; `label` says what runs next."""
        self.done = min(self.total, self.done + n)
        if self.widget is not None:
            self._bar.value = self.done
            self._label.value = label

    def extend(self, n: int) -> None:
        """`n` more steps than first thought (sizes measured again)."""
        self.total += n
        if self.widget is not None:
            self._bar.max = self.total

    def finish(self, failed: bool = False) -> None:
        """The bar's last state; then it gives way to a static copy and its widgets close."""
        if self.widget is not None and not self.widget.released:
            self._bar.bar_style = "danger" if failed else "success"
            if not failed:
                self._bar.value = self.total
            self._label.value = "stopped" if failed else "done"
            self.widget.release()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.finish(failed=exc_type is not None)


_PROGRESS_BOX: Any = None


def _progress_box() -> Any:
    """An HBox that is live while an exercise runs, then a static `<progress>` (made on first
    use: ipywidgets is imported only in a notebook)."""
    global _PROGRESS_BOX
    if _PROGRESS_BOX is None:
        import ipywidgets

        from devlab.fronts.lab.widgets._live import LiveWidget, StaticView

        class ProgressBox(LiveWidget, ipywidgets.HBox):
            def static(self) -> StaticView:
                bar, label = self.children
                html = (f"<div class='devlab-progress'>{escape(bar.description)} <progress "
                        f"value='{bar.value}' max='{bar.max}'></progress> "
                        f"{escape(label.value)}</div>")
                return StaticView(html, f"{bar.description} {bar.value}/{bar.max} {label.value}")

        _PROGRESS_BOX = ProgressBox
    return _PROGRESS_BOX


def check_positive(**values: int | float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be greater than 0, got {value!r}.")


def check_sizes(sizes: Sequence[int]) -> list[int]:
    out = sorted({int(s) for s in sizes})
    if not out or out[0] < 1:
        raise ValueError(f"sizes must be matrix sizes of at least 1, got {list(sizes)!r}.")
    return out
