"""Random valid recurrence programs, each with a timerl builder and an independent evaluator.

A program is a small tree of plain Python objects: inputs (numpy arrays over some of the
context's dims), derived tensors (``y = expr``) and piecewise placeholders (a list of branches,
each an index or condition write and an expression). The same tree is

- built into a timerl program (``Program.build``),
- printed as runnable timerl source (``Program.source``), the reproducer of a failure, and
- evaluated point by point by ``Reference``, a memoised lazy interpreter written here against
  numpy or torch (torch only for autograd gradients), which knows nothing of timerl: each point
  of a placeholder takes the first branch that matches it, and reads are plain array indexing.

Programs are valid by construction: every branch list ends with a branch covering every point
the earlier ones leave, every read of another point stays in range for the points its branch
runs at (tracked as a ``Scope``), and recurrences only read points that come before in their
own direction. Every construct is behind a named flag (``FLAGS``) so a failing one can be
switched off while looking for others; the test suite enables all of them.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Every construct the generator can produce; tests enable all of them.
FLAGS: tuple[str, ...] = (
    "two_dims",  # contexts with dims (i, t), not only (t,)
    "spatial",  # spatial shapes (2,) and (3,), not only scalars
    "shift",  # reads at d + k / d - k where the branch guarantees the range
    "clamp",  # tl.max(d - k, 0), tl.min(d + k, D - 1)
    "mod",  # d % k
    "div",  # d // k
    "const_index",  # 0, 1, D - 1 (removes the dim)
    "prefix",  # 0:d + 1
    "suffix",  # d:D
    "window",  # tl.max(d - k, 0):d + 1
    "ahead",  # d:tl.min(d + k, D)
    "full",  # 0:D
    "partial",  # 0:k with constant k (issue: partial slices under max/min)
    "after",  # d + 1:D (empty at the last point; reduced by sum only)
    "reduce_max",  # max/min over gathered slices (sum/mean always on)
    "spatial_reduce",  # sum/mean/max over the spatial axis
    "spatial_index",  # x[t, 1]
    "where",  # tl.where(c > 0, a, b)
    "maximum",  # tl.maximum(a, b)
    "exp",  # exp of a tanh-bounded value
    "lgamma",  # lgamma of a sigmoid-bounded value in (0.5, 1.5) (digamma in its gradient)
    "alias",  # a derived tensor that is only a read: lag = u[tl.max(t - 1, 0)]
    "derived_slice",  # slices of non-input tensors
    "piecewise",  # x[t.eq(T - 1)] = ..; x[t < 2] = ..; x[True] = ..
    "fwd",  # x[0] = ..; x[t + 1] = f(x[t])
    "fwd_cond",  # x[t.eq(0)] = ..; x[True] = f(x[t - 1])
    "bwd_cond",  # r[t.eq(T - 1)] = ..; r[True] = f(r[t + 1])
    "overlap",  # r[T - 1] = ..; r[t] = f(r[t + 1])  (first match wins)
    "two_step",  # x[0] = a; x[1] = b; x[t + 2] = f(x[t + 1], x[t])
    "coupled",  # a[t + 1] = f(a[t], b[t]); b[t + 1] = g(b[t], a[t + 1])
    "carry",  # h[0, 0] = ..; h[i + 1, 0] = h[i, T - 1]; h[i, t + 1] = f(h[i, t])
    "outer_rec",  # a recurrence over i in an (i, t) context
    "cross_read",  # x[i, t + 1] = f(x[tl.min(i + 1, I - 1), t], x[0:I, t].sum(0), ..)
    "linear",  # fwd_cond/bwd_cond with a linear step: r[True] = a + c * r[t + 1] (a scan)
    "host",  # an effect: host(v), a host function called at every point of v's domain
    "matmul",  # v @ M with a constant (S, S) matrix M (spatial values only)
    "softmax",  # v.softmax(-1), v.log_softmax(-1), v.logsumexp(-1) (spatial values only)
    "gather",  # v.gather(-1, k), v.take(k, -1) with constant ints k, v.cumsum(-1) (spatial)
    "kinks",  # v.clamp(-0.5, 0.5), v.relu(), v.abs()
    "movement",  # unsqueeze, expand, transpose, reshape, permute, squeeze of spatial values
    "noise",  # v + 0.25 * tl.randn(v.shape, like=v): a policy's exploration noise
    "sink",  # ctx.sink(x, fn): fn gets x at every point (checked when compiled with effects)
    "until",  # ctx.until(t, stop): t is dynamic, ended by data (inputs run past it)
)

DIM_BOUND = {"t": "T", "i": "I"}
# the value of an input's rows past the point where ``until`` ends t: far outside the (-1, 1)
# of the rows a program reads, so a read past the end shows in the values
PAST = 7.0


SPEC_FLAG = {
    "cur": None,
    "clamp_lo": "clamp",
    "clamp_hi": "clamp",
    "const": "const_index",
    "last": "const_index",
}

# --------------------------------------------------------------------------- choosers


class Chooser:
    """Where the generator's choices come from (hypothesis draws, or a seeded RNG)."""

    def int(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def pick(self, options: Sequence[Any]) -> Any:
        return options[self.int(0, len(options) - 1)]

    def chance(self, percent: int) -> bool:
        return self.int(0, 99) < percent


class RandomChooser(Chooser):
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


class DrawChooser(Chooser):
    """Choices drawn from hypothesis, so failing programs shrink towards the first options."""

    def __init__(self, draw: Callable[[Any], Any]) -> None:
        from hypothesis import strategies as st

        self.draw = draw
        self.st = st

    def int(self, lo: int, hi: int) -> int:
        return self.draw(self.st.integers(lo, hi))


# --------------------------------------------------------------------------- index specs


@dataclass(frozen=True)
class Spec:
    """The index of one source dim ``d`` (bound ``D``) in a read."""

    kind: str
    k: int = 0

    @property
    def is_slice(self) -> bool:
        return self.kind in ("prefix", "suffix", "window", "ahead", "full", "partial", "after")

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
            return n - 1
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
        raise AssertionError(kind)

    def build(self, d: Any, big: Any, tl: Any) -> Any:
        k = self.k
        return {
            "cur": lambda: d,
            "shift": lambda: d + k,
            "const": lambda: k,
            "last": lambda: big - 1,
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
        }[self.kind]()

    def source(self, d: str) -> str:
        big = DIM_BOUND[d]
        k = self.k
        shift = f"{d} + {k}" if k > 0 else f"{d} - {-k}"
        return {
            "cur": d,
            "shift": shift,
            "const": str(k),
            "last": f"{big} - 1",
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
        }[self.kind]


# --------------------------------------------------------------------------- array modules


class NumpyOps:
    """The reference's array operations in numpy (values)."""

    name = "numpy"

    @staticmethod
    def stack(items: list, shape: tuple) -> Any:
        if not items:
            return np.zeros((0, *shape))
        return np.stack(items)

    tanh = staticmethod(np.tanh)
    exp = staticmethod(np.exp)

    @staticmethod
    def lgamma(x: Any) -> Any:
        """The C library's, elementwise (numpy has none)."""
        return np.asarray(np.frompyfunc(math.lgamma, 1, 1)(x), dtype=np.float64)

    sin = staticmethod(np.sin)
    matmul = staticmethod(np.matmul)
    maximum = staticmethod(np.maximum)
    where = staticmethod(np.where)

    @staticmethod
    def sigmoid(x: Any) -> Any:
        return 1.0 / (1.0 + np.exp(-x))

    @staticmethod
    def reduce(x: Any, op: str, axis: int) -> Any:
        if op == "logsumexp":
            top = np.max(x, axis=axis, keepdims=True)
            return np.log(np.sum(np.exp(x - top), axis=axis)) + np.squeeze(top, axis)
        return {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[op](x, axis=axis)

    @staticmethod
    def softmax(x: Any) -> Any:
        z = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return z / np.sum(z, axis=-1, keepdims=True)

    clip = staticmethod(np.clip)

    @staticmethod
    def pick(kind: str, x: Any, index: np.ndarray) -> Any:
        """``x`` along its last axis: at ``index`` (gather and take agree on a vector), or
        summed up to each position (cumsum)."""
        return np.cumsum(x, axis=-1) if kind == "cumsum" else x[..., index]


class TorchOps:
    """The same operations in torch, so autograd gives the reference gradients."""

    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def stack(self, items: list, shape: tuple) -> Any:
        if not items:
            return self.torch.zeros((0, *shape), dtype=self.torch.float64)
        return self.torch.stack(items)

    def tanh(self, x: Any) -> Any:
        return self.torch.tanh(x)

    def exp(self, x: Any) -> Any:
        return self.torch.exp(x)

    def lgamma(self, x: Any) -> Any:
        return self.torch.lgamma(x)

    def sin(self, x: Any) -> Any:
        return self.torch.sin(x)

    def sigmoid(self, x: Any) -> Any:
        return self.torch.sigmoid(x)

    def matmul(self, a: Any, m: np.ndarray) -> Any:
        t = self.torch
        return t.matmul(t.as_tensor(a, dtype=t.float64), t.as_tensor(m, dtype=t.float64))

    def maximum(self, a: Any, b: Any) -> Any:
        t = self.torch
        a, b = t.as_tensor(a, dtype=t.float64), t.as_tensor(b, dtype=t.float64)
        return t.maximum(a, b)

    def where(self, c: Any, a: Any, b: Any) -> Any:
        t = self.torch
        a, b = t.as_tensor(a, dtype=t.float64), t.as_tensor(b, dtype=t.float64)
        return t.where(c, a, b)

    def softmax(self, x: Any) -> Any:
        return self.torch.softmax(x, -1)

    def clip(self, x: Any, lo: float, hi: float) -> Any:
        return self.torch.clamp(self.torch.as_tensor(x, dtype=self.torch.float64), lo, hi)

    def pick(self, kind: str, x: Any, index: np.ndarray) -> Any:
        t = self.torch
        x = t.as_tensor(x, dtype=t.float64)
        return t.cumsum(x, -1) if kind == "cumsum" else x[..., t.as_tensor(index)]

    def reduce(self, x: Any, op: str, axis: int) -> Any:
        t = self.torch
        if op == "logsumexp":
            return t.logsumexp(x, axis)
        if op == "sum":
            return x.sum(axis)
        if op == "mean":
            return x.mean(axis)
        if op == "max":
            return t.amax(x, axis)
        return t.amin(x, axis)


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


@dataclass
class Read(Expr):
    """``src[spec, ..., spatial]``, gathered slices reduced by ``reduce`` over axis 0."""

    src: TensorDef
    specs: tuple[Spec, ...]
    spatial: int | None = None
    reduce: str = "sum"

    def __post_init__(self) -> None:
        self.dims = frozenset(
            d for d, s in zip(self.src.domain, self.specs, strict=True) if not s.constant
        )
        shape = self.src.shape
        if self.spatial is not None:
            shape = shape[1:]
        self.shape = tuple(shape)
        self.nslices = sum(s.is_slice for s in self.specs)

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
        if key:
            out = out[tuple(key) if len(key) > 1 else key[0]]
        for _ in range(self.nslices):
            out = getattr(out, self.reduce)(0)
        return out

    def source(self) -> str:
        key = [s.source(d) for d, s in zip(self.src.domain, self.specs, strict=True)]
        if self.spatial is not None:
            key.append(str(self.spatial))
        text = f"{self.src.name}[{', '.join(key)}]" if key else self.src.name
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
        return out


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


# --------------------------------------------------------------------------- tensors


@dataclass(frozen=True)
class Write:
    """Where a branch writes: per dim ``cur`` (d), ``shift`` (d + k), ``const`` (k), ``last``."""

    specs: tuple[Spec, ...]

    def match(self, point: tuple, dims: tuple, n: dict) -> dict | None:
        env = {}
        for d, s, p in zip(dims, self.specs, point, strict=True):
            if s.kind == "cur":
                env[d] = p
            elif s.kind == "shift":
                if p < s.k:
                    return None
                env[d] = p - s.k
            elif s.kind == "const":
                if p != s.k:
                    return None
                env[d] = p
            elif s.kind == "last":
                if p != n[d] - 1:
                    return None
                env[d] = p
            else:
                raise AssertionError(s.kind)
        return env

    def key(self, b: Builder, dims: tuple) -> Any:
        key = tuple(
            s.build(b.sym[d], b.big[d], b.tl) for d, s in zip(dims, self.specs, strict=True)
        )
        return key if len(key) > 1 else key[0]

    def source(self, dims: tuple) -> str:
        return ", ".join(s.source(d) for d, s in zip(dims, self.specs, strict=True))


@dataclass(frozen=True)
class Cond:
    """A condition write: ``d.eq(0)``, ``d.eq(D - 1)``, ``d < k``, ``(i + t).eq(k)``, ``True``."""

    kind: str
    d: str = "t"
    k: int = 0

    def holds(self, env: dict, n: dict) -> bool:
        if self.kind == "true":
            return True
        if self.kind == "eq0":
            return env[self.d] == 0
        if self.kind == "eqlast":
            return env[self.d] == n[self.d] - 1
        if self.kind == "lt":
            return env[self.d] < self.k
        if self.kind == "sum_eq":
            return env["i"] + env["t"] == self.k
        raise AssertionError(self.kind)

    def match(self, point: tuple, dims: tuple, n: dict) -> dict | None:
        env = dict(zip(dims, point, strict=True))
        return env if self.holds(env, n) else None

    def key(self, b: Builder, dims: tuple) -> Any:
        if self.kind == "true":
            return True
        d, big = b.sym.get(self.d), b.big.get(self.d)
        if self.kind == "eq0":
            return d.eq(0)
        if self.kind == "eqlast":
            return d.eq(big - 1)
        if self.kind == "lt":
            return d < self.k
        return (b.sym["i"] + b.sym["t"]).eq(self.k)

    def source(self, dims: tuple) -> str:
        big = DIM_BOUND.get(self.d)
        return {
            "true": "True",
            "eq0": f"{self.d}.eq(0)",
            "eqlast": f"{self.d}.eq({big} - 1)",
            "lt": f"{self.d} < {self.k}",
            "sum_eq": f"(i + t).eq({self.k})",
        }[self.kind]


@dataclass
class TensorDef:
    """An input (``array``), a derived tensor (``expr``) or a placeholder (``branches``)."""

    name: str
    domain: tuple[str, ...]
    shape: tuple[int, ...]
    array: np.ndarray | None = None
    expr: Expr | None = None
    branches: list[tuple[Write | Cond, Expr]] = field(default_factory=list)
    construct: str = "input"
    group: str = ""  # placeholders defined together (coupled recurrences) share a group
    linear: bool = False  # a fwd_cond/bwd_cond recurrence with a linear step (flag "linear")

    @property
    def kind(self) -> str:
        if self.array is not None:
            return "input"
        return "derived" if self.expr is not None else "placeholder"


# --------------------------------------------------------------------------- program


class Builder:
    """State while building the timerl program: symbols, bounds, tensors by name."""

    def __init__(self, tl: Any, ctx: Any) -> None:
        self.tl = tl
        self.ctx = ctx
        self.sym = {s.name: s for s in ctx.dims}
        self.big = {d: b for d, b in zip(self.sym, ctx.bounds, strict=True)}
        self.tensors: dict[str, Any] = {}
        # what each sink received: tensor name -> [(point as a tuple over its dims, value)]
        self.sunk: dict[str, list[tuple[tuple[int, ...], np.ndarray]]] = {}

    def recorder(self, name: str) -> Callable[[Any, dict[str, int]], None]:
        got = self.sunk.setdefault(name, [])

        def record(value: Any, point: dict[str, int]) -> None:
            got.append((tuple(point.values()), np.array(value, dtype=np.float64)))

        return record

    def host(self, v: Any) -> Any:
        """``v`` through a host function marked as an effect (an env step's kind of call)."""
        out = self.tl.api.functional.apply(
            "udf",
            v.view,
            fn=host_function,
            shape=tuple(v.shape),
            dtype=np.dtype("float64"),
            effect=True,
            name="host",
        )
        self.ctx.add_root(out.op)
        return self.tl.RecurrentTensor(out, self.ctx)


def host_function(a: Any) -> np.ndarray:
    return np.tanh(np.asarray(a, dtype=np.float64)) * 0.5


class Reference:
    """The independent evaluator: each point computed on demand, memoised, first branch wins.

    With per-episode lengths (``Program.lengths``) ``T`` is the length of the episode being
    computed: a tensor over i sets it from its point, and one without i (a schedule over t
    alone) computes its points for the episode that reads them.
    """

    def __init__(self, program: Program, xp: Any, leaves: dict[str, Any]) -> None:
        self.program = program
        self.xp = xp
        self.leaves = leaves
        self.memo: dict[tuple, Any] = {}
        self.lengths = program.lengths
        self.sizes = [dict(program.n)]  # the sizes of the dims for the episode being computed

    @property
    def n(self) -> dict[str, int]:
        return self.sizes[-1]

    def value(self, t: TensorDef, point: tuple) -> Any:
        if self.lengths is None:
            return self._value(t, point, (t.name, point))
        if "i" not in t.domain:  # computed for the episode that reads it
            return self._value(t, point, (t.name, point, self.n["t"]))
        episode = point[t.domain.index("i")]
        if not 0 <= episode < self.program.n["i"]:
            raise IndexError(f"generator bug: {t.name} read at {point}, outside its domain")
        self.sizes.append({**self.program.n, "t": self.lengths[episode]})
        try:
            return self._value(t, point, (t.name, point))
        finally:
            self.sizes.pop()

    def _value(self, t: TensorDef, point: tuple, key: tuple) -> Any:
        if not all(0 <= p < self.n[d] for d, p in zip(t.domain, point, strict=True)):
            raise IndexError(f"generator bug: {t.name} read at {point}, outside its domain")
        if key in self.memo:
            return self.memo[key]
        if t.kind == "input":
            v = self.leaves[t.name][point]
        elif t.kind == "derived":
            v = t.expr.ev(self, dict(zip(t.domain, point, strict=True)))
        else:
            for where, expr in t.branches:
                env = where.match(point, t.domain, self.n)
                if env is not None:
                    v = expr.ev(self, env)
                    break
            else:
                raise AssertionError(f"generator bug: {t.name}{point} undefined")
        if self.xp.name != "torch":
            v = np.broadcast_to(np.asarray(v, dtype=np.float64), t.shape)
        else:
            torch = self.xp.torch
            v = torch.as_tensor(v, dtype=torch.float64).expand(t.shape)
        self.memo[key] = v
        return v

    def whole(self, t: TensorDef) -> Any:
        """All points of ``t``, domain axes leading (as ``tl.evaluate`` returns them); with
        per-episode lengths, a tensor over (i, t) is a list of each episode's points."""
        if self.lengths is not None and "t" in t.domain:
            assert t.domain == ("i", "t"), f"generator bug: {t.name} over t without i"
            return [
                self.xp.stack([self.value(t, (k, q)) for q in range(n)], t.shape)
                for k, n in enumerate(self.lengths)
            ]
        points = list(itertools.product(*(range(self.n[d]) for d in t.domain)))
        items = [self.value(t, p) for p in points]
        full = self.xp.stack(items, t.shape)
        return full.reshape(tuple(self.n[d] for d in t.domain) + t.shape)


@dataclass
class Program:
    dims: tuple[str, ...]
    n: dict[str, int]
    tensors: list[TensorDef]
    grad: bool = False
    sinks: tuple[str, ...] = ()  # tensors whose every point a sink receives
    # t ends by ``ctx.until`` at its last point ``n["t"] - 1``, with a cap this many points
    # further: inputs over t get that many more rows (``PAST``, never read), and a ``stop``
    # input is 1 at the end (None: t is static)
    until: int | None = None
    # the stop also reads a value without t taken from a point of an input over t (``(stop -
    # 0.5) * (w[0] + 1) > 0``, w in (0.5, 1.5)): what the stop needs from before its loop
    # that reads a loop's point runs inside the stopping loop, at that point
    until_reads_a_point: bool = False
    # with ``until`` on (i, t): each i ends t after its own number of points (``n["t"]`` to
    # ``n["t"] + until``), the stop condition over (i, t); inputs over t get rows of their own
    # up to the longest episode (``ragged_rows``), then ``PAST`` (None: one length for all)
    lengths: tuple[int, ...] | None = None

    def __repr__(self) -> str:
        return f"<program using {', '.join(sorted(self.used)) or 'no flagged construct'}>"

    @property
    def inputs(self) -> list[TensorDef]:
        return [t for t in self.tensors if t.kind == "input"]

    @property
    def outputs(self) -> list[TensorDef]:
        return [t for t in self.tensors if t.kind != "input"]

    @property
    def loss_of(self) -> TensorDef:
        return self.outputs[-1]

    @property
    def used(self) -> frozenset[str]:
        """The generator flags whose constructs appear in this program."""
        out = {t.construct for t in self.outputs} - {"derived"}
        if len(self.dims) == 2:
            out.add("two_dims")
        if any(t.shape for t in self.tensors):
            out.add("spatial")
        if any(t.linear for t in self.tensors):
            out.add("linear")
        if self.sinks:
            out.add("sink")
        if self.until is not None:
            out.add("until")
        if self.lengths is not None:
            out.add("ragged")
        for t in self.tensors:
            exprs = ([t.expr] if t.expr is not None else []) + [e for _, e in t.branches]
            for e in exprs:
                out |= e.flags()
        return frozenset(out)

    # -- timerl
    def build(self, tl: Any) -> tuple[Any, Builder, Any]:
        """The timerl program: (context, builder with tensors by name, loss or None)."""
        ctx = tl.Context(dims=self.dims)
        b = Builder(tl, ctx)
        loss = None
        with ctx:
            for t in self.tensors:
                if t.name in b.tensors:
                    continue
                if t.kind == "input":
                    b.tensors[t.name] = tl.from_numpy(
                        self.padded(t),
                        domain=tuple(b.sym[d] for d in t.domain),
                        requires_grad=self.grad,
                        dtype="float64",
                        name=t.name,
                    )
                elif t.kind == "derived":
                    b.tensors[t.name] = t.expr.build(b)
                else:
                    group = self.group_of(t)
                    for g in group:
                        b.tensors[g.name] = tl.RecurrentTensor.placeholder(
                            g.shape,
                            dtype="float64",
                            domain=tuple(b.sym[d] for d in g.domain),
                            name=g.name,
                        )
                    for g in group:
                        for where, expr in g.branches:
                            b.tensors[g.name][where.key(b, g.domain)] = expr.build(b)
            for name in self.sinks:
                ctx.sink(b.tensors[name], b.recorder(name))
            if self.until is not None:
                over = tuple(b.sym[d] for d in self.stop_domain)
                stop = tl.from_numpy(self.stop_marker(), domain=over, name="stop")
                if self.until_reads_a_point:
                    w = tl.from_numpy(self.stop_weights(), domain=(b.sym["t"],), name="w")
                    ctx.until(b.sym["t"], (stop - 0.5) * (w[0] + 1.0) > 0.0)
                else:
                    ctx.until(b.sym["t"], stop > 0.5)
            if self.grad:
                z = b.tensors[self.loss_of.name]
                loss = (z * z).sum()
                loss.backward()
        return ctx, b, loss

    def group_of(self, t: TensorDef) -> list[TensorDef]:
        """``t`` and the placeholders defined together with it."""
        return [t] + [g for g in self.tensors if g.group and g.group == t.name]

    def bounds(self, b: Builder) -> dict:
        return {b.big[d]: self.cap if d == "t" else self.n[d] for d in self.dims}

    @property
    def cap(self) -> int:
        return self.n["t"] + (self.until or 0)

    @property
    def stop_domain(self) -> tuple[str, ...]:
        return ("i", "t") if self.lengths is not None else ("t",)

    def rows(self, t: TensorDef) -> np.ndarray:
        """An input's values: its array, and with per-episode lengths rows of its own up to the
        longest episode (drawn from the array's values, so the same program draws them
        alike)."""
        if self.lengths is None or "t" not in t.domain:
            return t.array
        axis = t.domain.index("t")
        extra = max(self.lengths) - self.n["t"]
        rng = np.random.RandomState(int(abs(t.array.sum()) * 1e6) % 2**31)
        shape = list(t.array.shape)
        shape[axis] = extra
        return np.concatenate([t.array, rng.uniform(-1.0, 1.0, shape)], axis=axis)

    def padded(self, t: TensorDef) -> np.ndarray:
        """An input's array, with the rows past the stop where t ends by ``until`` (past each
        episode's own end where episodes have lengths of their own)."""
        rows = self.rows(t)
        if self.until is None or "t" not in t.domain:
            return rows
        axis = t.domain.index("t")
        shape = list(rows.shape)
        shape[axis] = self.cap - rows.shape[axis]
        out = np.concatenate([rows, np.full(shape, PAST)], axis=axis)
        if self.lengths is not None and "i" in t.domain:
            at_i = t.domain.index("i")
            for k, n in enumerate(self.lengths):
                index: list = [slice(None)] * out.ndim
                index[at_i], index[axis] = k, slice(n, None)
                out[tuple(index)] = PAST
        return out

    def stop_marker(self) -> np.ndarray:
        """1 at t's last point (``n["t"] - 1``, or each episode's own), 0 before it and after it
        (up to the cap)."""
        if self.lengths is None:
            out = np.zeros(self.cap)
            out[self.n["t"] - 1] = 1.0
            return out
        out = np.zeros((len(self.lengths), self.cap))
        out[range(len(self.lengths)), np.array(self.lengths) - 1] = 1.0
        return out

    def stop_weights(self) -> np.ndarray:
        """``w`` of ``until_reads_a_point``: positive, so the stop holds where the marker does."""
        return np.linspace(0.5, 1.5, self.cap)

    # -- reference
    def reference_values(self) -> dict[str, np.ndarray]:
        leaves = {t.name: self.rows(t) for t in self.inputs}
        ref = Reference(self, NumpyOps, leaves)
        return {t.name: ref.whole(t) for t in self.outputs}

    def reference_grads(self) -> dict[str, np.ndarray]:
        """d/d input of sum over the loss tensor's points of (z * z).sum(), by torch autograd."""
        import torch

        leaves = {
            t.name: torch.tensor(self.rows(t), dtype=torch.float64, requires_grad=True)
            for t in self.inputs
        }
        ref = Reference(self, TorchOps(), leaves)
        z = ref.whole(self.loss_of)
        parts = z if isinstance(z, list) else [z]  # one part per episode (``lengths``)
        total = sum((part * part).sum() for part in parts)
        names = list(leaves)
        if not total.requires_grad:  # the loss reads no input (constant indices into nothing)
            grads = [None] * len(names)
        else:
            grads = torch.autograd.grad(total, [leaves[k] for k in names], allow_unused=True)
        out = {
            k: (np.zeros_like(leaves[k].detach().numpy()) if g is None else g.numpy())
            for k, g in zip(names, grads, strict=True)
        }
        if self.lengths is not None:  # an input over (i, t): each episode's rows
            for t in self.inputs:
                if t.domain == ("i", "t"):
                    out[t.name] = [out[t.name][k, :n] for k, n in enumerate(self.lengths)]
        return out

    # -- reproducer
    def source(self) -> str:
        """The program as runnable timerl source."""
        lines = [
            "import numpy as np",
            "import timerl as tl",
            "",
            f"ctx = tl.Context(dims={self.dims!r})",
            f"({', '.join(self.dims)},), ({', '.join(DIM_BOUND[d] for d in self.dims)},)"
            " = ctx.dims, ctx.bounds",
        ]
        if "host" in self.used:
            lines += [
                "",
                "",
                "def host(x):",
                "    y = tl.api.functional.apply(",
                '        "udf", x.view, fn=lambda a: np.tanh(np.asarray(a, dtype=np.float64)) * 0.5,',
                '        shape=tuple(x.shape), dtype=np.dtype("float64"), effect=True, name="host",',
                "    )",
                "    ctx.add_root(y.op)",
                "    return tl.RecurrentTensor(y, ctx)",
                "",
                "",
            ]
        if "noise" in self.used:
            lines += [
                "",
                "",
                "def noise(shape, like, stream):",
                "    z = tl.randn(shape, like=like)",
                '    z.op.attrs["stream"] = stream',
                "    return z",
                "",
                "",
            ]
        lines.append("with ctx:")
        rg = ", requires_grad=True" if self.grad else ""
        done: set[str] = set()
        for t in self.tensors:
            if t.name in done:
                continue
            if t.kind == "input":
                arr = np.array2string(self.padded(t), separator=", ", precision=17, threshold=10**6)
                arr = " ".join(arr.split())
                dom = ", ".join(t.domain) + ("," if len(t.domain) == 1 else "")
                lines.append(
                    f"    {t.name} = tl.from_numpy(np.array({arr}), domain=({dom}),"
                    f' dtype="float64"{rg})'
                )
            elif t.kind == "derived":
                lines.append(f"    {t.name} = {t.expr.source()}")
            else:
                group = self.group_of(t)
                for g in group:
                    dom = ", ".join(g.domain) + ("," if len(g.domain) == 1 else "")
                    lines.append(
                        f"    {g.name} = tl.RecurrentTensor.placeholder({g.shape!r},"
                        f' dtype="float64", domain=({dom}))'
                    )
                    done.add(g.name)
                for g in group:
                    for where, expr in g.branches:
                        lines.append(f"    {g.name}[{where.source(g.domain)}] = {expr.source()}")
        for name in self.sinks:
            lines.append(
                f'    ctx.sink({name}, lambda value, point: print("{name}", point, value))'
            )
        if self.until is not None:
            stop = " ".join(np.array2string(self.stop_marker(), separator=", ").split())
            over = ", ".join(self.stop_domain) + ("," if len(self.stop_domain) == 1 else "")
            lines.append(f"    stop = tl.from_numpy(np.array({stop}), domain=({over}))")
            if self.until_reads_a_point:
                w = " ".join(np.array2string(self.stop_weights(), separator=", ").split())
                lines.append(f"    w = tl.from_numpy(np.array({w}), domain=(t,))")
                lines.append("    ctx.until(t, (stop - 0.5) * (w[0] + 1.0) > 0.0)")
            else:
                lines.append("    ctx.until(t, stop > 0.5)")
        outs = [t.name for t in self.outputs]
        if self.grad:
            z = self.loss_of.name
            lines.append(f"    loss = ({z} * {z}).sum()")
            lines.append("    loss.backward()")
            outs += [f"{t.name}.grad" for t in self.inputs]
        extent = {d: self.cap if d == "t" else self.n[d] for d in self.dims}
        bounds = ", ".join(f"{DIM_BOUND[d]}: {extent[d]}" for d in self.dims)
        lines.append(f"print(tl.evaluate([{', '.join(outs)}], bounds={{{bounds}}}))")
        return "\n".join(lines)


# --------------------------------------------------------------------------- generator


@dataclass
class Scope:
    """Which points a branch's expression runs at, per dim.

    ``fixed`` dims are pinned to one point by a constant write (only constant indices on them);
    for the others, ``lo`` and ``hi`` say the expression runs at points ``lo .. D - 1 - hi``, so
    shifts ``-lo .. hi`` stay in range.
    """

    lo: dict[str, int]
    hi: dict[str, int]
    fixed: frozenset = frozenset()


def _nodes(e: Expr) -> Iterator[Expr]:
    yield e
    for f in getattr(e, "__dataclass_fields__", {}):
        child = getattr(e, f)
        if isinstance(child, Expr):
            yield from _nodes(child)


def _per_episode(tensors: list[TensorDef], grad: bool) -> bool:
    """Whether the (i, t) program means the same with a length of t per i: every tensor it
    computes is over i (one without i would have no length of its own), and nothing reads
    another i's point of a tensor over (i, t), which some lengths would leave out (timerl
    refuses such reads; each episode is computed alone), and no host function (an effect)
    runs without i, as often as no length says. With gradients, no input is over t alone
    (its gradient would be a tensor asked for over t without i), and no tensor over (i, t)
    reads another i (the transpose of that read would gather other episodes' points, which
    timerl refuses)."""
    for t in tensors:
        if t.kind == "input":
            if grad and "t" in t.domain and "i" not in t.domain:
                return False
            continue
        if "i" not in t.domain:
            return False
        at = t.domain.index("i")
        if any(isinstance(w, Write) and w.specs[at].kind == "shift" for w, _ in t.branches):
            return False
        exprs = ([t.expr] if t.expr is not None else []) + [e for _, e in t.branches]
        for node in (node for e in exprs for node in _nodes(e)):
            if isinstance(node, Unary) and node.op == "host" and "i" not in node.dims:
                return False
            if not isinstance(node, Read):
                continue
            dom = node.src.domain
            # an alias is a view: read at another i, it reads its source there (and at the
            # reader's T, where its index names T)
            spread = "t" in dom or node.src.construct == "alias" or (grad and "t" in t.domain)
            if "i" in dom and spread and node.specs[dom.index("i")].kind != "cur":
                return False
    return True


class Generator:
    def __init__(self, ch: Chooser, flags: frozenset[str], grad: bool) -> None:
        self.ch = ch
        self.on = flags
        self.grad = grad
        self.counter = 0

    def flag(self, name: str) -> bool:
        return name in self.on

    def fresh(self, prefix: str) -> str:
        return f"{prefix}{self.counter_next()}"

    def counter_next(self) -> int:
        self.counter += 1
        return self.counter

    # -- reads
    def spec(self, d: str, scope: Scope, slices: bool) -> Spec:
        ch = self.ch
        n = self.n[d]
        options: list[Spec] = []
        if d in scope.fixed:
            if self.flag("const_index"):
                options += [Spec("const", 0), Spec("const", ch.int(0, n - 1)), Spec("last")]
            if slices and self.flag("full"):
                options.append(Spec("full"))
            if slices and self.flag("partial"):
                options.append(Spec("partial", ch.int(1, n)))
            return ch.pick(options) if options else Spec("const", 0)
        options.append(Spec("cur"))
        lo, hi = scope.lo.get(d, 0), scope.hi.get(d, 0)
        if self.flag("shift") and (lo or hi):
            k = ch.int(-lo, hi)
            if k:
                options.append(Spec("shift", k))
        if self.flag("clamp"):
            options += [Spec("clamp_lo", ch.int(1, 3)), Spec("clamp_hi", ch.int(1, 3))]
        if self.flag("mod"):
            options.append(Spec("mod", ch.int(2, 3)))
        if self.flag("div"):
            options.append(Spec("div", ch.int(2, 3)))
        if self.flag("const_index"):
            options += [Spec("const", ch.int(0, n - 1)), Spec("last")]
        if slices:
            for kind, k in (
                ("prefix", 0),
                ("suffix", 0),
                ("window", ch.int(1, 3)),
                ("ahead", ch.int(1, 3)),
                ("full", 0),
                ("partial", ch.int(1, n)),
                ("after", 0),
            ):
                if self.flag(kind):
                    options.append(Spec(kind, k))
        return ch.pick(options)

    def read(self, scope: Scope, pool: list[TensorDef], want: tuple | None = None) -> Read:
        ch = self.ch
        if want is not None:
            pool = [t for t in pool if t.shape == want] or pool
        src = ch.pick(pool)
        slices = src.kind == "input" or self.flag("derived_slice")
        specs = tuple(self.spec(d, scope, slices) for d in src.domain)
        spatial = None
        if src.shape and self.flag("spatial_index") and want != src.shape and ch.chance(20):
            spatial = ch.int(0, src.shape[0] - 1)
        reduce = "sum"
        if any(s.is_slice for s in specs):
            ops = ["sum", "mean"] + (["max", "min"] if self.flag("reduce_max") else [])
            if any(s.kind == "after" for s in specs):
                ops = ["sum"]  # an empty slice has no mean, max or min
            reduce = ch.pick(ops)
        return Read(src, specs, spatial, reduce)

    def leaf(self, scope: Scope, pool: list[TensorDef], selfreads: list[Read]) -> Expr:
        if selfreads and self.ch.chance(40):
            return self.ch.pick(selfreads)
        return self.read(scope, pool)

    def expr(self, scope: Scope, pool: list[TensorDef], depth: int, selfreads: list[Read]) -> Expr:
        ch = self.ch
        if depth <= 0 or ch.chance(30):
            return self.leaf(scope, pool, selfreads)
        kinds = ["unary", "binary", "affine"]
        if self.flag("where"):
            kinds.append("where")
        if self.flag("spatial_reduce") and self.S:
            kinds.append("sreduce")
        if self.flag("matmul") and self.S:
            kinds.append("matmul")
        if self.flag("gather") and self.S:
            kinds.append("pick")
        if self.flag("movement") and self.S:
            kinds.append("move")
        if self.flag("noise") and ch.chance(30):
            kinds.append("noise")
        if self.flag("host") and not self.grad and ch.chance(15):
            kinds.append("host")
        kind = ch.pick(kinds)
        if kind == "host":
            # an effect runs at every point of its domain, not only where its value is read:
            # what it reads must be in range everywhere (no shifted reads)
            everywhere = Scope({d: 0 for d in scope.lo}, {d: 0 for d in scope.hi}, scope.fixed)
            safe = [r for r in selfreads if all(sp.kind != "shift" for sp in r.specs)]
            return Unary("host", self.expr(everywhere, pool, depth - 1, safe))
        sub = lambda: self.expr(scope, pool, depth - 1, selfreads)  # noqa: E731
        if kind == "unary":
            x = sub()
            ops = ["tanh", "neg", "square", "sigmoid", "sin"]
            ops += [op for op in ("exp", "lgamma") if self.flag(op)]
            if x.shape and self.flag("softmax"):
                ops += ["softmax", "log_softmax"]
            if self.flag("kinks"):
                ops += ["clamp", "relu", "abs"]
            return Unary(ch.pick(ops), x)
        if kind == "binary":
            ops = ["add", "mul", "sub"] + (["maximum"] if self.flag("maximum") else [])
            return Binary(ch.pick(ops), sub(), sub())
        if kind == "affine":
            return Affine(sub(), ch.pick([0.5, -1.5, 2.0, 0.25]), ch.pick([0.0, 1.0, -0.5]))
        if kind == "where":
            return Where(sub(), sub(), sub())
        if kind == "noise":
            return Noise(sub(), 1000 + self.counter_next())
        if kind == "move":
            x = sub()
            return Move(ch.pick(["outer", "expand", "reshape"]), x) if x.shape else x
        if kind == "pick":
            x = sub()
            if not x.shape:
                return x
            n = x.shape[0]
            index = np.array([ch.int(0, n - 1) for _ in range(n)], dtype=np.int64)
            return Pick(ch.pick(["gather", "take", "cumsum"]), x, index)
        if kind == "matmul":
            x = sub()
            if not x.shape:
                return x
            n = x.shape[0]
            m = np.random.RandomState(ch.int(0, 2**16)).uniform(-1.0, 1.0, (n, n)) / n
            return MatMul(x, m)
        x = sub()
        if not x.shape:
            return x
        reductions = ["sum", "mean", "max"] + (["logsumexp"] if self.flag("softmax") else [])
        return SpatialReduce(ch.pick(reductions), x)

    def fit(self, e: Expr, want: tuple, scope: Scope, pool: list[TensorDef]) -> Expr:
        """``e`` brought to shape ``want`` (a spatial reduction, or a product with a read)."""
        if e.shape == want:
            return e
        if not want:
            return SpatialReduce("sum", e)
        return Binary("add", e, self.read(scope, pool, want=want))

    def bounded(self, body: Expr, selfreads: list[Read], want: tuple, scope, pool) -> Expr:
        """A recurrence step that stays bounded: tanh(0.5 * self + body)."""
        mix = Binary("add", Affine(self.ch.pick(selfreads), 0.5, 0.0), body)
        return Unary("tanh", self.fit(mix, want, scope, pool))

    # -- program
    def program(self, max_stages: int, two: bool | None) -> Program:
        ch = self.ch
        if two is None:
            two = self.flag("two_dims") and ch.chance(40)
        dims = ("i", "t") if two else ("t",)
        self.n = {"t": ch.int(2, 6)}
        if two:
            self.n["i"] = ch.int(2, 4)
        self.S = ch.pick([(), (2,), (3,)]) if self.flag("spatial") else ()
        tensors: list[TensorDef] = []
        domains = [dims] + ([("t",), ("i",)] if two else [])
        seed = ch.int(0, 2**16)
        rng = np.random.RandomState(seed)
        for k in range(ch.int(1, 3)):
            dom = dims if k == 0 else ch.pick(domains)
            shape = self.S if k == 0 else ch.pick([self.S, ()])
            arr = rng.uniform(-1.0, 1.0, tuple(self.n[d] for d in dom) + shape)
            tensors.append(TensorDef(f"u{k}", dom, shape, array=arr))
        stages = ["derived"] + [
            s
            for s in (
                "alias",
                "piecewise",
                "fwd",
                "fwd_cond",
                "bwd_cond",
                "overlap",
                "two_step",
                "coupled",
            )
            if self.flag(s)
        ]
        if two:
            stages += [s for s in ("carry", "outer_rec") if self.flag(s)]
        for _ in range(ch.int(1, max_stages)):
            tensors += self.stage(ch.pick(stages), dims, tensors)
        sinks: tuple[str, ...] = ()
        if self.flag("sink") and ch.chance(30):
            names = [t.name for t in tensors if t.kind != "input"]
            sinks = tuple(sorted({ch.pick(names) for _ in range(ch.int(1, 2))}))
        until, reads_a_point, lengths = None, False, None
        if self.flag("until") and ch.chance(20):
            until = ch.int(0, 3)  # rows past the stop; 0: it stops at the cap
            reads_a_point = ch.chance(50)
            if two and _per_episode(tensors, self.grad) and ch.chance(50):
                lengths = tuple(self.n["t"] + ch.int(0, until) for _ in range(self.n["i"]))
        return Program(
            dims,
            self.n,
            tensors,
            grad=self.grad,
            sinks=sinks,
            until=until,
            until_reads_a_point=reads_a_point,
            lengths=lengths,
        )

    def full_scope(self, dims: tuple) -> Scope:
        return Scope({d: 0 for d in dims}, {d: 0 for d in dims})

    def stage(self, kind: str, dims: tuple, pool: list[TensorDef]) -> list[TensorDef]:
        ch = self.ch
        depth = ch.int(1, 3)
        shape = ch.pick([self.S, ()]) if self.S else ()
        full = self.full_scope(dims)
        if kind == "derived":
            e = self.fit(self.expr(full, pool, depth, []), shape, full, pool)
            return [
                TensorDef(
                    self.fresh("y"),
                    tuple(d for d in dims if d in e.dims),
                    e.shape,
                    expr=e,
                    construct=kind,
                )
            ]
        if kind == "alias":
            sources = [t for t in pool if t.domain]
            r = self.read(full, sources)
            while r.nslices:
                r = self.read(full, sources)
            return [
                TensorDef(
                    self.fresh("lag"),
                    tuple(d for d in dims if d in r.dims),
                    r.shape,
                    expr=r,
                    construct=kind,
                )
            ]
        if kind == "piecewise":
            branches: list = []
            conds = [Cond("eqlast", "t"), Cond("eq0", "t"), Cond("lt", "t", ch.int(1, 3))]
            if len(dims) == 2:
                conds += [Cond("eqlast", "i"), Cond("eq0", "i"), Cond("sum_eq", "t", ch.int(0, 4))]
            chosen = [ch.pick(conds) for _ in range(ch.int(1, 2))] + [Cond("true")]
            guard = self.full_scope(dims)
            for c in chosen:
                branches.append(
                    (c, self.fit(self.expr(guard, pool, depth, []), shape, guard, pool))
                )
                # later branches run only where this condition fails: reads may shift there
                guard = Scope(dict(guard.lo), dict(guard.hi))
                if self.flag("shift") and c.kind == "eqlast":
                    guard.hi[c.d] = max(guard.hi[c.d], 1)
                elif self.flag("shift") and c.kind in ("eq0", "lt"):
                    guard.lo[c.d] = max(guard.lo[c.d], c.k if c.kind == "lt" else 1)
            return [TensorDef(self.fresh("p"), dims, shape, branches=branches, construct=kind)]
        # recurrences along dim d (t, or i for "outer_rec"); other dims run free
        d = "i" if kind == "outer_rec" else "t"
        x = TensorDef(self.fresh("x" if kind != "coupled" else "a"), dims, shape, construct=kind)

        def write(**over: Spec) -> Write:
            return Write(tuple(over.get(e, Spec("cur")) for e in dims))

        def selfread(src: TensorDef, **over: Spec) -> Read:
            return Read(src, tuple(over.get(e, Spec("cur")) for e in dims))

        def scope(lo: int = 0, hi: int = 0, fixed: tuple = (), on: str = d) -> Scope:
            s = self.full_scope(dims)
            s.lo[on], s.hi[on] = lo, hi
            s.fixed = frozenset(fixed)
            return s

        def body(sc: Scope, reads: list[Read]) -> Expr:
            e = self.expr(sc, pool, depth, reads)
            return self.bounded(e, reads, shape, sc, pool)

        def base(sc: Scope) -> Expr:
            return self.fit(self.expr(sc, pool, depth, []), shape, sc, pool)

        if kind in ("fwd", "outer_rec"):
            reads = [selfread(x)]
            if len(dims) == 2 and self.flag("cross_read"):
                # the previous step of the recurrence is complete along the other dim
                other = "t" if d == "i" else "i"
                for spec in (Spec("clamp_hi", 1), Spec("clamp_lo", 1), Spec("last")):
                    reads.append(selfread(x, **{other: spec}))
                for spec in (Spec("full"), Spec("prefix")):
                    reads.append(
                        Read(
                            x,
                            tuple(spec if e == other else Spec("cur") for e in dims),
                            reduce=ch.pick(["sum", "mean", "max"]),
                        )
                    )
            x.branches = [
                (write(**{d: Spec("const", 0)}), base(scope(fixed=(d,)))),
                (write(**{d: Spec("shift", 1)}), body(scope(hi=1), reads)),
            ]
        elif kind in ("fwd_cond", "bwd_cond"):
            first, lag = ("eq0", -1) if kind == "fwd_cond" else ("eqlast", 1)
            sc = scope(lo=1) if lag < 0 else scope(hi=1)
            prev = selfread(x, **{d: Spec("shift", lag)})
            if self.flag("linear") and ch.chance(50):
                # a + c * x[t -+ 1] with |c| <= 0.5: a linear recurrence, which stays bounded;
                # its terms read within the range (scanned) or one step beyond it (kept)
                wide = ch.chance(30)
                coef = Affine(Unary("tanh", base(sc if wide else scope())), 0.5, 0.0)
                step = Binary("add", base(sc if wide else scope()), Binary("mul", coef, prev))
                x.linear = True
            else:
                step = body(sc, [prev])
            x.branches = [(Cond(first, d), base(scope())), (Cond("true"), step)]
        elif kind == "overlap":
            x.branches = [
                (write(**{d: Spec("last")}), base(scope(fixed=(d,)))),
                (write(), body(scope(hi=1), [selfread(x, **{d: Spec("shift", 1)})])),
            ]
        elif kind == "two_step":
            x.branches = [
                (write(**{d: Spec("const", 0)}), base(scope(fixed=(d,)))),
                (write(**{d: Spec("const", 1)}), base(scope(fixed=(d,)))),
                (
                    write(**{d: Spec("shift", 2)}),
                    body(scope(hi=2), [selfread(x), selfread(x, **{d: Spec("shift", 1)})]),
                ),
            ]
        elif kind == "coupled":
            y = TensorDef(self.fresh("b"), dims, shape, construct=kind, group=x.name)
            x.branches = [
                (write(**{d: Spec("const", 0)}), base(scope(fixed=(d,)))),
                (write(**{d: Spec("shift", 1)}), body(scope(hi=1), [selfread(x), selfread(y)])),
            ]
            y.branches = [
                (write(**{d: Spec("const", 0)}), base(scope(fixed=(d,)))),
                (
                    write(**{d: Spec("shift", 1)}),
                    body(scope(hi=1), [selfread(y), selfread(x, **{d: Spec("shift", 1)})]),
                ),
            ]
            return [x, y]
        elif kind == "carry":
            x.branches = [
                (Write((Spec("const", 0), Spec("const", 0))), base(scope(fixed=("i", "t")))),
                (
                    Write((Spec("shift", 1), Spec("const", 0))),
                    body(
                        scope(hi=1, fixed=("t",), on="i"),
                        [selfread(x, t=Spec("last"))],
                    ),
                ),
                (write(t=Spec("shift", 1)), body(scope(hi=1), [selfread(x)])),
            ]
        else:
            raise AssertionError(kind)
        return [x]


def generate(
    ch: Chooser,
    flags: frozenset[str] = frozenset(FLAGS),
    grad: bool = False,
    max_stages: int = 3,
    two: bool | None = None,
) -> Program:
    """One random valid program from the choices of ``ch`` (``two``: force the (i, t) dims)."""
    return Generator(ch, flags, grad).program(max_stages, two)
