"""The generator of random valid programs: every construct behind a named flag (``FLAGS``).

Programs are valid by construction: every branch list ends with a branch covering every point
the earlier ones leave, every read of another point stays in range for the points its branch
runs at (tracked as a ``Scope``), and recurrences only read points that come before in their
own direction. The test suite enables every flag; a failing construct can be switched off
while looking for others.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from exprs import (
    Affine,
    Binary,
    Cell,
    Conv,
    Expr,
    MatMul,
    Move,
    Noise,
    Pick,
    Read,
    SpatialReduce,
    Spec,
    Unary,
    Where,
    nodes,
)
from programs import Program, TensorDef, Write
from stages import Scope, Stages

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
    "conv",  # a quarter of the products: tl.conv2d along v as a one-row image, kernel 1x3
    "cell",  # a quarter of the products: a GRU cell's step of (v, w), gates cut by narrow
    "softmax",  # v.softmax(-1), v.log_softmax(-1), v.logsumexp(-1) (spatial values only)
    "gather",  # v.gather(-1, k), v.take(k, -1) with constant ints k, v.cumsum(-1) (spatial)
    "kinks",  # v.clamp(-0.5, 0.5), v.relu(), v.abs()
    "movement",  # unsqueeze, expand, transpose, reshape, permute, squeeze of spatial values
    "noise",  # v + 0.25 * tl.randn(v.shape, like=v): a policy's exploration noise
    "sink",  # ctx.sink(x, fn): fn gets x at every point (checked when compiled with effects)
    "until",  # ctx.until(t, stop): t is dynamic, ended by data (inputs run past it)
    "bound_one",  # bounds of 1 (2 is always drawn): most branches then apply to no point
    "before",  # 0:d (empty at the first point; reduced by sum only)
    "frame",  # x[t + k] = f(x, x[t + 1]) or r[t - k] = f(r, r[t - 1]), k = 1, 2, bases at the ends
    "chain",  # a forward recurrence (two-step, coupled, framed) read by a backward one
    "at_point",  # reads by the dim where a write pins it: x[2] = f(u[t], u[0:t + 1])
    "empty_branch",  # p[2] = .., p[i, T - 3] = ..: constant points, possibly past the bound
    "whole_base",  # a whole-range reduction in a base case: x[T - 1] = u[0:T].sum(0) + ..
    "constant",  # a base case that is a number: x[0] = -0.526
    "bare",  # x alone for x at the current point (in a frame x[t - 1] = .., the point t)
    "scalar_input",  # inputs over no dim, read whole or by a spatial index (u3[1]: a view)
    "spread",  # y[t] = u3[1]: a value over fewer dims written at every point
    "broadcast",  # a scalar written to a spatial placeholder: y8[t] = y7[0]
)

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


# --------------------------------------------------------------------------- generator


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
        for node in (node for e in exprs for node in nodes(e)):
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


class Generator(Stages):
    """Draws one program: its dims and bounds, inputs, then stages of definitions
    (``Stages``), each expression built from reads that stay in range where it applies."""

    def __init__(self, ch: Chooser, flags: frozenset[str], grad: bool) -> None:
        self.ch = ch
        self.on = flags
        self.grad = grad
        self.counter = 0
        # a tensor the next recurrence step must read (a forward one, read by a backward one)
        self.must_read: TensorDef | None = None

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
        pinned = d in scope.at
        if pinned and not self.flag("at_point"):  # only constant indices at a pinned point
            if self.flag("const_index"):
                options += [Spec("const", 0), Spec("const", ch.int(0, n - 1)), Spec("last")]
            if slices and self.flag("full"):
                options.append(Spec("full"))
            if slices and self.flag("partial"):
                options.append(Spec("partial", ch.int(1, n)))
            return ch.pick(options) if options else Spec("const", 0)
        options.append(Spec("cur"))
        # a pinned point p may be read down to 0 (a read up would depend on the bound)
        lo, hi = (scope.at[d], 0) if pinned else (scope.lo.get(d, 0), scope.hi.get(d, 0))
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
                ("before", 0),
            ):
                if self.flag(kind):
                    options.append(Spec(kind, k))
        return ch.pick(options)

    def read(
        self, scope: Scope, pool: list[TensorDef], want: tuple | None = None, index: bool = False
    ) -> Read:
        """A read of a tensor of ``pool`` (of shape ``want`` where one has it); ``index``: a
        spatial index of it wherever it has a spatial shape."""
        ch = self.ch
        if want is not None:
            pool = [t for t in pool if t.shape == want] or pool
        src = ch.pick(pool)
        slices = src.kind == "input" or self.flag("derived_slice")
        specs = tuple(self.spec(d, scope, slices) for d in src.domain)
        spatial = None
        indexable = src.shape and self.flag("spatial_index") and want != src.shape
        if indexable and (index or ch.chance(30)):
            spatial = ch.int(0, src.shape[0] - 1)
        reduce = "sum"
        if any(s.is_slice for s in specs):
            ops = ["sum", "mean"] + (["max", "min"] if self.flag("reduce_max") else [])
            if any(s.kind in ("after", "before") for s in specs):
                ops = ["sum"]  # an empty slice has no mean, max or min
            reduce = ch.pick(ops)
        return Read(src, specs, spatial, reduce, bare=self.bare(specs, spatial))

    def bare(self, specs: tuple[Spec, ...], spatial: int | None) -> bool:
        """Whether a read at the current point is written as the tensor alone (``x``)."""
        plain = specs and spatial is None and all(s.kind == "cur" for s in specs)
        return bool(plain) and self.flag("bare") and self.ch.chance(40)

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
            everywhere = Scope(
                {d: 0 for d in scope.lo}, {d: 0 for d in scope.hi}, {d: 0 for d in scope.at}
            )
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
            seed = ch.int(0, 2**16)
            rng = np.random.RandomState(seed)
            # a quarter of them a convolution, a quarter a recurrent cell, chosen by the seed
            # already drawn so that the other programs stay those drawn before
            if seed % 4 == 1 and self.flag("conv"):
                return Conv(x, rng.uniform(-1.0, 1.0, (2, 1, 1, 3)) / 3.0)
            if seed % 4 == 2 and self.flag("cell"):
                h = sub()
                h = h if h.shape == x.shape else x
                return Cell(
                    x, h, rng.uniform(-1.0, 1.0, (n, 3 * n)), rng.uniform(-1.0, 1.0, (n, 3 * n))
                )
            return MatMul(x, rng.uniform(-1.0, 1.0, (n, n)) / n)
        x = sub()
        if not x.shape:
            return x
        reductions = ["sum", "mean", "max"] + (["logsumexp"] if self.flag("softmax") else [])
        return SpatialReduce(ch.pick(reductions), x)

    def fit(
        self, e: Expr, want: tuple, scope: Scope, pool: list[TensorDef], assign: bool = False
    ) -> Expr:
        """``e`` brought to shape ``want`` (a spatial reduction, or a sum with a read);
        ``assign``: a branch's value, which a scalar may be (the write broadcasts it)."""
        if e.shape == want:
            return e
        if not want:
            return SpatialReduce("sum", e)
        if assign and not e.shape and self.flag("broadcast") and self.ch.chance(40):
            return e
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
        # bounds of 1 and 2 are common: branches at points past them apply to nothing
        lo = 1 if self.flag("bound_one") else 2
        self.n = {"t": ch.pick([lo, 2, 3, 4, 5, 6, lo, 2])}
        if two:
            self.n["i"] = ch.pick([lo, 2, 3, 4, lo, 2])
        self.S = ch.pick([(), (2,), (3,)]) if self.flag("spatial") else ()
        tensors: list[TensorDef] = []
        domains = [dims] + ([("t",), ("i",)] if two else [])
        if self.flag("scalar_input"):
            domains.append(())  # a constant: u3[1] is a spatial index
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
                "spread",
                "frame",
                "chain",
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


def generate(
    ch: Chooser,
    flags: frozenset[str] = frozenset(FLAGS),
    grad: bool = False,
    max_stages: int = 3,
    two: bool | None = None,
) -> Program:
    """One random valid program from the choices of ``ch`` (``two``: force the (i, t) dims)."""
    return Generator(ch, flags, grad).program(max_stages, two)
