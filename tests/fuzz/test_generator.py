"""The generator and its reference: shifted frames and branches past a bound mean what the
guide says, point by point, and every generated program is valid (the reference evaluates
it without reading outside a domain)."""

from __future__ import annotations

import collections
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402, F401 (hands the reference timerl's noise)
from exprs import Affine, Binary, Const, Read, Spec  # noqa: E402
from generator import FLAGS, RandomChooser, generate  # noqa: E402
from programs import Cond, Program, TensorDef, Write  # noqa: E402


def _over_t(n: int, rows: np.ndarray, *tensors: TensorDef) -> tuple[Program, TensorDef]:
    u = TensorDef("u0", ("t",), (), array=rows[:n])
    for t in tensors:
        for _, e in t.branches:
            for node in _reads(e):
                if node.src.name == "u0":
                    node.src = u
    return Program(("t",), {"t": n}, [u, *tensors]), u


def _reads(e):
    from exprs import nodes

    return [node for node in nodes(e) if isinstance(node, Read)]


ROWS = np.array([0.3, -0.2, 0.7, 0.1, -0.5])


def test_a_backward_frame_reads_the_later_point():
    """``r[T - 1] = u; r[t - 1] = u + 0.5 * r``: point p is ``u[p + 1] + 0.5 * r[p + 1]``
    (the right side at t = p + 1; bare ``r`` is ``r[t]``)."""
    r = TensorDef("r1", ("t",), (), construct="frame")
    u = TensorDef("u0", ("t",), ())
    r.branches = [
        (Write((Spec("last"),)), Read(u, (Spec("cur"),))),
        (
            Write((Spec("shift", -1),)),
            Binary(
                "add", Read(u, (Spec("cur"),)), Affine(Read(r, (Spec("cur"),), bare=True), 0.5, 0.0)
            ),
        ),
    ]
    program, u = _over_t(4, ROWS, r)
    want = np.zeros(4)
    want[3] = ROWS[3]
    for p in range(2, -1, -1):
        want[p] = ROWS[p + 1] + 0.5 * want[p + 1]
    np.testing.assert_allclose(program.reference_values()["r1"], want, rtol=1e-12)
    source = program.source()
    assert "r1[T - 1] = u0[t]" in source and "r1[t - 1] = (u0[t]) + ((r1) * 0.5 + 0.0)" in source


def test_a_two_step_backward_frame_has_its_bases_at_the_end():
    """``r[T - 1] = 1; r[T - 2] = 2; r[t - 2] = r + r[t - 1]``; with ``T = 1`` the base at
    ``T - 2`` is no point."""
    r = TensorDef("r1", ("t",), (), construct="frame")
    r.branches = [
        (Write((Spec("last", 0),)), Const(1.0)),
        (Write((Spec("last", 1),)), Const(2.0)),
        (
            Write((Spec("shift", -2),)),
            Binary("add", Read(r, (Spec("cur"),)), Read(r, (Spec("shift", -1),))),
        ),
    ]
    program, _ = _over_t(5, ROWS, r)
    np.testing.assert_allclose(program.reference_values()["r1"], [8.0, 5.0, 3.0, 2.0, 1.0])
    assert "r1[T - 2] = 2.0" in program.source()
    program, _ = _over_t(1, ROWS, r)
    np.testing.assert_allclose(program.reference_values()["r1"], [1.0])


def test_a_branch_past_the_bound_applies_to_no_point():
    """``p[2] = u[0:t + 1].sum(0); p[True] = 0.25``: with ``T = 2`` every point is 0.25 (the
    first branch reads nothing); with ``T = 3`` point 2 is ``u[0] + u[1] + u[2]``."""
    u = TensorDef("u0", ("t",), ())
    p = TensorDef("p1", ("t",), (), construct="piecewise")
    p.branches = [
        (Write((Spec("const", 2),)), Read(u, (Spec("prefix"),))),
        (Cond("true"), Const(0.25)),
    ]
    program, _ = _over_t(2, ROWS, p)
    np.testing.assert_allclose(program.reference_values()["p1"], [0.25, 0.25])
    program, _ = _over_t(3, ROWS, p)
    np.testing.assert_allclose(program.reference_values()["p1"], [0.25, 0.25, ROWS[:3].sum()])


# what the generator must draw to find the classes it missed (each a flag it reports as used)
NEW = {
    "frame",
    "chain",
    "empty_branch",
    "bound_one",
    "at_point",
    "whole_base",
    "constant",
    "bare",
    "scalar_input",
    "spread",
    "broadcast",
    "before",
    "conv",
    "cell",
}


def test_generated_programs_are_valid_and_draw_every_construct():
    """The reference evaluates every point of 300 programs (gradients of a third) without
    reading outside a domain, and the programs use every construct; most have a bound of 1 or
    2, and a few (small bounds) hold a branch that applies to no point."""
    used: collections.Counter = collections.Counter()
    small = 0
    for k in range(300):
        ch = RandomChooser(k)
        program = generate(ch, frozenset(FLAGS), grad=k % 3 == 0, max_stages=3)
        program.reference_values()
        if program.grad:
            program.reference_grads()
        used.update(program.used)
        small += min(program.n.values()) <= 2
    assert set(used) >= NEW, NEW - set(used)
    assert small > 150 and used["empty_branch"] > 10, (small, used)


# constructs whose programs timerl computes (the printed source is what is checked)
FRAMED = frozenset({"spatial", "frame", "bare", "constant", "before", "at_point", "full"})


@pytest.mark.parametrize("seed", range(3))
def test_printed_reproducer_of_a_framed_program(seed):
    """The printed source of a program in shifted frames gives the reference's values."""
    program = generate(RandomChooser(100 + seed), FRAMED, max_stages=2, two=False)
    source = program.source().replace("print(tl.evaluate(", "result = (tl.evaluate(")
    scope: dict = {}
    exec(compile(source, "<reproducer>", "exec"), scope)
    want = program.reference_values()
    for t, got in zip(program.outputs, scope["result"], strict=True):
        np.testing.assert_allclose(got, want[t.name], rtol=1e-7, atol=1e-9)
