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
from timerl.ir.validate import edge_conditions
from timerl.symbolic import (
    FALSE,
    TRUE,
    Condition,
    Const,
    Dim,
    Expr,
    Slice,
    always_le0,
    max_,
    min_,
    pieces,
    simplify,
)
from timerl.symbolic.expr import And, Cmp, DivMod


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
    # t = T - 1 its VJP would read u[T]. A value read only by a branch at a point the bounds
    # may not have (``x[1] = u[1] * w`` under ``T = 1``) contributes where they have it.
    needed = needed_points(ops, [loss.op], exists=True)
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
        conds = edge_conditions(c)
        live = needed[c.id]
        for edge, part, cond in zip(c.inputs, parts, conds, strict=True):
            if part is None or edge.src.id not in relevant:
                continue
            for where, index in _affine_pieces(edge.index):
                piece = Edge(edge.src, index, edge.cond)
                contribution = _transpose_read(c, piece, part, simplify(cond & live & where))
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


def _transpose_read(c: Op, edge: Edge, g: View, cond: Condition) -> View:
    """``_transpose`` for any number of temporal slices in one read.

    ``u[0:I, t + 1:T]`` is read as ``w[t + 1:T]`` of an intermediate ``w[t'] = u[0:I, t']``
    (its gathered axes swapped back into place): each step gathers one slice, whose transpose
    ``_transpose`` knows. ``w`` exists only here, to carry the gradient between the steps.
    """
    slots = [k for k, idx in enumerate(edge.index) if isinstance(idx, Slice)]
    if len(slots) <= 1:
        return _transpose(c, edge, g, cond)
    x = edge.src

    def used_elsewhere(k: int) -> set[Dim]:
        out: set[Dim] = set()
        for pos, idx in enumerate(edge.index):
            if pos != k:
                out |= {s for s in idx.symbols() if isinstance(s, Dim)}
        return out

    # peel a slice whose dim no other index uses: w's domain holds that dim as x's own
    k = next((k for k in reversed(slots) if x.domain[k] not in used_elsewhere(k)), None)
    if k is None:
        raise ProgramError(
            f"autodiff: the read of {x.label}[{', '.join(map(str, edge.index))}] by "
            f"{c.where()} slices dims that its other indices use; its gradient is not "
            "supported: compute part of the read as a tensor of its own first"
        )
    d, others = x.domain[k], used_elsewhere(k)
    inner = edge.index[:k] + (d,) + edge.index[k + 1 :]
    w = Op(
        prim="identity",
        domain=tuple(sorted(others | {d}, key=lambda s: s.uid)),
        shape=View(x, inner).shape,
        dtype=x.dtype,
        inputs=[Edge(x, inner)],
        name=f"{x.label}[{', '.join(map(str, inner))}]",
    )
    outer = tuple(edge.index[k] if dim is d else dim for dim in w.domain)
    # g's leading axes: one per slice, in x's dim order; w's read puts the peeled one first
    n, j = len(slots), slots.index(k)
    perm = (j, *(m for m in range(n) if m != j), *range(n, len(g.shape)))
    g_w = apply("permute", g, perm=perm)
    g_inner = _transpose(c, Edge(w, outer, edge.cond), g_w, cond)
    return _transpose_read(w, Edge(x, inner), g_inner, TRUE)


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
    # C's points that read x's point, per dim of C, in x's coordinates: a point (shifts), a
    # range summed over (dims x lacks, floor division, any other index: masked), or a moving
    # range whose elements sit on a diagonal (slices that follow C's point).
    read: dict[Dim, Expr | Slice] = {}
    summed: set[Dim] = set()
    masks: list[tuple[Dim, Expr, Dim]] = []  # (C dim, C's index, x dim it must equal)
    conds: list[Condition] = []
    pins: dict[Dim, Expr] = {}  # x dims read at one fixed point: x dim -> that point
    select: Expr | None = None  # position of d inside a slice's leading axis
    diag: tuple[Dim, Expr, int] | None = None  # C dim, (first offset, step) of a moving slice
    n_slices = sum(isinstance(i, Slice) for i in index)
    if n_slices > 1:
        raise ProgramError(
            f"autodiff: {where} gathers several temporal slices at once; its gradient is not "
            "supported: read the slices one after another (e.g. sum one, then slice the result)"
        )
    # points first: a slice whose bounds use a dim a point index already maps (w[t:T, t])
    # then holds x's point at one position of one C point's slice
    for pos in sorted(range(len(index)), key=lambda k: isinstance(index[k], Slice)):
        d, idx = x.domain[pos], index[pos]
        if isinstance(idx, Slice):
            cdims = _cdims(idx.start, c) | _cdims(idx.stop, c)
            mapped = {cd: read[cd] for cd in cdims if isinstance(read.get(cd), Expr)}
            if mapped and len(mapped) == len(cdims):
                idx = idx.substitute(mapped)  # type: ignore[arg-type]
                cdims = set()
            if not cdims:
                select = d - idx.start
                conds += [idx.start <= d, d < idx.stop]
                continue
            if len(cdims) > 1:
                raise ProgramError(
                    f"autodiff: {where}: slice bounds mix several dims; its gradient is not "
                    "supported"
                )
            (cd,) = cdims
            if cd in read:
                raise ProgramError(
                    f"autodiff: {where}: dim {cd.name} is used twice; its gradient is not "
                    "supported here"
                )
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
            diag = (cd, d - lo - a, -1) if a is not None else (cd, d - idx.start, 0)
            continue
        cdims = _cdims(idx, c)
        if not cdims:
            conds.append(d.eq(idx))
            pins[d] = idx
            continue
        if len(cdims) > 1:
            raise ProgramError(
                f"autodiff: {where}: index {idx} mixes several dims; its gradient is not "
                "supported (read through an index of one dim, e.g. a tensor over both dims)"
            )
        (cd,) = cdims
        k = _shift(idx, cd)
        if cd in read:
            earlier = read[cd]
            if k is None or not isinstance(earlier, Expr):
                raise ProgramError(
                    f"autodiff: {where}: dim {cd.name} is used twice; its gradient is not "
                    "supported here"
                )
            conds.append((d - k).eq(earlier))  # a diagonal: both indices name one C point
            continue
        if k is not None:
            back = d - k
            read[cd] = back
            conds += [back >= 0, back < cd.bound]
            continue
        span = _floordiv_span(idx, cd, d)
        if span is not None:  # x's point d is read by a run of C's points: sum them
            first, stop = span
            lo, hi = max_(first, 0), min_(stop, cd.bound)
            # where x's point is read by no point of C the run is empty, never negative
            read[cd] = Slice(lo, hi if always_le0(lo - hi) else max_(lo, hi))
            conds += [first < cd.bound, stop > 0]
        else:  # any other index (t % k, 2 * t): sum C's points whose index is d
            read[cd] = Slice(Const(0), cd.bound)
            masks.append((cd, idx, d))
        summed.add(cd)
    for cd in c.domain:
        if cd not in read:
            read[cd] = _summed_range(cd, cond, pins)
            summed.add(cd)
    valid: Condition = TRUE
    for k in conds:
        valid = valid & k
    # Dropping what holds everywhere (t < T at a point of t) also keeps a dynamic bound out
    # of gradient ops that run inside its own ``until`` loop, where it is not known yet.
    valid = simplify(valid)
    if diag is not None:
        return _diagonal(c, x, gop, read, summed, masks, diag, valid, g.dtype, where)
    full_index = tuple(read[cd] for cd in c.domain)
    view = View(gop, full_index)
    if valid != TRUE and select is None:
        view = _guarded(view, valid, x.domain, f"guard({c.label})")
    view = _sum_gathered(view, c.domain, full_index, masks)
    if select is not None:
        # Select first, guard after: where the read did not apply, d - start may lie outside
        # the slice (u[0:2] has no element for the gradient at t = 2).
        view = _select_element(view, select)
        if valid != TRUE:
            view = _guarded(view, valid, x.domain, f"guard({c.label})")
    return view


def _guarded(view: View, valid: Condition, domain: tuple[Dim, ...], name: str) -> View:
    """``view`` where ``valid`` holds, zeros elsewhere (its ops then run only where valid)."""
    shape = view.shape
    op = Op(
        prim="merge",
        domain=domain,
        shape=shape,
        dtype=view.dtype,
        inputs=[view.edge(valid), _zero_scalar(view.dtype).edge()],
        attrs={"shape": shape, "dtype": view.dtype},
        name=name,
    )
    return View.of(op)


def _sum_gathered(
    view: View, cdomain: tuple[Dim, ...], index: tuple, masks: list[tuple[Dim, Expr, Dim]]
) -> View:
    """Sum the axes ``index`` gathered (one per slice, in order), keeping only the points a
    mask allows: C's point ``p`` on dim ``cd`` counts where ``idx(p) == d``."""
    axes = [cd for cd, i in zip(cdomain, index, strict=True) if isinstance(i, Slice)]
    rank = len(view.shape)
    for cd, idx, d in masks:
        where = apply("full", shape=(), value=idx, dtype=np.dtype("int64"))  # over (cd,)
        over = View(where.op, tuple(Slice(Const(0), cd.bound) for _ in where.op.domain))
        here = apply("full", shape=(), value=d, dtype=np.dtype("int64"))
        hit = apply("cast", apply("eq", over, here), dtype=view.dtype)
        shape = [Const(1)] * rank
        shape[axes.index(cd)] = cd.bound
        view = apply("mul", view, apply("reshape", hit, shape=tuple(shape)))
    if axes:
        view = apply("sum", view, axes=tuple(range(len(axes))), keepdims=False)
    return view


def _diagonal(
    c: Op,
    x: Op,
    gop: Op,
    read: dict[Dim, Expr | Slice],
    summed: set[Dim],
    masks: list[tuple[Dim, Expr, Dim]],
    diag: tuple[Dim, Expr, int],
    valid: Condition,
    dtype: np.dtype,
    where: str,
) -> View:
    """The transpose of a moving slice: from each C point whose slice covered x's point, the
    element it put there. Dims summed over are summed first, into an op over C's other dims
    and the x dims their ranges use."""
    dcd, first, step = diag
    src: Op = gop
    src_index = tuple(read[cd] for cd in c.domain)
    if summed:
        kept = [cd for cd in c.domain if cd not in summed]
        uses: set[Dim] = set()
        for cd in summed:
            uses |= {s for s in read[cd].symbols() if isinstance(s, Dim)}
        if uses & set(kept):
            raise ProgramError(
                f"autodiff: {where}: the dims summed over depend on the dims of the moving "
                "slice; its gradient is not supported"
            )
        stage_index = tuple(read[cd] if cd in summed else cd for cd in c.domain)
        partial = _sum_gathered(View(gop, stage_index), c.domain, stage_index, masks)
        if not partial.is_identity:
            partial = apply("identity", partial)
        src = partial.op
        src_index = tuple(read[dim] if dim in kept else dim for dim in src.domain)
    sl = read[dcd]
    assert isinstance(sl, Slice)
    n = sl.stop - sl.start
    shape = (n,) + tuple(x.shape)
    out = Op(
        prim="diag_gather",
        domain=x.domain,
        shape=shape,
        dtype=dtype,
        inputs=[Edge(src, src_index)],
        attrs={"first": first, "step": step, "shape": shape, "dtype": dtype},
        name=f"dgather({c.label})",
    )
    view = apply("sum", View.of(out), axes=(0,), keepdims=False)
    if valid != TRUE:
        # Guard after the gather: where the read did not apply its range may not exist.
        view = _guarded(view, valid, x.domain, f"guard({c.label})")
    return view


def _summed_range(cd: Dim, cond: Condition, pins: dict[Dim, Expr]) -> Slice:
    """The points of C's dim ``cd`` to sum over: the whole dim, narrowed to where ``cond``
    (the condition g was masked with) can hold. Bounds that equal x's pinned point on the
    same dim are written relative to x's point (``i`` rather than ``I - 1`` where only
    ``i = I - 1`` is read), which lets the scheduler see the gradient's direction."""
    lows: list[Expr] = [Const(0)]
    highs: list[Expr] = [cd.bound - 1]
    parts = cond.parts if isinstance(cond, And) else (cond,)
    for part in parts:
        if not isinstance(part, Cmp) or part.op == "!=":
            continue
        terms, _ = part.diff.linear()
        coef = terms.get(cd)
        rest = part.diff - cd * coef if coef in (1, -1) else None
        if rest is None or any(isinstance(s, Dim) for s in rest.symbols()):
            continue
        # coef * cd + rest OP 0
        edge = -rest if coef == 1 else rest
        strict = 1 if part.op == "<" else 0
        if part.op == "==" or coef == 1:
            highs.append(edge - strict)
        if part.op == "==" or coef == -1:
            lows.append(edge + strict)
    pin = pins.get(cd)
    if pin is not None:

        def relative(e: Expr) -> Expr:
            diff = e - pin
            return cd + diff.value if isinstance(diff, Const) else e

        lows, highs = [relative(e) for e in lows], [relative(e) for e in highs]
        lows.append(Const(0))
        highs.append(cd.bound - 1)
    lo, hi = max_(*lows), min_(*highs)
    stop = hi + 1
    if not always_le0(lo - stop):
        stop = max_(lo, stop)  # an empty range where the condition cannot hold
    return Slice(lo, stop)


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


def _shift(e: Expr, cd: Dim) -> Expr | None:
    """``k`` when ``e == cd + k`` with ``k`` free of ``cd``, else None."""
    terms, _ = e.linear()
    if terms.get(cd) != 1:
        return None
    rest = e - cd
    return None if cd in rest.symbols() else rest


def _floordiv_span(e: Expr, cd: Dim, d: Dim) -> tuple[Expr, Expr] | None:
    """For ``e == (cd + b) // k + r`` (b, r free of ``cd``): the run ``[first, stop)`` of
    ``cd`` values where ``e`` equals x's point ``d``; None for any other form."""
    terms, const = e.linear()
    atom = next((a for a in terms if cd in a.symbols()), None)
    if (
        not isinstance(atom, DivMod)
        or atom.kind != "//"
        or terms[atom] != 1
        or any(cd in a.symbols() for a in terms if a is not atom)
    ):
        return None
    b = _shift(atom.arg, cd)
    if b is None:
        return None
    r = e - atom
    first = (d - r) * atom.divisor - b
    return first, first + atom.divisor


def _offset(e: Expr, cd: Dim, where: str) -> Expr | None:
    """``k`` when ``e == cd + k`` (k free of C's dim), None when ``e`` does not use ``cd``."""
    if cd not in e.symbols():
        return None
    terms, _ = e.linear()
    if terms.get(cd) != 1:
        raise ProgramError(
            f"autodiff: {where}: slice bound {e} must move one step per step of {cd.name}; "
            "its gradient is not supported"
        )
    rest = e - cd
    if cd in rest.symbols():
        raise ProgramError(f"autodiff: {where}: index {e} is not affine in {cd.name}")
    return rest
