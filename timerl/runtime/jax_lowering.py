"""The JAX backend's lowering of every primitive, kept apart from the primitives' semantics.

Like ``torch_lowering``: each entry takes the op's inputs as arrays and its attributes as
keywords, and must agree with the numpy reference ``impl`` value for value
(``tests/runtime/test_jax_backend.py`` checks every entry). Every lowering is a pure ``jnp``
function of its inputs, so a run of them can be traced into one ``jax.jit`` region
(``runtime/regions.py``); the two random primitives are the exception (see below). Importing
this module imports jax, so only the jax backend does.

64-bit types: the IR declares float64/int64 (numpy's defaults), which jax truncates to 32
bits unless ``jax_enable_x64`` is on. The backend turns it on only while it runs or makes
arrays (``jax.enable_x64(True)``, a thread-local scope), not process-wide, so other jax code in
the same process (a baseline, a user's model) keeps jax's default.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np

from timerl.ir import counter_rng
from timerl.ir.prims import REGISTRY

LOWERINGS: dict[str, Callable[..., Any]] = {}
# primitives this backend does not lower, and why (tests/ir/test_prim_tables.py: every
# primitive is lowered or named here)
NOT_LOWERED: dict[str, str] = {
    "udf": "a host call: the executor calls its Python function on numpy arrays itself",
}

# Per-point attributes these lowerings also accept as traced scalars (inside ``jax.jit``), so
# an op whose index or fill value changes with the point still joins a jitted region; any
# other per-point attribute (a shape, a length) must be a Python int.
TRACED_ATTRS: dict[str, tuple[str, ...]] = {
    "select_at": ("index",),
    "narrow": ("start",),
    "full": ("value",),
    "place_at": ("index",),
}


def register_lowering(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Declare jax's computation of primitive ``name``; one lowering per primitive."""
    if name not in REGISTRY:
        raise KeyError(f"no primitive {name!r} to lower")
    if name in LOWERINGS or name in NOT_LOWERED:
        raise KeyError(f"primitive {name!r} already has a jax lowering (or declines one)")
    LOWERINGS[name] = fn
    return fn


# --- elementwise -------------------------------------------------------------------------------

for _name, _fn in [
    ("neg", jnp.negative),
    ("exp", jnp.exp),
    ("log", jnp.log),
    ("tanh", jnp.tanh),
    ("sigmoid", jax.nn.sigmoid),
    ("sqrt", jnp.sqrt),
    ("abs", jnp.abs),
    ("sign", jnp.sign),
    ("sin", jnp.sin),
    ("cos", jnp.cos),
    ("logical_not", jnp.logical_not),
    ("floor", jnp.floor),
    ("lgamma", jax.scipy.special.gammaln),
    ("digamma", jax.scipy.special.digamma),
    ("trigamma", lambda x: jax.scipy.special.polygamma(1, x)),
    ("add", jnp.add),
    ("sub", jnp.subtract),
    ("mul", jnp.multiply),
    ("div", jnp.true_divide),
    ("pow", jnp.power),
    ("floordiv", jnp.floor_divide),
    ("mod", jnp.mod),
    ("maximum", jnp.maximum),
    ("minimum", jnp.minimum),
    ("lt", jnp.less),
    ("le", jnp.less_equal),
    ("gt", jnp.greater),
    ("ge", jnp.greater_equal),
    ("eq", jnp.equal),
    ("ne", jnp.not_equal),
    ("logical_and", jnp.logical_and),
    ("logical_or", jnp.logical_or),
    ("where", jnp.where),
    ("identity", lambda x: x),
    ("detach", lambda x: x),
]:
    register_lowering(_name, _fn)

register_lowering("cast", lambda x, dtype: jnp.asarray(x).astype(np.dtype(dtype)))

# --- reductions --------------------------------------------------------------------------------


def _reduce(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(x: Any, axes: Any = None, keepdims: bool = False, _sum: bool = False) -> Any:
        if axes is not None and not tuple(axes):
            return x
        return fn(x, axis=None if axes is None else tuple(axes), keepdims=keepdims)

    return run


register_lowering("sum", _reduce(jnp.sum))
register_lowering("sumsq", lambda x: jnp.vdot(x, x))
register_lowering("max", _reduce(jnp.max))
register_lowering(
    "argmax", lambda x, axis, keepdims=False: jnp.argmax(x, axis=axis, keepdims=keepdims)
)

# --- movement and indexing ---------------------------------------------------------------------

register_lowering("reshape", lambda x, shape: jnp.reshape(x, tuple(shape)))
register_lowering("permute", lambda x, perm: jnp.transpose(x, tuple(perm)))
register_lowering("expand", lambda x, shape: jnp.broadcast_to(x, tuple(shape)))
register_lowering("getitem", lambda x, key: jnp.asarray(x)[key])
register_lowering(
    "getitem_grad",
    lambda g, key, shape: jnp.zeros(tuple(shape), dtype=g.dtype).at[key].add(g),
)
register_lowering(
    "narrow",
    lambda x, axis, start, length: jax.lax.dynamic_slice_in_dim(x, start, length, axis=axis),
)


def _pad_axis(x: Any, axis: int, before: int, size: int) -> Any:
    axis = axis % x.ndim
    widths = [(0, 0)] * x.ndim
    widths[axis] = (before, size - before - x.shape[axis])
    return jnp.pad(x, widths)


register_lowering("pad_axis", _pad_axis)
register_lowering("cat", lambda *xs, axis: jnp.concatenate(xs, axis=axis))
register_lowering("matmul", jnp.matmul)
register_lowering("gather", lambda x, idx, axis: jnp.take_along_axis(x, idx, axis=axis))


def _scatter_add(src: Any, idx: Any, axis: int, shape: Any) -> Any:
    grid = list(jnp.indices(idx.shape, sparse=True))
    grid[axis] = idx
    return jnp.zeros(tuple(shape), dtype=src.dtype).at[tuple(grid)].add(src)


register_lowering("scatter_add", _scatter_add)
register_lowering("select_at", lambda x, index: x[index])
register_lowering(
    "place_at",
    lambda x, index, size: jnp.zeros((size,) + tuple(x.shape), dtype=x.dtype).at[index].set(x),
)


def _diag_gather(xs: Any, first: int, step: int, shape: Any, dtype: Any, valid: bool = True) -> Any:
    # positions outside x come from points where the read did not apply (see the reference)
    if len(xs) == 0 or not valid:
        return jnp.zeros((0 if valid else shape[0],) + tuple(shape[1:]), dtype=np.dtype(dtype))
    if any(tuple(x.shape[1:]) != tuple(shape[1:]) for x in xs):  # a piece not applying here
        return jnp.zeros(tuple(shape), dtype=np.dtype(dtype))
    zero = jnp.zeros(tuple(shape[1:]), dtype=np.dtype(dtype))
    picks = ((x, first + step * j) for j, x in enumerate(xs))
    return jnp.stack([x[k] if 0 <= k < len(x) else zero for x, k in picks])


register_lowering("diag_gather", _diag_gather)


def _index_add(src: Any, idx: Any, axis: int, size: int) -> Any:
    # the reference's layout: the output's indexed axis first, the source's first index axis
    # first, both flattened the same way
    rest = tuple(src.shape[axis + idx.ndim :])
    out = jnp.zeros((size,) + tuple(src.shape[:axis]) + rest, dtype=src.dtype)
    flat = jnp.moveaxis(src, axis, 0).reshape((-1,) + tuple(out.shape[1:]))
    return jnp.moveaxis(out.at[idx.reshape(-1)].add(flat), 0, axis)


def _cumsum(x: Any, axis: int, reverse: bool = False) -> Any:
    if reverse:
        return jnp.flip(jnp.cumsum(jnp.flip(x, axis), axis=axis), axis)
    return jnp.cumsum(x, axis=axis)


register_lowering("take", lambda x, idx, axis: jnp.take(x, idx, axis=axis))


def _take_matmul(x: Any, idx: Any, w: Any, trans: bool = False) -> Any:
    # XLA fuses the gather into the product; no chunking needed (its arrays are immutable)
    rows = jnp.take(x, idx.reshape(-1), axis=0).reshape(idx.size, -1)
    if trans:
        return rows.T @ w
    return (rows @ w).reshape(tuple(idx.shape) + (w.shape[-1],))


register_lowering("take_matmul", _take_matmul)
register_lowering("index_add", _index_add)


def _linear_scan(a: Any, c: Any, base: Any, reverse: bool = False) -> Any:
    def step(x: Any, ac: tuple[Any, Any]) -> tuple[Any, Any]:
        y = ac[0] + ac[1] * x
        return y, y

    if a.shape[0] == 0:
        return jnp.zeros(a.shape, dtype=a.dtype)
    base = jnp.broadcast_to(base, a.shape[1:])  # a number written to a spatial recurrence
    steps = (a[:-1], c[:-1]) if reverse else (a[1:], c[1:])
    _, ys = jax.lax.scan(step, base, steps, reverse=reverse)
    parts = [ys, base[None]] if reverse else [base[None], ys]
    return jnp.concatenate(parts, axis=0)


register_lowering("cumsum", _cumsum)
register_lowering("linear_scan", _linear_scan)
register_lowering("argsort", lambda x, axis: jnp.argsort(x, axis=axis, stable=True))

# --- sources -----------------------------------------------------------------------------------

register_lowering(
    "full", lambda shape, value, dtype: jnp.full(tuple(shape), value, dtype=np.dtype(dtype))
)
register_lowering("const", lambda value: jnp.asarray(value))
register_lowering("orthogonal", lambda **attrs: jnp.asarray(REGISTRY["orthogonal"].impl(**attrs)))
register_lowering("iota", lambda length, dtype="int64": jnp.arange(length, dtype=np.dtype(dtype)))


# Random values come from the reference's counter-based generator, computed in jnp: the same
# bits as numpy (32-bit integer arithmetic is exact everywhere) and traceable, so a draw can
# run inside a jitted function.
# Each draw is jitted on its own (its coordinates traced, seed, stream, shape and batch static):
# eagerly the generator is some thirty dispatches, and a draw outside any region (a rollout's
# noise, vectorised over its steps) would pay for each.
def _jitted_draw(draw: Callable[..., Any]) -> Callable[..., Any]:
    @functools.partial(jax.jit, static_argnames=("prefix", "shape", "dtype", "batch"))
    def jitted(coords: tuple, prefix: tuple, shape: tuple, dtype: Any, batch: tuple) -> Any:
        return draw(jnp, (*prefix, *coords), shape, dtype, batch)

    def lowering(shape: Any, dtype: Any, key: tuple, batch: Any = ()) -> Any:
        coords = key[2:]
        if any(isinstance(c, int) and not 0 <= c < 2**32 for c in coords):
            # hashed as a Python int (64 bits), as the reference does; a traced one is 32
            return draw(jnp, key, tuple(shape), dtype, batch)
        frozen = tuple((int(size), tuple(map(tuple, moved))) for size, moved in batch)
        return jitted(
            tuple(coords),
            prefix=tuple(int(k) for k in key[:2]),
            shape=tuple(int(s) for s in shape),
            dtype=np.dtype(dtype),
            batch=frozen,
        )

    return lowering


register_lowering("uniform", _jitted_draw(counter_rng.uniform))
register_lowering("normal", _jitted_draw(counter_rng.normal))

# --- structure ---------------------------------------------------------------------------------

register_lowering("tuple_get", lambda x, item, **_: x[item])
register_lowering("merge", lambda *xs: xs[0])
register_lowering("add_n", lambda *xs, **_: sum(xs[1:], xs[0]))
# a pure function handed over as a traceable jax function: traced into the region or loop
register_lowering("pure_call", lambda *xs, fn, **_: fn(*xs))

# --- convolutions and pooling: leading axes folded into XLA's batch ----------------------------


def _folded(x: Any) -> Any:
    """``(*lead, C, H, W)`` as ``(N, C, H, W)``."""
    return x.reshape((int(np.prod(x.shape[:-3], dtype=np.int64)),) + tuple(x.shape[-3:]))


def _conv(x: Any, w: Any, stride: Any, padding: Any) -> Any:
    return jax.lax.conv_general_dilated(
        x,
        w,
        tuple(stride),
        [(int(p), int(p)) for p in padding],
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
        precision=jax.lax.Precision.HIGHEST,
    )


def _conv2d(x: Any, w: Any, stride: Any, padding: Any) -> Any:
    y = _conv(_folded(x), w, stride, padding)
    return y.reshape(x.shape[:-3] + y.shape[1:])


def _conv2d_input_grad(g: Any, w: Any, stride: Any, padding: Any, size: Any) -> Any:
    gf = _folded(g)
    zeros = jnp.zeros((gf.shape[0], w.shape[1], *size), dtype=g.dtype)
    _, pull = jax.vjp(lambda x: _conv(x, w, stride, padding), zeros)
    return pull(gf)[0].reshape(g.shape[:-3] + zeros.shape[1:])


def _weight_grad(x: Any, g: Any, stride: Any, padding: Any, kernel: Any) -> Any:
    zeros = jnp.zeros((g.shape[-3], x.shape[-3], *kernel), dtype=g.dtype)
    _, pull = jax.vjp(lambda w: _conv(_folded(x), w, stride, padding), zeros)
    return pull(_folded(g))[0]


def _conv2d_weight_grad(
    x: Any, g: Any, stride: Any, padding: Any, kernel: Any, batch: int = 0
) -> Any:
    if not batch:
        return _weight_grad(x, g, stride, padding, kernel)
    kept = x.shape[:batch]
    xs, gs = x.reshape((-1,) + x.shape[batch:]), g.reshape((-1,) + g.shape[batch:])
    out = jax.vmap(lambda a, b: _weight_grad(a, b, stride, padding, kernel))(xs, gs)
    return out.reshape(kept + out.shape[1:])


def _pool(x: Any, kernel: Any, stride: Any, padding: Any) -> Any:
    return jax.lax.reduce_window(
        x,
        -np.inf,
        jax.lax.max,
        (1, 1, *kernel),
        (1, 1, *stride),
        ((0, 0), (0, 0), *((int(p), int(p)) for p in padding)),
    )


def _max_pool2d(x: Any, kernel: Any, stride: Any, padding: Any) -> Any:
    y = _pool(_folded(x), kernel, stride, padding)
    return y.reshape(x.shape[:-3] + y.shape[1:])


def _max_pool2d_grad(x: Any, g: Any, kernel: Any, stride: Any, padding: Any) -> Any:
    _, pull = jax.vjp(lambda a: _pool(a, kernel, stride, padding), _folded(x))
    return pull(_folded(g))[0].reshape(x.shape)


register_lowering("conv2d", _conv2d)
register_lowering("conv2d_input_grad", _conv2d_input_grad)
register_lowering("conv2d_weight_grad", _conv2d_weight_grad)
register_lowering("max_pool2d", _max_pool2d)
register_lowering("max_pool2d_grad", _max_pool2d_grad)
