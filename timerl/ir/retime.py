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
        not (t.piecewise or t.host or t.constant)
        and not op.effect
        and bool(op.inputs)
        and op.domain != ()
    )


def retime(view: View, target: Op) -> View:
    """A view with the same values as ``view`` whose op is read at its own point.

    Only ops that lead back to ``target`` (the tensor being defined) are cloned: those carry the
    recurrence; anything else is read at the shifted index instead, so no computation is
    duplicated for nothing. A ``detach`` stops gradients, not dependences: an op behind it that
    reads ``target`` ahead (``softmax``'s detached max) is cloned too, or it would sit in a
    cycle with ``target`` reading both earlier and later points.
    """
    memo: dict[tuple, Op] = {}
    reaching = _reaching(view.op, target)

    def leads_to_target(op: Op) -> bool:
        return op.id in reaching

    if not _reads_ahead(view, target, leads_to_target):
        return view
    return _retime(view, memo, leads_to_target)


def _reaching(start: Op, target: Op) -> set[int]:
    """Ids of the ops reachable from ``start`` that reach ``target``.

    Found backwards from ``target`` over the reversed edges of the explored part: a depth-first
    post-order is no topological order on a cyclic graph, and would miss ops whose only path to
    ``target`` runs through an op still being explored.
    """
    readers: dict[int, list[Op]] = {}
    seen: set[int] = set()
    stack = [start]
    while stack:
        op = stack.pop()
        if op.id in seen:
            continue
        seen.add(op.id)
        if op is target:
            continue
        for e in op.inputs:
            readers.setdefault(e.src.id, []).append(op)
            stack.append(e.src)
    if target.id not in seen:
        return set()
    out = {target.id}
    stack = [target]
    while stack:
        op = stack.pop()
        for r in readers.get(op.id, []):
            if r.id not in out:
                out.add(r.id)
                stack.append(r)
    return out


def _reads_ahead(view: View, target: Op, wanted) -> bool:
    """Whether the expression reads anything ahead of its own point, against the shift.

    ``f[t + 2] = f[t + 1] + f[t]`` does (``t + 1`` from the sum at ``t``), and so does
    ``b[t + 1] = b[t] + a[t + 1]``: read from the sum at ``t``, ``a[t + 1]`` looks like a read of
    the future, which with ``a`` reading ``b`` (now or once ``a`` is defined) makes a cycle
    with both directions. ``h[t + 1] =
    tanh(W @ h[t])`` does not, and is left alone: its ops keep their natural domain. Only the
    ops that retiming would clone are looked through; what they read is read at the shifted
    index either way.
    """
    shifts = _shifts(view)
    if shifts is None:
        return False
    back = {d: e - d for d, e in shifts.items()}  # negative: defines p from the value at p - k
    seen: set[int] = set()
    open_memo: dict[int, bool] = {}
    stack = [view.op]
    while stack:
        op = stack.pop()
        if op.id in seen or op is target or not wanted(op) or not _clonable(op):
            continue
        seen.add(op.id)
        for e in op.inputs:
            for d, idx in zip(e.src.domain, e.index, strict=True):
                k = back.get(d)
                if not isinstance(k, Const) or k.value == 0:
                    continue
                lo, hi = (idx.start, idx.stop - 1) if isinstance(idx, Slice) else (idx, idx)
                ahead = not always_le0(hi - d) if k.value < 0 else not always_le0(d - lo)
                if ahead and _may_join_a_cycle(e.src, target, open_memo):
                    return True
            stack.append(e.src)
    return False


def _may_join_a_cycle(op: Op, target: Op, memo: dict[int, bool]) -> bool:
    """Whether ``op`` reads ``target`` or a tensor still open to definitions (a placeholder
    other than ``from_numpy``'s): only then can a read of it ahead of the point end up in a
    cycle with ``target``. Data read ahead (``u[t + 1]`` of
    an array) is read at the shifted index as it is."""
    stack, seen = [op], set()
    while stack:
        o = stack.pop()
        if o.id in seen:
            continue
        if (
            memo.get(o.id)
            or o is target
            or (prims.get(o.prim).traits.piecewise and not o.attrs.get("sealed"))
        ):
            memo[op.id] = True
            return True
        seen.add(o.id)
        stack.extend(e.src for e in o.inputs)
    memo[op.id] = False
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
