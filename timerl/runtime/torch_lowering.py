"""The torch backend's lowering of every primitive, kept apart from the primitives' semantics.

``timerl.ir.prims`` defines what an op means (inference, VJP, traits, the numpy reference
``impl``); this module says how torch computes it. Each entry takes the op's inputs as tensors
and its attributes as keywords, like the reference, and must agree with it value for value
(``tests/ir/test_prims.py`` checks that). Importing this module imports torch, so only the torch
backend does.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from timerl.ir import rowwise
from timerl.ir.graph import Op
from timerl.ir.prims import REGISTRY
from timerl.runtime.backend import plain_reads, static_shape

LOWERINGS: dict[str, Callable[..., Any]] = {}
# primitives this backend does not lower, and why (tests/ir/test_prim_tables.py: every
# primitive is lowered or named here)
NOT_LOWERED: dict[str, str] = {
    "udf": "a host call: the executor calls its Python function on numpy arrays itself",
}
# primitive -> f(op): a lowering for the op's static shapes, or None (``Backend.kernel``)
SPECIALISED: dict[str, Callable[[Op], Callable[..., Any] | None]] = {}


def register_lowering(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Declare torch's computation of primitive ``name``; one lowering per primitive."""
    if name not in REGISTRY:
        raise KeyError(f"no primitive {name!r} to lower")
    if name in LOWERINGS or name in NOT_LOWERED:
        raise KeyError(f"primitive {name!r} already has a torch lowering (or declines one)")
    LOWERINGS[name] = fn
    return fn


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (numpy calls its boolean ``bool_``, torch ``bool``)."""
    return _torch_dtype(np.dtype(dtype))


@functools.lru_cache(maxsize=64)
def _torch_dtype(dt: np.dtype) -> torch.dtype:
    # cached: casts and broadcasts ask per kernel, and numpy's ``dtype.name`` takes about
    # 12 us (5% of an e256 PPO iteration's run time on this backend)
    return getattr(torch, "bool" if dt == np.dtype(bool) else dt.name)


# --- elementwise -------------------------------------------------------------------------------

for _name, _fn in [
    ("neg", lambda x: -x),
    ("exp", torch.exp),
    ("log", torch.log),
    ("tanh", torch.tanh),
    ("sigmoid", torch.sigmoid),
    ("sqrt", torch.sqrt),
    ("abs", torch.abs),
    ("sign", torch.sign),
    ("sin", torch.sin),
    ("cos", torch.cos),
    ("logical_not", torch.logical_not),
    ("floor", torch.floor),
    ("lgamma", torch.lgamma),
    ("digamma", torch.digamma),
    ("trigamma", lambda x: torch.polygamma(1, x)),
    ("add", lambda a, b: a + b),
    ("sub", lambda a, b: a - b),
    ("mul", lambda a, b: a * b),
    ("div", lambda a, b: a / b),
    ("pow", torch.pow),
    ("floordiv", lambda a, b: torch.div(a, b, rounding_mode="floor")),
    ("mod", torch.remainder),
    ("maximum", torch.maximum),
    ("minimum", torch.minimum),
    ("lt", lambda a, b: a < b),
    ("le", lambda a, b: a <= b),
    ("gt", lambda a, b: a > b),
    ("ge", lambda a, b: a >= b),
    ("eq", lambda a, b: a == b),
    ("ne", lambda a, b: a != b),
    ("logical_and", torch.logical_and),
    ("logical_or", torch.logical_or),
    ("where", torch.where),
    ("identity", lambda x: x),
    ("detach", lambda x: x),
]:
    register_lowering(_name, _fn)

# ``to`` hands back the tensor itself for its own dtype; a cast's value is its own (``fresh``)
register_lowering("cast", lambda x, dtype: x.to(torch_dtype(dtype), copy=True))

# the same elementwise primitives written into ``out=`` (an input that dies at the op, of the
# op's shape and dtype: memory/donation.py)
DONATING: dict[str, Callable[..., Any]] = {
    "neg": torch.neg,
    "exp": torch.exp,
    "log": torch.log,
    "tanh": torch.tanh,
    "sqrt": torch.sqrt,
    "abs": torch.abs,
    "sin": torch.sin,
    "cos": torch.cos,
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "pow": torch.pow,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
}

# --- reductions --------------------------------------------------------------------------------


def _reduce(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(x: Any, axes: Any = None, keepdims: bool = False, _sum: bool = False) -> Any:
        axes = tuple(range(x.dim())) if axes is None else tuple(axes)
        if not axes:
            return x.clone()  # a reduction's value is its own (``Traits.shares_input``)
        return fn(x, dim=axes, keepdim=keepdims)

    return run


register_lowering("sum", _reduce(torch.sum))
register_lowering("sumsq", lambda x: torch.dot(x.reshape(-1), x.reshape(-1)))
register_lowering("max", _reduce(torch.amax))
register_lowering(
    "argmax", lambda x, axis, keepdims=False: torch.argmax(x, dim=axis, keepdim=keepdims)
)

# --- movement and indexing ---------------------------------------------------------------------

register_lowering("reshape", lambda x, shape: torch.reshape(x, shape))
register_lowering("permute", lambda x, perm: x.permute(*perm))
register_lowering(
    "expand", lambda x, shape: x.expand(tuple(shape)) if len(shape) else x.reshape(())
)
register_lowering("getitem", lambda x, key: x[key])


def _getitem_grad(g: Any, key: Any, shape: Any) -> Any:
    out = torch.zeros(tuple(shape), dtype=g.dtype, device=g.device)
    out[key] += g
    return out


register_lowering("getitem_grad", _getitem_grad)
register_lowering("narrow", lambda x, axis, start, length: x.narrow(axis, start, length))


def _pad_axis(x: Any, axis: int, before: int, size: int) -> Any:
    shape = list(x.shape)
    shape[axis] = size
    out = torch.zeros(shape, dtype=x.dtype, device=x.device)
    out.narrow(axis, before, x.shape[axis]).copy_(x)
    return out


register_lowering("pad_axis", _pad_axis)
register_lowering("cat", lambda *xs, axis: torch.cat(xs, dim=axis))


def _cpu_vendor() -> str:
    """The CPU's vendor id (``AuthenticAMD``, ``GenuineIntel``; empty where unknown)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


# torch's CPU wheels multiply with MKL, which runs a generic code path on non-Intel CPUs; numpy's
# OpenBLAS picks its kernels by CPU. On this project's 2-core EPYC, one thread, float32, numpy's
# product (``ir/rowwise.dense_matmul``: OpenBLAS and its forms for PPO's shapes) takes about
# half MKL's time on many rows times a weight ((250, 256, 64) @ (64, 64): 20 against 40 ms;
# (4096, 64) @ (64, 64): 1.3 against 2.6 ms) and a tenth of it on few columns ((64, 64000), a
# transposed view, @ (64000, 2): 3.1 against 66 ms). On a few rows torch wins: the two arrays'
# conversion costs about 15 us, and MKL is as fast below about 1,000 rows. So on such a CPU those
# two kinds of CPU products of floats are numpy's, on the tensors' own memory (no copy).
NUMPY_PRODUCTS = torch.backends.mkl.is_available() and _cpu_vendor() not in ("", "GenuineIntel")
NUMPY_MIN_ROWS = 2048  # output rows from which numpy's product is the faster
_NUMPY_BLAS_DTYPES = (torch.float32, torch.float64)


def _numpy_product(*xs: Any) -> bool:
    # on one thread only: beside torch's own pool, numpy's BLAS threads (waiting busy after
    # each product) took the cores torch's threads ran on, and Pong PPO on two threads ran
    # 1.5x slower than with every product torch's (8.3 and 7.5 against 5.4 and 5.1 s an
    # iteration)
    return (
        NUMPY_PRODUCTS
        and torch.get_num_threads() == 1
        and all(
            isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dtype in _NUMPY_BLAS_DTYPES
            for x in xs
        )
    )


def _matmul(a: Any, b: Any) -> Any:
    """``a @ b``; numpy's product where it is the faster BLAS (above)."""
    rows = a.numel() // max(a.shape[-1], 1)
    few_columns = b.shape[-1] <= 8 and a.numel() >= 16384
    if (rows >= NUMPY_MIN_ROWS or few_columns) and a.dtype == b.dtype and _numpy_product(a, b):
        return torch.from_numpy(rowwise.dense_matmul(a.numpy(), b.numpy()))
    return torch.matmul(a, b)


register_lowering("matmul", _matmul)


def _matmul_for(op: Op) -> Callable[..., Any] | None:
    """``torch.matmul`` itself for a product whose static shapes rule numpy's BLAS out
    (``_matmul``'s tests cost 0.8 us of a rollout step's 3 us product of 16 rows)."""
    out, a = static_shape(op.shape), static_shape(op.inputs[0].src.shape[-1:])
    if out is None or a is None or len(out) < 2 or not plain_reads(op):
        return None
    rows, cols = int(np.prod(out[:-1], dtype=np.int64)), out[-1]
    if rows >= NUMPY_MIN_ROWS or (cols <= 8 and rows * a[0] >= 16384):
        return None
    return torch.matmul


SPECIALISED["matmul"] = _matmul_for
register_lowering("gather", lambda x, idx, axis: torch.gather(x, axis, idx))
register_lowering(
    "scatter_add",
    lambda src, idx, axis, shape: torch.zeros(
        tuple(shape), dtype=src.dtype, device=src.device
    ).scatter_add(axis, idx, src),
)
register_lowering("select_at", lambda x, index: x[index])


def _place_at(x: Any, index: int, size: int) -> Any:
    out = torch.zeros((size,) + tuple(x.shape), dtype=x.dtype, device=x.device)
    out[index] = x
    return out


register_lowering("place_at", _place_at)


def _diag_gather(xs: Any, first: int, step: int, shape: Any, dtype: Any, valid: bool = True) -> Any:
    # positions outside x come from points where the read did not apply (see the reference)
    if len(xs) == 0 or not valid:
        return torch.zeros((0 if valid else shape[0],) + tuple(shape[1:]), dtype=torch_dtype(dtype))
    if any(tuple(x.shape[1:]) != tuple(shape[1:]) for x in xs):  # a piece not applying here
        return torch.zeros(tuple(shape), dtype=torch_dtype(dtype))
    zero = torch.zeros(tuple(shape[1:]), dtype=torch_dtype(dtype))
    picks = ((x, first + step * j) for j, x in enumerate(xs))
    return torch.stack([x[k] if 0 <= k < len(x) else zero for x, k in picks])


register_lowering("diag_gather", _diag_gather)


def _take(x: Any, idx: Any, axis: int) -> Any:
    flat = torch.index_select(x, axis, idx.reshape(-1))
    return flat.reshape(tuple(x.shape[:axis]) + tuple(idx.shape) + tuple(x.shape[axis + 1 :]))


def _index_add(src: Any, idx: Any, axis: int, size: int) -> Any:
    rest = list(src.shape[axis + idx.dim() :])
    out = torch.zeros(list(src.shape[:axis]) + [size] + rest, dtype=src.dtype, device=src.device)
    flat = src.reshape(list(src.shape[:axis]) + [-1] + rest)
    return out.index_add(axis, idx.reshape(-1), flat)


def _cumsum(x: Any, axis: int, reverse: bool = False) -> Any:
    if reverse:
        return torch.flip(torch.cumsum(torch.flip(x, (axis,)), dim=axis), (axis,))
    return torch.cumsum(x, dim=axis)


def _take_matmul(x: Any, idx: Any, w: Any, trans: bool = False) -> Any:
    """``x[idx] @ w`` (or ``x[idx].T @ w``), a chunk of rows at a time (``ir/rowwise.py``)."""
    many = idx.numel() >= NUMPY_MIN_ROWS
    if many and _numpy_product(x, w) and x.dtype == w.dtype and idx.device.type == "cpu":
        return torch.from_numpy(rowwise.take_matmul(x.numpy(), idx.numpy(), w.numpy(), trans))
    ids = idx.reshape(-1)
    k = int(np.prod(tuple(x.shape[1:])))
    step = rowwise.chunk_rows(k * x.element_size())
    if trans:
        out = torch.zeros((k, w.shape[-1]), dtype=w.dtype, device=w.device)
        for a in range(0, ids.numel(), step):
            rows = torch.index_select(x, 0, ids[a : a + step]).reshape(-1, k)
            out.addmm_(rows.T, w[a : a + step])
        return out
    out = torch.empty((ids.numel(), w.shape[-1]), dtype=w.dtype, device=w.device)
    for a in range(0, ids.numel(), step):
        rows = torch.index_select(x, 0, ids[a : a + step]).reshape(-1, k)
        torch.matmul(rows, w, out=out[a : a + step])
    return out.reshape(tuple(idx.shape) + (w.shape[-1],))


register_lowering("take", _take)
register_lowering("take_matmul", _take_matmul)
register_lowering("index_add", _index_add)


def _linear_scan(a: Any, c: Any, base: Any, reverse: bool = False) -> Any:
    # one step a row: on the cpu numpy's ufuncs on the same memory cost a third of torch's
    # per-call dispatch (250 steps of two small ops per PPO iteration)
    if a.device.type == "cpu":
        impl = REGISTRY["linear_scan"].impl
        return torch.from_numpy(impl(a.numpy(), c.numpy(), base.numpy(), reverse))
    steps = a.shape[0]
    out = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    if steps == 0:
        return out
    out[steps - 1 if reverse else 0] = base
    for t in range(steps - 2, -1, -1) if reverse else range(1, steps):
        torch.mul(c[t], out[t + 1 if reverse else t - 1], out=out[t])
        out[t].add_(a[t])
    return out


register_lowering("cumsum", _cumsum)
register_lowering("linear_scan", _linear_scan)
register_lowering("argsort", lambda x, axis: torch.argsort(x, dim=axis, stable=True))

# --- sources -----------------------------------------------------------------------------------

register_lowering(
    "full", lambda shape, value, dtype: torch.full(tuple(shape), value, dtype=torch_dtype(dtype))
)
register_lowering("const", lambda value: torch.as_tensor(value))
register_lowering(
    "orthogonal", lambda **attrs: torch.as_tensor(REGISTRY["orthogonal"].impl(**attrs))
)
register_lowering(
    "iota",
    lambda length, dtype="int64": torch.arange(length, dtype=torch_dtype(dtype)),
)


# Random values are the reference's, drawn from the counter-based key: the same numbers on
# every backend, so a program's results do not depend on where it runs.
def _keyed(reference: Callable[..., Any]) -> Callable[..., Any]:
    return lambda shape, dtype, key, batch=(): torch.as_tensor(reference(shape, dtype, key, batch))


register_lowering("uniform", _keyed(REGISTRY["uniform"].impl))
register_lowering("normal", _keyed(REGISTRY["normal"].impl))

# --- structure ---------------------------------------------------------------------------------

register_lowering("tuple_get", lambda x, item, **_: x[item])
register_lowering("merge", lambda *xs: xs[0])
register_lowering("add_n", lambda *xs, **_: sum(xs[1:], xs[0]) if len(xs) > 1 else xs[0].clone())


def _pure_call(*xs: torch.Tensor, fn: Any, **_: Any) -> tuple[torch.Tensor, ...]:
    # evaluated eagerly on the host (``fn.host``), its results moved back to the inputs' device
    device = xs[0].device if xs else torch.device("cpu")
    outs = fn.host(*[x.detach().cpu().numpy() for x in xs])
    return tuple(torch.from_numpy(np.array(o)).to(device) for o in outs)


register_lowering("pure_call", _pure_call)

# --- convolutions and pooling: leading axes folded into torch's batch ---------------------------


def _folded(x: torch.Tensor) -> torch.Tensor:
    """``(*lead, C, H, W)`` as ``(N, C, H, W)``."""
    n = int(np.prod(x.shape[:-3], dtype=np.int64))
    return x.reshape(n, *x.shape[-3:])


def _unfolded(y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return y.reshape(*like.shape[:-3], *y.shape[1:])


def _conv2d(x: Any, w: Any, stride: Any, padding: Any) -> Any:
    xf = _folded(x)

    def conv(layout: torch.memory_format) -> torch.Tensor:
        y = torch.nn.functional.conv2d(
            xf.contiguous(memory_format=layout), w, stride=tuple(stride), padding=tuple(padding)
        )
        return y.contiguous()

    return _unfolded(_in_faster_layout(conv, "conv2d", xf, w, stride, padding), x)


def _conv2d_input_grad(g: Any, w: Any, stride: Any, padding: Any, size: Any) -> Any:
    gf = _folded(g)
    shape = (gf.shape[0], w.shape[1], *size)

    def input_grad(layout: torch.memory_format) -> torch.Tensor:
        gx = torch.nn.grad.conv2d_input(
            shape,
            w,
            gf.contiguous(memory_format=layout),
            stride=tuple(stride),
            padding=tuple(padding),
        )
        return gx.contiguous()

    return _unfolded(_in_faster_layout(input_grad, "input_grad", gf, w, stride, padding), g)


def _conv2d_weight_grad(
    x: Any, g: Any, stride: Any, padding: Any, kernel: Any, batch: int = 0
) -> Any:
    if batch:  # one gradient per point of the kept leading axes
        kept = x.shape[:batch]
        xs, gs = x.reshape(-1, *x.shape[batch:]), g.reshape(-1, *g.shape[batch:])
        parts = [
            _conv2d_weight_grad(a, b, stride, padding, kernel) for a, b in zip(xs, gs, strict=True)
        ]
        return torch.stack(parts).reshape(*kept, g.shape[-3], x.shape[-3], *kernel)
    shape = (g.shape[-3], x.shape[-3], *kernel)
    xf, gf = _folded(x), _folded(g)

    def weight_grad(layout: torch.memory_format) -> torch.Tensor:
        return torch.nn.grad.conv2d_weight(
            xf.contiguous(memory_format=layout),
            shape,
            gf.contiguous(memory_format=layout),
            stride=tuple(stride),
            padding=tuple(padding),
        )

    return _in_faster_layout(weight_grad, "weight_grad", xf, gf, stride, padding)


# On the CPU, oneDNN's convolutions are up to 2.5x faster in channels-last for some shapes and
# 2x slower for others (the weight gradient of a 4-channel 8x8 stride-4 input, the Nature
# CNN's first layer on stacked frames, gains 2.5x; of 3-channel inputs, loses 2x). So each
# shape takes the faster memory layout, timed on its first call (conversions included) and
# kept for the process, as ``cudnn.benchmark`` does on a GPU. The layouts sum in different
# orders: results may differ in the last bits between processes that chose differently.
_LAYOUT: dict[tuple, torch.memory_format] = {}


def _in_faster_layout(
    fn: Callable[[torch.memory_format], torch.Tensor],
    kind: str,
    a: torch.Tensor,
    b: torch.Tensor,
    stride: Any,
    padding: Any,
) -> torch.Tensor:
    if a.device.type != "cpu":
        return fn(torch.contiguous_format)
    key = (kind, tuple(a.shape), tuple(b.shape), tuple(stride), tuple(padding), a.dtype)
    layout = _LAYOUT.get(key)
    if layout is not None:
        return fn(layout)
    _LAYOUT[key], out = _faster_layout(fn)
    return out


def _faster_layout(
    fn: Callable[[torch.memory_format], torch.Tensor],
) -> tuple[torch.memory_format, torch.Tensor]:
    """The faster layout, timed twice each (a first call builds oneDNN's kernel), and its
    last result, so the timing costs three calls more than the op."""
    best: dict[torch.memory_format, tuple[float, torch.Tensor]] = {}
    for layout in (torch.contiguous_format, torch.channels_last) * 2:
        start = time.perf_counter()
        out = fn(layout)
        seconds = time.perf_counter() - start
        if layout not in best or seconds < best[layout][0]:
            best[layout] = (seconds, out)
    faster = min(best, key=lambda layout: best[layout][0])
    return faster, best[faster][1]


def _max_pool2d(x: Any, kernel: Any, stride: Any, padding: Any) -> Any:
    y = torch.nn.functional.max_pool2d(_folded(x), tuple(kernel), tuple(stride), tuple(padding))
    return _unfolded(y, x)


def _max_pool2d_grad(x: Any, g: Any, kernel: Any, stride: Any, padding: Any) -> Any:
    xf = _folded(x)
    _, where = torch.nn.functional.max_pool2d(
        xf, tuple(kernel), tuple(stride), tuple(padding), return_indices=True
    )
    gx = torch.ops.aten.max_pool2d_with_indices_backward(
        _folded(g), xf, list(kernel), list(stride), list(padding), [1, 1], False, where
    )
    return _unfolded(gx, x)


register_lowering("conv2d", _conv2d)
register_lowering("conv2d_input_grad", _conv2d_input_grad)
register_lowering("conv2d_weight_grad", _conv2d_weight_grad)
register_lowering("max_pool2d", _max_pool2d)
register_lowering("max_pool2d_grad", _max_pool2d_grad)
