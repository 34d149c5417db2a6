"""RecurrentTensor: a PDG view with PyTorch-style operators and recurrent indexing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

import numpy as np

from timerl.api.scope import Scope, current
from timerl.errors import ProgramError, ShapeError
from timerl.ir.build import apply, ordered
from timerl.ir.graph import Op, View
from timerl.ir.shapes import ONE, norm_axis, numel, static
from timerl.symbolic import (
    TRUE,
    Condition,
    Const,
    Dim,
    Expr,
    Slice,
    as_expr,
)

TensorLike = Union["RecurrentTensor", float, int, bool, np.ndarray]
DEFAULT_FLOAT = np.dtype("float32")


def _current_context() -> Scope:
    return current()


class RecurrentTensor:
    """A tensor over a domain of the context's dims, with a spatial shape.

    Inside an expression, ``x`` alone means ``x`` at the current point; ``x[t - 1]``,
    ``x[0:T]`` read it elsewhere (docs/guide.md, "Dims, bounds, domains and shapes").
    """

    __slots__ = ("view", "ctx", "requires_grad", "grad", "outer", "__weakref__")
    __array_priority__ = 1000  # so ``np.float32(2) * x`` calls our operator

    def __init__(self, view: View, ctx: Scope, requires_grad: bool = False) -> None:
        self.view = view
        self.ctx = ctx
        self.requires_grad = requires_grad
        self.grad: RecurrentTensor | None = None
        self.outer: RecurrentTensor | None = (
            None  # per-iteration parameter an unrolled one starts from
        )

    # --- construction -------------------------------------------------------------------------
    @staticmethod
    def placeholder(
        shape: Sequence[int | Expr] = (),
        dtype: Any = "float32",
        domain: Sequence[Dim] = (),
        requires_grad: bool = False,
        name: str | None = None,
    ) -> RecurrentTensor:
        """A tensor defined later, piecewise, by assignments such as ``x[0] = ...``."""
        ctx = _current_context()
        dom = tuple(domain)
        if ordered(set(dom)) != dom or len(set(dom)) != len(dom):
            raise ProgramError(f"placeholder domain {dom} must list distinct dims in context order")
        if name is not None:
            _checked_name(name, "placeholder")
        op = Op(
            prim="merge",
            domain=dom,
            shape=sizes(shape, "placeholder"),
            dtype=np.dtype(dtype),
            attrs={"shape": tuple(shape), "dtype": np.dtype(dtype)},
            name=name,
        )
        from timerl.ir.build import user_site

        op.site = user_site()
        t = RecurrentTensor(View.of(op), ctx, requires_grad)
        ctx._register_placeholder(t)
        return t

    def _new(self, view: View) -> RecurrentTensor:
        return RecurrentTensor(view, self.ctx)

    # --- metadata -----------------------------------------------------------------------------
    @property
    def op(self) -> Op:
        return self.view.op

    @property
    def domain(self) -> tuple[Dim, ...]:
        return ordered(self.view.dims)

    @property
    def shape(self) -> tuple[int | Expr, ...]:
        return tuple(s.value if isinstance(s, Const) else s for s in self.view.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.view.dtype

    @property
    def ndim(self) -> int:
        return len(self.view.shape)

    @property
    def name(self) -> str:
        return self.op.label

    def named(self, name: str) -> RecurrentTensor:
        """Give the underlying op a name used in errors, ``explain()`` and renderings."""
        self.op.name = _checked_name(name, "named")
        return self

    def __repr__(self) -> str:
        dom = ", ".join(d.name for d in self.domain)
        return (
            f"RecurrentTensor({self.name}, domain=({dom}), shape={self.shape}, dtype={self.dtype})"
        )

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        first = self.shape[0]
        if not isinstance(first, int):
            raise TypeError(f"len() of a dynamic size {first}")
        return first

    def __bool__(self) -> bool:
        raise TypeError(
            f"the truth value of {self.name} is only known at run time; "
            "use tl.where(...) or a piecewise definition"
        )

    __hash__ = object.__hash__

    # --- indexing -----------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> RecurrentTensor:
        key = key if isinstance(key, tuple) else (key,)
        view = self.view
        dims = self.domain
        if dims:
            if len(key) == 1 and key[0] is Ellipsis:
                key = tuple(dims)
            if len(key) < len(dims):
                raise ProgramError(
                    f"{self.name} has domain ({', '.join(d.name for d in dims)}): index every "
                    f"domain dim first, got {len(key)} index(es)"
                )
            temporal, spatial = key[: len(dims)], key[len(dims) :]
            index = {
                d: _temporal_index(k, self.name, d) for k, d in zip(temporal, dims, strict=True)
            }
            if not view.is_identity:
                composed = [_compose(i, index, self.name) for i in view.index]
                if all(c is not None for c in composed):
                    view = View(view.op, tuple(composed))  # type: ignore[arg-type]
                else:
                    # No single index reads these points (a slice of u[max(t - 1, 0)] holds
                    # u[0] twice): compute the view as a tensor of its own, then slice that.
                    view = apply("identity", view)
            if view.is_identity:
                view = View(view.op, tuple(index[d] for d in view.op.domain))
            self._check_static_range(view)
            # gathered slices come first: spatial indices address the tensor's own axes
            gathered = sum(isinstance(i, Slice) for i in index.values())
            if spatial and gathered:
                spatial = (slice(None),) * gathered + tuple(spatial)
        else:
            spatial = key
        out = self._new(view)
        if spatial and not all(k == slice(None) for k in spatial):
            out = out._spatial_index(tuple(spatial))
        return out

    def _check_static_range(self, view: View) -> None:
        for d, idx in zip(view.op.domain, view.index, strict=True):
            lo = idx.start if isinstance(idx, Slice) else idx
            if isinstance(lo, Const) and lo.value < 0:
                raise ProgramError(
                    f"{self.op.where()}: index {idx} reads before the start of {d.name}"
                )

    def _spatial_index(self, key: tuple) -> RecurrentTensor:
        for k in key:
            if isinstance(k, RecurrentTensor):
                raise ProgramError("indexing by a tensor: use x.gather(dim, index) instead")
            if isinstance(k, slice) and any(isinstance(v, Expr) for v in (k.start, k.stop, k.step)):
                raise ProgramError(
                    f"{self.name}: symbolic slice {k} on a spatial dim; temporal slices go on "
                    "domain dims (index every domain dim first)"
                )
        key = tuple(int(k) if isinstance(k, (int, np.integer)) else k for k in key)
        return self._new(apply("getitem", self.view, key=key))

    def __setitem__(self, key: Any, value: TensorLike) -> None:
        self.ctx._define(self, key, value)

    # --- operators ----------------------------------------------------------------------------
    def _lift(self, other: TensorLike) -> RecurrentTensor:
        out = lift(other, like=self)
        if out.ctx is not self.ctx:
            raise ProgramError(
                f"{self.name} and {out.name} belong to different contexts: build a program "
                "inside one tl.Context"
            )
        return out

    def _binary(self, prim: str, other: TensorLike, reverse: bool = False) -> RecurrentTensor:
        other = self._lift(other)
        a, b = (other, self) if reverse else (self, other)
        return self._new(apply(prim, a.view, b.view))

    def __add__(self, o):
        return self._binary("add", o)

    def __radd__(self, o):
        return self._binary("add", o, True)

    def __sub__(self, o):
        return self._binary("sub", o)

    def __rsub__(self, o):
        return self._binary("sub", o, True)

    def __mul__(self, o):
        return self._binary("mul", o)

    def __rmul__(self, o):
        return self._binary("mul", o, True)

    def __truediv__(self, o):
        return self._binary("div", o)

    def __rtruediv__(self, o):
        return self._binary("div", o, True)

    def __pow__(self, o):
        return self._binary("pow", o)

    def pow(self, exponent: TensorLike) -> RecurrentTensor:
        return self._binary("pow", exponent)

    def __floordiv__(self, o):
        return self._binary("floordiv", o)

    def __rfloordiv__(self, o):
        return self._binary("floordiv", o, True)

    def __mod__(self, o):
        return self._binary("mod", o)

    def __rmod__(self, o):
        return self._binary("mod", o, True)

    def __rpow__(self, o):
        return self._binary("pow", o, True)

    def __neg__(self):
        return self._new(apply("neg", self.view))

    def __matmul__(self, o):
        return matmul(self, self._lift(o))

    def __rmatmul__(self, o):
        return matmul(self._lift(o), self)

    def __lt__(self, o):
        return self._binary("lt", o)

    def __le__(self, o):
        return self._binary("le", o)

    def __gt__(self, o):
        return self._binary("gt", o)

    def __ge__(self, o):
        return self._binary("ge", o)

    def __eq__(self, o):  # type: ignore[override]
        return self._binary("eq", o)

    def __ne__(self, o):  # type: ignore[override]
        return self._binary("ne", o)

    def __and__(self, o):
        return self._binary("logical_and", o)

    def __or__(self, o):
        return self._binary("logical_or", o)

    def __invert__(self):
        return self._new(apply("logical_not", self.view))

    def eq(self, o):
        return self._binary("eq", o)

    # --- elementwise math ---------------------------------------------------------------------
    def _unary(self, prim: str) -> RecurrentTensor:
        return self._new(apply(prim, self.view))

    def exp(self):
        return self._unary("exp")

    def log(self):
        return self._unary("log")

    def tanh(self):
        return self._unary("tanh")

    def sigmoid(self):
        return self._unary("sigmoid")

    def sqrt(self):
        return self._unary("sqrt")

    def abs(self):
        return self._unary("abs")

    def sign(self):
        return self._unary("sign")

    def sin(self):
        return self._unary("sin")

    def cos(self):
        return self._unary("cos")

    def floor(self):
        return self._unary("floor")

    def lgamma(self):
        """``log |Gamma(x)|`` (its gradient is ``digamma``)."""
        return self._unary("lgamma")

    def digamma(self):
        """The derivative of ``lgamma`` (its gradient is ``trigamma``)."""
        return self._unary("digamma")

    def trigamma(self):
        """The derivative of ``digamma``; it has no gradient of its own."""
        return self._unary("trigamma")

    def square(self):
        return self * self

    def relu(self):
        return maximum(self, 0.0)

    def clamp(self, min: float | None = None, max: float | None = None):  # noqa: A002
        out = self
        if min is not None:
            out = maximum(out, min)
        if max is not None:
            out = minimum(out, max)
        return out

    clip = clamp

    def detach(self) -> RecurrentTensor:
        """The same values with no gradient flowing back through them."""
        return self._new(apply("detach", self.view))

    def to(self, dtype: Any) -> RecurrentTensor:
        if np.dtype(dtype) == self.dtype:
            return self
        return self._new(apply("cast", self.view, dtype=np.dtype(dtype)))

    def float(self):
        return self.to("float32")

    def long(self):
        return self.to("int64")

    def bool(self):
        return self.to(bool)

    # --- reductions ---------------------------------------------------------------------------
    def _axes(self, dim: int | Sequence[int] | None) -> tuple[int, ...] | None:
        if dim is None:
            return None
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        return tuple(norm_axis(d, self.ndim, "dim") for d in dims)

    def sum(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> RecurrentTensor:
        src = self.to("int64") if self.dtype == np.dtype(bool) else self
        return self._new(apply("sum", src.view, axes=self._axes(dim), keepdims=keepdim))

    def square_sum(self) -> RecurrentTensor:
        """``(x * x).sum()`` as one reduction: no array of squares (a gradient norm's cost)."""
        return self._new(apply("sumsq", self.view))

    def mean(
        self, dim: int | Sequence[int] | None = None, keepdim: bool = False
    ) -> RecurrentTensor:
        axes = self._axes(dim)
        axes = tuple(range(self.ndim)) if axes is None else axes
        count = numel([self.view.shape[a] for a in axes])
        total = (
            self.float().sum(axes, keepdim)
            if not np.issubdtype(self.dtype, np.floating)
            else self.sum(axes, keepdim)
        )
        return total / full((), count, dtype=total.dtype, ctx=self.ctx)

    def var(
        self, dim: int | Sequence[int] | None = None, keepdim: bool = False, unbiased: bool = True
    ):
        axes = self._axes(dim)
        axes = tuple(range(self.ndim)) if axes is None else axes
        centred = self - self.mean(axes, keepdim=True)
        count = numel([self.view.shape[a] for a in axes])
        denom = count - 1 if unbiased else count
        return (centred * centred).sum(axes, keepdim) / full(
            (), denom, dtype=self.dtype, ctx=self.ctx
        )

    def std(
        self, dim: int | Sequence[int] | None = None, keepdim: bool = False, unbiased: bool = True
    ):
        return self.var(dim, keepdim, unbiased).sqrt()

    def amax(
        self, dim: int | Sequence[int] | None = None, keepdim: bool = False
    ) -> RecurrentTensor:
        return self._new(apply("max", self.view, axes=self._axes(dim), keepdims=keepdim))

    def amin(
        self, dim: int | Sequence[int] | None = None, keepdim: bool = False
    ) -> RecurrentTensor:
        return -((-self).amax(dim, keepdim))

    def max(self, dim: int | None = None, keepdim: bool = False) -> RecurrentTensor:
        """Maximum values (over ``dim``); use ``argmax`` for the indices."""
        return self.amax(dim, keepdim)

    def min(self, dim: int | None = None, keepdim: bool = False) -> RecurrentTensor:
        return self.amin(dim, keepdim)

    def argmax(self, dim: int = -1, keepdim: bool = False) -> RecurrentTensor:
        return self._new(
            apply("argmax", self.view, axis=norm_axis(dim, self.ndim), keepdims=keepdim)
        )

    def logsumexp(self, dim: int, keepdim: bool = False) -> RecurrentTensor:
        top = self.amax(dim, keepdim=True).detach()
        out = (self - top).exp().sum(dim, keepdim=True).log() + top
        return out if keepdim else out.squeeze(dim)

    def softmax(self, dim: int = -1) -> RecurrentTensor:
        z = (self - self.amax(dim, keepdim=True).detach()).exp()
        return z / z.sum(dim, keepdim=True)

    def log_softmax(self, dim: int = -1) -> RecurrentTensor:
        return self - self.logsumexp(dim, keepdim=True)

    # --- movement -----------------------------------------------------------------------------
    def reshape(self, *shape: int | Expr) -> RecurrentTensor:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        sizes = [as_expr(s) for s in shape]
        if sum(1 for s in sizes if s == Const(-1)) > 1:
            raise ShapeError("reshape: only one size may be -1")
        if Const(-1) in sizes:
            known = numel([s for s in sizes if s != Const(-1)])
            total = numel(self.view.shape)
            if isinstance(total, Const) and isinstance(known, Const):
                sizes[sizes.index(Const(-1))] = Const(total.value // max(known.value, 1))
            elif known == ONE:
                sizes[sizes.index(Const(-1))] = total
            else:
                raise ShapeError(f"reshape: cannot infer -1 for dynamic shape {self.shape}")
        old, new = static(self.view.shape), static(sizes)
        if old is not None and new is not None and int(np.prod(old)) != int(np.prod(new)):
            raise ShapeError(f"cannot reshape {self.name} of shape {old} into {new}")
        return self._new(apply("reshape", self.view, shape=tuple(sizes)))

    view_as_shape = reshape

    def flatten(self, start_dim: int = 0) -> RecurrentTensor:
        start = norm_axis(start_dim, max(self.ndim, 1))
        lead = list(self.view.shape[:start])
        return self.reshape(*lead, numel(self.view.shape[start:]))

    def permute(self, *dims: int) -> RecurrentTensor:
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        perm = tuple(norm_axis(d, self.ndim) for d in dims)
        return self._new(apply("permute", self.view, perm=perm))

    def transpose(self, a: int, b: int) -> RecurrentTensor:
        perm = list(range(self.ndim))
        a, b = norm_axis(a, self.ndim), norm_axis(b, self.ndim)
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(*perm)

    @property
    def T(self) -> RecurrentTensor:  # noqa: N802 - PyTorch's name
        return self.permute(*reversed(range(self.ndim)))

    def unsqueeze(self, dim: int) -> RecurrentTensor:
        shape = list(self.view.shape)
        shape.insert(norm_axis(dim, self.ndim + 1), ONE)
        return self._new(apply("reshape", self.view, shape=tuple(shape)))

    def squeeze(self, dim: int | None = None) -> RecurrentTensor:
        shape = list(self.view.shape)
        if dim is None:
            shape = [s for s in shape if s != ONE]
        else:
            d = norm_axis(dim, self.ndim)
            if shape[d] != ONE:
                return self
            del shape[d]
        return self._new(apply("reshape", self.view, shape=tuple(shape)))

    def expand(self, *shape: int | Expr) -> RecurrentTensor:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        sizes = list(map(as_expr, shape))
        lead = len(sizes) - self.ndim
        sizes = [self.view.shape[k - lead] if s == Const(-1) else s for k, s in enumerate(sizes)]
        return self._new(apply("expand", self.view, shape=tuple(sizes)))

    def take(self, index: RecurrentTensor, dim: int = 0) -> RecurrentTensor:
        """Rows (along ``dim``) picked by an integer tensor, like ``torch.index_select``."""
        return self._new(apply("take", self.view, index.view, axis=norm_axis(dim, self.ndim)))

    def index_add(self, index: RecurrentTensor, size: int, dim: int = 0) -> RecurrentTensor:
        """Rows (along ``dim``) summed into ``size`` rows at the positions ``index`` gives
        (a scatter-add, like ``torch.index_add`` into zeros; the gradient of ``take``)."""
        return self._new(
            apply(
                "index_add",
                self.view,
                index.view,
                axis=norm_axis(dim, self.ndim),
                size=as_expr(size),
            )
        )

    def narrow(self, dim: int, start: int | Expr, length: int | Expr) -> RecurrentTensor:
        return self._new(
            apply(
                "narrow",
                self.view,
                axis=norm_axis(dim, self.ndim),
                start=as_expr(start),
                length=as_expr(length),
            )
        )

    def cumsum(self, dim: int) -> RecurrentTensor:
        return self._new(apply("cumsum", self.view, axis=norm_axis(dim, self.ndim)))

    def argsort(self, dim: int = -1) -> RecurrentTensor:
        return self._new(apply("argsort", self.view, axis=norm_axis(dim, self.ndim)))

    def gather(self, dim: int, index: RecurrentTensor) -> RecurrentTensor:
        return self._new(apply("gather", self.view, index.view, axis=norm_axis(dim, self.ndim)))

    # --- autodiff -----------------------------------------------------------------------------
    def backward(self, inputs: Sequence[RecurrentTensor] | None = None) -> None:
        """Differentiate this loss (summed over its points and elements) w.r.t. ``inputs``
        (default: every tensor created with ``requires_grad=True``); sets their ``.grad``."""
        from timerl.ir.autodiff import gradients

        params = list(inputs) if inputs is not None else self.ctx._grad_leaves()
        if not params:
            raise ProgramError("backward(): no tensor in this context has requires_grad=True")
        for p in params:
            if not p.requires_grad or not p.view.is_identity:
                raise ProgramError(f"backward(): {p.name} is not a tensor with requires_grad=True")
        loss = self if not self.ndim else self.sum()
        grads = gradients(loss.view, [p.op for p in params])
        self.ctx._differentiated.update(p.op.id for p in params)
        for p in params:
            g = grads.get(p.op.id)
            p.grad = self._new(g) if g is not None else zeros_like(p)
            self.ctx._gradients.add(p.grad.op.id)


# --- module-level helpers (also exported as tl.*) -----------------------------------------------


def _temporal_index(k: Any, name: str, dim: Dim) -> Expr | Slice:
    if isinstance(k, slice):
        if k.step not in (None, 1):
            raise ProgramError(f"{name}: temporal slices take no step (got {k})")
        start = as_expr(0 if k.start is None else k.start)
        stop = as_expr(dim.bound if k.stop is None else k.stop)
        return Slice(start, stop)
    if isinstance(k, Condition):
        raise ProgramError(f"{name}: a condition can only appear on the left of an assignment")
    try:
        return as_expr(k)
    except TypeError as err:
        raise ProgramError(f"{name}: bad index {k!r} for dim {dim.name}: {err}") from None


def _compose(index: Expr | Slice, new: dict[Dim, Expr | Slice], name: str) -> Expr | Slice | None:
    """Re-index a view: substitute the reader's new indices for the view's own dims.

    None where no index expression reads those points: a slice through a clamped, modular or
    scaled index, or through an index that mixes sliced dims.
    """
    points = {d: v for d, v in new.items() if isinstance(v, Expr)}
    sliced = {d: v for d, v in new.items() if isinstance(v, Slice)}
    if isinstance(index, Slice):
        if sliced.keys() & index.symbols():
            raise ProgramError(f"{name}: cannot slice a dim that already bounds a slice ({index})")
        return index.substitute(points)
    used = sliced.keys() & index.symbols()
    if not used:
        return index.substitute(points)
    if len(used) > 1:
        return None
    (d,) = used
    shift = index - d
    if d in shift.symbols():
        return None
    sl = sliced[d]
    shift = shift.substitute(points)
    return Slice(sl.start + shift, sl.stop + shift)


def lift(
    value: TensorLike, like: RecurrentTensor | None = None, ctx: Scope | None = None
) -> RecurrentTensor:
    """A Python/numpy value as a constant tensor (scalars take a float operand's dtype)."""
    if isinstance(value, RecurrentTensor):
        return value
    ctx = ctx or (like.ctx if like is not None else _current_context())
    if isinstance(value, Expr):
        # A point's index as a value (x * (t + 1)): x's dtype when numeric, else int64.
        numeric = like is not None and (
            np.issubdtype(like.dtype, np.floating) or like.dtype.kind in "iu"
        )
        dtype = like.dtype if like is not None and numeric else np.dtype("int64")
        return RecurrentTensor(apply("full", shape=(), value=value, dtype=dtype), ctx)
    arr = np.asarray(value)
    if arr.dtype == np.float64:
        float_like = like is not None and np.issubdtype(like.dtype, np.floating)
        arr = arr.astype(like.dtype if float_like else DEFAULT_FLOAT)
    elif (
        arr.dtype.kind in "iu"
        and arr.ndim == 0
        and like is not None
        and (np.issubdtype(like.dtype, np.floating) or like.dtype.kind in "iu")
    ):
        arr = arr.astype(like.dtype)
    if arr.ndim == 0:
        return RecurrentTensor(apply("full", shape=(), value=arr.item(), dtype=arr.dtype), ctx)
    return RecurrentTensor(apply("const", value=arr), ctx)


def full(
    shape: Sequence[int | Expr],
    value: float | Expr,
    dtype: Any = "float32",
    ctx: Scope | None = None,
):
    ctx = ctx or _current_context()
    return RecurrentTensor(
        apply("full", shape=sizes(shape, "full"), value=value, dtype=np.dtype(dtype)), ctx
    )


def _checked_name(name: object, what: str) -> str:
    """A tensor's name: text that errors, ``explain()`` and the generated code quote."""
    if not isinstance(name, str) or not name:
        raise ProgramError(f"{what}: a tensor's name must be a non-empty str, got {name!r}")
    return name


def sizes(shape: Sequence[int | Expr], what: str) -> tuple[Expr, ...]:
    """A shape as index expressions; a size known to be negative is refused where it is
    written, not where a kernel would first be handed it."""
    out = tuple(as_expr(s) for s in shape)
    for s in out:
        if s.is_const and s.evaluate({}) < 0:
            raise ShapeError(f"{what}: shape {tuple(shape)} has a negative size {s.evaluate({})}")
    return out


def zeros_like(x: RecurrentTensor) -> RecurrentTensor:
    return full(x.view.shape, 0, dtype=x.dtype, ctx=x.ctx) + x.detach() * 0


def maximum(a: TensorLike, b: TensorLike) -> RecurrentTensor:
    a, b = _pair(a, b)
    return a._new(apply("maximum", a.view, b.view))


def minimum(a: TensorLike, b: TensorLike) -> RecurrentTensor:
    a, b = _pair(a, b)
    return a._new(apply("minimum", a.view, b.view))


def _pair(a: TensorLike, b: TensorLike) -> tuple[RecurrentTensor, RecurrentTensor]:
    if isinstance(a, RecurrentTensor):
        return a, lift(b, like=a)
    if isinstance(b, RecurrentTensor):
        return lift(a, like=b), b
    raise TypeError("at least one operand must be a RecurrentTensor")


def matmul(a: RecurrentTensor, b: RecurrentTensor) -> RecurrentTensor:
    """``a @ b`` with PyTorch's rules for 1-d operands."""
    a1, b1 = a.ndim == 1, b.ndim == 1
    if a1:
        a = a.unsqueeze(0)
    if b1:
        b = b.unsqueeze(-1)
    out = a._new(apply("matmul", a.view, b.view))
    if a1:
        out = out.squeeze(-2)
    if b1:
        out = out.squeeze(-1)
    return out


def where(cond: TensorLike, a: TensorLike, b: TensorLike) -> RecurrentTensor:
    """Elementwise ``a`` where ``cond`` holds, else ``b``."""
    anchor = next((x for x in (a, b, cond) if isinstance(x, RecurrentTensor)), None)
    if anchor is None:
        raise TypeError("tl.where needs at least one RecurrentTensor operand")
    if isinstance(a, RecurrentTensor):
        a_t, b_t = a, lift(b, like=a)
    elif isinstance(b, RecurrentTensor):
        a_t, b_t = lift(a, like=b), b
    else:
        a_t, b_t = lift(a, ctx=anchor.ctx), lift(b, ctx=anchor.ctx)
    c = lift(cond, like=anchor)
    if c.dtype != np.dtype(bool):
        c = c.bool()
    return anchor._new(apply("where", c.view, a_t.view, b_t.view))


def cat(tensors: Sequence[RecurrentTensor], dim: int = 0) -> RecurrentTensor:
    if not tensors:
        raise ShapeError("cat of no tensors")
    first = tensors[0]
    axis = norm_axis(dim, first.ndim)
    return first._new(apply("cat", *(t.view for t in tensors), axis=axis))


def stack(tensors: Sequence[RecurrentTensor], dim: int = 0) -> RecurrentTensor:
    if not tensors:
        raise ShapeError("stack of no tensors")
    axis = norm_axis(dim, tensors[0].ndim + 1)
    return cat([t.unsqueeze(axis) for t in tensors], dim=axis)


def branch_condition(
    key: tuple, dims: tuple[Dim, ...], name: str
) -> tuple[Condition, dict[Dim, Expr]]:
    """Turn an assignment's left-hand side into (where it applies, how the value is read).

    ``x[t + 1] = v`` applies where ``t >= 1`` and reads ``v`` at ``t - 1``; ``x[0] = v`` applies
    where ``t == 0``; ``x[cond] = v`` applies where ``cond`` holds.
    """
    if len(key) == 1 and isinstance(key[0], (Condition, bool)):
        cond = key[0] if isinstance(key[0], Condition) else (TRUE if key[0] else ~TRUE)
        return cond, {d: d for d in dims}
    if len(key) != len(dims):
        raise ProgramError(
            f"{name}: give one index per domain dim "
            f"({', '.join(d.name for d in dims)}) or one condition, got {len(key)}"
        )
    cond: Condition = TRUE
    subst: dict[Dim, Expr] = {}
    for k, d in zip(key, dims, strict=True):
        if isinstance(k, slice):
            raise ProgramError(f"{name}: slices are not allowed on the left ({k})")
        if isinstance(k, Condition):
            raise ProgramError(f"{name}: a condition must be the only index")
        e = as_expr(k)
        terms, const = e.linear()
        if d in e.symbols():
            if terms != {d: 1} or any(s in e.symbols() for s in dims if s is not d):
                raise ProgramError(
                    f"{name}: left index {e} on {d.name} must be {d.name} plus a constant"
                )
            shift = const
            subst[d] = d - shift
            if shift > 0:
                cond = cond & (d >= shift)
            elif shift < 0:
                cond = cond & (d < d.bound + shift)
        else:
            if any(isinstance(s, Dim) for s in e.symbols()):
                raise ProgramError(f"{name}: left index {e} on {d.name} uses another dim")
            cond = cond & d.eq(e)
            subst[d] = e
    return cond, subst
