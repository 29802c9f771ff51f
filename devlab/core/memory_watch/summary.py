"""What a watch of memory amounts to: per-device start, peak and end (`DeviceSummary`,
`MemorySummary`). `format_bytes` (from `devlab._helpers.sizes`) shows their byte counts."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from devlab._helpers.sizes import format_bytes

__all__ = ["DeviceSummary", "MemorySummary", "format_bytes"]


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "") + format_bytes(n)


@dataclass(frozen=True)
class DeviceSummary:
    """One device over one watch. Bytes throughout.

    `peak` is the highest use during the watch: exact where the backend keeps it (a
    simulated GPU; torch's allocator when its high-water mark rose during the watch), else the
    highest sample; `peak_at_least` says the true peak may be higher (torch's high-water mark
    from before the watch stands above every sample, so a spike between two samples hides).
    """

    label: str
    start: int
    peak: int
    end: int
    limit: int | None
    reserved_end: int | None
    samples: int
    peak_at_least: bool = False

    @property
    def growth(self) -> int:
        """What the watched code left behind: end minus start."""
        return self.end - self.start

    @property
    def peak_increase(self) -> int:
        """How far above its starting point the device went."""
        return self.peak - self.start

    @property
    def held(self) -> int:
        """Still held at the end."""
        return self.end

    @property
    def peak_text(self) -> str:
        return ("≥ " if self.peak_at_least else "") + format_bytes(self.peak)

    def line(self) -> str:
        text = (f"{self.label}: peak {self.peak_text} ({_signed(self.peak_increase)}),"
                f" growth {_signed(self.growth)}, still held {format_bytes(self.held)}")
        if self.reserved_end is not None and self.reserved_end != self.end:
            text += f" (reserved {format_bytes(self.reserved_end)})"
        if self.limit:
            text += f", limit {format_bytes(self.limit)} ({self.peak / self.limit:.0%} at peak)"
        return text


@dataclass(frozen=True)
class MemorySummary:
    """Per-device start/peak/end of a watch, as text (`str`) or HTML."""

    devices: list[DeviceSummary]
    duration: float
    rate: float

    def __getitem__(self, label: str) -> DeviceSummary:
        for d in self.devices:
            if d.label == label:
                return d
        raise KeyError(label)

    def __str__(self) -> str:
        note = self.note()
        return "\n".join([d.line() for d in self.devices] + ([note[2:] + "."] if note else []))

    def _repr_html_(self) -> str:
        rows = "".join(
            "<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in (
                d.label, format_bytes(d.start), d.peak_text, _signed(d.growth),
                format_bytes(d.held), format_bytes(d.limit))) + "</tr>"
            for d in self.devices)
        head = "".join(f"<th>{h}</th>" for h in
                       ("device", "start", "peak", "growth", "still held", "limit"))
        return (f"<table class='devlab-memory-summary'><thead><tr>{head}</tr></thead>"
                f"<tbody>{rows}</tbody></table>"
                f"<small>{self.duration:.2f} s watched, {self.rate:.0f} samples/s"
                f"{escape(self.note())}</small>")

    def note(self) -> str:
        """Why a peak shows as "≥", if one does (empty otherwise)."""
        if not any(d.peak_at_least for d in self.devices):
            return ""
        return ("; ≥: the highest sample. torch's peak counter holds a higher mark from before"
                " this watch, so a spike between samples would not show; call"
                " torch.cuda.reset_peak_memory_stats() before it to see the exact peak")

    def __repr__(self) -> str:
        return str(self)
