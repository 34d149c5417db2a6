"""``rewrite``: the one way passes edit the schedule tree; positions and loops as the passes
rely on them, and the schedule it is given left as it was."""

from __future__ import annotations

import numpy as np

from timerl.ir.graph import Op
from timerl.schedule.program import Compute, Free, Loop, Schedule, rewrite
from timerl.symbolic import Dim


def _op(name: str) -> Op:
    return Op("const", (), (), np.dtype(np.float32), name=name)


def _tree():
    a, b, c, d = (_op(n) for n in "abcd")
    inner = Loop(Dim("t"), True, [Compute(b), Compute(c)])
    return Schedule([Compute(a), inner, Compute(d)]), (a, b, c, d), inner


def _names(body) -> list:
    return [
        [s.__class__.__name__, *_names(s.body)]
        if isinstance(s, Loop)
        else f"{s.__class__.__name__}({s.op.name})"
        for s in body
    ]


def test_each_statement_is_edited_at_its_position_inside_loops_too():
    sched, _, _ = _tree()
    seen = []
    rewrite(sched.body, lambda s, at: seen.append((at, _names([s])[0])))
    assert seen == [
        ((0,), "Compute(a)"),
        ((1,), ["Loop", "Compute(b)", "Compute(c)"]),
        ((1, 0), "Compute(b)"),
        ((1, 1), "Compute(c)"),
        ((2,), "Compute(d)"),
    ]


def test_statements_are_inserted_replaced_and_dropped_and_the_original_kept():
    sched, (a, b, c, d), inner = _tree()

    def edit(s, at):
        if at == (1, 0):
            return [s, Free(b)]  # after
        if at == (1, 1):
            return []  # dropped
        if at == (2,):
            return [Free(a), Compute(c)]  # before, and replaced
        return None

    out = rewrite(sched.body, edit)
    assert _names(out) == [
        "Compute(a)",
        ["Loop", "Compute(b)", "Free(b)"],
        "Free(a)",
        "Compute(c)",
    ]
    assert out[1] is not inner and out[1].dim is inner.dim
    assert _names(sched.body) == ["Compute(a)", ["Loop", "Compute(b)", "Compute(c)"], "Compute(d)"]


def test_a_loop_put_in_place_of_another_is_rewritten_at_that_position():
    sched, (a, b, c, d), inner = _tree()
    replacement = Loop(inner.dim, True, [Compute(d)])

    def edit(s, at):
        if s is inner:
            return [replacement]
        if at == (1, 0):
            return [s, Free(d)]
        return None

    out = rewrite(sched.body, edit)
    assert _names(out) == ["Compute(a)", ["Loop", "Compute(d)", "Free(d)"], "Compute(d)"]
    assert replacement.body == [replacement.body[0]]  # rebuilt, not edited in place
