"""Memory sizes: byte counts written for people (`format_bytes`) and memory limits in MB
checked (`check_memory_limit`)."""

from __future__ import annotations

__all__ = ["format_bytes", "check_memory_limit"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB' (binary units, as nvidia-smi and torch report); None -> '—'."""
    if n is None:
        return "—"
    sign = "-" if n < 0 else ""
    value = abs(float(n))
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def check_memory_limit(mb: object, name: str = "memory_limit") -> int | None:
    """`mb` if it is a memory limit TensorFlow accepts (a whole number of megabytes above 0,
    or None for no limit), else a `ValueError` naming `name`."""
    if mb is None:
        return None
    if not isinstance(mb, int) or isinstance(mb, bool) or mb <= 0:
        raise ValueError(f"{name} is a whole number of megabytes greater than 0, got {mb!r}.")
    return mb
