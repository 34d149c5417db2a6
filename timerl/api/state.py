"""A compiled program's state between iterations of its outer loop, by name.

A training program carries parameters, optimiser moments and running statistics from one
iteration to the next; an executor's ``snapshot()`` holds them by op position. These
functions say which of them are which by the names the program's author gave
(``RecurrentTensor.placeholder(..., name=...)``, ``tl.nn`` parameters), and how far past its
last iteration a program must be compiled so that a snapshot of that iteration holds them all.
:class:`~timerl.api.program.Program` offers them as methods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from timerl.ir import prims
from timerl.ir.graph import Op
from timerl.symbolic import Bound, Dim


def outer_dim(ops: Sequence[Op]) -> Dim | None:
    """The program's outermost dim (the iteration dim of a training program), if any."""
    loops = [op.domain[0] for op in ops if op.domain]
    return min(loops, key=lambda d: d.uid) if loops else None


def carried_state(
    ops: Sequence[Op],
    static: Mapping[Bound, int],
    snapshot: Mapping[int, Mapping[tuple, Any]],
    iteration: int,
) -> dict[str, np.ndarray]:
    """Each named tensor defined piecewise over the outer dim alone, at point
    ``iteration + 1`` (its value after iteration ``iteration``), read from a snapshot taken
    right after that iteration.

    The compiler keeps a recurrence's definition (``w[0] = init; w[i] = update[i - 1, ...]``)
    but the carried value lives in its update's store; evaluating the definition's recurrent
    branch index at ``iteration + 1`` says which stored point that is. Works for any program,
    whatever its names; a recurrence whose next value is only computed in a later iteration
    (``w[i + 1]`` reading something at ``i + 1``) is not carried yet, and is left out."""
    outer = outer_dim(ops)
    if outer is None:
        return {}
    position = {op.id: k for k, op in enumerate(ops)}
    env = {**static, outer: iteration + 1}
    out: dict[str, np.ndarray] = {}
    for op in ops:
        if not op.name or op.domain != (outer,) or op.name in out:
            continue
        if not prims.get(op.prim).traits.piecewise:
            continue
        for edge in op.inputs:
            store = snapshot.get(position.get(edge.src.id, -1))
            if not store or _false_at(edge.cond, env):
                continue
            try:
                point = tuple(int(x.evaluate(env)) for x in edge.index)
            except Exception:  # a slice or a symbol without value: not a carried point
                continue
            if point in store:
                out[op.name] = np.asarray(store[point])
                break
    return out


def resume_margin(ops: Sequence[Op], static: Mapping[Bound, int], iterations: int) -> int:
    """How many iterations past ``iterations + 1`` the outer bound must reach so that the last
    iteration run computes every value a longer run would carry on from it.

    The compiler computes a value only where a later op reads it, judged against the outer
    bound: with ``seen[i + 1] = seen[i] + ...`` read only by an update that itself stops at
    ``i + 1 < I``, ``seen``'s update stops at ``i + 2 < I``. A run compiled with ``I`` just
    past its last iteration then ends without the carried value its resumed continuation
    needs. Each guard is evaluated at the last iteration (the other dims at 0) against the
    bound as given and against a far one."""
    outer = outer_dim(ops)
    if outer is None:
        return 0
    far = 1 << 20

    def holds(op: Op, margin: int) -> bool:
        env: dict[Any, int] = {**static, outer.bound: iterations + 1 + margin}
        env.update({d: 0 for d in op.domain})
        env[outer] = iterations - 1
        try:
            return bool(op.guard.evaluate(env))
        except Exception:  # a symbol without a value here: not a guard on the bound alone
            return True

    need = 0
    for op in ops:
        if outer not in op.domain or holds(op, 0) or not holds(op, far):
            continue
        need = max(need, next(m for m in range(1, far) if holds(op, m)))
    return need


def _false_at(cond: Any, env: Mapping[Any, int]) -> bool:
    try:
        return not bool(cond.evaluate(env))
    except Exception:
        return False
