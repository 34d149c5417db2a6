"""Exact minimum peak memory on one device with CP-SAT: the headroom yardstick.

Model: a position per node (all different, edges ordered); per buffer a last-use variable
``L[b] >= pos[u]`` for every user ``u`` (exactly the last use at an optimum, since larger only
costs memory) and an interval ``[pos[b], L[b] + 1)`` of demand ``bytes[b]``; one cumulative
constraint whose capacity is the peak. This is the step model exactly: buffer ``b`` is resident
at step ``s`` iff ``pos[b] <= s <= L[b]``. The best portfolio order is the hint and the upper
bound, so the solver is anytime: with a time limit it returns its best order and bound.
"""

from __future__ import annotations

import time

import numpy as np

from timerl.graphopt.baselines import best_of_portfolio
from timerl.graphopt.brkga import SearchResult
from timerl.graphopt.decoders import Problem, Solution
from timerl.graphopt.graph import Graph
from timerl.graphopt.perfmodel import PeakMemory


def peak_lower_bound(graph: Graph) -> int:
    """A bound no order can beat, from dependences alone (no solver).

    Buffer ``b`` is resident at the step of node ``v`` in *every* order when ``v`` is ``b``'s
    producer or a descendant of it, and some user of ``b`` (or of a view of it) is ``v`` or a
    descendant of ``v`` (or ``b`` is kept as an output). The bound is the largest total of
    such forced bytes at any node. Ancestor/descendant sets are Python-int bitsets.
    """
    n = graph.n
    if n == 0:
        return 0
    anc = [0] * n
    for v in graph.program_order:
        a = 1 << v
        for u in graph.preds[v]:
            a |= anc[u]
        anc[v] = a
    desc = [0] * n
    for v in reversed(graph.program_order):
        d = 1 << v
        for w in graph.succs[v]:
            d |= desc[w]
        desc[v] = d
    pm = PeakMemory(graph)
    users = np.split(pm.users, pm.starts[1:]) if pm.buffers.size else []
    total = np.zeros(n)
    width = (n + 7) // 8
    for slot, b in enumerate(pm.buffers.tolist()):
        if pm.keep_to_end[slot]:
            forced = desc[b]
        else:
            reach = 0
            for u in users[slot].tolist():
                reach |= anc[u]
            forced = desc[b] & reach
        bits = np.frombuffer(forced.to_bytes(width, "little"), dtype=np.uint8)
        total += np.unpackbits(bits, bitorder="little")[:n] * float(graph.nbytes[b])
    return int(round(total.max()))


def exact_peak_memory(
    problem: Problem,
    *,
    time_limit: float = 10.0,
    workers: int = 2,
    start: Solution | None = None,
    seed: int = 0,
) -> SearchResult:
    """Minimum-peak order (``bound`` = proven lower bound; equal to ``value`` when optimal)."""
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    g = problem.graph
    n = g.n
    pm: PeakMemory = problem.peak
    if start is None:
        start = best_of_portfolio(problem).solution
    start_val = pm.peak(start.order)
    if n == 0 or pm.buffers.size == 0:
        return SearchResult(start, float(start_val), 0, "exact", 0.0, [start_val], start_val)
    m = cp_model.CpModel()
    pos = [m.new_int_var(0, n - 1, f"p{v}") for v in range(n)]
    m.add_all_different(pos)
    for s, d in g.edges.tolist():
        m.add(pos[s] < pos[d])
    spos = np.empty(n, dtype=np.int64)
    spos[start.order] = np.arange(n)
    for v in range(n):
        m.add_hint(pos[v], int(spos[v]))
    intervals, demands = [], []
    users_of = np.split(pm.users, pm.starts[1:])
    for slot, b in enumerate(pm.buffers.tolist()):
        if pm.keep_to_end[slot]:
            last = m.new_constant(n - 1)
        else:
            last = m.new_int_var(0, n - 1, f"L{b}")
            for u in users_of[slot].tolist():
                m.add(last >= pos[u])
        size = m.new_int_var(1, n, f"s{b}")
        end = m.new_int_var(1, n, f"e{b}")
        m.add(end == last + 1)
        intervals.append(m.new_interval_var(pos[b], size, end, f"i{b}"))
        demands.append(int(g.nbytes[b]))
    lower = peak_lower_bound(g)
    peak = m.new_int_var(lower, max(start_val, lower), "peak")
    m.add_cumulative(intervals, demands, peak)
    m.minimize(peak)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = int(workers)
    solver.parameters.random_seed = int(seed)
    status = solver.solve(m)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        order = np.argsort([solver.value(p) for p in pos], kind="stable").astype(np.int64)
        value = pm.peak(order)
        if value > start_val:  # cannot happen (upper bound), but never return worse
            order, value = start.order, start_val
        bound = value if status == cp_model.OPTIMAL else int(solver.best_objective_bound)
    else:
        order, value, bound = start.order, start_val, lower
    problem.evaluations += 1
    return SearchResult(
        Solution(order),
        float(value),
        1,
        "exact",
        time.perf_counter() - t0,
        [float(value)],
        float(bound),
    )
