"""Convolutions and pooling over images (NCHW): ``conv2d`` with its two gradients
(``conv2d_input_grad``, a transposed convolution, and ``conv2d_weight_grad``), ``max_pool2d``
and its gradient ``max_pool2d_grad``.

An image operand is ``(*lead, C, H, W)``: any leading axes (none, a batch, a rollout's steps
and environments) fold into one batch, so running a convolution over a dim (vectorisation) or
a block of rows (incrementalisation) adds a leading axis and keeps the primitive. Weights are
``(O, C, kh, kw)``; ``stride`` and ``padding`` are pairs of ints (zero padding for a
convolution, ``-inf`` for a pool). Channels, spatial sizes and kernels are static.

The numpy reference is im2col: the windows of the padded input are a strided view
(``sliding_window_view``) and one BLAS product (``tensordot``) contracts them with the weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from timerl.errors import ShapeError
from timerl.ir.prims.batching import Batch, Batched, Batching, Decline
from timerl.ir.prims.core import Shape, Traits
from timerl.ir.prims.define import define
from timerl.ir.prims.rows import Decline as RowDecline
from timerl.ir.prims.rows import Numbered, Rows, attrs_key, const_size
from timerl.symbolic import Const, as_expr

Pair = tuple[int, int]


# --- sizes -------------------------------------------------------------------------------------


def out_size(size: int, kernel: int, stride: int, pad: int) -> int:
    """Positions of a window of ``kernel`` along an axis of ``size`` padded by ``pad`` each side."""
    return (size + 2 * pad - kernel) // stride + 1


def _static(shape: Shape, what: str, op: str) -> tuple[int, ...]:
    """The trailing (channel and spatial) sizes of an image or kernel, which must be static."""
    sizes = []
    for s in shape:
        v = const_size(as_expr(s))
        if v is None:
            raise ShapeError(f"{op}: {what} sizes must be static, got {tuple(shape)}")
        sizes.append(v)
    return tuple(sizes)


def _pair(attrs: Mapping[str, Any], key: str) -> Pair:
    a, b = attrs[key]
    return int(a), int(b)


def _windows(op: str, hw: Pair, kernel: Pair, stride: Pair, padding: Pair) -> Pair:
    """The output's spatial size, or a ShapeError naming what does not fit."""
    if min(stride) < 1:
        raise ShapeError(f"{op}: stride must be positive, got {stride}")
    if min(padding) < 0:
        raise ShapeError(f"{op}: padding must be non-negative, got {padding}")
    padded = (hw[0] + 2 * padding[0], hw[1] + 2 * padding[1])
    if kernel[0] > padded[0] or kernel[1] > padded[1]:
        raise ShapeError(
            f"{op}: kernel {kernel} is larger than its padded input {padded} "
            f"(input {hw}, padding {padding})"
        )
    return tuple(out_size(hw[k], kernel[k], stride[k], padding[k]) for k in range(2))  # type: ignore[return-value]


def _image(shape: Shape, op: str, what: str = "input") -> tuple[Shape, int, Pair]:
    if len(shape) < 3:
        raise ShapeError(f"{op}: {what} must be (..., C, H, W), got {tuple(shape)}")
    c, h, w = _static(shape[-3:], f"{what} channel and spatial", op)
    return tuple(shape[:-3]), c, (h, w)


def _float(dtypes: Sequence[np.dtype], op: str) -> np.dtype:
    if not all(np.issubdtype(d, np.floating) for d in dtypes) or len(set(dtypes)) != 1:
        raise ShapeError(
            f"{op}: operands must share one floating dtype, got {[str(d) for d in dtypes]} "
            "(cast images to float first)"
        )
    return np.dtype(dtypes[0])


# --- numpy reference: im2col -------------------------------------------------------------------


def _pad(x: np.ndarray, padding: Pair, value: float = 0.0) -> np.ndarray:
    if padding == (0, 0):
        return x
    widths = [(0, 0)] * (x.ndim - 2) + [(padding[0],) * 2, (padding[1],) * 2]
    return np.pad(x, widths, constant_values=value)


def _cols(x: np.ndarray, kernel: Pair, stride: Pair, padding: Pair, value: float = 0.0):
    """The windows of ``x``: a strided view ``(*lead, C, Ho, Wo, kh, kw)`` (no copy)."""
    xp = _pad(x, padding, value)
    win = np.lib.stride_tricks.sliding_window_view(xp, kernel, axis=(-2, -1))
    return win[..., :: stride[0], :: stride[1], :, :]


def conv2d_ref(x: np.ndarray, w: np.ndarray, stride: Pair, padding: Pair) -> np.ndarray:
    cols = _cols(x, w.shape[-2:], tuple(stride), tuple(padding))
    lead = x.ndim - 3
    # (*lead, C, Ho, Wo, kh, kw) . (O, C, kh, kw) -> (*lead, Ho, Wo, O): one GEMM
    out = np.tensordot(cols, w, axes=([lead, lead + 3, lead + 4], [1, 2, 3]))
    return np.ascontiguousarray(np.moveaxis(out, -1, lead))


def conv2d_input_grad_ref(
    g: np.ndarray, w: np.ndarray, stride: Pair, padding: Pair, size: Pair
) -> np.ndarray:
    lead = g.ndim - 3
    o, c, kh, kw = w.shape
    ho, wo = g.shape[-2:]
    # (O, C, kh, kw) . (*lead, O, Ho, Wo) -> (C, kh, kw, *lead, Ho, Wo), then added back into
    # the windows they came from (col2im: one strided add per kernel offset, each of a
    # contiguous slab), channels first until the end
    cols = np.tensordot(w, g, axes=([0], [lead]))
    (sh, sw), (ph, pw) = stride, padding
    hp, wp = size[0] + 2 * ph, size[1] + 2 * pw
    out = np.zeros((c,) + g.shape[:lead] + (hp, wp), dtype=g.dtype)
    for i in range(kh):
        for j in range(kw):
            out[..., i : i + sh * ho : sh, j : j + sw * wo : sw] += cols[:, i, j]
    out = np.moveaxis(out[..., ph : ph + size[0], pw : pw + size[1]], 0, lead)
    return np.ascontiguousarray(out)


def conv2d_weight_grad_ref(
    x: np.ndarray, g: np.ndarray, stride: Pair, padding: Pair, kernel: Pair, batch: int = 0
) -> np.ndarray:
    cols = _cols(x, tuple(kernel), tuple(stride), tuple(padding))
    lead = x.ndim - 3
    if batch == 0:
        # (*lead, C, Ho, Wo, kh, kw) . (*lead, O, Ho, Wo) over lead, Ho, Wo -> (C, kh, kw, O)
        axes_c = list(range(lead)) + [lead + 1, lead + 2]
        axes_g = list(range(lead)) + [lead + 1, lead + 2]
        out = np.tensordot(cols, g, axes=(axes_c, axes_g))
        return np.ascontiguousarray(np.moveaxis(out, -1, 0))
    letters = "abcdefghij"
    kept, summed = letters[:batch], letters[batch:lead]
    spec = f"{kept}{summed}CHWKL,{kept}{summed}OHW->{kept}OCKL"
    return np.einsum(spec, cols, g, optimize=True).astype(x.dtype, copy=False)


def max_pool2d_ref(x: np.ndarray, kernel: Pair, stride: Pair, padding: Pair) -> np.ndarray:
    cols = _cols(x, tuple(kernel), tuple(stride), tuple(padding), -np.inf)
    return np.ascontiguousarray(cols.max(axis=(-2, -1)))


def max_pool2d_grad_ref(
    x: np.ndarray, g: np.ndarray, kernel: Pair, stride: Pair, padding: Pair
) -> np.ndarray:
    """Each window's gradient goes to its first largest element (row-major), as torch's."""
    cols = _cols(x, tuple(kernel), tuple(stride), tuple(padding), -np.inf)
    best = cols.max(axis=(-2, -1))
    (sh, sw), (ph, pw) = stride, padding
    ho, wo = best.shape[-2:]
    out = np.zeros(x.shape[:-2] + (x.shape[-2] + 2 * ph, x.shape[-1] + 2 * pw), dtype=g.dtype)
    taken = np.zeros(best.shape, dtype=bool)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            hit = (cols[..., i, j] == best) & ~taken
            taken |= hit
            out[..., i : i + sh * ho : sh, j : j + sw * wo : sw] += np.where(hit, g, 0)
    return np.ascontiguousarray(out[..., ph : ph + x.shape[-2], pw : pw + x.shape[-1]])


# --- inference ---------------------------------------------------------------------------------


def _infer_conv2d(shapes, dtypes, attrs):
    x, w = shapes
    lead, c, hw = _image(x, "conv2d")
    if len(w) != 4:
        raise ShapeError(f"conv2d: weight must be (O, C, kh, kw), got {tuple(w)}")
    o, wc, kh, kw = _static(w, "weight", "conv2d")
    if wc != c:
        raise ShapeError(f"conv2d: input has {c} channels, weight {tuple(w)} expects {wc}")
    ho, wo = _windows("conv2d", hw, (kh, kw), _pair(attrs, "stride"), _pair(attrs, "padding"))
    return lead + (Const(o), Const(ho), Const(wo)), _float(dtypes, "conv2d")


def _infer_input_grad(shapes, dtypes, attrs):
    g, w = shapes
    lead, o, got = _image(g, "conv2d_input_grad", "gradient")
    wo_, c, kh, kw = _static(w, "weight", "conv2d_input_grad")
    size = _pair(attrs, "size")
    want = _windows(
        "conv2d_input_grad", size, (kh, kw), _pair(attrs, "stride"), _pair(attrs, "padding")
    )
    if o != wo_ or got != want:
        raise ShapeError(
            f"conv2d_input_grad: gradient {(o, *got)} does not fit weight {tuple(w)} "
            f"over an input of {size} (expected {(wo_, *want)})"
        )
    return lead + (Const(c), Const(size[0]), Const(size[1])), _float(dtypes, "conv2d_input_grad")


def _infer_weight_grad(shapes, dtypes, attrs):
    x, g = shapes
    lead, c, hw = _image(x, "conv2d_weight_grad")
    glead, o, got = _image(g, "conv2d_weight_grad", "gradient")
    kernel = _pair(attrs, "kernel")
    want = _windows(
        "conv2d_weight_grad", hw, kernel, _pair(attrs, "stride"), _pair(attrs, "padding")
    )
    batch = int(attrs.get("batch", 0))
    if len(glead) != len(lead) or got != want or not 0 <= batch <= len(lead):
        raise ShapeError(
            f"conv2d_weight_grad: gradient {tuple(g)} does not fit input {tuple(x)} "
            f"(expected spatial {want}, {batch} kept leading axes)"
        )
    shape = tuple(lead[:batch]) + (Const(o), Const(c), Const(kernel[0]), Const(kernel[1]))
    return shape, _float(dtypes, "conv2d_weight_grad")


def _infer_max_pool2d(shapes, dtypes, attrs):
    lead, c, hw = _image(shapes[0], "max_pool2d")
    kernel, padding = _pair(attrs, "kernel"), _pair(attrs, "padding")
    if padding[0] > kernel[0] // 2 or padding[1] > kernel[1] // 2:
        # a window of padding alone would have no element: its max is not defined
        raise ShapeError(f"max_pool2d: padding {padding} exceeds half the kernel {kernel}")
    ho, wo = _windows("max_pool2d", hw, kernel, _pair(attrs, "stride"), padding)
    return lead + (Const(c), Const(ho), Const(wo)), _float(dtypes[:1], "max_pool2d")


def _infer_max_pool2d_grad(shapes, dtypes, attrs):
    x, g = shapes
    out, _ = _infer_max_pool2d([x], dtypes[:1], attrs)
    if len(g) != len(out) or any(a != b for a, b in zip(g[-3:], out[-3:], strict=True)):
        raise ShapeError(f"max_pool2d_grad: gradient {tuple(g)} is not the pool's {tuple(out)}")
    return tuple(x), _float(dtypes, "max_pool2d_grad")


# --- gradients ---------------------------------------------------------------------------------


def _conv_attrs(op) -> dict[str, Pair]:
    return {"stride": _pair(op.attrs, "stride"), "padding": _pair(op.attrs, "padding")}


def _vjp_conv2d(ap, op, i, o, g):
    x, w = i
    attrs = _conv_attrs(op)
    size = _static(x.shape[-2:], "input spatial", "conv2d")
    kernel = _static(w.shape[-2:], "kernel", "conv2d")
    gx = ap("conv2d_input_grad", g, w, size=size, **attrs)
    gw = ap("conv2d_weight_grad", x, g, kernel=kernel, **attrs)
    return [gx, gw]


def _vjp_input_grad(ap, op, i, o, g):
    # linear in both operands: the transpose of a transposed convolution is a convolution
    gg, w = i
    attrs = _conv_attrs(op)
    kernel = _static(w.shape[-2:], "kernel", "conv2d_input_grad")
    return [ap("conv2d", g, w, **attrs), ap("conv2d_weight_grad", g, gg, kernel=kernel, **attrs)]


def _vjp_max_pool2d(ap, op, i, o, g):
    return [ap("max_pool2d_grad", i[0], g, **dict(op.attrs))]


# --- batching: a new leading axis is one more folded into the batch ---------------------------


def _batch_image_first(b: Batch) -> Batched:
    """Only the image (or its gradient) changes along the dim: the weights stay shared."""
    if b.batched[1:] and any(b.batched[1:]):
        raise Decline("its weights change along the dim (one convolution per set of weights)")
    return Batched(b.op.prim, dict(b.op.attrs))


def _batch_all(b: Batch) -> Batched:
    if not all(b.batched):
        raise Decline("an operand is the same at every point (would need an explicit broadcast)")
    return Batched(b.op.prim, dict(b.op.attrs))


def _batch_weight_grad(b: Batch) -> Batched:
    """One weight gradient per point: keep the new leading axis out of the sum."""
    if not all(b.batched):
        raise Decline("an operand is the same at every point (would need an explicit broadcast)")
    attrs = dict(b.op.attrs)
    attrs["batch"] = int(attrs.get("batch", 0)) + 1
    return Batched(b.op.prim, attrs)


# --- rows: each image's result is its own -----------------------------------------------------


def _image_blocks(op, axis: int, out: Shape, shapes: Sequence[Shape]) -> tuple[int | None, ...]:
    """Rows along a leading axis of the image (and of a gradient shaped like it)."""
    if axis >= len(out) - 3:
        raise RowDecline("rows along a channel or spatial axis mix under the kernel")
    return (axis,) + (None,) * (len(shapes) - 1)


def _pool_grad_blocks(op, axis: int, out: Shape, shapes: Sequence[Shape]) -> tuple[int | None, ...]:
    """The pooled image and its gradient share their leading axes."""
    return (_image_blocks(op, axis, out, shapes)[0],) * 2


def _weight_grad_sum(op, shapes: Sequence[Shape]) -> dict[int, tuple[int | None, ...]]:
    """The weight gradient over all rows is the sum of its gradients over blocks of rows."""
    x, g = shapes
    n = const_size(x[0]) if len(x) > 3 else None
    if n is None or op.attrs.get("batch", 0) or const_size(g[0]) != n:
        return {}
    return {n: (0, 0)}


def _image_key(op, vals: list[Numbered]) -> tuple | None:
    """Stacked images through shared weights: each image's result is its own."""
    if not vals[0].row or vals[0].rank < 4 or any(v.row for v in vals[1:]):
        return None
    attrs = attrs_key(op)
    return None if attrs is None else (op.prim, attrs)


IMAGE_ROWS = Rows(blocks=_image_blocks, stacks=_image_key)


# --- cost --------------------------------------------------------------------------------------


def _channels(sizes, k: int, axis: int, weights: int) -> float:
    o = sizes.axis(k, axis)
    return float(o) if o else max(1.0, weights**0.5)  # no shapes: a square kernel matrix


def _cost_conv2d(sizes, attrs) -> float:
    """``2`` operations per output element and weight of its output channel."""
    w = sizes.read(1)
    return 2.0 * sizes.out() * w / _channels(sizes, 1, 0, w)


def _cost_input_grad(sizes, attrs) -> float:
    """As the convolution it transposes: per gradient element, one weight row."""
    w = sizes.read(1)
    return 2.0 * sizes.read(0) * w / _channels(sizes, 1, 0, w)


def _cost_weight_grad(sizes, attrs) -> float:
    """As the convolution: per output gradient element, one weight row (of one kept point)."""
    w = sizes.out()
    kept = 1.0
    for a in range(int(attrs.get("batch", 0))):
        kept *= sizes.axis(1, a) or 1  # no shapes: counted as one
    return 2.0 * sizes.read(1) * w / (kept * _channels(sizes, 1, -3, w))


def _cost_pool(sizes, attrs) -> float:
    kh, kw = _pair(attrs, "kernel")
    return float(sizes.out() * kh * kw)


def _cost_pool_grad(sizes, attrs) -> float:
    kh, kw = _pair(attrs, "kernel")
    return 2.0 * sizes.read(1) * kh * kw


NO_IDENTITIES = ()  # no algebraic identity of its own (zero weights fold as any constant)

define(
    "conv2d",
    _infer_conv2d,
    conv2d_ref,
    _vjp_conv2d,
    traits=Traits(fresh=True),
    cost=_cost_conv2d,
    batching=Batching(_batch_image_first),
    rows=IMAGE_ROWS,
    simplify=NO_IDENTITIES,
)

define(
    "conv2d_input_grad",
    _infer_input_grad,
    conv2d_input_grad_ref,
    _vjp_input_grad,
    traits=Traits(fresh=True),
    cost=_cost_input_grad,
    batching=Batching(_batch_image_first),
    rows=IMAGE_ROWS,
    simplify=NO_IDENTITIES,
)

define(
    "conv2d_weight_grad",
    _infer_weight_grad,
    conv2d_weight_grad_ref,
    differentiable=False,
    traits=Traits(fresh=True),
    cost=_cost_weight_grad,
    batching=Batching(_batch_weight_grad),
    rows=Rows(accumulates=_weight_grad_sum),
    simplify=NO_IDENTITIES,
)

define(
    "max_pool2d",
    _infer_max_pool2d,
    max_pool2d_ref,
    _vjp_max_pool2d,
    traits=Traits(fresh=True),
    cost=_cost_pool,
    batching=Batching(_batch_all),
    rows=IMAGE_ROWS,
    simplify=NO_IDENTITIES,
)

define(
    "max_pool2d_grad",
    _infer_max_pool2d_grad,
    max_pool2d_grad_ref,
    differentiable=False,
    traits=Traits(fresh=True),
    cost=_cost_pool_grad,
    batching=Batching(_batch_all),
    rows=Rows(blocks=_pool_grad_blocks),
    simplify=NO_IDENTITIES,
)
