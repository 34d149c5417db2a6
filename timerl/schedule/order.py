"""Op order inside loop bodies, chosen by graphopt to lower each block's peak memory.

The scheduler emits a body's ops in dependence order, close to the order they were written:
a backward pass then computes every layer's local derivative (``1 - tanh^2``) right after the
forward pass and keeps it until the chain rule reaches it. Each block of consecutive compute
statements is a small DAG; graphopt's classical portfolio (memory-aware list scheduling, DFS,
post-order: what memory-aware compilers do by default) and, on larger blocks, a short BRKGA
search propose orders, and one is kept only when graphopt's exact single-device model says its
peak is lower than the written order's.

The model of a block: a node per op with its per-point output bytes at the compile bounds; an
edge for every read of another op of the block that comes earlier in it (reads of a later op
read an earlier point, computed in an earlier iteration), and a chain through the effect ops,
which must keep their order. Values read outside the block, at another point, or kept for the
user are outputs (alive to the end of the block).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from timerl.graphopt.baselines import best_of_portfolio
from timerl.graphopt.brkga import brkga
from timerl.graphopt.decoders import Problem
from timerl.graphopt.graph import Graph, Node
from timerl.ir.graph import Op
from timerl.schedule.program import Compute, Loop, Schedule, Stmt
from timerl.symbolic import Bound, Expr

MIN_BLOCK = 4  # fewer ops leave nothing to reorder
# Blocks this large also get a short BRKGA run seeded with the written and the classical
# orders (never worse than either). 300 decodes cost ~0.3 s of PPO's compile and lower its
# peak by a fifth; the learned policy is what would make longer searches pay.
SEARCH_FROM = 12
SEARCH_BUDGET = 300


def order_blocks(
    sched: Schedule, ops: list[Op], bounds: Mapping[Bound, int], keep: set[int]
) -> tuple[Schedule, int]:
    """The schedule with each block reordered where that lowers its peak; and how many were."""
    where: dict[int, int] = {}  # op id -> id of the block holding it
    blocks: list[list[Op]] = []
    _collect(sched.body, blocks)
    for b, block in enumerate(blocks):
        for op in block:
            where[op.id] = b
    outside: dict[int, bool] = {op.id: op.id in keep for op in ops}
    for op in ops:
        for e in op.inputs:
            src = e.src.id
            same_point = all(i is d for i, d in zip(e.index, e.src.domain, strict=False))
            if where.get(op.id) != where.get(src) or not same_point or op.domain != e.src.domain:
                outside[src] = True
    env: dict = dict(bounds)
    for op in ops:
        for d in op.domain:
            env.setdefault(d, max(bounds.get(d.bound, 1) - 1, 0))
    new_order: dict[int, list[Op]] = {}
    for b, block in enumerate(blocks):
        if len(block) >= MIN_BLOCK:
            better = _reorder(block, outside, env)
            if better is not None:
                new_order[b] = better
    if not new_order:
        return sched, 0
    queue = {b: list(order) for b, order in new_order.items()}
    body = _rebuild(sched.body, where, queue)
    return Schedule(body), len(new_order)


def _collect(body: list[Stmt], blocks: list[list[Op]]) -> None:
    run: list[Op] = []
    for s in body:
        if isinstance(s, Compute):
            run.append(s.op)
            continue
        if run:
            blocks.append(run)
            run = []
        if isinstance(s, Loop):
            _collect(s.body, blocks)
    if run:
        blocks.append(run)


def _nbytes(op: Op, env: Mapping) -> int:
    size = np.dtype(op.dtype).itemsize
    for n in op.shape:
        try:
            size *= max(int(n.evaluate(env)) if isinstance(n, Expr) else int(n), 0)
        except (KeyError, TypeError, ValueError):
            return np.dtype(op.dtype).itemsize  # a shape only known while running
    return size


def _reorder(block: list[Op], outside: Mapping[int, bool], env: Mapping) -> list[Op] | None:
    pos = {op.id: k for k, op in enumerate(block)}
    nodes = [
        Node(id=str(op.id), op=op.prim, bytes=_nbytes(op, env), cost=0.0, output=outside[op.id])
        for op in block
    ]
    edges = set()
    last_effect: Op | None = None
    for op in block:
        for e in op.inputs:
            k = pos.get(e.src.id)
            if k is not None and k < pos[op.id]:
                edges.add((str(e.src.id), str(op.id)))
        if op.effect or op.prim == "udf":
            if last_effect is not None:
                edges.add((str(last_effect.id), str(op.id)))
            last_effect = op
    problem = Problem(Graph("block", nodes, sorted(edges)))
    given = problem.complete(np.arange(len(block), dtype=np.int64))
    best = best_of_portfolio(problem).solution
    if len(block) >= SEARCH_FROM:
        best = brkga(problem, budget=SEARCH_BUDGET, seeds=[given, best], seed=0).solution
    if problem.evaluate(best) >= problem.evaluate(given):
        return None
    return [block[k] for k in best.order.tolist()]


def _rebuild(body: list[Stmt], where: Mapping[int, int], queue: dict[int, list[Op]]) -> list[Stmt]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Compute) and where.get(s.op.id) in queue:
            out.append(Compute(queue[where[s.op.id]].pop(0)))
        elif isinstance(s, Loop):
            out.append(Loop(s.dim, s.forward, _rebuild(s.body, where, queue), s.until))
        else:
            out.append(s)
    return out


__all__ = ["order_blocks"]
