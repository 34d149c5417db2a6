"""An input whose last row is never read: a warning naming it, and nothing else."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import timerl as tl
from timerl.compiler.unread import UnreadRowWarning

ROWS = 20


def _recurrence(read_next: bool):
    """``h[t + 1] = tanh(h[t] @ u + x[t] @ w)`` over a 20-row ``x`` (19 steps, ``x[19]``
    unread), or the version that reads every row."""
    rng = np.random.default_rng(0)
    ctx = tl.Context(dims=("t",))
    (t,), _ = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_numpy(rng.standard_normal((ROWS, 3)), domain=(t,), name="x")
        w = tl.from_numpy(rng.standard_normal((3, 4)), requires_grad=True, name="w")
        u = tl.from_numpy(rng.standard_normal((4, 4)) * 0.3, requires_grad=True, name="u")
        h = tl.RecurrentTensor.placeholder((4,), domain=(t,), name="h")
        if read_next:
            h[0] = (x[0] @ w).tanh()
            h[t + 1] = (h[t] @ u + x[t + 1] @ w).tanh()
        else:
            h[0] = tl.zeros((4,))
            h[t + 1] = (h[t] @ u + x[t] @ w).tanh()
    return ctx, h


def test_a_recurrence_one_row_short_warns_naming_the_input_and_explain_says_it():
    ctx, h = _recurrence(read_next=False)
    with pytest.warns(UnreadRowWarning) as caught:
        prog = ctx.compile(outputs=[h])
    assert len(caught) == 1
    text = str(caught[0].message)
    assert text.startswith("input x (from_numpy at ") and "test_unread.py:" in text
    assert "its last row along t (t = 19, of the 20 given) is never read" in text
    assert "makes 19 steps" in text
    assert caught[0].filename == __file__  # the user's compile line, not timerl's
    assert "its last row along t" in prog.explain()


def test_reading_every_row_says_nothing():
    ctx, h = _recurrence(read_next=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prog = ctx.compile(outputs=[h])
    assert "never read" not in prog.explain()


def test_fewer_rows_read_on_purpose_say_nothing():
    """Reads that skip rows at both ends, or read a slice, or read an input not given with
    from_numpy, are not the off-by-one this looks for."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_numpy(np.arange(10.0), domain=(t,), name="x")
        head = x[0 : T - 1].sum(0)  # a slice: every row counts as read
        middle = tl.RecurrentTensor.placeholder((), domain=(t,), name="m")
        middle[t.eq(0) | t.eq(T - 1)] = tl.zeros(())
        middle[True] = x[t]  # reads rows 1 .. T - 2: neither end
        y = tl.RecurrentTensor.placeholder((), domain=(t,), name="y")
        y[0] = tl.zeros(())
        y[t + 1] = y[t] + 1.0  # no input at all
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tl.evaluate([head, middle, y])


def test_one_warning_per_input_and_dim_however_often_it_is_read():
    ctx = tl.Context(dims=("i", "t"))
    (i, t), _ = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_numpy(np.ones((3, 5)), domain=(i, t), name="x")
        a = tl.RecurrentTensor.placeholder((), domain=(i, t), name="a")
        a[i, 0] = tl.zeros(())
        a[i, t + 1] = a[i, t] + x[i, t] * 2.0 + x[i, t] ** 2.0
    with pytest.warns(UnreadRowWarning) as caught:
        tl.evaluate(a)
    assert len(caught) == 1 and "along t (t = 4, of the 5 given)" in str(caught[0].message)
