"""Op order inside loop bodies, chosen by graphopt to lower each block's peak memory.

The scheduler emits a body's ops in dependence order, close to the order they were written:
a backward pass then computes every layer's local derivative (``1 - tanh^2``) right after the
forward pass and keeps it until the chain rule reaches it. Each block of consecutive compute
statements of a loop body is a static region; ``to_graph`` translates it into a graphopt graph
(the same model the graph corpus uses, with views and costs), in its strict form: every read
of an earlier op of the block keeps its place after that op, whatever point it reads, and
side effects keep their order; values from outside the block count only when a slice read
stacks them into a fresh buffer.

graphopt's classical portfolio (memory-aware list scheduling, DFS, post-order) proposes
orders; on blocks of ``SEARCH_FROM`` graph nodes or more, BRKGA steered by the shipped graph
policy (``timerl.graphopt.learned``) searches from them for ``SEARCH_BUDGET`` decodes, unless
one of them already meets the block's dependence lower bound (``graphopt.exact``): no order
can beat it, and the search would only cost compile time (PPO's first update block, about 100
nodes: 50 to 70 ms per compile on CartPole-v1 and on images alike); and it stops early once it
stops improving (``SEARCH_PATIENCE``). An
order is kept only when graphopt's exact single-device model says its peak is lower than the written
order's. Without usable policy weights (a broken install) the search runs with uniform
proposals, as it did before the policy existed; the policy runs in numpy, so torch is never
needed here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from timerl.errors import TimerlError
from timerl.graphopt.baselines import best_of_portfolio, portfolio_solutions
from timerl.graphopt.brkga import brkga
from timerl.graphopt.decoders import Problem, Solution
from timerl.graphopt.exact import peak_lower_bound
from timerl.graphopt.graph import Graph
from timerl.graphopt.policy import PolicyWeights
from timerl.ir.graph import Op, consumers
from timerl.memory.liveness import add_frees
from timerl.schedule.program import Compute, Position, Schedule, Stmt, rewrite
from timerl.schedule.to_graph import block_graph, loop_blocks
from timerl.symbolic import Bound

MIN_BLOCK = 4  # fewer ops leave nothing to reorder
# Blocks of this many graph nodes also get a short BRKGA run, seeded with the written and the
# classical orders (never worse than either) and steered by the policy. Smaller blocks of the
# corpus's timerl family are solved by the portfolio already (their optimum is proven), so
# searching them only costs compile time.
SEARCH_FROM = 64
SEARCH_BUDGET = 300
# ... and stops after this many generations (16 decodes each) in a row found no lower peak: on
# PPO's update bodies (CartPole-v1, Pendulum-v1, images) the search improves on its seeds by
# the 8th generation or never (the 400-node backward never did: 300 decodes, 85 ms a compile,
# for nothing)
SEARCH_PATIENCE = 10


def order_blocks(
    sched: Schedule,
    ops: list[Op],
    bounds: Mapping[Bound, int],
    keep: set[int],
    state_on_disk: bool = False,
) -> tuple[Schedule, int]:
    """The schedule with each block reordered where that lowers its peak; and how many were.
    ``state_on_disk``: model carried state as swapped between updates (``to_graph``)."""
    # the blocks as the memory statements will cut them: a value computed earlier and freed
    # in a block is held there from its start (``to_graph``); reordering inside blocks moves
    # no free to another block
    blocks = loop_blocks(add_frees(sched, ops, keep).body)
    readers = consumers(ops)
    where: dict[int, int] = {}  # op id -> index of the block holding it
    for b, block in enumerate(blocks):
        for op in block.ops:
            where[op.id] = b
    policy = _policy()
    new_order: dict[int, list[Op]] = {}
    for b, block in enumerate(blocks):
        if len(block.ops) >= MIN_BLOCK:
            graph, op_of = block_graph(
                block,
                bounds,
                readers,
                keep,
                strict_reads=True,
                resident_inputs=True,
                state_on_disk=state_on_disk,
            )
            better = _reorder(graph, policy)
            if better is not None:
                ids = graph.ids
                new_order[b] = [op_of[ids[v]] for v in better.tolist() if ids[v] in op_of]
    if not new_order:
        return sched, 0

    def place(s: Stmt, _at: Position) -> list[Stmt] | None:
        # a block's compute statements take its new order, each in the next slot it had
        if isinstance(s, Compute) and where.get(s.op.id) in new_order:
            return [Compute(new_order[where[s.op.id]].pop(0))]
        return None

    return Schedule(rewrite(sched.body, place)), len(new_order)


def _policy() -> PolicyWeights | None:
    """The shipped policy, or None when its file is missing or unusable (search unsteered)."""
    from timerl.graphopt.learned import load_policy

    try:
        return load_policy()
    except TimerlError:
        return None


def _reorder(graph: Graph, policy: PolicyWeights | None) -> np.ndarray | None:
    """A node order of lower peak than the written one, or None."""
    problem = Problem(graph)
    given = problem.complete(np.array(graph.program_order, dtype=np.int64))
    if len(graph.nodes) < SEARCH_FROM:
        best = best_of_portfolio(problem).solution
    else:
        seeds = {"written": given, **portfolio_solutions(problem)}
        best = min(seeds.values(), key=problem.evaluate)  # the written order on a tie
        if problem.evaluate(best) > peak_lower_bound(graph):  # else no order beats it
            best = _search(problem, policy, seeds)
    if problem.evaluate(best) >= problem.evaluate(given):
        return None
    return best.order


def _search(problem: Problem, policy: PolicyWeights | None, seeds: dict) -> Solution:
    budget, patience = SEARCH_BUDGET, SEARCH_PATIENCE
    if policy is None:
        found = brkga(problem, budget=budget, seeds=list(seeds.values()), patience=patience)
        return found.solution
    from timerl.graphopt.learned import learned_search

    return learned_search(problem, policy, budget=budget, seeds=seeds, patience=patience).solution


__all__ = ["order_blocks"]
