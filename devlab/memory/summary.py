"""What a watch of memory amounts to: per-device start, peak and end (`DeviceSummary`,
`MemorySummary`). `format_bytes` (from `devlab.sizes`) shows their byte counts."""

from __future__ import annotations

from dataclasses import dataclass

from devlab.sizes import format_bytes

__all__ = ["DeviceSummary", "MemorySummary", "format_bytes"]


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "") + format_bytes(n)


@dataclass(frozen=True)
class DeviceSummary:
    """One device over one watch. Bytes throughout."""

    label: str
    start: int
    peak: int
    end: int
    limit: int | None
    reserved_end: int | None
    samples: int

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

    def line(self) -> str:
        text = (f"{self.label}: peak {format_bytes(self.peak)} ({_signed(self.peak_increase)}),"
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
        return "\n".join(d.line() for d in self.devices)

    def _repr_html_(self) -> str:
        from html import escape

        rows = "".join(
            "<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in (
                d.label, format_bytes(d.start), format_bytes(d.peak), _signed(d.growth),
                format_bytes(d.held), format_bytes(d.limit))) + "</tr>"
            for d in self.devices)
        head = "".join(f"<th>{h}</th>" for h in
                       ("device", "start", "peak", "growth", "still held", "limit"))
        return (f"<table class='devlab-memory-summary'><thead><tr>{head}</tr></thead>"
                f"<tbody>{rows}</tbody></table>"
                f"<small>{self.duration:.2f} s watched, {self.rate:.0f} samples/s</small>")

    def __repr__(self) -> str:
        return str(self)
