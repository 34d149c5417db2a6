"""``tl.*`` functions: constructors, elementwise helpers and symbolic min/max."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from timerl.api.scope import current
from timerl.api.tensor import RecurrentTensor, cat, lift, sizes, stack, where
from timerl.api.tensor import full as _full
from timerl.api.tensor import maximum as _maximum
from timerl.api.tensor import minimum as _minimum
from timerl.errors import ProgramError
from timerl.ir.build import apply
from timerl.symbolic import Expr, as_expr, max_, min_

__all__ = [
    "arange",
    "cat",
    "conv2d",
    "exp",
    "full",
    "log",
    "max",
    "max_pool2d",
    "maximum",
    "min",
    "minimum",
    "ones",
    "rand",
    "randn",
    "sink",
    "stack",
    "tanh",
    "where",
    "zeros",
]


def full(shape: Sequence[int | Expr], value: float, dtype: Any = "float32") -> RecurrentTensor:
    return _full(shape, value, dtype)


def zeros(shape: Sequence[int | Expr] | int, dtype: Any = "float32") -> RecurrentTensor:
    return _full((shape,) if isinstance(shape, (int, Expr)) else shape, 0, dtype)


def ones(shape: Sequence[int | Expr] | int, dtype: Any = "float32") -> RecurrentTensor:
    return _full((shape,) if isinstance(shape, (int, Expr)) else shape, 1, dtype)


def arange(n: int | Expr, dtype: Any = "int64") -> RecurrentTensor:
    """``0, 1, ..., n - 1``; ``n`` may be an index expression (``tl.min(t + 5, T) - t``), whose
    value, and so the tensor's length, follows the point."""
    if isinstance(n, Expr):
        return RecurrentTensor(apply("iota", length=n, dtype=dtype), current())
    return lift(np.arange(n, dtype=dtype), ctx=current())


def rand(
    shape: Sequence[int | Expr] | int = (),
    like: RecurrentTensor | None = None,
    key_at: Sequence[Expr] | None = None,
) -> RecurrentTensor:
    """Uniform [0, 1) noise, a pure function of (seed, stream, point).

    ``like`` lends its domain (fresh noise at every point of it); ``key_at`` draws the same
    noise at points that map to the same key (e.g. one permutation per epoch).
    """
    return _random("uniform", shape, like, key_at)


def randn(
    shape: Sequence[int | Expr] | int = (),
    like: RecurrentTensor | None = None,
    key_at: Sequence[Expr] | None = None,
) -> RecurrentTensor:
    """Standard normal noise, a pure function of (seed, stream, point); see ``rand``."""
    return _random("normal", shape, like, key_at)


def _random(prim: str, shape: Any, like: RecurrentTensor | None, key_at: Any) -> RecurrentTensor:
    ctx = like.ctx if like is not None else current()
    shape = (shape,) if isinstance(shape, (int, Expr)) else tuple(shape)
    attrs: dict[str, Any] = {"stream": ctx.next_stream()}
    if key_at is not None:
        attrs["key_at"] = tuple(as_expr(k) for k in key_at)
    view = apply(
        prim,
        domain=like.domain if like is not None else None,
        shape=sizes(shape, {"uniform": "rand", "normal": "randn"}[prim]),
        dtype=np.dtype("float32"),
        **attrs,
    )
    return RecurrentTensor(view, ctx)


def _tensor_or_symbolic(fn_sym: Callable, fn_tensor: Callable, args: tuple) -> Any:
    if builtins.any(isinstance(a, RecurrentTensor) for a in args):
        out = args[0]
        for a in args[1:]:
            out = fn_tensor(out, a)
        return out
    return fn_sym(*args)


def min(*args: Any) -> Any:  # noqa: A001 - tl.min mirrors the contract
    """``tl.min``: symbolic min of index expressions, or elementwise minimum of tensors."""
    return _tensor_or_symbolic(min_, _minimum, args)


def max(*args: Any) -> Any:  # noqa: A001
    """``tl.max``: symbolic max of index expressions, or elementwise maximum of tensors."""
    return _tensor_or_symbolic(max_, _maximum, args)


maximum = _maximum
minimum = _minimum


def exp(x: RecurrentTensor) -> RecurrentTensor:
    return x.exp()


def log(x: RecurrentTensor) -> RecurrentTensor:
    return x.log()


def tanh(x: RecurrentTensor) -> RecurrentTensor:
    return x.tanh()


def _pair(value: int | Sequence[int], what: str) -> tuple[int, int]:
    """An int or a pair of ints, as a pair (a kernel, stride or padding per spatial axis)."""
    pair = (value, value) if isinstance(value, (int, np.integer)) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) for v in pair):
        raise ProgramError(f"{what} must be an int or a pair of ints, got {value!r}")
    return int(pair[0]), int(pair[1])


def conv2d(
    x: RecurrentTensor,
    weight: RecurrentTensor,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
) -> RecurrentTensor:
    """A 2-d convolution of ``x`` ``(..., C, H, W)`` (any leading axes: a batch, a rollout's
    steps) by ``weight`` ``(O, C, kh, kw)``, zero-padded; no bias (``nn.Conv2d`` adds one)."""
    attrs = {"stride": _pair(stride, "conv2d stride"), "padding": _pair(padding, "conv2d padding")}
    return x._new(apply("conv2d", x.view, x._lift(weight).view, **attrs))


def max_pool2d(
    x: RecurrentTensor,
    kernel: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] = 0,
) -> RecurrentTensor:
    """The largest element of each window of ``x`` ``(..., C, H, W)`` (padding never wins);
    ``stride`` defaults to the kernel, as torch's."""
    k = _pair(kernel, "max_pool2d kernel")
    s = k if stride is None else _pair(stride, "max_pool2d stride")
    p = _pair(padding, "max_pool2d padding")
    return x._new(apply("max_pool2d", x.view, kernel=k, stride=s, padding=p))


def sink(tensor: RecurrentTensor, fn: Callable[[np.ndarray, dict[str, int]], Any]) -> None:
    """Call ``fn(value, point)`` at every point of ``tensor`` as the program runs."""
    tensor.ctx.sink(tensor, fn)


_ = (cat, stack, where, as_expr)
