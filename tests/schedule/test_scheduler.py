"""The loop-distribution scheduler on its own: how a read relates to its reader's point, and
the loops, directions and order it gives small programs."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as tl
from timerl.errors import CycleError
from timerl.schedule.program import Compute, Loop
from timerl.schedule.scheduler import (
    FUTURE,
    NONE,
    PAST,
    SAME,
    STRICT_FUTURE,
    STRICT_PAST,
    relation,
)
from timerl.symbolic import Slice


def _dim():
    ctx = tl.Context(dims=("t",))
    return ctx.dims[0], ctx.bounds[0]


def test_relation_of_points_and_slices_to_the_readers_point():
    t, T = _dim()
    assert relation(t, t) == SAME
    assert relation(t - 1, t) == STRICT_PAST
    assert relation(t + 2, t) == STRICT_FUTURE
    assert relation(Slice(t * 0, t + 1), t) == PAST  # 0:t+1 ends at t
    assert relation(Slice(t, T), t) == FUTURE  # t:T starts at t
    assert relation(Slice(t * 0, T), t) == NONE  # the whole range
    assert relation(T - 1 - t, t) == NONE  # a mirror: before at some points, after at others


def test_relation_narrowed_by_the_readers_guard():
    # x[t // 2] is the same point at t = 0, strictly earlier wherever t >= 1
    t, _ = _dim()
    assert relation(t // 2, t) != STRICT_PAST
    assert relation(t // 2, t, t >= 1) == STRICT_PAST


def _loops(body):
    return [s for s in body if isinstance(s, Loop)]


def _computed(loop: Loop) -> set[str]:
    return {s.op.label for s in loop.body if isinstance(s, Compute)}


def test_a_forward_and_a_backward_recurrence_get_loops_of_their_direction_in_order():
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        r = tl.from_numpy(np.arange(6.0), domain=(t,))
        x = tl.RecurrentTensor.placeholder((), domain=(t,), name="x")
        x[0] = tl.zeros(())
        x[t + 1] = x[t] * 0.5 + r[t]
        ret = tl.RecurrentTensor.placeholder((), domain=(t,), name="ret")
        ret[t.eq(T - 1)] = x[T - 1]
        ret[True] = x[t] + 0.9 * ret[t + 1]
    prog = ctx.compile(bounds={T: 6}, outputs=[ret])
    loops = _loops(prog.schedule.body)
    forward = next(k for k, lp in enumerate(loops) if "x" in _computed(lp))
    backward = next(k for k, lp in enumerate(loops) if "ret" in _computed(lp))
    assert loops[forward].forward and not loops[backward].forward
    # ret reads x[T - 1], the last point of x's loop: x's loop runs first, to completion
    assert forward < backward


def test_a_cycle_at_the_same_point_is_refused_naming_its_tensors():
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        a = tl.RecurrentTensor.placeholder((), domain=(t,), name="a")
        b = tl.RecurrentTensor.placeholder((), domain=(t,), name="b")
        a[True] = b[t] + 1.0
        b[True] = a[t] * 2.0
    with pytest.raises(CycleError, match=r"\ba\b.*\bb\b|\bb\b.*\ba\b"):
        ctx.compile(bounds={T: 4}, outputs=[b])


def test_a_lone_view_joins_the_one_component_that_reads_it_at_its_own_point():
    """Incrementalisation's block reads: a ``narrow`` of an outside value, computed in the
    loop of its reader, not in a loop of its own whose every point would be held."""
    import networkx as nx

    from timerl.ir.graph import Edge, Op
    from timerl.schedule.scheduler import _join_views

    t, T = _dim()
    f32 = np.dtype("float32")
    whole = Op("const", (), (T * 2,), f32, attrs={"value": None})
    view = Op("narrow", (t,), (2,), f32, [Edge(whole, ())], {"axis": 0, "start": t * 2})
    here = Op("tanh", (t,), (2,), f32, [Edge(view, (t,))])
    behind = Op("tanh", (t,), (2,), f32, [Edge(view, (t - 1,))])

    def joined(readers: list[Op]) -> bool:
        ops = [view, *readers]
        deps = [(r, e) for r in readers for e in r.inputs]
        graph = nx.DiGraph()
        graph.add_nodes_from(op.id for op in ops)
        graph.add_edges_from((e.src.id, r.id) for r, e in deps)
        comps = list(nx.strongly_connected_components(graph))
        added = _join_views(graph, comps, {op.id: op for op in ops}, deps)
        assert added == any(graph.has_edge(r.id, view.id) for r in readers)
        return added

    assert joined([here])
    assert not joined([behind])  # read at another point: it would make a carried cycle
    assert not joined([here, Op("exp", (t,), (2,), f32, [Edge(view, (t,))])])  # two readers


def _sink_program(shared_source: bool):
    """Per-``u`` frames scaled to float and read by a recurrence over ``u``, whose loop a
    whole-range read (a mean over all ``u``) splits from the first loop the scaling could join."""
    ctx = tl.Context(dims=("u",))
    (u,), (U,) = ctx.dims, ctx.bounds
    frames_np = np.arange(4 * 64, dtype=np.uint8).reshape(4, 64)
    with ctx:
        frames = tl.from_numpy(frames_np, domain=(u,))
        other = tl.from_numpy(np.arange(4.0), domain=(u,))
        scaled = frames[u].float() * (1 / 255)
        score = (frames[u].float().sum() if shared_source else other[u]) * 2.0
        mean = score[0:U].mean()
        w = tl.RecurrentTensor.placeholder((), domain=(u,), name="w")
        w[0] = tl.ones(())
        w[u + 1] = w[u] * 0.5 + (scaled * w[u]).sum() * 1e-3 - mean * 1e-3
    prog = ctx.compile(bounds={U: 4}, outputs=[w], optimize=False)
    scaled_np = frames_np.astype(np.float32) / 255
    score_np = (scaled_np.sum(1) * 255 if shared_source else np.arange(4.0)) * 2.0
    want = [1.0]
    for k in range(3):
        want.append(
            want[-1] * 0.5 + (scaled_np[k] * want[-1]).sum() * 1e-3 - score_np.mean() * 1e-3
        )
    return prog, w, np.array(want)


def _loop_of(prog, prim: str) -> int:
    loops = _loops(prog.schedule.body)
    return next(
        k
        for k, lp in enumerate(loops)
        if any(s.op.prim == prim for s in lp.body if isinstance(s, Compute))
    )


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_op_read_only_by_a_later_loop_is_computed_in_that_loop():
    """One point of the float frames live at a time, not all ``U`` of them (PPO's minibatch
    scaling, read by the update's convolution, held 441 MiB for Pong before)."""
    prog, w, want = _sink_program(shared_source=False)
    loops = _loops(prog.schedule.body)
    assert len(loops) == 2
    assert _loop_of(prog, "cast") == next(k for k, lp in enumerate(loops) if "w" in _computed(lp))
    np.testing.assert_allclose(prog.run().value(w), want, rtol=1e-5)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_op_stays_when_moving_it_would_hold_an_input_its_loop_still_reads():
    # the frames' point is read by the first loop's sum too: the scaling stays beside it
    prog, w, want = _sink_program(shared_source=True)
    loops = _loops(prog.schedule.body)
    assert any("w" in _computed(lp) for lp in loops)
    assert _loop_of(prog, "cast") != next(k for k, lp in enumerate(loops) if "w" in _computed(lp))
    np.testing.assert_allclose(prog.run().value(w), want, rtol=1e-5)
