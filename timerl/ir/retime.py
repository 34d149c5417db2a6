"""Retiming: rebuild a pure expression so it is computed at the point it defines.

``x[t + 2] = x[t + 1] + x[t]`` defines ``x`` at ``p`` from the sum at ``p - 2``; read as is, the
sum op reads ``x`` one step *ahead* of its own point and the recurrence looks like it mixes
directions. Cloning the sum with every index shifted (``x[p - 1] + x[p - 2]``) gives an op read at
its own point whose reads are all behind it, which is what the scheduler, guards, autodiff
and memory analysis reason about best. Clones stop at placeholders, side effects and
constants, which are read at the shifted index instead; random ops keep their key point, so
they draw the same numbers.
"""

from __future__ import annotations

import numpy as np

from timerl.ir import prims
from timerl.ir.graph import Edge, Op, View
from timerl.symbolic import Const, Dim, Expr, Slice, always_le0


def _shifts(view: View) -> dict[Dim, Expr] | None:
    """``{d: e}`` when the view reads its op at ``d -> e`` with e a shift of d, else None."""
    out: dict[Dim, Expr] = {}
    for d, idx in zip(view.op.domain, view.index, strict=True):
        if not isinstance(idx, Expr):
            return None
        terms, _ = idx.linear()
        if terms != {d: 1}:
            return None
        out[d] = idx
    return out


def _clonable(op: Op) -> bool:
    t = prims.get(op.prim).traits
    return (
        not (t.piecewise or t.host or t.constant or t.stops_gradient)
        and not op.effect
        and bool(op.inputs)
        and op.domain != ()
    )


def retime(view: View, target: Op) -> View:
    """A view with the same values as ``view`` whose op is read at its own point.

    Only ops that lead back to ``target`` (the tensor being defined) are cloned: those carry the
    recurrence; anything else, and everything behind a ``detach``, is read at the shifted index
    instead, so no computation is duplicated for nothing.
    """
    memo: dict[tuple, Op] = {}
    reaches: dict[int, bool] = {}

    def leads_to_target(op: Op) -> bool:
        stack, order = [op], []
        while stack:
            o = stack.pop()
            if o.id in reaches:
                continue
            reaches[o.id] = False  # provisional, breaks cycles
            order.append(o)
            if o is target:
                continue
            if not prims.get(o.prim).traits.stops_gradient:
                stack.extend(e.src for e in o.inputs if e.src.id not in reaches)
        for o in reversed(order):
            reaches[o.id] = o is target or (
                not prims.get(o.prim).traits.stops_gradient
                and any(reaches.get(e.src.id, False) for e in o.inputs)
            )
        return reaches[op.id]

    if not _reads_ahead(view, target, leads_to_target):
        return view
    return _retime(view, memo, leads_to_target)


def _reads_ahead(view: View, target: Op, wanted) -> bool:
    """Whether the expression reads ``target`` ahead of its own point, against the shift.

    ``f[t + 2] = f[t + 1] + f[t]`` does (``t + 1`` from the sum at ``t``); ``h[t + 1] =
    tanh(W @ h[t])`` does not, and is left alone: its ops keep their natural domain.
    """
    shifts = _shifts(view)
    if shifts is None:
        return False
    back = {d: e - d for d, e in shifts.items()}  # negative: defines p from the value at p - k
    seen: set[int] = set()
    stack = [view.op]
    while stack:
        op = stack.pop()
        if op.id in seen or op is target or not wanted(op):
            continue
        seen.add(op.id)
        for e in op.inputs:
            if e.src is target:
                for d, idx in zip(target.domain, e.index, strict=True):
                    if d not in back or not isinstance(back[d], Const) or back[d].value == 0:
                        continue
                    lo, hi = (idx.start, idx.stop - 1) if isinstance(idx, Slice) else (idx, idx)
                    ahead = not always_le0(hi - d) if back[d].value < 0 else not always_le0(d - lo)
                    if ahead:
                        return True
            else:
                stack.append(e.src)
    return False


def _retime(view: View, memo: dict, wanted) -> View:
    op = view.op
    shifts = _shifts(view)
    if (
        shifts is None
        or not _clonable(op)
        or all(shifts[d] is d for d in op.domain)
        or not wanted(op)
    ):
        return view
    key = (op.id, tuple(shifts[d] for d in op.domain))
    if key not in memo:
        rule = prims.get(op.prim)
        attrs = dict(op.attrs)
        for name in rule.point_attrs:
            value = attrs.get(name)
            if isinstance(value, (tuple, list)):
                attrs[name] = tuple(
                    v.substitute(shifts) if isinstance(v, Expr) else v for v in value
                )
            elif isinstance(value, Expr):
                attrs[name] = value.substitute(shifts)
        if rule.keyed and "key_at" not in attrs:
            attrs["key_at"] = tuple(shifts[d] for d in op.domain)
        clone = Op(
            prim=op.prim,
            domain=op.domain,
            shape=tuple(s.substitute(shifts) for s in op.shape),
            dtype=np.dtype(op.dtype),
            attrs=attrs,
            name=op.name,
            site=op.site,
        )
        memo[key] = clone
        for e in op.inputs:
            index = tuple(
                i.substitute(shifts) if isinstance(i, (Expr, Slice)) else i for i in e.index
            )
            inner = _retime(View(e.src, index), memo, wanted)
            clone.inputs.append(Edge(inner.op, inner.index, e.cond.substitute(shifts)))
    return View.of(memo[key])
