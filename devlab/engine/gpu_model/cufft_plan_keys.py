"""cuFFT's plan cache, as PyTorch keeps one per CUDA GPU: which plans an FFT makes, and the LRU
that holds them. Pure (sizes and strides in, plan keys out), a port of
aten/src/ATen/native/cuda/CuFFTPlanCache.h (`CuFFTParams`, `CuFFTParamsLRUCache`) and
SpectralOps.cpp (`_exec_fft`, `_fft_{c2c,r2c,c2r}_cufft`), so it is tested without running an op.

A plan's key is what `CuFFTParams` holds: the signal sizes with the batch first (two-sided),
the input and output strides of the batched tensors `_exec_fft` hands cuFFT, the transform
type (C2C, R2C, C2R) and the real value type. Direction and normalization are not in it: a
forward and an inverse C2C of one geometry share a plan.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

# CUDA >= 10: at most size_t's largest plans (CUFFT_MAX_PLAN_NUM), 4096 by default.
DEFAULT_MAX_SIZE = 4096
MAX_PLAN_NUM = 2**64 - 1
# cuFFT plans at most 3 signal dimensions at once (`cufft_max_ndim`).
MAX_NDIM = 3


class PlanKey(NamedTuple):
    """`CuFFTParams`: (batch, *signal) sizes, input and output strides, type, value type."""

    sizes: tuple[int, ...]
    input_strides: tuple[int, ...]
    output_strides: tuple[int, ...]
    fft_type: str  # "C2C", "R2C" or "C2R"
    value_type: str  # the real dtype's name: "float32", "float64"


class PlanCache:
    """`CuFFTParamsLRUCache`: the most recently used plans, at most `max_size` of them."""

    def __init__(self, max_size: int = DEFAULT_MAX_SIZE) -> None:
        self._plans: OrderedDict[PlanKey, None] = OrderedDict()
        self._max_size = check_max_size(max_size)

    @property
    def max_size(self) -> int:
        return self._max_size

    @property
    def size(self) -> int:
        return len(self._plans)

    def resize(self, new_size: int) -> None:
        """Set the capacity, dropping the least recently used plans beyond it."""
        self._max_size = check_max_size(new_size)
        while len(self._plans) > self._max_size:
            self._plans.popitem(last=False)

    def lookup(self, key: PlanKey) -> bool:
        """Use the plan for `key` (True: it was cached). With max_size 0 torch makes an
        uncached plan each time, so nothing is kept."""
        if self._max_size == 0:
            return False
        if key in self._plans:
            self._plans.move_to_end(key)
            return True
        if len(self._plans) >= self._max_size:
            self._plans.popitem(last=False)
        self._plans[key] = None
        return False

    def clear(self) -> None:
        self._plans.clear()

    def keys(self) -> list[PlanKey]:
        """The cached keys, least recently used first."""
        return list(self._plans)


def check_max_size(new_size: int) -> int:
    """`_set_max_size`'s checks, in torch's words."""
    if new_size < 0:
        raise RuntimeError(f"cuFFT plan cache size must be non-negative, but got {new_size}")
    if new_size > MAX_PLAN_NUM:
        raise RuntimeError(f"cuFFT plan cache size can not be larger than {MAX_PLAN_NUM}, "
                           f"but got {new_size}")
    return int(new_size)


def contiguous_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def _view_strides(shape: Sequence[int], stride: Sequence[int], new: Sequence[int]
                  ) -> tuple[int, ...] | None:
    """`at::detail::computeStride`: the strides of `reshape` as a view, None where it copies."""
    if not shape:
        return tuple(1 for _ in new)
    newstride = [0] * len(new)
    view_d = len(new) - 1
    chunk_base = stride[-1]
    tensor_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and stride[d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new[view_d] == 1):
                newstride[view_d] = view_numel * chunk_base
                view_numel *= new[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base = stride[d - 1]
                tensor_numel = view_numel = 1
    return tuple(newstride) if view_d == -1 else None


class Tensor(NamedTuple):
    """What a plan depends on of a tensor: sizes, strides, complex or not."""

    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    complex: bool


def exec_fft(inp: Tensor, out_sizes: Sequence[int], dim: Sequence[int], out_complex: bool,
             value_type: str) -> tuple[PlanKey, Tensor]:
    """`_exec_fft`: the plan key of one cuFFT call over dims `dim`, and the output it leaves
    (re-strided to the input's batch order)."""
    ndim, signal_ndim = len(inp.sizes), len(dim)
    batch_dims = ndim - signal_ndim
    batch = [d for d in range(ndim) if d not in dim]
    batch.sort(key=lambda d: -inp.strides[d])  # std::sort: stride order, largest first
    perm = batch + list(dim)
    psizes = [inp.sizes[p] for p in perm]
    pstrides = [inp.strides[p] for p in perm]
    batch_size = 1
    for s in psizes[:batch_dims]:
        batch_size *= s
    batched = [batch_size, *psizes[batch_dims:]]
    in_strides = _view_strides(psizes, pstrides, batched) or contiguous_strides(batched)
    signal = [batch_size] + [max(psizes[batch_dims + i], out_sizes[d]) for i, d in
                             enumerate(dim)]
    batched_out = [batch_size] + [out_sizes[d] for d in dim]
    out_strides = contiguous_strides(batched_out)
    fft_type = {(True, True): "C2C", (True, False): "C2R", (False, True): "R2C"}[
        (inp.complex, out_complex)]
    key = PlanKey(tuple(signal), tuple(in_strides), out_strides, fft_type, value_type)
    # The output, back in the input's dimension order (as_strided_ at _exec_fft's end).
    final = [0] * ndim
    numel = 1
    for i in range(batch_dims - 1, -1, -1):
        final[perm[i]] = numel * out_strides[0]
        numel *= out_sizes[perm[i]]
    for i in range(batch_dims, ndim):
        final[perm[i]] = out_strides[1 + i - batch_dims]
    return key, Tensor(tuple(out_sizes), tuple(final), out_complex)


def _optimized(dim: Sequence[int]) -> bool:
    """`use_optimized_cufft_path`: one cuFFT call for the whole transform."""
    return not (len(dim) > MAX_NDIM or (len(dim) >= 2 and dim[0] == 0 and dim[1] == 1))


def c2c_plans(inp: Tensor, dim: Sequence[int], value_type: str) -> list[PlanKey]:
    """The plans of `_fft_c2c_cufft`: up to 3 dims a call, smallest strides first."""
    return _c2c(inp, dim, value_type)[0]


def _c2c(inp: Tensor, dim: Sequence[int], value_type: str) -> tuple[list[PlanKey], Tensor]:
    keys: list[PlanKey] = []
    if not dim:
        return keys, inp
    sorted_dims = list(dim)
    working = inp
    while sorted_dims:
        sorted_dims.sort(key=lambda d: -working.strides[d])
        take = min(MAX_NDIM, len(sorted_dims))
        key, out = exec_fft(working, inp.sizes, sorted_dims[-take:], True, value_type)
        keys.append(key)
        sorted_dims = sorted_dims[:-take]
        working = out
    return keys, working


def r2c_plans(inp: Tensor, dim: Sequence[int], onesided: bool, value_type: str,
              storage_offset: int = 0) -> list[PlanKey]:
    """The plans of `_fft_r2c_cufft` (its input over-aligned as complex: an odd element offset
    is cloned with the last signal dim innermost)."""
    sizes = list(inp.sizes)
    last = dim[-1]
    half = list(sizes)
    half[last] = sizes[last] // 2 + 1
    out_sizes = half if onesided else sizes
    working = inp
    if storage_offset % 2:
        moved = [d for d in range(len(sizes)) if d != last] + [last]
        cs = contiguous_strides([sizes[d] for d in moved])
        strides = [0] * len(sizes)
        for i, d in enumerate(moved):
            strides[d] = cs[i]
        working = Tensor(inp.sizes, tuple(strides), False)
    if _optimized(dim):
        return [exec_fft(working, out_sizes, dim, True, value_type)[0]]
    key, out = exec_fft(working, out_sizes if len(dim) == 1 else half, [last], True,
                        value_type)
    keys = [key]
    rest = list(dim[:-1])
    while rest:
        rest.sort(key=lambda d: -out.strides[d])
        take = min(MAX_NDIM, len(rest))
        key, out = exec_fft(out, half, rest[-take:], True, value_type)
        keys.append(key)
        rest = rest[:-take]
    return keys


def c2r_plans(inp: Tensor, dim: Sequence[int], last_dim_size: int, value_type: str
              ) -> list[PlanKey]:
    """The plans of `_fft_c2r_cufft`: its input is cloned contiguous first (gh-34551)."""
    out_sizes = list(inp.sizes)
    out_sizes[dim[-1]] = last_dim_size
    if _optimized(dim):
        temp = Tensor(inp.sizes, contiguous_strides(inp.sizes), True)
        return [exec_fft(temp, out_sizes, dim, False, value_type)[0]]
    keys: list[PlanKey] = []
    temp = Tensor(inp.sizes, contiguous_strides(inp.sizes), True)  # the clone
    if len(dim) > 1:
        keys, temp = _c2c(inp, dim[:-1], value_type)
    keys.append(exec_fft(temp, out_sizes, [dim[-1]], False, value_type)[0])
    return keys
