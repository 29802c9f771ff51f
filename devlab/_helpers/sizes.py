"""Memory sizes: byte counts written for people (`format_bytes`) and memory limits in MB
checked (`check_memory_limit`)."""

from __future__ import annotations

__all__ = ["format_bytes", "check_memory_limit", "MAX_MEMORY_LIMIT_MB"]

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


# torch counts bytes in 64-bit signed integers (sizes, memory stats): the largest limit in MB
# whose bytes it can hold.
MAX_MEMORY_LIMIT_MB = (2**63 - 1) // 2**20


def check_memory_limit(mb: object, name: str = "memory_limit") -> int | None:
    """`mb` if it is a memory limit TensorFlow accepts (a whole number of megabytes above 0,
    or None for no limit) whose bytes torch can count (at most `MAX_MEMORY_LIMIT_MB`, 8 EiB),
    else a `ValueError` naming `name`."""
    if mb is None:
        return None
    if not isinstance(mb, int) or isinstance(mb, bool) or mb <= 0:
        raise ValueError(f"{name} is a whole number of megabytes greater than 0, got {mb!r}.")
    if mb > MAX_MEMORY_LIMIT_MB:
        raise ValueError(
            f"{name} is at most {MAX_MEMORY_LIMIT_MB:,} MB (8 EiB, the most bytes torch counts "
            f"in a 64-bit integer), got {_big(mb)}."
        )
    return mb


def _big(n: int) -> str:
    # Python refuses to write out an int of more than 4,300 digits.
    return f"{n:,}" if n.bit_length() <= 256 else f"a number of {n.bit_length():,} bits"
