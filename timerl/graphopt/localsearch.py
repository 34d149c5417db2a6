"""Peak-directed local search over orders, the move half of the learned search.

A single-device peak is set by one step (or a few equal ones): only buffers resident there
matter, and only two kinds of move can lower it. A node produced before the peak whose
readers all run after it can be *delayed* past the peak (its buffer leaves the peak step);
a node after the peak that is the last reader of a buffer resident there can be *advanced*
before it (the buffer is freed earlier). Each iteration draws the peak step, lists those
candidates, draws one (by ``node_weight`` when a policy gives one, else uniformly) and a
destination on the other side of the peak, within the node's dependence window; the move is
kept when the peak does not rise (equal moves walk plateaus), with ties broken by how many
steps sit at the peak. A share of moves (``explore``) is a random node moved anywhere in its
window, as the classical local search does.

Each evaluation is the exact step model's profile of the new order (one pass of numpy over
the buffers: no decode), so a move costs a tenth of a BRKGA decode on 1,000 nodes.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from timerl.graphopt.brkga import SearchResult
from timerl.graphopt.decoders import Problem, Solution


class _Windows:
    """Per node, the earliest and latest position it may take given its neighbours'."""

    def __init__(self, problem: Problem) -> None:
        g = problem.graph
        self.pred_ptr, self.pred_idx = g.pred_ptr, g.pred_idx
        self.succ_ptr, self.succ_idx = g.succ_ptr, g.succ_idx
        self.n = g.n

    def lo(self, pos: np.ndarray, v: int) -> int:
        a, b = self.pred_ptr[v], self.pred_ptr[v + 1]
        return int(pos[self.pred_idx[a:b]].max()) + 1 if b > a else 0

    def hi(self, pos: np.ndarray, v: int) -> int:
        a, b = self.succ_ptr[v], self.succ_ptr[v + 1]
        return int(pos[self.succ_idx[a:b]].min()) - 1 if b > a else self.n - 1


def _move(order: np.ndarray, pos: np.ndarray, i: int, j: int) -> None:
    """Move the node at position ``i`` to position ``j`` (others shift by one)."""
    v = order[i]
    if j > i:
        order[i:j] = order[i + 1 : j + 1]
    elif j < i:
        order[j + 1 : i + 1] = order[j:i].copy()
    order[j] = v
    a, b = min(i, j), max(i, j) + 1
    pos[order[a:b]] = np.arange(a, b)


def peak_local_search(
    problem: Problem,
    start: Solution,
    *,
    budget: int = 5000,
    seed: int = 0,
    node_weight: np.ndarray | None = None,
    explore: float = 0.2,
    segments: float = 0.0,
    method: str = "peak-local",
) -> SearchResult:
    """Local search on single-device peak memory from ``start`` for ``budget`` evaluations;
    see the module docstring. ``node_weight`` (positive, per node) biases which candidate
    moves; the result is never worse than ``start``.

    ``segments``: the share of peak-directed moves that move the candidate together with the
    run of nodes it ends (a delay) or starts (an advance) in the order, each the input
    (output) of the next: a whole chain crosses the peak at once, where moving its nodes one
    by one would first raise the peak."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    pm = problem.peak
    n = problem.n
    order = np.array(start.order, dtype=np.int64)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    win = _Windows(problem)
    weight = None if node_weight is None else np.asarray(node_weight, dtype=np.float64)
    producer = pm.buffers  # the node that allocates each buffer
    keep = pm.keep_to_end

    def score(p: np.ndarray) -> tuple[float, int]:
        top = p.max()
        return float(top), int(np.count_nonzero(p >= top - 0.5))

    alloc, last = pm.lifetimes(pos)
    prof = pm.profile_of(alloc, last)
    cur = score(prof)
    evals = 1
    history = [cur[0]]
    budget = max(int(budget), 1)
    tries = 0
    while evals < budget and n > 1 and tries < 50 * budget:
        tries += 1
        if rng.random() < explore:
            v = int(rng.integers(n)) if weight is None else _draw(rng, np.arange(n), weight)
            lo, hi = win.lo(pos, v), win.hi(pos, v)
            if hi <= lo:
                continue
            j = int(rng.integers(lo, hi))
            i = int(pos[v])
            j = j + 1 if j >= i else j
        else:
            peaks = np.flatnonzero(prof >= cur[0] - 0.5)
            t = int(peaks[int(rng.integers(peaks.size))])
            live = (alloc <= t) & (last >= t)
            early = producer[live & (alloc < t)]  # produced before the peak: delay
            late = ~keep & live & (last > t)
            ends = order[last[late]]  # last readers after the peak: advance
            cands = np.concatenate([early, ends])
            if cands.size == 0:
                continue
            v = (
                int(cands[int(rng.integers(cands.size))])
                if weight is None
                else _draw(rng, cands, weight)
            )
            i = int(pos[v])
            if segments and rng.random() < segments:
                span = _segment_move(order, pos, win, i, t)
                if span is None:
                    continue
                a2, l2 = pm.lifetimes(pos)
                p2 = pm.profile_of(a2, l2)
                new = score(p2)
                evals += 1
                if new <= cur:
                    if new[0] < cur[0]:
                        history.append(new[0])
                    cur, alloc, last, prof = new, a2, l2, p2
                else:
                    _rotate_back(order, pos, span)
                continue
            if i < t:
                hi = win.hi(pos, v)
                if hi <= t:
                    continue
                j = t if rng.random() < 0.5 else int(rng.integers(t, hi + 1))
                # moving down past the peak node: it shifts to t - 1, v lands after it
            else:
                lo = win.lo(pos, v)
                if lo > t:
                    continue
                j = t if rng.random() < 0.5 else int(rng.integers(lo, t + 1))
            if j == i:
                continue
        _move(order, pos, i, j)
        a2, l2 = pm.lifetimes(pos)
        p2 = pm.profile_of(a2, l2)
        new = score(p2)
        evals += 1
        if new <= cur:
            if new[0] < cur[0]:
                history.append(new[0])
            cur, alloc, last, prof = new, a2, l2, p2
        else:
            _move(order, pos, j, i)
    sol = problem.complete(order)
    value = float(np.rint(cur[0]))
    problem.evaluations += evals
    return SearchResult(sol, value, evals, method, time.perf_counter() - t0, history)


def _draw(rng: np.random.Generator, cands: np.ndarray, weight: np.ndarray) -> int:
    w = weight[cands]
    total = w.sum()
    if not total > 0:
        return int(cands[int(rng.integers(cands.size))])
    return int(cands[int(np.searchsorted(np.cumsum(w), rng.random() * total))])


def _segment_move(
    order: np.ndarray, pos: np.ndarray, win: _Windows, i: int, t: int
) -> tuple[int, int, int] | None:
    """Move the run of nodes ending at position ``i`` (before the peak ``t``: each node of
    the run an input of the next) to just after ``t``, or the run starting at ``i`` (after
    it: each an output of the previous) to just before ``t``; None when the run cannot
    cross (a node outside it reads it, or feeds it, on the way). Returns the rotation done
    ``(a, b, shift)``, for :func:`_rotate_back`."""
    g_pred = win.pred_ptr, win.pred_idx
    g_succ = win.succ_ptr, win.succ_idx

    def linked(u: int, w: int) -> bool:  # u is an input of w
        a, b = g_pred[0][w], g_pred[0][w + 1]
        return bool((g_pred[1][a:b] == u).any())

    def crosses(seg: list[int], ptr: np.ndarray, idx: np.ndarray, blocked: Any) -> bool:
        inside = set(seg)
        for u in seg:
            for w in idx[ptr[u] : ptr[u + 1]].tolist():
                if w not in inside and blocked(pos[w]):
                    return False
        return True

    if i < t:
        j = i
        while j > 0 and linked(int(order[j - 1]), int(order[j])):
            j -= 1
        # the longest run ending at i whose readers outside it all run after the peak
        while j < i and not crosses(order[j : i + 1].tolist(), *g_succ, lambda p: p <= t):
            j += 1
        if j == i:
            return None
        a_, b_, shift = j, t + 1, i + 1 - j  # rotate [j, t] left by the run's length
    else:
        j = i
        while j + 1 < len(order) and linked(int(order[j]), int(order[j + 1])):
            j += 1
        # the longest run starting at i whose inputs outside it all run before the peak
        while j > i and not crosses(order[i : j + 1].tolist(), *g_pred, lambda p: p >= t):
            j -= 1
        if j == i:
            return None
        a_, b_, shift = t, j + 1, i - t  # rotate [t, j] left by (i - t): the run first
    if shift <= 0 or shift >= b_ - a_:
        return None
    order[a_:b_] = np.roll(order[a_:b_], -shift)
    pos[order[a_:b_]] = np.arange(a_, b_)
    return a_, b_, shift


def _rotate_back(order: np.ndarray, pos: np.ndarray, span: tuple[int, int, int]) -> None:
    a, b, shift = span
    order[a:b] = np.roll(order[a:b], shift)
    pos[order[a:b]] = np.arange(a, b)
