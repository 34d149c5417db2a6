"""First-iteration reuse: what a loop's first iteration recomputes from an earlier loop is read.

PPO acts with the policy for ``T`` steps, then updates it in a loop over ``u`` whose
parameters start, at ``u = 0``, from the very weights it acted with. So the first update's
forward pass over the batch (``tanh(obs_batch @ W[i, u] + b[i, u])`` at ``u = 0``) recomputes,
on the same rows, what the rollout computed step by step (``tanh(obs[i, t] @ W[i] + b[i])``),
and the critic over the batch recomputes the rollout's values. With one epoch and one
minibatch that is the whole forward pass of the update.

The pass proves such equalities by value numbering. A *row value* is a tensor whose leading
axis holds one row per (step, env) pair; both sides are numbered in the same terms:

* the rollout side: an op over ``(.., t)`` numbered as if stacked over the whole range
  ``x[.., 0:T]`` with its rows flattened (step-major, env within step);
* the update side: an op over ``(.., u)`` numbered at ``u = 0``, where each piecewise
  definition takes its ``u = 0`` branch (``W[i, 0] = W[i]``) and the batch is the rollout's
  range flattened (``reshape(x[i, 0:T], (T * B, ..))``, the ``_batch`` of the algorithms);
* a row-wise op (its ``stacks`` rule in the row table, ``ir/prims/rows.py``: elementwise,
  matmul by an unbatched matrix, a reduction or reshape that keeps the row axis) applied to
  row values and unbatched values gets the same number on both sides, because stacking rows
  commutes with it. Anything else (random draws, piecewise definitions, effects, reads at
  another step) is a leaf numbered by its identity, so it only equals itself.

An update op whose number at ``u = 0`` is a rollout op's becomes a piecewise definition:
at ``u = 0`` a view of the rollout's rows (``reshape(x[i, 0:T])``: the rollout keeps ``x`` as a
block store, or its vectorised form computes it once), at ``u >= 1`` the op as written. Its
readers read the new definition; the old op is then needed only at ``u >= 1`` (the domain
conditions pass says so), which with one update per iteration is never. Only ops read from
outside the matched set get a definition: inside it, the matched readers at ``u = 0`` are
replaced too.

Values are equal up to float rounding: the rollout multiplies ``B`` rows at a time and the
update ``T * B``, which BLAS may sum in another order (vectorisation does the same).
"""

from __future__ import annotations

from dataclasses import dataclass

from timerl.compiler.spec import ProgramSpec
from timerl.ir import prims
from timerl.ir.graph import Edge, Op, View, consumers, copy_graph, walk
from timerl.ir.prims.rows import StackRule, stack_rule
from timerl.symbolic import TRUE, Bound, Const, Dim, Expr, Slice, as_expr
from timerl.symbolic.bounds import simplify as simplify_cond


@dataclass(frozen=True)
class _Val:
    """A numbered value: its number, its rank, and for a row value its number of rows."""

    num: int
    rank: int
    rows: int | None = None  # None: not a row value (the same for every row)

    @property
    def row(self) -> bool:
        return self.rows is not None


def _static(x: Expr, static: dict[Bound, int]) -> int | None:
    v = x.substitute({b: Const(n) for b, n in static.items()})
    return int(v.value) if isinstance(v, Const) else None


def _at_own_point(src: Op, index: tuple) -> bool:
    """``src`` read at its own point (``x[i, u]`` from an op over ``(i, u)``)."""
    return View(src, index).is_identity


def _rule(op: Op) -> StackRule | None:
    """The op's rule for stacked rows (the row table's ``stacks``): none for an effect."""
    return None if op.effect else stack_rule(op.prim)


class _Numbering:
    """Value numbers shared by the rollout side and the update side."""

    def __init__(self, static: dict[Bound, int]) -> None:
        self.static = static
        self.table: dict[tuple, int] = {}

    def number(self, key: tuple) -> int:
        return self.table.setdefault(key, len(self.table))

    def leaf(self, op: Op, index: tuple) -> _Val:
        return _Val(self.number(("at", op.id, tuple(map(str, index)))), len(op.shape))

    def combine(self, op: Op, vals: list[_Val]) -> _Val | None:
        """The value of a row-wise op of row values that all have the same rows, or None."""
        if prims.get(op.prim).traits.same_value and len(vals) == 1:
            return vals[0]
        rule = _rule(op)
        rows = {v.rows for v in vals if v.row}
        if rule is None or len(rows) != 1 or not op.shape:
            return None
        (n,) = rows
        if _static(op.shape[0], self.static) != n:
            return None
        head = rule(op, vals)
        if head is None:
            return None
        key = (*head, str(op.dtype), tuple((v.num, v.row) for v in vals))
        return _Val(self.number(key), len(op.shape), n)


class _Rollout:
    """Numbers of ops over a loop dim ``t``, stacked over its whole range."""

    def __init__(self, num: _Numbering) -> None:
        self.num = num
        self.memo: dict[tuple[int, Dim], _Val | None] = {}
        self.found: dict[int, Op] = {}  # row value number -> the op that computes it
        self.dims: set[Dim] = set()  # the loops whose rows something reads

    def stacked(self, op: Op, t: Dim) -> _Val | None:
        key = (op.id, t)
        if key not in self.memo:
            self.memo[key] = None  # cycles (recurrences over t) end as leaves
            self.memo[key] = self._stacked(op, t)
        return self.memo[key]

    def _stacked(self, op: Op, t: Dim) -> _Val | None:
        if not op.shape or op.domain[-1:] != (t,):
            return None
        rows = _static(op.shape[0], self.num.static)
        vals: list[_Val] | None = []
        for e in op.inputs:
            v = self._input(op, e, t)
            if v is None:
                vals = None
                break
            vals.append(v)
        if rows is None:
            return None
        out = self.num.combine(op, vals) if vals is not None else None
        if out is None:  # a leaf: only equal to itself read over the whole range
            return _Val(self.num.number(("rows", op.id, t)), len(op.shape), rows)
        if not prims.get(op.prim).traits.same_value:
            self.found.setdefault(out.num, op)
        return out

    def _input(self, op: Op, e: Edge, t: Dim) -> _Val | None:
        if e.cond != TRUE or any(isinstance(i, Slice) for i in e.index):
            return None
        if t in e.src.domain:
            same = e.src.domain == op.domain and _at_own_point(e.src, e.index)
            return self.stacked(e.src, t) if same else None
        if any(t in i.symbols() for i in e.index):
            return None
        return self.num.leaf(e.src, e.index)


class _Update:
    """Numbers of ops at the first point (``u = 0``) of a loop dim ``u``."""

    def __init__(self, num: _Numbering, rollout: _Rollout, u: Dim | None) -> None:
        self.num = num
        self.rollout = rollout
        self.u = u
        self.memo: dict[int, _Val | None] = {}

    def first(self, op: Op) -> _Val | None:
        if op.id not in self.memo:
            self.memo[op.id] = None
            self.memo[op.id] = self._first(op)
        return self.memo[op.id]

    def _first(self, op: Op) -> _Val | None:
        u = self.u
        if u is None or u not in op.domain:
            return self._batch(op)
        if prims.get(op.prim).traits.piecewise:
            for e in op.inputs:
                at0 = simplify_cond(e.cond.substitute({u: Const(0)}))
                if at0 == TRUE:
                    return self._read(e.src, tuple(i.substitute({u: Const(0)}) for i in e.index))
            return None
        if any(e.cond != TRUE for e in op.inputs):
            return None
        vals = [self._read(e.src, e.index) for e in op.inputs]
        if any(v is None for v in vals):
            return None
        return self.num.combine(op, vals)

    def _read(self, src: Op, index: tuple) -> _Val | None:
        if any(isinstance(i, Slice) for i in index):
            return None
        if self.u is not None and self.u in src.domain:
            return self.first(src) if _at_own_point(src, index) else None
        if _at_own_point(src, index):
            v = self.first(src)
            if v is not None:
                return v
        return self.num.leaf(src, index)

    def _batch(self, op: Op) -> _Val | None:
        """A value computed once before the loop over ``u``: the rollout's rows flattened
        (``reshape(x[.., 0:T], (T * B, ..))``) or a row-wise op of such values."""
        if prims.get(op.prim).traits.reshapes and len(op.inputs) == 1:
            rows = self._flattened(op)
            if rows is not None:
                return rows
        if not op.inputs or any(e.cond != TRUE for e in op.inputs):
            return None
        vals = [self._read(e.src, e.index) for e in op.inputs]
        if any(v is None for v in vals):
            return None
        return self.num.combine(op, vals)

    def _flattened(self, op: Op) -> _Val | None:
        e = op.inputs[0]
        src, index = e.src, e.index
        while prims.get(src.prim).traits.same_value and e.cond == TRUE and src.inputs:
            if not _at_own_point(src, index):
                return None
            e = src.inputs[0]
            src, index = e.src, e.index
        if e.cond != TRUE or not src.domain or not isinstance(index[-1], Slice):
            return None
        t = src.domain[-1]
        whole = index[-1]
        if not (whole.start == Const(0) and whole.stop == t.bound):
            return None
        if any(isinstance(i, Slice) for i in index[:-1]):
            return None
        if not all(i is d for i, d in zip(index[:-1], src.domain[:-1], strict=True)):
            return None
        steps = self.num.static.get(t.bound)
        per_step = _static(src.shape[0], self.num.static) if src.shape else None
        self.rollout.dims.add(t)
        stacked = self.rollout.stacked(src, t)
        if steps is None or per_step is None or stacked is None or not stacked.row:
            return None
        shape = op.attrs.get("shape", ())
        if not shape or _static(as_expr(shape[0]), self.num.static) != steps * per_step:
            return None
        if tuple(map(str, shape[1:])) != tuple(map(str, src.shape[1:])):
            return None
        return _Val(stacked.num, stacked.rank, steps * per_step)


@dataclass(frozen=True)
class Reuse:
    """An update op whose value at ``u = 0`` is the rollout op's rows, flattened."""

    op: Op
    dim: Dim | None  # u; None: an op computed once, after the loop over t
    source: Op  # over (.., t)


def find_reuse(spec: ProgramSpec) -> list[Reuse]:
    """Every update op (over a dim whose piecewise definitions start from earlier values)
    whose value at that dim's first point is an earlier loop's rows."""
    static = dict(spec.static)
    num = _Numbering(static)
    rollout = _Rollout(num)
    starts: set[Dim] = set()
    for op in spec.ops:  # dims along which some definition starts at 0 from an outer value
        if prims.get(op.prim).traits.piecewise and op.domain:
            d = op.domain[-1]
            if any(d not in e.src.domain for e in op.inputs):
                starts.add(d)
    fixed = {r.id for r in spec.roots} | spec.keep
    candidates: list[tuple[Op, Dim | None, _Val]] = []
    # u = None: ops outside any such loop, run once per iteration after the rollout (the
    # one full-batch update of REINFORCE and A2C)
    for u in [None, *sorted(starts, key=lambda d: d.name)]:
        upd = _Update(num, rollout, u)
        for op in spec.ops:  # creation order: inputs first, so recursion stays shallow
            if op.id in fixed or op.effect or (u is not None and u not in op.domain):
                continue
            traits = prims.get(op.prim).traits
            if traits.piecewise or traits.view:  # a view computes nothing worth reusing
                continue
            v = upd.first(op)
            if v is not None and v.row:
                candidates.append((op, u, v))
    # number the loops whose rows the updates read, to find the op computing each value
    for op in spec.ops:
        if op.domain and op.domain[-1] in rollout.dims:
            rollout.stacked(op, op.domain[-1])
    out: list[Reuse] = []
    for op, u, v in candidates:
        src = rollout.found.get(v.num)
        if src is None or _static(op.shape[0], static) != _flat_rows(src, static):
            continue
        outer = src.domain[:-1]
        if (op.domain == outer) if u is None else (set(outer) <= set(op.domain)):
            out.append(Reuse(op, u, src))
    return out


def _flat_rows(src: Op, static: dict[Bound, int]) -> int | None:
    steps = static.get(src.domain[-1].bound)
    per = _static(src.shape[0], static)
    return None if steps is None or per is None else steps * per


def reuse_first_iteration(spec: ProgramSpec, notes: list[str] | None = None) -> ProgramSpec:
    """The program with each update op found by ``find_reuse`` read from the rollout at its
    loop's first point."""
    found = find_reuse(spec)
    if not found:
        return spec
    ops = copy_graph(spec.ops)
    by_id = {op.id: op for op in ops}
    matched = {r.op.id: r for r in found}
    readers = consumers(ops)
    created: list[Op] = []
    for r in found:
        q = by_id[r.op.id]
        outside = [
            (c, e) for c, e in readers[q.id] if c.id not in matched or not _at_own_point(q, e.index)
        ]
        if not outside:
            continue
        src = by_id[r.source.id]
        t = src.domain[-1]
        outer = src.domain[:-1]
        rows = Op(
            prim="reshape",
            domain=outer,
            shape=q.shape,
            dtype=q.dtype,
            inputs=[Edge(src, (*outer, Slice(Const(0), t.bound)))],
            attrs={"shape": q.shape},
            name=f"{src.label}[0:{t.bound.name}]",
            site=q.site,
        )
        u = r.dim
        if u is None:  # the op itself is the rollout's rows
            created.append(rows)
            for _reader, e in outside:
                e.src = rows
            if notes is not None:
                notes.append(
                    f"reused {q.label}: the rows of {src.label} over {t.name} "
                    "(same weights and inputs)"
                )
            continue
        merged = Op(
            prim="merge",
            domain=q.domain,
            shape=q.shape,
            dtype=q.dtype,
            inputs=[
                Edge(rows, outer, u.eq(0)),
                Edge(q, tuple(q.domain), u >= 1),
            ],
            attrs={"shape": q.shape, "dtype": q.dtype},
            name=f"{q.label}@{u.name}0",
            site=q.site,
        )
        created += [rows, merged]
        for _reader, e in outside:
            e.src = merged
        if notes is not None:
            notes.append(
                f"reused {q.label} at {u.name} = 0: the rows of {src.label} over "
                f"{t.name} (same weights and inputs)"
            )
    spec = spec.with_ops(ops + created)
    return spec.with_ops(walk(spec.roots))


__all__ = ["Reuse", "find_reuse", "reuse_first_iteration"]
