import numpy as np
import pytest

from timerl.graphopt.baselines import (
    PORTFOLIO,
    best_of_portfolio,
    local_search,
    memory_greedy_order,
    postorder,
    program_baseline,
)
from timerl.graphopt.decoders import Problem
from timerl.graphopt.graph import Graph
from timerl.graphopt.perfmodel import Cluster, PeakMemory, validate_order
from timerl.graphopt.random_graph import random_graph


@pytest.mark.parametrize("seed", range(10))
def test_every_portfolio_order_is_topological(seed):
    g = random_graph(1 + seed * 7, seed=seed, view_prob=0.3)
    for fn in PORTFOLIO.values():
        validate_order(g, fn(g))


def test_best_of_portfolio_is_the_minimum_of_its_members():
    g = random_graph(60, seed=9)
    pm = PeakMemory(g)
    res = best_of_portfolio(Problem(g))
    assert res.value == min(pm.peak(fn(g)) for fn in PORTFOLIO.values())


def test_program_order_is_file_order():
    g = random_graph(30, seed=1)
    res = program_baseline(Problem(g))
    assert res.solution.order.tolist() == list(range(30))


def fan_graph():
    # two independent chains big a1 -> small output a2 and b1 -> b2, listed producers first:
    # program order holds both big buffers at once, a memory-aware order never does.
    nodes = [("a1", 100, False), ("b1", 100, False), ("a2", 1, True), ("b2", 1, True)]
    return Graph.from_json(
        {
            "name": "fan",
            "nodes": [
                {"id": i, "op": "x", "bytes": b, "cost": 1.0, "output": o} for i, b, o in nodes
            ],
            "edges": [["a1", "a2"], ["b1", "b2"]],
        }
    )


def test_memory_greedy_prefers_freeing_ops():
    g = fan_graph()
    pm = PeakMemory(g)
    assert pm.peak(np.array(g.program_order)) == 201
    order = memory_greedy_order(g)
    assert [g.nodes[v].id for v in order] == ["a1", "a2", "b1", "b2"]
    assert pm.peak(order) == 102  # b1 + both outputs


def test_postorder_runs_each_output_chain_to_completion():
    g = fan_graph()
    assert [g.nodes[v].id for v in postorder(g)] == ["a1", "a2", "b1", "b2"]


@pytest.mark.parametrize("seed", range(4))
def test_local_search_improves_or_keeps_and_stays_valid(seed):
    g = random_graph(60, seed=seed)
    p = Problem(g)
    start = program_baseline(p)
    res = local_search(p, start.solution, budget=500, seed=seed)
    validate_order(g, res.solution.order)
    assert res.value <= start.value
    assert res.value == PeakMemory(g).peak(res.solution.order)
    assert res.evaluations <= 500


def test_local_search_multi_device_moves():
    g = random_graph(30, seed=2)
    p = Problem(g, "runtime", Cluster.make(2, host=True))
    start = best_of_portfolio(p)
    res = local_search(p, start.solution, budget=300, seed=0)
    assert res.value <= start.value
    validate_order(g, res.solution.order)
