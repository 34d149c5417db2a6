"""The definitions a generated program is made of, one stage at a time.

Each stage adds one or a few tensors to the program: a derived expression, a read alone, a
piecewise placeholder, or a recurrence, forward or backward, written in any frame
(``x[t + 2] = f(x, x[t + 1])``, ``r[t - 1] = f(r)``). Every branch's expression is drawn in the
``Scope`` of the points it applies to, so its reads stay in range there; a branch at a
constant point (``x[2] = ..``, ``x[T - 2] = ..``) may apply to no point at all when the bound
is small, and then reads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exprs import Affine, Binary, Const, Expr, Read, SpatialReduce, Spec, Unary
from programs import Cond, TensorDef, Write

if TYPE_CHECKING:
    from generator import Generator

# the numbers a base case may be written as (``x[0] = -0.526``)
CONSTANTS = (-0.526, 0.25, 1.0, 0.0)


@dataclass
class Scope:
    """Which points a branch's expression runs at, per dim.

    A dim in ``at`` is pinned to one point by a constant write (``x[2] = ..``, ``x[T - 1] =
    ..``): a read there may use the dim (it is that point, where the point exists) and shift it
    down by up to ``at[d]``, the least the point can be. For the other dims, ``lo`` and ``hi``
    say the expression runs at points ``lo .. D - 1 - hi``, so shifts ``-lo .. hi`` stay in
    range.
    """

    lo: dict[str, int]
    hi: dict[str, int]
    at: dict[str, int] = field(default_factory=dict)


def full_scope(dims: tuple) -> Scope:
    return Scope({d: 0 for d in dims}, {d: 0 for d in dims})


def on_dim(dims: tuple, d: str, lo: int = 0, hi: int = 0, at: dict | None = None) -> Scope:
    """The scope of a branch along ``d`` (``lo``/``hi``), pinned on the dims of ``at``."""
    s = full_scope(dims)
    s.lo[d], s.hi[d] = lo, hi
    s.at = dict(at or {})
    return s


def write(dims: tuple, **over: Spec) -> Write:
    return Write(tuple(over.get(e, Spec("cur")) for e in dims))


def selfread(src: TensorDef, dims: tuple, **over: Spec) -> Read:
    return Read(src, tuple(over.get(e, Spec("cur")) for e in dims))


class Stages:
    """Mixed into ``Generator``: the stages, drawn with its choices, reads and expressions."""

    def stage(self: Generator, kind: str, dims: tuple, pool: list[TensorDef]) -> list[TensorDef]:
        ch = self.ch
        depth = ch.int(1, 3)
        shape = ch.pick([self.S, ()]) if self.S else ()
        full = full_scope(dims)
        if kind == "derived":
            e = self.fit(self.expr(full, pool, depth, []), shape, full, pool)
            domain = tuple(d for d in dims if d in e.dims)
            return [TensorDef(self.fresh("y"), domain, e.shape, expr=e, construct=kind)]
        if kind == "alias":
            sources = [t for t in pool if t.domain]
            r = self.read(full, sources)
            while r.nslices:
                r = self.read(full, sources)
            domain = tuple(d for d in dims if d in r.dims)
            return [TensorDef(self.fresh("lag"), domain, r.shape, expr=r, construct=kind)]
        if kind == "spread":
            return [self.spread(dims, pool, shape, depth)]
        if kind == "piecewise":
            return [self.piecewise(dims, pool, shape, depth)]
        if kind == "frame":
            return self.frame(dims, pool, shape, depth)
        if kind == "chain":
            return self.chain(dims, pool)
        return self.recurrence(kind, dims, pool, shape, depth)

    # -- pieces of branches
    def base(
        self: Generator,
        sc: Scope,
        pool: list,
        depth: int,
        shape: tuple,
        step: bool = False,
        number: bool = True,
    ) -> Expr:
        """A value not read from the tensor being defined: a base case (``number``: possibly
        a number alone), or (``step``) a definition in a shifted frame, which reads the tensor
        ``must_read`` names."""
        ch = self.ch
        if number and not step and self.flag("constant") and ch.chance(15):
            return Const(ch.pick(CONSTANTS))
        e = self.expr(sc, pool, depth, [])
        if sc.at and self.flag("whole_base") and ch.chance(40):
            whole = self.whole(sc, pool, ch.pick(sorted(sc.at)))
            if whole is not None:
                e = Binary("add", e, whole)
        if step:
            e = self.forced(sc, e)
        return self.fit(e, shape, sc, pool, assign=True)

    def whole(self: Generator, sc: Scope, pool: list, d: str) -> Read | None:
        """A whole-range reduction over ``d`` (``u[0:T].sum(0)``) for a branch pinned on it."""
        sources = [
            t for t in pool if d in t.domain and (t.kind == "input" or self.flag("derived_slice"))
        ]
        if not sources or not self.flag("full"):
            return None
        src = self.ch.pick(sources)
        specs = tuple(Spec("full") if e == d else self.spec(e, sc, False) for e in src.domain)
        ops = ["sum", "mean"] + (["max", "min"] if self.flag("reduce_max") else [])
        return Read(src, specs, reduce=self.ch.pick(ops))

    def forced(self: Generator, sc: Scope, e: Expr) -> Expr:
        """``e`` plus a read of ``must_read`` (then cleared), where one is set."""
        src, self.must_read = self.must_read, None
        if src is None:
            return e
        specs = tuple(self.spec(d, sc, False) for d in src.domain)
        r: Expr = Read(src, specs, bare=self.bare(specs, None))
        if r.shape and not e.shape:
            r = SpatialReduce("sum", r)
        return Binary("add", e, r)

    def body(self: Generator, sc: Scope, reads: list[Read], pool: list, depth: int, shape) -> Expr:
        """A recurrence step: bounded, reading ``reads`` (the points before in its direction)."""
        e = self.forced(sc, self.expr(sc, pool, depth, reads))
        return self.bounded(e, reads, shape, sc, pool)

    def linear(
        self: Generator, sc: Scope, reads: list[Read], pool: list, depth: int, shape, plain: Scope
    ) -> Expr:
        """``a + c1 * x[..] + c2 * x[..]`` with ``|c1| + |c2| <= 0.5``: a linear recurrence
        (a scan), bounded; ``a`` reads within the step's range (scanned) or, in ``sc``, beyond
        it (kept)."""
        ch = self.ch
        wide = ch.chance(30)
        where = sc if wide else plain
        step = self.forced(sc, self.base(where, pool, depth, shape, number=False))
        share = 0.5 / len(reads)
        for r in reads:
            if ch.chance(50):
                # a coefficient for all elements, or one per element
                size = ch.pick([(), shape])
                coef = Affine(
                    Unary("tanh", self.base(where, pool, 1, size, number=False)), share, 0.0
                )
                step = Binary("add", step, Binary("mul", coef, r))
            else:
                step = Binary("add", step, Affine(r, ch.pick([share, -share, 0.4 * share]), 0.0))
        return step

    # -- stages
    def spread(self: Generator, dims: tuple, pool: list, shape: tuple, depth: int) -> TensorDef:
        """``y[t] = u3[1]``: a value over fewer dims (often a spatial index of a constant, a
        view of it on torch) written at every point; readers then outlive the indexed value."""
        ch = self.ch
        full = full_scope(dims)
        if ch.chance(60):
            scalars = [t for t in pool if not t.domain and t.shape] or pool
            e: Expr = self.read(full, scalars, index=True)
        else:
            e = self.expr(full, pool, depth, [])
        where = Cond("true") if ch.chance(30) else write(dims)
        y = TensorDef(self.fresh("y"), dims, shape, construct="spread")
        y.branches = [(where, self.fit(e, shape, full, pool, assign=True))]
        return y

    def piecewise(self: Generator, dims: tuple, pool: list, shape: tuple, depth: int) -> TensorDef:
        """Branches by condition (``t.eq(T - 1)``, ``t < 2``, ..) or at constant points
        (``p[2] = ..``, ``p[i, T - 2] = ..``, which may lie past the bound), then one for every
        point (``True`` or ``p[t]``)."""
        ch = self.ch
        conds = [Cond("eqlast", "t"), Cond("eq0", "t"), Cond("lt", "t", ch.int(1, 3))]
        if len(dims) == 2:
            conds += [Cond("eqlast", "i"), Cond("eq0", "i"), Cond("sum_eq", "t", ch.int(0, 4))]
        chosen: list[Cond | Write] = []
        for _ in range(ch.int(1, 2)):
            if self.flag("empty_branch") and ch.chance(40):
                d = ch.pick(dims)
                k = ch.int(0, 3)
                chosen.append(write(dims, **{d: ch.pick([Spec("const", k), Spec("last", k)])}))
            else:
                chosen.append(ch.pick(conds))
        if self.flag("empty_branch") and ch.chance(50):
            chosen.append(write(dims))
        else:
            chosen.append(Cond("true"))
        branches: list = []
        guard = full_scope(dims)
        for c in chosen:
            sc = guard
            if isinstance(c, Write) and any(s.kind != "cur" for s in c.specs):
                d, s = next((d, s) for d, s in zip(dims, c.specs, strict=True) if s.kind != "cur")
                point = s.k if s.kind == "const" else self.n[d] - 1 - s.k
                sc = Scope(dict(guard.lo), dict(guard.hi), {d: max(point, 0)})
                # at 0 or at D - 1 the write is the condition d.eq(0) or d.eq(D - 1)
                c_as = Cond("eq0", d) if s == Spec("const", 0) else None
                c_as = Cond("eqlast", d) if s == Spec("last", 0) else c_as
            else:
                c_as = c
            branches.append((c, self.fit(self.expr(sc, pool, depth, []), shape, sc, pool, True)))
            # later branches run only where this one does not apply: reads may shift there
            guard = Scope(dict(guard.lo), dict(guard.hi))
            if not self.flag("shift") or not isinstance(c_as, Cond):
                continue
            if c_as.kind == "eqlast":
                guard.hi[c_as.d] = max(guard.hi[c_as.d], 1)
            elif c_as.kind in ("eq0", "lt"):
                guard.lo[c_as.d] = max(guard.lo[c_as.d], c_as.k if c_as.kind == "lt" else 1)
        return TensorDef(self.fresh("p"), dims, shape, branches=branches, construct="piecewise")

    def frame(
        self: Generator,
        dims: tuple,
        pool: list,
        shape: tuple,
        depth: int,
        back: bool | None = None,
    ) -> list[TensorDef]:
        """A definition in a shifted frame along ``d``: forward ``x[d + k] = f(x, x[d + 1])``
        after bases at ``0 .. k - 1``, or backward ``x[d - k] = f(x, x[d - 1])`` after bases
        at ``D - 1 .. D - k`` (``x[T - 2]`` is no point when ``T = 1``), k = 1 or 2. The right
        side is read at ``d``, the written point minus k: bare ``x`` is ``x[d]``. Recurrent
        (bounded or linear, possibly coupled with a partner that reads the new point) or not
        (a value of other tensors, written in that frame)."""
        ch = self.ch
        d = "i" if len(dims) == 2 and ch.chance(25) else "t"
        k = ch.int(1, 2)
        if back is None:
            back = ch.chance(60)
        sign = -1 if back else 1
        recurrent = ch.chance(80)
        coupled = recurrent and self.flag("coupled") and ch.chance(30)
        lin = recurrent and self.flag("linear") and ch.chance(35)
        x = TensorDef(self.fresh("r" if back else "x"), dims, shape, construct="frame")
        group = [x]
        if coupled:
            group.append(TensorDef(self.fresh("b"), dims, shape, construct="frame", group=x.name))
        n = self.n[d]
        step_sc = on_dim(dims, d, lo=k if back else 0, hi=0 if back else k)
        plain = full_scope(dims)

        def at(src: TensorDef, j: int) -> Read:
            """``src`` at ``d + j`` (``j = 0``: ``src[d]``, or ``src`` alone)."""
            if j:
                return selfread(src, dims, **{d: Spec("shift", j)})
            r = selfread(src, dims)
            r.bare = self.bare(r.specs, None)
            return r

        for g in group:
            for j in range(k):
                spec = Spec("last", j) if back else Spec("const", j)
                point = max(n - 1 - j, 0) if back else j
                value = self.base(on_dim(dims, d, at={d: point}), pool, depth, shape)
                g.branches.append((write(dims, **{d: spec}), value))
        for g in group:
            # the points before in the direction of the recurrence, and the partner's
            reads = [at(g, sign * j) for j in range(k)]
            if g is not x:
                reads.append(at(x, sign * k))  # the point x has just written
            elif coupled:
                reads.append(at(group[1], 0))
            if not recurrent:
                step = self.base(step_sc, pool, depth, shape, step=True)
            elif lin:
                step = self.linear(step_sc, reads, pool, depth, shape, plain)
                g.linear = True
            else:
                step = self.body(step_sc, reads, pool, depth, shape)
            g.branches.append((write(dims, **{d: Spec("shift", sign * k)}), step))
        return group

    def chain(self: Generator, dims: tuple, pool: list) -> list[TensorDef]:
        """A forward recurrence (two-step, coupled, or in a frame) read by a backward one."""
        ch = self.ch
        first_kinds = [s for s in ("two_step", "coupled", "frame") if self.flag(s)]
        then_kinds = [s for s in ("bwd_cond", "overlap", "frame") if self.flag(s)]
        if not first_kinds or not then_kinds:
            return self.stage("derived", dims, pool)
        depth = ch.int(1, 3)
        shape = ch.pick([self.S, ()]) if self.S else ()
        kind = ch.pick(first_kinds)
        if kind == "frame":
            first = self.frame(dims, pool, shape, depth, back=False)
        else:
            first = self.recurrence(kind, dims, pool, shape, depth)
        self.must_read = ch.pick(first)
        kind = ch.pick(then_kinds)
        shape = ch.pick([self.S, ()]) if self.S else ()
        if kind == "frame":
            then = self.frame(dims, pool + first, shape, depth, back=True)
        else:
            then = self.recurrence(kind, dims, pool + first, shape, depth)
        self.must_read = None
        return first + then

    def recurrence(
        self: Generator, kind: str, dims: tuple, pool: list, shape: tuple, depth: int
    ) -> list[TensorDef]:
        """The recurrences written in their usual frames, along ``t`` (or ``i`` for
        ``outer_rec``); the other dims run free."""
        ch = self.ch
        d = "i" if kind == "outer_rec" else "t"
        x = TensorDef(self.fresh("x" if kind != "coupled" else "a"), dims, shape, construct=kind)
        n = self.n[d]

        def scope(lo: int = 0, hi: int = 0, at: dict | None = None, on: str = d) -> Scope:
            return on_dim(dims, on, lo, hi, at)

        def body(sc: Scope, reads: list[Read]) -> Expr:
            return self.body(sc, reads, pool, depth, shape)

        def base(sc: Scope) -> Expr:
            return self.base(sc, pool, depth, shape)

        if kind in ("fwd", "outer_rec"):
            reads = [selfread(x, dims)]
            if len(dims) == 2 and self.flag("cross_read"):
                # the previous step of the recurrence is complete along the other dim
                other = "t" if d == "i" else "i"
                for spec in (Spec("clamp_hi", 1), Spec("clamp_lo", 1), Spec("last")):
                    reads.append(selfread(x, dims, **{other: spec}))
                for spec in (Spec("full"), Spec("prefix")):
                    reads.append(
                        Read(
                            x,
                            tuple(spec if e == other else Spec("cur") for e in dims),
                            reduce=ch.pick(["sum", "mean", "max"]),
                        )
                    )
            x.branches = [
                (write(dims, **{d: Spec("const", 0)}), base(scope(at={d: 0}))),
                (write(dims, **{d: Spec("shift", 1)}), body(scope(hi=1), reads)),
            ]
        elif kind in ("fwd_cond", "bwd_cond"):
            first, lag = ("eq0", -1) if kind == "fwd_cond" else ("eqlast", 1)
            sc = scope(lo=1) if lag < 0 else scope(hi=1)
            prev = selfread(x, dims, **{d: Spec("shift", lag)})
            if self.flag("linear") and ch.chance(50):
                step = self.linear(sc, [prev], pool, depth, shape, scope())
                x.linear = True
            else:
                step = body(sc, [prev])
            # the first branch applies at one point, which its reads may use
            x.branches = [
                (Cond(first, d), base(scope(at={d: 0 if lag < 0 else max(n - 1, 0)}))),
                (Cond("true"), step),
            ]
        elif kind == "overlap":
            x.branches = [
                (write(dims, **{d: Spec("last")}), base(scope(at={d: n - 1}))),
                (write(dims), body(scope(hi=1), [selfread(x, dims, **{d: Spec("shift", 1)})])),
            ]
        elif kind == "two_step":
            x.branches = [
                (write(dims, **{d: Spec("const", 0)}), base(scope(at={d: 0}))),
                (write(dims, **{d: Spec("const", 1)}), base(scope(at={d: 1}))),
                (
                    write(dims, **{d: Spec("shift", 2)}),
                    body(
                        scope(hi=2),
                        [selfread(x, dims), selfread(x, dims, **{d: Spec("shift", 1)})],
                    ),
                ),
            ]
        elif kind == "coupled":
            y = TensorDef(self.fresh("b"), dims, shape, construct=kind, group=x.name)
            x.branches = [
                (write(dims, **{d: Spec("const", 0)}), base(scope(at={d: 0}))),
                (
                    write(dims, **{d: Spec("shift", 1)}),
                    body(scope(hi=1), [selfread(x, dims), selfread(y, dims)]),
                ),
            ]
            y.branches = [
                (write(dims, **{d: Spec("const", 0)}), base(scope(at={d: 0}))),
                (
                    write(dims, **{d: Spec("shift", 1)}),
                    body(
                        scope(hi=1),
                        [selfread(y, dims), selfread(x, dims, **{d: Spec("shift", 1)})],
                    ),
                ),
            ]
            return [x, y]
        elif kind == "carry":
            x.branches = [
                (
                    write(dims, i=Spec("const", 0), t=Spec("const", 0)),
                    base(scope(at={"i": 0, "t": 0})),
                ),
                (
                    write(dims, i=Spec("shift", 1), t=Spec("const", 0)),
                    body(
                        scope(hi=1, at={"t": 0}, on="i"),
                        [selfread(x, dims, t=Spec("last"))],
                    ),
                ),
                (write(dims, t=Spec("shift", 1)), body(scope(hi=1), [selfread(x, dims)])),
            ]
        else:
            raise AssertionError(kind)
        return [x]
