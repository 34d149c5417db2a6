"""Expressions of generated programs: index specs and expression nodes.

Each node is built into timerl (``build``), printed as timerl source (``source``) and evaluated
at one point by the reference (``ev``), which knows nothing of timerl.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from programs import Builder, Reference, TensorDef

DIM_BOUND = {"t": "T", "i": "I"}

SPEC_FLAG = {
    "cur": None,
    "clamp_lo": "clamp",
    "clamp_hi": "clamp",
    "const": "const_index",
    "last": "const_index",
}

# --------------------------------------------------------------------------- index specs


@dataclass(frozen=True)
class Spec:
    """The index of one source dim ``d`` (bound ``D``) in a read, or of a write (``cur``,
    ``shift`` by ``k`` of either sign, ``const`` ``k``, ``last``: ``D - 1 - k``)."""

    kind: str
    k: int = 0

    @property
    def is_slice(self) -> bool:
        return self.kind in (
            "prefix",
            "suffix",
            "window",
            "ahead",
            "full",
            "partial",
            "after",
            "before",
        )

    @property
    def constant(self) -> bool:
        """True when the index does not mention ``d`` (the read loses that dim)."""
        return self.kind in ("const", "last", "full", "partial")

    def value(self, p: int | None, n: int) -> int | range:
        k = self.k
        kind = self.kind
        if kind == "cur":
            return p
        if kind == "shift":
            return p + k
        if kind == "const":
            return k
        if kind == "last":
            return n - 1 - k
        if kind == "clamp_lo":
            return max(p - k, 0)
        if kind == "clamp_hi":
            return min(p + k, n - 1)
        if kind == "mod":
            return p % k
        if kind == "div":
            return p // k
        if kind == "prefix":
            return range(0, p + 1)
        if kind == "suffix":
            return range(p, n)
        if kind == "window":
            return range(max(p - k, 0), p + 1)
        if kind == "ahead":
            return range(p, min(p + k, n))
        if kind == "full":
            return range(0, n)
        if kind == "partial":
            return range(0, k)
        if kind == "after":
            return range(p + 1, n)
        if kind == "before":
            return range(0, p)
        raise AssertionError(kind)

    def build(self, d: Any, big: Any, tl: Any) -> Any:
        k = self.k
        return {
            "cur": lambda: d,
            "shift": lambda: d + k,
            "const": lambda: k,
            "last": lambda: big - 1 - k,
            "clamp_lo": lambda: tl.max(d - k, 0),
            "clamp_hi": lambda: tl.min(d + k, big - 1),
            "mod": lambda: d % k,
            "div": lambda: d // k,
            "prefix": lambda: slice(0, d + 1),
            "suffix": lambda: slice(d, big),
            "window": lambda: slice(tl.max(d - k, 0), d + 1),
            "ahead": lambda: slice(d, tl.min(d + k, big)),
            "full": lambda: slice(0, big),
            "partial": lambda: slice(0, k),
            "after": lambda: slice(d + 1, big),
            "before": lambda: slice(0, d),
        }[self.kind]()

    def source(self, d: str) -> str:
        big = DIM_BOUND[d]
        k = self.k
        shift = f"{d} + {k}" if k > 0 else f"{d} - {-k}"
        return {
            "cur": d,
            "shift": shift,
            "const": str(k),
            "last": f"{big} - {1 + k}",
            "clamp_lo": f"tl.max({d} - {k}, 0)",
            "clamp_hi": f"tl.min({d} + {k}, {big} - 1)",
            "mod": f"{d} % {k}",
            "div": f"{d} // {k}",
            "prefix": f"0:{d} + 1",
            "suffix": f"{d}:{big}",
            "window": f"tl.max({d} - {k}, 0):{d} + 1",
            "ahead": f"{d}:tl.min({d} + {k}, {big})",
            "full": f"0:{big}",
            "partial": f"0:{k}",
            "after": f"{d} + 1:{big}",
            "before": f"0:{d}",
        }[self.kind]


# --------------------------------------------------------------------------- expressions

# how the reference gets ``Noise``'s numbers: ``draw(stream, point, shape)``, given by the
# harness (``use_noise``), which imports timerl
_DRAW: list[Callable[[int, tuple, tuple], np.ndarray]] = []


def use_noise(draw: Callable[[int, tuple, tuple], np.ndarray]) -> None:
    _DRAW[:] = [draw]


class Expr:
    """A node of an expression: ``dims`` it varies over, spatial ``shape``."""

    dims: frozenset
    shape: tuple

    def ev(self, ref: Reference, env: dict[str, int]) -> Any:
        raise NotImplementedError

    def build(self, b: Builder) -> Any:
        raise NotImplementedError

    def source(self) -> str:
        raise NotImplementedError

    def leaves(self) -> set[str]:
        raise NotImplementedError

    def flags(self) -> set[str]:
        """The generator flags this expression exercises."""
        out: set[str] = set()
        for f in self.__dataclass_fields__:
            child = getattr(self, f)
            if isinstance(child, Expr):
                out |= child.flags()
        return out | self.own_flags()

    def own_flags(self) -> set[str]:
        return set()


def nodes(e: Expr) -> Iterator[Expr]:
    """``e`` and every expression under it."""
    yield e
    for f in getattr(e, "__dataclass_fields__", {}):
        child = getattr(e, f)
        if isinstance(child, Expr):
            yield from nodes(child)


@dataclass
class Read(Expr):
    """``src[spec, ..., spatial]``, gathered slices reduced by ``reduce`` over axis 0;
    ``bare``: written ``src`` alone, which means ``src`` at the current point (every spec
    ``cur``), in a shifted frame ``x[t - k] = ..`` the point ``t``, not the one written."""

    src: TensorDef
    specs: tuple[Spec, ...]
    spatial: int | None = None
    reduce: str = "sum"
    bare: bool = False

    def __post_init__(self) -> None:
        self.dims = frozenset(
            d for d, s in zip(self.src.domain, self.specs, strict=True) if not s.constant
        )
        shape = self.src.shape
        if self.spatial is not None:
            shape = shape[1:]
        self.shape = tuple(shape)
        self.nslices = sum(s.is_slice for s in self.specs)
        if self.bare:
            assert self.spatial is None and all(s.kind == "cur" for s in self.specs), self

    def ev(self, ref: Reference, env: dict[str, int]) -> Any:
        idx = [
            s.value(env.get(d), ref.n[d]) for d, s in zip(self.src.domain, self.specs, strict=True)
        ]
        ranges = [r if isinstance(r, range) else range(r, r + 1) for r in idx]
        items = {}
        for point in itertools.product(*ranges):
            v = ref.value(self.src, point)
            items[point] = v[self.spatial] if self.spatial is not None else v
        value = self._gather(ref, idx, (), items)
        for _ in range(self.nslices):
            value = ref.xp.reduce(value, self.reduce, 0)
        return value

    def _gather(self, ref: Reference, idx: list, prefix: tuple, items: dict) -> Any:
        k = len(prefix)
        if k == len(idx):
            return items[prefix]
        if isinstance(idx[k], range):
            parts = [self._gather(ref, idx, prefix + (p,), items) for p in idx[k]]
            inner = self.shape
            inner = (
                tuple(len(r) for r in idx[k + 1 :] if isinstance(r, range)) + inner
            )  # shape of one part
            return ref.xp.stack(parts, inner)
        return self._gather(ref, idx, prefix + (idx[k],), items)

    def build(self, b: Builder) -> Any:
        key = [
            s.build(b.sym[d], b.big[d], b.tl)
            for d, s in zip(self.src.domain, self.specs, strict=True)
        ]
        if self.spatial is not None:
            key.append(self.spatial)
        out = b.tensors[self.src.name]
        if key and not self.bare:
            out = out[tuple(key) if len(key) > 1 else key[0]]
        for _ in range(self.nslices):
            out = getattr(out, self.reduce)(0)
        return out

    def source(self) -> str:
        key = [s.source(d) for d, s in zip(self.src.domain, self.specs, strict=True)]
        if self.spatial is not None:
            key.append(str(self.spatial))
        text = f"{self.src.name}[{', '.join(key)}]" if key and not self.bare else self.src.name
        return text + f".{self.reduce}(0)" * self.nslices

    def leaves(self) -> set[str]:
        return {self.src.name}

    def own_flags(self) -> set[str]:
        out = {SPEC_FLAG.get(s.kind, s.kind) for s in self.specs} - {None}
        if self.spatial is not None:
            out.add("spatial_index")
        if self.nslices and self.src.kind != "input":
            out.add("derived_slice")
        if self.nslices and self.reduce in ("max", "min"):
            out.add("reduce_max")
        if self.bare and self.specs:
            out.add("bare")
        if not self.src.domain:
            out.add("scalar_input")
        return out


@dataclass
class Const(Expr):
    """A number as a whole branch: a base case written as ``x[0] = -0.5``."""

    value: float

    def __post_init__(self) -> None:
        self.dims, self.shape = frozenset(), ()

    def ev(self, ref: Reference, env: dict[str, int]) -> Any:
        return self.value

    def build(self, b: Builder) -> Any:
        return self.value

    def source(self) -> str:
        return repr(self.value)

    def leaves(self) -> set[str]:
        return set()

    def own_flags(self) -> set[str]:
        return {"constant"}


@dataclass
class Unary(Expr):
    op: str
    x: Expr

    def __post_init__(self) -> None:
        self.dims, self.shape = self.x.dims, self.x.shape

    def ev(self, ref: Reference, env: dict[str, int]) -> Any:
        v = self.x.ev(ref, env)
        xp = ref.xp
        return {
            "tanh": lambda: xp.tanh(v),
            "sigmoid": lambda: xp.sigmoid(v),
            "exp": lambda: xp.exp(xp.tanh(v)),
            "lgamma": lambda: xp.lgamma(xp.sigmoid(v) + 0.5),
            "neg": lambda: -v,
            "square": lambda: v * v,
            "sin": lambda: xp.sin(v),
            "host": lambda: xp.tanh(v) * 0.5,
            "softmax": lambda: xp.softmax(v),
            "log_softmax": lambda: v - xp.reduce(v, "logsumexp", -1)[..., None],
            "clamp": lambda: xp.clip(v, -0.5, 0.5),
            "relu": lambda: xp.where(v > 0.0, v, 0.0 * v),
            "abs": lambda: abs(v),
        }[self.op]()

    def build(self, b: Builder) -> Any:
        v = self.x.build(b)
        return {
            "tanh": lambda: v.tanh(),
            "sigmoid": lambda: v.sigmoid(),
            "exp": lambda: v.tanh().exp(),
            "lgamma": lambda: (v.sigmoid() + 0.5).lgamma(),
            "neg": lambda: -v,
            "square": lambda: v * v,
            "sin": lambda: v.sin(),
            "host": lambda: b.host(v),
            "softmax": lambda: v.softmax(-1),
            "log_softmax": lambda: v.log_softmax(-1),
            "clamp": lambda: v.clamp(-0.5, 0.5),
            "relu": lambda: v.relu(),
            "abs": lambda: v.abs(),
        }[self.op]()

    def source(self) -> str:
        s = self.x.source()
        return {
            "tanh": f"({s}).tanh()",
            "sigmoid": f"({s}).sigmoid()",
            "exp": f"({s}).tanh().exp()",
            "lgamma": f"(({s}).sigmoid() + 0.5).lgamma()",
            "neg": f"-({s})",
            "square": f"({s}) * ({s})",
            "sin": f"({s}).sin()",
            "host": f"host({s})",
            "softmax": f"({s}).softmax(-1)",
            "log_softmax": f"({s}).log_softmax(-1)",
            "clamp": f"({s}).clamp(-0.5, 0.5)",
            "relu": f"({s}).relu()",
            "abs": f"({s}).abs()",
        }[self.op]

    def leaves(self) -> set[str]:
        return self.x.leaves()

    def own_flags(self) -> set[str]:
        if self.op in ("softmax", "log_softmax"):
            return {"softmax"}
        if self.op in ("clamp", "relu", "abs"):
            return {"kinks"}
        return {self.op} if self.op in ("exp", "lgamma", "host") else set()


def _bshape(a: tuple, b: tuple) -> tuple:
    return a if len(a) >= len(b) else b


@dataclass
class Binary(Expr):
    op: str
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        self.dims = self.a.dims | self.b.dims
        self.shape = _bshape(self.a.shape, self.b.shape)

    def ev(self, ref: Reference, env: dict[str, int]) -> Any:
        a, b = self.a.ev(ref, env), self.b.ev(ref, env)
        if self.op == "add":
            return a + b
        if self.op == "sub":
            return a - b
        if self.op == "mul":
            return a * b
        return ref.xp.maximum(a, b)

    def build(self, b: Builder) -> Any:
        x, y = self.a.build(b), self.b.build(b)
        if self.op == "add":
            return x + y
        if self.op == "sub":
            return x - y
        if self.op == "mul":
            return x * y
        return b.tl.maximum(x, y)

    def source(self) -> str:
        x, y = self.a.source(), self.b.source()
        if self.op == "maximum":
            return f"tl.maximum({x}, {y})"
        sym = {"add": "+", "sub": "-", "mul": "*"}[self.op]
        return f"({x}) {sym} ({y})"

    def leaves(self) -> set[str]:
        return self.a.leaves() | self.b.leaves()

    def own_flags(self) -> set[str]:
        return {"maximum"} if self.op == "maximum" else set()


@dataclass
class Where(Expr):
    """``tl.where(c > 0, a, b)``."""

    c: Expr
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        self.dims = self.c.dims | self.a.dims | self.b.dims
        self.shape = _bshape(_bshape(self.c.shape, self.a.shape), self.b.shape)

    def ev(self, ref: Reference, env: dict[str, int]) -> Any:
        return ref.xp.where(self.c.ev(ref, env) > 0, self.a.ev(ref, env), self.b.ev(ref, env))

    def build(self, b: Builder) -> Any:
        return b.tl.where(self.c.build(b) > 0, self.a.build(b), self.b.build(b))

    def source(self) -> str:
        return f"tl.where(({self.c.source()}) > 0, {self.a.source()}, {self.b.source()})"

    def leaves(self) -> set[str]:
        return self.c.leaves() | self.a.leaves() | self.b.leaves()

    def own_flags(self) -> set[str]:
        return {"where"}


@dataclass
class Affine(Expr):
    """``x * scale + shift`` with Python float constants."""

    x: Expr
    scale: float
    shift: float

    def __post_init__(self) -> None:
        self.dims, self.shape = self.x.dims, self.x.shape

    def ev(self, ref: Reference, env: dict[str, int]) -> Any:
        return self.x.ev(ref, env) * self.scale + self.shift

    def build(self, b: Builder) -> Any:
        return self.x.build(b) * self.scale + self.shift

    def source(self) -> str:
        return f"({self.x.source()}) * {self.scale} + {self.shift}"

    def leaves(self) -> set[str]:
        return self.x.leaves()


@dataclass
class Noise(Expr):
    """``x + 0.25 * tl.randn(x.shape, like=x)``: standard normal noise at each point of x's
    dims. The reference takes the numbers timerl defines for ``(stream, point)`` as data, as
    it takes the inputs (``use_noise``: this module imports nothing of timerl), so what is
    compared is which point's numbers each value gets: batched, blocked, retimed or
    reordered, the same as drawn point by point. ``stream`` is set on the op, not counted by
    the context, so the reference knows it without building the program."""

    x: Expr
    stream: int

    def __post_init__(self) -> None:
        self.dims, self.shape = self.x.dims, self.x.shape

    def ev(self, ref: Reference, env: dict[str, int]) -> Any:
        if not _DRAW:
            raise RuntimeError("the reference draws noise with what harness.use_noise gave it")
        point = tuple(env[d] for d in ref.program.dims if d in self.dims)
        z = _DRAW[0](self.stream, point, self.shape)
        if ref.xp.name == "torch":
            z = ref.xp.torch.as_tensor(z)
        return self.x.ev(ref, env) + z * 0.25

    def build(self, b: Builder) -> Any:
        x = self.x.build(b)
        z = b.tl.randn(self.shape, like=x)
        z.op.attrs["stream"] = self.stream
        return x + z * 0.25

    def source(self) -> str:
        x = self.x.source()
        return f"({x}) + noise({self.shape}, {x}, stream={self.stream}) * 0.25"

    def leaves(self) -> set[str]:
        return self.x.leaves()

    def own_flags(self) -> set[str]:
        return {"noise"}


@dataclass
class SpatialReduce(Expr):
    """``x.sum(-1)`` (or mean/max) over the one spatial axis."""

    op: str
    x: Expr

    def __post_init__(self) -> None:
        self.dims, self.shape = self.x.dims, ()

    def ev(self, ref: Reference, env: dict[str, int]) -> Any:
        return ref.xp.reduce(self.x.ev(ref, env), self.op, -1)

    def build(self, b: Builder) -> Any:
        return getattr(self.x.build(b), self.op)(-1)

    def source(self) -> str:
        return f"({self.x.source()}).{self.op}(-1)"

    def leaves(self) -> set[str]:
        return self.x.leaves()

    def own_flags(self) -> set[str]:
        return {"spatial_reduce"} | ({"softmax"} if self.op == "logsumexp" else set())


@dataclass
class MatMul(Expr):
    """``x @ m``: a product with a constant matrix, as a layer of a policy is."""

    x: Expr
    m: np.ndarray

    def __post_init__(self) -> None:
        self.dims, self.shape = self.x.dims, self.x.shape

    def ev(self, ref: Reference, env: dict[str, int]) -> Any:
        return ref.xp.matmul(self.x.ev(ref, env), self.m)

    def build(self, b: Builder) -> Any:
        return self.x.build(b) @ b.tl.from_numpy(self.m, dtype="float64")

    def source(self) -> str:
        m = " ".join(np.array2string(self.m, separator=", ", precision=17).split())
        return f'({self.x.source()}) @ tl.from_numpy(np.array({m}), dtype="float64")'

    def leaves(self) -> set[str]:
        return self.x.leaves()

    def own_flags(self) -> set[str]:
        return {"matmul"}


@dataclass
class Pick(Expr):
    """``x.gather(-1, k)``, ``x.take(k, -1)`` (``k`` constant ints, one per position) or
    ``x.cumsum(-1)``: what a categorical policy's log-probability and its gradient
    (``index_add``, ``scatter_add``) are made of."""

    kind: str
    x: Expr
    index: np.ndarray

    def __post_init__(self) -> None:
        self.dims, self.shape = self.x.dims, self.x.shape

    def ev(self, ref: Reference, env: dict[str, int]) -> Any:
        return ref.xp.pick(self.kind, self.x.ev(ref, env), self.index)

    def build(self, b: Builder) -> Any:
        x = self.x.build(b)
        if self.kind == "cumsum":
            return x.cumsum(-1)
        k = b.tl.from_numpy(self.index, dtype="int64")
        return x.gather(-1, k) if self.kind == "gather" else x.take(k, -1)

    def source(self) -> str:
        x = self.x.source()
        if self.kind == "cumsum":
            return f"({x}).cumsum(-1)"
        k = f'tl.from_numpy(np.array({self.index.tolist()}), dtype="int64")'
        return f"({x}).gather(-1, {k})" if self.kind == "gather" else f"({x}).take({k}, -1)"

    def leaves(self) -> set[str]:
        return self.x.leaves()

    def own_flags(self) -> set[str]:
        return {"gather"}


@dataclass
class Move(Expr):
    """A spatial value through movement ops, back to its shape: ``outer`` is
    ``(x.unsqueeze(-1) * x.unsqueeze(0)).sum(0)`` (x times its sum), ``expand``
    ``x.unsqueeze(0).expand(2, S).transpose(0, 1).sum(-1)`` (twice x), ``reshape``
    ``x.reshape(S, 1).permute(1, 0).squeeze(0)`` (x)."""

    kind: str
    x: Expr

    def __post_init__(self) -> None:
        self.dims, self.shape = self.x.dims, self.x.shape

    def ev(self, ref: Reference, env: dict[str, int]) -> Any:
        v = self.x.ev(ref, env)
        if self.kind == "outer":
            return v * ref.xp.reduce(v, "sum", -1)
        return v * 2.0 if self.kind == "expand" else v

    def build(self, b: Builder) -> Any:
        x = self.x.build(b)
        n = self.shape[0]
        if self.kind == "outer":
            return (x.unsqueeze(-1) * x.unsqueeze(0)).sum(0)
        if self.kind == "expand":
            return x.unsqueeze(0).expand(2, n).transpose(0, 1).sum(-1)
        return x.reshape(n, 1).permute(1, 0).squeeze(0)

    def source(self) -> str:
        x, n = self.x.source(), self.shape[0]
        return {
            "outer": f"(({x}).unsqueeze(-1) * ({x}).unsqueeze(0)).sum(0)",
            "expand": f"({x}).unsqueeze(0).expand(2, {n}).transpose(0, 1).sum(-1)",
            "reshape": f"({x}).reshape({n}, 1).permute(1, 0).squeeze(0)",
        }[self.kind]

    def leaves(self) -> set[str]:
        return self.x.leaves()

    def own_flags(self) -> set[str]:
        return {"movement"}


def _array_source(a: np.ndarray) -> str:
    body = " ".join(np.array2string(a, separator=", ", precision=17).split())
    return f'tl.from_numpy(np.array({body}), dtype="float64")'


@dataclass
class Conv(Expr):
    """A convolution along the vector: ``x`` as a one-row image ``(1, 1, S)``, a constant
    kernel ``w`` of ``(2, 1, 1, 3)`` zero-padded by one on each side of the row, its two output
    channels summed back to ``(S,)`` (an image layer's ``conv2d`` and its two gradients)."""

    x: Expr
    w: np.ndarray

    def __post_init__(self) -> None:
        self.dims, self.shape = self.x.dims, self.x.shape

    def ev(self, ref: Reference, env: dict[str, int]) -> Any:
        return ref.xp.conv_row(self.x.ev(ref, env), self.w)

    def build(self, b: Builder) -> Any:
        n = self.shape[0]
        w = b.tl.from_numpy(self.w, dtype="float64")
        return b.tl.conv2d(self.x.build(b).reshape(1, 1, n), w, padding=(0, 1)).reshape(2, n).sum(0)

    def source(self) -> str:
        n = self.shape[0]
        x, w = self.x.source(), _array_source(self.w)
        return f"tl.conv2d(({x}).reshape(1, 1, {n}), {w}, padding=(0, 1)).reshape(2, {n}).sum(0)"

    def leaves(self) -> set[str]:
        return self.x.leaves()

    def own_flags(self) -> set[str]:
        return {"conv"}


@dataclass
class Cell(Expr):
    """A GRU cell's step ``h' = (1 - u) n + u h`` from input ``x`` and state ``h`` (both
    ``(S,)``), gates reset, update, new cut from ``x @ wi`` and ``h @ wh`` (constant
    ``(S, 3 S)``) by ``narrow``, as ``nn.GRUCell`` does."""

    x: Expr
    h: Expr
    wi: np.ndarray
    wh: np.ndarray

    def __post_init__(self) -> None:
        self.dims, self.shape = self.x.dims | self.h.dims, self.x.shape

    def ev(self, ref: Reference, env: dict[str, int]) -> Any:
        xp, n = ref.xp, self.shape[0]
        h = self.h.ev(ref, env)
        zi, zh = xp.matmul(self.x.ev(ref, env), self.wi), xp.matmul(h, self.wh)
        r = xp.sigmoid(zi[..., :n] + zh[..., :n])
        u = xp.sigmoid(zi[..., n : 2 * n] + zh[..., n : 2 * n])
        new = xp.tanh(zi[..., 2 * n :] + r * zh[..., 2 * n :])
        return (1.0 - u) * new + u * h

    def build(self, b: Builder) -> Any:
        n, tl = self.shape[0], b.tl
        h = self.h.build(b)
        zi = self.x.build(b) @ tl.from_numpy(self.wi, dtype="float64")
        zh = h @ tl.from_numpy(self.wh, dtype="float64")
        r = (zi.narrow(-1, 0, n) + zh.narrow(-1, 0, n)).sigmoid()
        u = (zi.narrow(-1, n, n) + zh.narrow(-1, n, n)).sigmoid()
        new = (zi.narrow(-1, 2 * n, n) + r * zh.narrow(-1, 2 * n, n)).tanh()
        return (1.0 - u) * new + u * h

    def source(self) -> str:
        n = self.shape[0]
        zi = f"(({self.x.source()}) @ {_array_source(self.wi)})"
        h = f"({self.h.source()})"
        zh = f"({h} @ {_array_source(self.wh)})"

        def gate(k: int) -> str:
            return f"{zi}.narrow(-1, {k * n}, {n}) + {zh}.narrow(-1, {k * n}, {n})"

        new = f"({zi}.narrow(-1, {2 * n}, {n}) + ({gate(0)}).sigmoid() * {zh}.narrow(-1, {2 * n}, {n})).tanh()"
        u = f"({gate(1)}).sigmoid()"
        return f"((1.0 - {u}) * {new} + {u} * {h})"

    def leaves(self) -> set[str]:
        return self.x.leaves() | self.h.leaves()

    def own_flags(self) -> set[str]:
        return {"cell"}
