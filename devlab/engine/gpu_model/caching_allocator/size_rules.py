"""The caching allocator's size rules (`CUDACachingAllocator.cpp`'s `round_size`,
`get_allocation_size` and `get_free_block`'s test): what a request is rounded to, the segment a
request needs when nothing cached serves it, and whether a cached block may serve it.

`CachingAllocator.allocate` writes the first two out inline for the plain settings (See Note
[The allocator's hot path] in state_machine.py); these are the rules it follows.
"""

from __future__ import annotations

from devlab.engine.gpu_model.caching_allocator.alloc_conf import (
    KMIN_BLOCK,
    LARGE_BUFFER,
    MIN_LARGE_ALLOC,
    ROUND_LARGE,
    SMALL_BUFFER,
    SMALL_SIZE,
    AllocatorConfig,
    power_of_two,
)


def round_size(size: int, config: AllocatorConfig) -> int:
    """A request's size as the allocator hands it out (`round_size`)."""
    if size < KMIN_BLOCK:
        return KMIN_BLOCK
    divisions = config.divisions(size)
    if divisions > 1 and size > KMIN_BLOCK * divisions:
        return _roundup_power2_next_division(size, divisions)
    return (size + KMIN_BLOCK - 1) // KMIN_BLOCK * KMIN_BLOCK


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    if power_of_two(size):
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def segment_size(size: int) -> int:
    """The cudaMalloc a rounded request needs when no cached block fits
    (`get_allocation_size`)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


def serves(block_size: int, size: int, max_split: int, max_non_split_rounding: int) -> bool:
    """Whether the smallest cached block that fits a rounded request of `size` bytes, of
    `block_size` bytes, may serve it (`get_free_block`'s test): an oversize block (of
    max_split_size or more) is not split for a smaller request, nor handed out whole for one
    `max_non_split_rounding` or more smaller than itself. The one statement of the fit
    decision: `allocate` and `refusal` both ask it."""
    if size < max_split:
        return block_size < max_split
    return block_size < size + max_non_split_rounding
