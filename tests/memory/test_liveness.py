"""Liveness on its own: the window a read keeps alive, and where the frees of small programs
go (each point right after its last reader)."""

from __future__ import annotations

import numpy as np

import timerl as tl
from timerl.memory.liveness import window_lag
from timerl.schedule.program import Compute, Free, Loop
from timerl.symbolic import Slice


def test_window_lag_of_reads_behind_and_ahead():
    ctx = tl.Context(dims=("t",))
    t = ctx.dims[0]
    assert window_lag(t, t, forward=True, limit=64) == 0
    assert window_lag(t - 3, t, forward=True, limit=64) == 3
    assert window_lag(Slice(tl.max(t - 3, 0), t + 1), t, forward=True, limit=64) == 3
    assert window_lag(t + 1, t, forward=True, limit=64) is None  # ahead of a forward loop
    assert window_lag(t + 1, t, forward=False, limit=64) == 1  # behind a backward one
    assert window_lag(t - 100, t, forward=True, limit=64) is None  # past the limit
    assert window_lag(Slice(t * 0, t + 1), t, forward=True, limit=64) is None  # all of 0:t+1


def _statements(body, out=None):
    out = [] if out is None else out
    for s in body:
        out.append(s)
        if isinstance(s, Loop):
            _statements(s.body, out)
    return out


def _loop_of(body, label):
    for s in _statements(body):
        if isinstance(s, Loop) and any(
            isinstance(c, Compute) and c.op.label == label for c in s.body
        ):
            return s
    raise AssertionError(f"no loop computes {label}")


def test_a_point_read_one_step_later_is_freed_inside_the_loop():
    # h[t] is read at its own point only (h[t + 1] reads the tanh of t): each iteration frees
    # its point, but the last, which the product after the loop reads
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        u = tl.from_numpy(np.linspace(0.0, 1.0, 8), domain=(t,))
        h = tl.RecurrentTensor.placeholder((), domain=(t,), name="h")
        h[0] = tl.zeros(())
        h[t + 1] = (h[t] + u[t]).tanh()
        total = (h[T - 1] * 2.0).named("total")
    prog = ctx.compile(bounds={T: 8}, outputs=[total], optimize=False)
    loop = _loop_of(prog.schedule.body, "h")
    frees = [s for s in loop.body if isinstance(s, Free) and s.op.label == "h"]
    assert len(frees) == 1 and frees[0].pinned  # h[T - 1] is kept for its reader after the loop
    after = prog.schedule.body[prog.schedule.body.index(loop) + 1 :]
    reader = next(
        k for k, s in enumerate(after) if isinstance(s, Compute) and s.op.label == "total"
    )
    assert any(isinstance(s, Free) and s.op.label == "h" for s in after[reader + 1 :])


def test_a_tensor_read_whole_is_freed_once_after_its_last_reader():
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        u = tl.from_numpy(np.linspace(0.0, 1.0, 8), domain=(t,))
        y = (u * 3.0).named("y")
        total = y[0:T].sum(0) + y[0:T].max(0)
    prog = ctx.compile(bounds={T: 8}, outputs=[total], optimize=False)
    body = prog.schedule.body
    frees = [k for k, s in enumerate(body) if isinstance(s, Free) and s.op.label == "y"]
    readers = [
        k
        for k, s in enumerate(body)
        if isinstance(s, Compute) and any(e.src.label == "y" for e in s.op.inputs)
    ]
    assert len(frees) == 1 and len(readers) == 2 and frees[0] > max(readers)
    assert frees[0] == max(readers) + 1  # right after the last one, not at the end


def test_outputs_are_never_freed():
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        u = tl.from_numpy(np.linspace(0.0, 1.0, 8), domain=(t,))
        y = (u * 3.0).named("y")
        total = y[0:T].sum(0)
    prog = ctx.compile(bounds={T: 8}, outputs=[total, y], optimize=False)
    frees = [s for s in _statements(prog.schedule.body) if isinstance(s, Free)]
    assert not any(s.op.label == "y" for s in frees)
