"""Where a loop's iterations can only repeat each other, for ``budget.planned_peak``.

The planned peak replays the schedule point by point, so a rollout of 100,000 steps cost
100,000 replayed iterations per plan, and planning under a budget replays many plans (about
0.4 ms an iteration: 13 s to compile PPO with ``num_steps=100_000`` under a budget, against
0.5 s without one). Most iterations of a long loop do the same as the one before, shifted by
one point: the replay watches for that and applies the repeated iterations' net effect
instead of replaying them (``budget._Steady``).

Watching alone cannot see an iteration coming that differs: a guard that turns at ``t == T // 2``,
an index clamped by ``min(t + 5, T - 1)``, a point kept at ``t == T - 1``. This module reads
the loop's body once and gives the points where anything that depends on the loop's dim may
change: where an affine guard, a free's kept points or a donation's read cross over. Between
two such points every iteration evaluates the same branches, so iterations that watched equal
stay equal. A body whose behaviour depends on the dim in a way it cannot bound (a dim inside a
min, max, div or mod, a shape that grows with the dim, a swap) gives None: every iteration is
replayed, as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from timerl.memory.storage import Storage
from timerl.schedule.program import Compute, Free, Loop, Stmt, SwapIn, SwapOut
from timerl.symbolic import Dim, Expr, Symbol
from timerl.symbolic.expr import comparisons


def _affine(expr: Expr, dim: Dim) -> tuple[int, dict[Expr, int], int] | None:
    """``expr`` as ``a * dim + sum(c * atom) + const`` with no atom depending on ``dim``; None
    where ``dim`` sits inside a min, max, div or mod."""
    terms, const = expr.linear()
    a = 0
    rest: dict[Expr, int] = {}
    for atom, c in terms.items():
        if atom is dim:
            a += c
        elif dim in atom.symbols():
            return None
        else:
            rest[atom] = c
    return a, rest, const


class _Unbounded(Exception):
    """The body depends on the dim in a way no turning point bounds."""


def turning_points(
    loop: Loop,
    env: Mapping[Symbol, int],
    donations: Mapping[int, int],
    storage: Mapping[int, Storage],
) -> list[int] | None:
    """The values of ``loop.dim`` near which an iteration may differ from its neighbours, or
    None where they cannot be bounded (see the module's docstring).

    ``env`` holds the bounds and the dims of the loops around ``loop``: a guard whose turning
    point also depends on a loop inside it turns at a different point per inner iteration,
    which is not bounded here either. A free of every point under a prefix, of a tensor
    computed outside the loop, could meet points the watched iterations never saw; it is not
    bounded either."""
    dim = loop.dim
    points: set[int] = set()
    inside: set[int] = set()

    def computed(body: list[Stmt]) -> None:
        for s in body:
            if isinstance(s, Loop):
                computed(s.body)
            elif isinstance(s, Compute):
                inside.add(s.op.id)

    computed(loop.body)

    def crossing(expr: Expr) -> None:
        """Where ``expr`` (compared against 0) changes sign or passes 0."""
        form = _affine(expr, dim)
        if form is None:
            raise _Unbounded
        a, rest, const = form
        if a == 0:
            return  # the same at every point of this loop
        try:
            c = const + sum(k * atom.evaluate(env) for atom, k in rest.items())
        except KeyError:  # depends on an inner loop's dim
            raise _Unbounded from None
        root = -c / a
        points.update(range(math.floor(root) - 1, math.ceil(root) + 2))

    def index(exprs: tuple) -> None:
        for x in exprs:
            if not isinstance(x, Expr) or _affine(x, dim) is None:
                raise _Unbounded

    def visit(body: list[Stmt]) -> None:
        for s in body:
            if isinstance(s, Loop):
                visit(s.body)
            elif isinstance(s, (SwapOut, SwapIn)):
                raise _Unbounded
            elif isinstance(s, Compute):
                op = s.op
                atoms = comparisons(op.guard)
                if atoms is None:
                    raise _Unbounded
                for cmp in atoms:
                    crossing(cmp.diff)
                if any(dim in x.symbols() for x in op.shape):
                    raise _Unbounded
                if op.id in donations:
                    index(op.inputs[donations[op.id]].index)
            elif isinstance(s, Free):
                index(s.prefix)
                st = storage.get(s.op.id)
                whole = len(s.op.domain) - (st is not None and st.kind in ("block", "ring"))
                if s.op.id not in inside and len(s.prefix) < whole:
                    raise _Unbounded
                index(s.pinned)
                if s.prefix and s.pinned:  # a kept point: where the freed one meets it
                    for kept in s.pinned:
                        crossing(s.prefix[-1] - kept)

    try:
        visit(loop.body)
    except _Unbounded:
        return None
    return sorted(points)
