"""The compiler orders loop-body blocks with the learned policy, through the one translator of
``timerl.schedule.to_graph``; without usable weights it falls back to uniform BRKGA."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import timerl as tl
import timerl.compiler.order as order
import timerl.graphopt.learned as learned
from timerl.graphopt.policy import PolicyWeights

# These programs are small loop bodies over t that vectorisation would batch into one op each
# (no loop left to order): keep them point by point to test the op order itself.
POINT_BY_POINT = tl.CompileOptions(vectorize=False)


def _compile():
    u = np.random.RandomState(0).randn(4, 3000)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_numpy(u, domain=(t,), dtype="float64")
        big = [(x * float(k + 1)).tanh() for k in range(5)]  # all written before any sum
        total = big[0].sum() + big[1].sum() + big[2].sum() + big[3].sum() + big[4].sum()
    prog = ctx.compile(bounds={T: 4}, outputs=[total], backend="numpy", options=POINT_BY_POINT)
    prog.run()
    want = sum(np.tanh(u * (k + 1)).sum(axis=1) for k in range(5))
    return prog, np.asarray(prog.value(total)), want


def _spy(monkeypatch):
    monkeypatch.setattr(order, "SEARCH_FROM", 12)  # the test's block is small: search it
    used = []
    real = order._reorder

    def spy(graph, policy):
        used.append(policy)
        return real(graph, policy)

    monkeypatch.setattr(order, "_reorder", spy)
    return used


def test_blocks_are_searched_with_the_shipped_policy(monkeypatch):
    used = _spy(monkeypatch)
    prog, got, want = _compile()
    assert used and all(isinstance(p, PolicyWeights) and p.meta["trained"] for p in used)
    assert any("reordered" in n for n in prog.report.notes)
    np.testing.assert_allclose(got, want, rtol=1e-10)


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_unusable_weights_fall_back_to_uniform_search(monkeypatch, tmp_path, damage):
    path = tmp_path / "policy.npz"
    if damage == "truncated":
        PolicyWeights.random(hidden=8, rounds=1).save(path)
        path.write_bytes(path.read_bytes()[:100])
    monkeypatch.setattr(learned, "SHIPPED", path)
    used = _spy(monkeypatch)
    prog, got, want = _compile()
    assert used and all(p is None for p in used)
    assert any("reordered" in n for n in prog.report.notes)
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_compiling_needs_no_torch(monkeypatch):
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails
    with pytest.raises(ImportError):
        import torch  # noqa: F401
    used = _spy(monkeypatch)
    prog, got, want = _compile()
    assert used and all(isinstance(p, PolicyWeights) for p in used)
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_a_block_whose_written_order_meets_the_lower_bound_is_not_searched(monkeypatch):
    """No order beats the dependence lower bound: reaching it, the compiler keeps the
    written order without the search's decodes."""
    monkeypatch.setattr(order, "SEARCH_FROM", 12)
    sizes: list[int] = []
    real = order._reorder

    def spy(graph, policy):
        sizes.append(len(graph.nodes))
        return real(graph, policy)

    def no_search(*args, **kwargs):
        raise AssertionError("searched a block whose written order is optimal")

    monkeypatch.setattr(order, "_reorder", spy)
    monkeypatch.setattr(learned, "learned_search", no_search)
    monkeypatch.setattr(order, "brkga", no_search)
    u = np.random.RandomState(0).randn(4, 3000)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        y = tl.from_numpy(u, domain=(t,), dtype="float64")
        for k in range(8):  # a chain: each value's only reader is the next op
            y = (y * float(k + 1)).tanh()
        total = y.sum()
    prog = ctx.compile(bounds={T: 4}, outputs=[total], backend="numpy", options=POINT_BY_POINT)
    prog.run()
    assert sizes and max(sizes) >= 12  # a block large enough to search was looked at
    assert not any("reordered" in n for n in prog.report.notes)
    want = u
    for k in range(8):
        want = np.tanh(want * (k + 1))
    np.testing.assert_allclose(np.asarray(prog.value(total)), want.sum(axis=1), rtol=1e-10)
