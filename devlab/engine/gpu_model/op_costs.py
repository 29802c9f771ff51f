"""Which rule an op follows, and the shapes its rule reads: `predict(op, shapes, dtype, gpu)`.

Op names are aten's (`mm`, `addmm`, `bmm`, `linear`, `matmul`, `conv2d`, `softmax`, ...),
with or without the `aten::` prefix and a trailing `_` (in place); which family each op is in
is devlab.engine.gpu_model.ops_catalog's (pure Python too). Matrix products and
convolutions follow the tile rule; every other op moves its inputs' and output's bytes at the
achieved bandwidth of its family (softmax and layer-norm kernels have their own; reductions,
embedding lookups and copies use the element-wise one).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from devlab.engine.gpu_model.kernels import (
    COPY,
    ELEMENTWISE,
    EMBEDDING,
    GEMM,
    LAYER_NORM,
    REDUCTION,
    SOFTMAX,
    Kernel,
    gemm,
    memory_bound,
)
from devlab.engine.gpu_model.ops_catalog import added
from devlab.engine.gpu_model.ops_catalog import family as _catalog_family
from devlab.engine.gpu_model.specs import GpuSpec, gpu

Shape = Sequence[int]

# The bytes a backward kernel moves for each input that needs a gradient, as a multiple of the
# forward's (no measurements: from what the kernels read and write). An element-wise op's
# gradient reads the incoming gradient and the saved input(s) and writes one gradient;
# softmax's reads its output and the gradient (3 tensors for 2); layer norm's also reduces
# the weight's and bias's gradients over the rows.
BACKWARD_BYTES = {ELEMENTWISE: 1.0, REDUCTION: 1.0, EMBEDDING: 1.0, COPY: 1.0, SOFTMAX: 1.5,
                  LAYER_NORM: 2.0}
ITEMSIZE = {"float32": 4, "tf32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8,
            "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


def family(op: str) -> str:
    """The rule `op` follows: its family in devlab.engine.gpu_model.ops_catalog (element-wise for any op not
    listed there)."""
    return _catalog_family(op) or ELEMENTWISE


def gemm_dims(op: str, shapes: Sequence[Shape], out: Shape | None = None
              ) -> tuple[int, int, int, int, bool]:
    """(batch, m, n, k, batched) of a matrix product or convolution: `batch` products of
    (m x k) by (k x n). Convolutions are implicit GEMMs: m = output pixels x images,
    n = output channels, k = input channels per group x kernel pixels, one per group."""
    name = op.removeprefix("aten::").split(".")[0].rstrip("_")
    if added(name):
        shapes = shapes[1:]
    if name.startswith("conv_transpose"):
        # Its weight is (in, out / groups, *kernel): each input pixel spreads over the
        # kernel's pixels of every output channel (the gradient of a convolution).
        x, w = shapes[0], shapes[1]
        groups = max(1, x[1] // max(1, w[0]))
        return groups, x[0] * prod(x[2:]), w[1] * prod(w[2:]), w[0] // groups, False
    if name.startswith("conv") or name in ("convolution", "_convolution"):
        x, w = shapes[0], shapes[1]
        if out is None:
            raise ValueError(f"{op}: the output shape is needed to cost a convolution")
        groups = max(1, x[1] // max(1, w[1]))
        return groups, out[0] * prod(out[2:]), w[0] // groups, w[1] * prod(w[2:]), False
    if name == "linear":
        x, w = shapes[0], shapes[1]
        return 1, prod(x[:-1]) if len(x) > 1 else 1, w[0], x[-1], False
    if name == "scaled_dot_product_attention":
        q, k = shapes[0], shapes[1]
        return prod(q[:-2]), q[-2], k[-2], q[-1], True
    a, b = shapes[0], shapes[1]
    if len(a) == 1:
        a = (1, a[0])
    if len(b) == 1:
        b = (b[0], 1)
    if len(b) == 2:  # a's leading dimensions fold into its rows: one product
        return 1, prod(a[:-1]), b[-1], a[-1], False
    batch = max(prod(a[:-2]), prod(b[:-2]))
    return batch, a[-2], b[-1], a[-1], True


def _nbytes(shapes: Sequence[Shape], out: Shape | None, itemsize: int) -> int:
    return (sum(prod(s) for s in shapes) + (prod(out) if out is not None else 0)) * itemsize


def predict(op: str, shapes: Sequence[Shape], dtype: str = "float32",
            gpu_name: str | GpuSpec = "T4", out: Shape | None = None) -> Kernel:
    """The modeled kernel of `op` on inputs of these `shapes` in `dtype` on GPU `gpu_name`.

    `out` is the output's shape (needed for convolutions; for memory-bound ops it adds the
    output's bytes, else the largest input's are counted as written).
    """
    spec = gpu(gpu_name)
    itemsize = ITEMSIZE.get(dtype, 4)
    kind = family(op)
    if kind == GEMM:
        batch, m, n, k, batched = gemm_dims(op, shapes, out)
        name = op.removeprefix("aten::").split(".")[0]
        extra = sum(prod(s) for s in shapes[:1]) * itemsize if name in (
            "addmm", "baddbmm") else (prod(shapes[2]) * itemsize if name == "linear"
                                      and len(shapes) > 2 else 0)
        return gemm(spec, batch, m, n, k, dtype, itemsize, batched, extra)
    if out is None:
        out = max(shapes, key=prod) if kind != REDUCTION else ()
    if kind == EMBEDDING:  # a lookup reads the rows it gathers, not the whole table
        return memory_bound(spec, kind, 2 * prod(out) * itemsize)
    return memory_bound(spec, kind, _nbytes(shapes, out, itemsize), row=_row(op, kind, shapes),
                        itemsize=itemsize)


# The ops whose kernels reduce rows of their input's last dimension (softmax over dim=-1, the
# usual; layer norm over its normalized shape's last): the rows kernels.py reads the L2 by.
_ROWS = {"softmax", "_softmax", "log_softmax", "_log_softmax", "layer_norm", "native_layer_norm",
         "rms_norm", "cross_entropy", "cross_entropy_loss"}


def _row(op: str, kind: str, shapes: Sequence[Shape]) -> int:
    """The length of the rows a softmax or layer norm reduces (0: not known)."""
    name = op.removeprefix("aten::").split(".")[0].rstrip("_")
    if kind not in (SOFTMAX, LAYER_NORM) or name not in _ROWS or not shapes or not shapes[0]:
        return 0
    return int(shapes[0][-1])


def backward(op: str, shapes: Sequence[Shape], dtype: str = "float32",
             gpu_name: str | GpuSpec = "T4", out: Shape | None = None,
             needs_grad: Sequence[bool] | None = None) -> list[Kernel]:
    """The kernels of `op`'s backward: one per input that needs a gradient (all by default).
    A product's gradient for an operand is itself a product (dA = dC Bᵀ, dB = Aᵀ dC);
    a memory-bound op's moves `BACKWARD_BYTES` times the forward's bytes."""
    spec = gpu(gpu_name)
    needs = list(needs_grad) if needs_grad is not None else [True] * len(shapes)
    forward = predict(op, shapes, dtype, spec, out)
    if forward.family != GEMM:
        scaled = memory_bound(spec, forward.family,
                              int(forward.nbytes * BACKWARD_BYTES[forward.family]))
        return [scaled for need in needs if need]
    batch, m, n, k, batched = gemm_dims(op, shapes, out)
    itemsize = ITEMSIZE.get(dtype, 4)
    return gemm_backward(spec, batch, m, n, k, dtype, itemsize, batched, sum(needs))


def gemm_backward(spec: GpuSpec, batch: int, m: int, n: int, k: int, dtype: str,
                  itemsize: int, batched: bool, count: int) -> list[Kernel]:
    """The first `count` of a product's two gradient products: the input's (m x n by n x k)
    and the weight's (k x m by m x n)."""
    grads = [gemm(spec, batch, m, k, n, dtype, itemsize, batched),
             gemm(spec, batch, k, n, m, dtype, itemsize, batched)]
    return grads[:min(count, 2)]
