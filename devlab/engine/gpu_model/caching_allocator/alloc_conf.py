"""PYTORCH_CUDA_ALLOC_CONF: the caching allocator's settings and the size constants they
bound, as torch keeps them in `c10/core/AllocatorConfig.h` (and parses them in
`AllocatorConfig.cpp`, torch 2.13).

`AllocatorConfig.parse` reads the string as torch does and refuses what torch refuses, in
torch's words (`AllocatorConfigError`), and what devlab does not model (expandable segments,
the cudaMallocAsync backend), naming the option.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KMIN_BLOCK = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
SMALL_SIZE = 1 << 20  # kSmallSize: the largest "small" allocation is 1 MiB
SMALL_BUFFER = 2 << 20  # kSmallBuffer: small allocations are packed in 2 MiB segments
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: requests of 1-10 MiB get a 20 MiB segment
LARGE_BUFFER = 20 << 20  # kLargeBuffer
ROUND_LARGE = 2 << 20  # kRoundLarge: larger segments are rounded up to 2 MiB
SIZE_MAX = (1 << 64) - 1  # max_split_size's default: no block is "oversize"
_MB = 1 << 20
_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB ... 64 GiB


class AllocatorConfigError(ValueError):
    """A PYTORCH_CUDA_ALLOC_CONF that torch would refuse, or that devlab does not model."""


@dataclass(frozen=True)
class AllocatorConfig:
    """The caching allocator's settings (PYTORCH_CUDA_ALLOC_CONF), with torch's defaults."""

    max_split_size: int = SIZE_MAX
    max_non_split_rounding: int = LARGE_BUFFER
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple[int, ...] = (0,) * _INTERVALS
    expandable_segments: bool = False

    @classmethod
    def parse(cls, conf: str | None) -> AllocatorConfig:
        """The settings of a PYTORCH_CUDA_ALLOC_CONF string, read as torch reads it
        (`AllocatorConfig::parseArgs`); a mistake is an `AllocatorConfigError` in torch's words."""
        if not conf:
            return cls()
        tokens = _lex(conf)
        values: dict[str, Any] = {}
        divisions = [0] * _INTERVALS
        i = 0
        while i < len(tokens):
            key = tokens[i]
            if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
                i = _expect(tokens, i + 1, ":")
                mb = _int(tokens, i + 1, key)
                i += 1
                if mb < LARGE_BUFFER // _MB:
                    raise AllocatorConfigError(
                        f"CachingAllocator option {key} too small, must be >= "
                        f"{LARGE_BUFFER // _MB}")
                values["max_split_size" if key == "max_split_size_mb"
                       else "max_non_split_rounding"] = min(mb, SIZE_MAX // _MB) * _MB
            elif key == "garbage_collection_threshold":
                i = _expect(tokens, i + 1, ":")
                try:
                    threshold = float(tokens[i + 1])
                except (IndexError, ValueError):
                    raise AllocatorConfigError(
                        "Error, expecting garbage_collection_threshold value") from None
                i += 1
                if not 0.0 < threshold < 1.0:
                    raise AllocatorConfigError(
                        "garbage_collect_threshold is invalid, set it in (0.0, 1.0)")
                values["garbage_collection_threshold"] = threshold
            elif key == "roundup_power2_divisions":
                i = _expect(tokens, i + 1, ":")
                i = _parse_divisions(tokens, i + 1, divisions)
                values["roundup_power2_divisions"] = tuple(divisions)
            elif key == "expandable_segments":
                i = _expect(tokens, i + 1, ":")
                flag = _flag(tokens, i + 1, key)
                i += 1
                if flag:
                    raise AllocatorConfigError(
                        "PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True is not simulated "
                        "(devlab models CUDA's segments as cudaMalloc makes them); remove it, "
                        "or set expandable_segments:False")
            elif key == "backend":
                i = _expect(tokens, i + 1, ":")
                name = tokens[i + 1] if i + 1 < len(tokens) else ""
                i += 1
                if name == "cudaMallocAsync":
                    raise AllocatorConfigError(
                        "PYTORCH_CUDA_ALLOC_CONF: backend:cudaMallocAsync is not simulated "
                        "(devlab models the native caching allocator); use backend:native")
                if name != "native":
                    raise AllocatorConfigError(
                        "Unknown allocator backend, options are native and cudaMallocAsync")
            elif key in ("release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
                         "pinned_use_background_threads"):
                # Host-side and locking choices: nothing a GPU's memory shows.
                i = _expect(tokens, i + 1, ":")
                _flag(tokens, i + 1, key)
                i += 1
            elif key == "pinned_num_register_threads":
                i = _expect(tokens, i + 1, ":")
                _int(tokens, i + 1, key)
                i += 1
            else:
                raise AllocatorConfigError(f"Unrecognized CachingAllocator option: {key}")
            if i + 1 < len(tokens):
                i = _expect(tokens, i + 1, ",")
            i += 1
        return cls(**values)

    def divisions(self, size: int) -> int:
        """How many parts the power-of-two interval holding `size` is rounded to (0: none)."""
        index = size.bit_length() - 1 - 20  # intervals start at 1 MiB
        return self.roundup_power2_divisions[min(max(index, 0), _INTERVALS - 1)]


def _lex(conf: str) -> list[str]:
    """`AllocatorConfig::lexArgs`: `,` `:` `[` `]` are tokens of their own, spaces vanish."""
    tokens: list[str] = []
    buf = ""
    for ch in conf:
        if ch in ",:[]":
            if buf:
                tokens.append(buf)
                buf = ""
            tokens.append(ch)
        elif ch != " ":
            buf += ch
    if buf:
        tokens.append(buf)
    return tokens


def _expect(tokens: list[str], i: int, ch: str) -> int:
    if i >= len(tokens) or tokens[i] != ch:
        raise AllocatorConfigError(
            f"Error parsing CachingAllocator::AllocatorConfig settings, expected {ch}")
    return i


def _int(tokens: list[str], i: int, key: str) -> int:
    try:
        return int(tokens[i])
    except (IndexError, ValueError):
        raise AllocatorConfigError(f"Error, expecting {key} value") from None


def _flag(tokens: list[str], i: int, key: str) -> bool:
    if i >= len(tokens) or tokens[i] not in ("True", "False"):
        raise AllocatorConfigError(f"Expected a single True/False argument for {key}")
    return tokens[i] == "True"


def power_of_two(n: int) -> bool:
    """Whether `n` is a positive power of two (what the divisions and their intervals must be)."""
    return n > 0 and n & (n - 1) == 0


def _parse_divisions(tokens: list[str], i: int, divisions: list[int]) -> int:
    """`parseRoundUpPower2Divisions`: one number for every interval, or `[MB:N, ..., >:N]`."""
    if i >= len(tokens):
        raise AllocatorConfigError("Error, expecting roundup_power2_divisions value")
    if tokens[i] != "[":
        n = _int(tokens, i, "roundup_power2_divisions")
        if not power_of_two(n):
            raise AllocatorConfigError("For roundups, the divisons has to be power of 2 ")
        divisions[:] = [n] * _INTERVALS
        return i
    first, last = True, 0
    i += 1
    while i < len(tokens) and tokens[i] != "]":
        interval = tokens[i]
        i = _expect(tokens, i + 1, ":")
        n = _int(tokens, i + 1, "roundup_power2_divisions")
        i += 1
        if n != 0 and not power_of_two(n):
            raise AllocatorConfigError(
                "For roundups, the divisons has to be power of 2 or 0 to disable roundup ")
        if interval == ">":
            divisions[last:] = [n] * (_INTERVALS - last)
        else:
            try:
                mb = int(interval)
            except ValueError:
                raise AllocatorConfigError("Error parsing roundup_power2_divisions value") from None
            if not power_of_two(mb):
                raise AllocatorConfigError("For roundups, the intervals have to be power of 2 ")
            index = min(mb.bit_length() - 1, _INTERVALS - 1)
            if first:
                divisions[:index] = [n] * index
                first = False
            divisions[index] = n
            last = index
        if i + 1 < len(tokens) and tokens[i + 1] != "]":
            i = _expect(tokens, i + 1, ",")
        i += 1
    if i >= len(tokens):
        raise AllocatorConfigError(
            "Error parsing CachingAllocator::AllocatorConfig settings, expected ]")
    return i
