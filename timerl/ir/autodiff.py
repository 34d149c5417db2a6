"""Reverse-mode autodiff on the PDG, through spatial ops and temporal dependencies.

For every op X on a path from a leaf to the loss we create a gradient op ``gX`` over X's
domain (an ``add_n`` of contributions). A consumer C that reads X through an edge with index
``E`` (``t - 1``, ``0:T``, ``0:t + 1``, ``T - 1`` ...) contributes the *transpose* of that read:
its VJP, computed at C's points, is read back at X's points through the inverse relation —
``c = d - k`` for shifts, a sum over all of C's points for dims X lacks, a select of the
element a slice put at position ``d - start``, or a diagonal gather over the C points whose
slice covered ``d`` (``0:c+1`` and ``c:T`` slices). Gradient recurrences come out in the
opposite direction of the forward ones, and the scheduler runs them like any other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from timerl.errors import ProgramError
from timerl.ir import prims
from timerl.ir.build import apply
from timerl.ir.graph import Edge, Op, View, consumers, walk
from timerl.ir.reads import needed_points
from timerl.ir.validate import exclusive_conditions
from timerl.symbolic import (
    FALSE,
    TRUE,
    Condition,
    Const,
    Dim,
    Expr,
    Slice,
    max_,
    min_,
    pieces,
    simplify,
)


def _ap(prim: str, *views: View, **attrs) -> View:
    return apply(prim, *views, **attrs)


def _differentiable(op: Op) -> bool:
    rule = prims.get(op.prim)
    return rule.differentiable and rule.vjp is not None


def depends_differentiably(value: Op, on: Op, through_not: frozenset[int] = frozenset()) -> bool:
    """Whether ``value`` reads ``on`` through ops gradients flow through (not via detach, nor
    via the ops in ``through_not``: gradients, which updates use as constants)."""
    seen: set[int] = set(through_not)
    stack = [value]
    while stack:
        op = stack.pop()
        if op is on:
            return True
        if op.id in seen or not (prims.get(op.prim).traits.piecewise or _differentiable(op)):
            continue
        seen.add(op.id)
        stack.extend(e.src for e in op.inputs)
    return False


def _zero_scalar(dtype: np.dtype) -> View:
    return apply("full", shape=(), value=0.0, dtype=dtype)


def gradients(loss: View, wrt: Sequence[Op]) -> dict[int, View]:
    """d(sum of loss over its points and elements) / d(each op in ``wrt``), per point."""
    if not loss.is_identity:
        loss = apply("identity", loss)
    if not np.issubdtype(loss.dtype, np.floating):
        raise ProgramError(f"backward(): the loss {loss.op.label} must be floating point")
    ops = walk([loss.op])
    by_id = {op.id: op for op in ops}
    users = consumers(ops)
    # Ops from which a leaf's influence reaches the loss through differentiable consumers.
    reach: set[int] = set()
    stack = [op.id for op in wrt if op.id in by_id]
    while stack:
        i = stack.pop()
        if i in reach:
            continue
        reach.add(i)
        stack.extend(c.id for c, _ in users.get(i, []) if _differentiable(c))
    # ... and that the loss depends on through differentiable ops (not only through detach).
    back: set[int] = set()
    stack = [loss.op.id]
    while stack:
        i = stack.pop()
        if i in back:
            continue
        back.add(i)
        if _differentiable(by_id[i]):
            stack.extend(e.src.id for e in by_id[i].inputs)
    relevant = {i for i in reach & back if np.issubdtype(by_id[i].dtype, np.floating)}
    if loss.op.id not in relevant:
        return {}

    # A VJP contributes only where its op's value is read: the branch value of
    # ``x[t + 1] = f(x, u[t + 1])`` exists at every t but is read only for t < T - 1, and at
    # t = T - 1 its VJP would read u[T].
    needed = needed_points(ops, [loss.op])
    grad_ops: dict[int, Op] = {}
    for i in sorted(relevant):
        x = by_id[i]
        grad_ops[i] = Op(
            prim="add_n",
            domain=x.domain,
            shape=x.shape,
            dtype=x.dtype,
            attrs={"shape": x.shape, "dtype": x.dtype},
            name=f"grad({x.label})",
        )
    seed = apply("full", shape=loss.op.shape, value=1.0, dtype=loss.dtype)
    grad_ops[loss.op.id].inputs.append(seed.edge())

    for i in sorted(relevant):
        c = by_id[i]
        if not _differentiable(c) or not any(e.src.id in relevant for e in c.inputs):
            continue
        ins = [View(e.src, e.index) for e in c.inputs]
        rule = prims.get(c.prim)
        g = View.of(grad_ops[c.id])
        parts = rule.vjp(_ap, c, ins, View.of(c), g)
        conds = exclusive_conditions(c) if rule.traits.piecewise else [e.cond for e in c.inputs]
        live = needed[c.id]
        for edge, part, cond in zip(c.inputs, parts, conds, strict=True):
            if part is None or edge.src.id not in relevant:
                continue
            for where, index in _affine_pieces(edge.index):
                piece = Edge(edge.src, index, edge.cond)
                contribution = _transpose(c, piece, part, simplify(cond & live & where))
                grad_ops[edge.src.id].inputs.append(contribution.edge())
    for gop in grad_ops.values():
        if not gop.inputs:
            zeros = apply("full", shape=gop.shape, value=0.0, dtype=gop.dtype)
            gop.inputs.append(zeros.edge())
    return {op.id: View.of(grad_ops[op.id]) for op in wrt if op.id in grad_ops}


def _affine_pieces(index: tuple) -> list[tuple[Condition, tuple]]:
    """A read through clamped indices (``x[min(t + 5, T - 1)]``, ``x[max(t - 3, 0):t + 1]``)
    as reads through affine ones, each where it applies: each piece transposes exactly."""
    out: list[tuple[Condition, tuple]] = [(TRUE, ())]
    for idx in index:
        if isinstance(idx, Slice):
            options = [
                (simplify(a & b), Slice(lo, hi))
                for a, lo in pieces(idx.start)
                for b, hi in pieces(idx.stop)
            ]
        else:
            options = pieces(idx)
        both = [(simplify(w & v), (*prefix, i)) for w, prefix in out for v, i in options]
        out = [(where, idx) for where, idx in both if where != FALSE]
    return out


def _transpose(c: Op, edge: Edge, g: View, cond: Condition) -> View:
    """The contribution of C's VJP ``g`` (over C's points) to the gradient of ``edge.src``."""
    x = edge.src
    index = edge.index
    if (
        cond == TRUE
        and x.domain == c.domain
        and all(i is d for i, d in zip(index, x.domain, strict=True))
    ):
        return g  # the common case: same point, nothing to move
    # Make g a value over exactly C's domain, zero where the edge did not apply.
    if cond != TRUE or g.dims != set(c.domain) or not g.is_identity:
        zero = _zero_scalar(g.dtype)
        gop = Op(
            prim="merge",
            domain=c.domain,
            shape=g.shape,
            dtype=g.dtype,
            inputs=[g.edge(cond), zero.edge()],
            attrs={"shape": g.shape, "dtype": g.dtype},
            name=f"vjp({c.label})",
        )
    else:
        gop = g.op
    where = f"the read of {x.label}[{', '.join(map(str, index))}] by {c.where()}"
    read: dict[Dim, Expr | Slice] = {}
    conds: list[Condition] = []
    select: Expr | None = None  # position of d inside a slice's leading axis
    diag: tuple[Dim, tuple[Expr, int]] | None = (
        None  # x dim, (first offset, step) of a moving slice
    )
    n_slices = sum(isinstance(i, Slice) for i in index)
    if n_slices > 1:
        raise ProgramError(f"autodiff: {where} gathers several temporal slices at once")
    for d, idx in zip(x.domain, index, strict=True):
        if isinstance(idx, Slice):
            cdims = _cdims(idx.start, c) | _cdims(idx.stop, c)
            if not cdims:
                select = d - idx.start
                conds += [idx.start <= d, d < idx.stop]
                continue
            if len(cdims) > 1:
                raise ProgramError(f"autodiff: {where}: slice bounds mix several dims")
            (cd,) = cdims
            if cd in read:
                raise ProgramError(f"autodiff: {where}: dim {cd.name} is used twice")
            a = _offset(idx.start, cd, where)
            b = _offset(idx.stop, cd, where)
            lo: Expr = Const(0)
            hi: Expr = cd.bound
            if b is not None:
                lo = max_(lo, d - b + 1)
            else:
                conds.append(d < idx.stop)
            if a is not None:
                hi = min_(hi, d - a + 1)
            else:
                conds.append(idx.start <= d)
            read[cd] = Slice(lo, hi)
            # element of C's point c_j = lo + j that holds d: d - start(c_j)
            diag = (d, (d - lo - a, -1) if a is not None else (d - idx.start, 0))
            continue
        cdims = _cdims(idx, c)
        if not cdims:
            conds.append(d.eq(idx))
            continue
        if len(cdims) > 1:
            raise ProgramError(f"autodiff: {where}: index {idx} mixes several dims")
        (cd,) = cdims
        k = _offset(idx, cd, where)
        if cd in read or k is None:
            raise ProgramError(f"autodiff: {where}: index {idx} is not invertible")
        back = d - k
        read[cd] = back
        conds += [back >= 0, back < cd.bound]
    free = [cd for cd in c.domain if cd not in read]
    for cd in free:
        read[cd] = Slice(Const(0), cd.bound)
    full_index = tuple(read[cd] for cd in c.domain)
    valid: Condition = TRUE
    for k in conds:
        valid = valid & k
    # Dropping what holds everywhere (t < T at a point of t) also keeps a dynamic bound out
    # of gradient ops that run inside its own ``until`` loop, where it is not known yet.
    valid = simplify(valid)
    x_shape = x.shape
    if diag is not None:
        if free:
            raise ProgramError(f"autodiff: {where}: a moving slice with other summed dims")
        _, (first, step) = diag
        cd = next(cd for cd in c.domain if isinstance(read[cd], Slice))
        sl = read[cd]
        assert isinstance(sl, Slice)
        n = sl.stop - sl.start
        out = Op(
            prim="diag_gather",
            domain=x.domain,
            shape=(n,) + tuple(x_shape),
            dtype=g.dtype,
            inputs=[Edge(gop, full_index)],
            attrs={
                "first": first,
                "step": step,
                "shape": (n,) + tuple(x_shape),
                "dtype": g.dtype,
                "valid": valid,
            },
            name=f"dgather({c.label})",
        )
        return apply("sum", View.of(out), axes=(0,), keepdims=False)
    view = View(gop, full_index)
    if valid != TRUE:
        shape = view.shape
        guarded = Op(
            prim="merge",
            domain=x.domain,
            shape=shape,
            dtype=g.dtype,
            inputs=[Edge(gop, full_index, valid), _zero_scalar(g.dtype).edge()],
            attrs={"shape": shape, "dtype": g.dtype},
            name=f"guard({c.label})",
        )
        view = View.of(guarded)
    if free:
        view = apply("sum", view, axes=tuple(range(len(free))), keepdims=False)
    if select is not None:
        view = _select_element(view, select)
    return view


def _select_element(view: View, index: Expr) -> View:
    """Element ``index`` of ``view``'s leading axis. The gradient of ``x[0:T].sum()`` is a
    broadcast: its elements are all the same, so take one without the index (and without
    ``T``, which inside its own ``until`` loop is not known yet)."""
    op = view.op
    if view.is_identity and prims.get(op.prim).traits.broadcast:
        base = View(op.inputs[0].src, op.inputs[0].index)
        shape = tuple(op.shape)
        if len(base.shape) < len(shape):
            return apply("expand", base, shape=shape[1:]) if base.shape != shape[1:] else base
        if base.shape[0] == Const(1):
            return apply("select_at", base, index=Const(0))
    return apply("select_at", view, index=index)


def _cdims(e: Expr, c: Op) -> set[Dim]:
    return {s for s in e.symbols() if isinstance(s, Dim) and s in c.domain}


def _offset(e: Expr, cd: Dim, where: str) -> Expr | None:
    """``k`` when ``e == cd + k`` (k free of C's dim), None when ``e`` does not use ``cd``."""
    if cd not in e.symbols():
        return None
    terms, _ = e.linear()
    if terms.get(cd) != 1:
        raise ProgramError(f"autodiff: {where}: index {e} must move one step per step of {cd.name}")
    rest = e - cd
    if cd in rest.symbols():
        raise ProgramError(f"autodiff: {where}: index {e} is not affine in {cd.name}")
    return rest
