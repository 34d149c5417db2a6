"""The post-order decoder, the decoder gene, the peak-directed local search and the learned
search built from them: every schedule valid, values exact, never worse than where they
start, each budget spent exactly."""

import itertools

import numpy as np
import pytest

from timerl.errors import GraphError
from timerl.graphopt.baselines import best_of_portfolio, portfolio_solutions
from timerl.graphopt.decoders import Problem, decode_order, decode_postorder, order_keys
from timerl.graphopt.graph import Graph, Node
from timerl.graphopt.learned import learned_search
from timerl.graphopt.localsearch import peak_local_search
from timerl.graphopt.perfmodel import PeakMemory, peak_memory_reference, validate_order
from timerl.graphopt.policy import OUTPUTS, PolicyWeights, proposal
from timerl.graphopt.random_graph import random_graph


def _two_chains() -> Graph:
    """x feeds chains a (big inside, small end) and b (small inside, big end), joined by y.
    Memory-optimal: a's chain to its end first, then b's (the small end is held)."""
    nodes = [
        Node("x", "input", 10, 0.0),
        Node("a1", "op", 100, 1e-6),
        Node("a2", "op", 1, 1e-6),
        Node("b1", "op", 5, 1e-6),
        Node("b2", "op", 50, 1e-6),
        Node("y", "add", 1, 1e-6, output=True),
    ]
    edges = [("x", "a1"), ("a1", "a2"), ("x", "b1"), ("b1", "b2"), ("a2", "y"), ("b2", "y")]
    return Graph("two-chains", nodes, edges)


def test_postorder_runs_the_higher_priority_subtree_to_its_end_first():
    g = _two_chains()
    ix = g.index
    keys = np.zeros(g.n)
    keys[ix["a2"]] = 1.0  # among y's inputs, a2's subtree first
    order = [g.ids[v] for v in decode_postorder(g, keys).tolist()]
    assert order == ["x", "a1", "a2", "b1", "b2", "y"]
    keys[ix["b2"]] = 2.0
    order = [g.ids[v] for v in decode_postorder(g, keys).tolist()]
    assert order == ["x", "b1", "b2", "a1", "a2", "y"]


@pytest.mark.parametrize("seed", range(6))
def test_postorder_decodes_every_key_vector_to_a_topological_order(seed):
    g = random_graph(120, seed)
    keys = np.random.default_rng(seed).random(g.n)
    order = decode_postorder(g, keys)
    validate_order(g, order)  # raises unless a topological permutation


def test_postorder_reaches_orders_list_scheduling_reaches_only_with_many_keys():
    """Over every key order of the two-chain graph, the post-order decoder's best peak equals
    the optimum, and so does list scheduling's: both decoders can express it."""
    g = _two_chains()
    best = min(
        peak_memory_reference(g, list(p))
        for p in itertools.permutations(range(g.n))
        if _topological(g, p)
    )
    pm = PeakMemory(g)
    rng = np.random.default_rng(0)
    keys = rng.random((200, g.n))
    assert min(pm.peak(decode_postorder(g, k)) for k in keys) == best
    assert min(pm.peak(decode_order(g, k)) for k in keys) == best


def _topological(g: Graph, perm: tuple[int, ...]) -> bool:
    pos = {v: i for i, v in enumerate(perm)}
    return all(pos[int(s)] < pos[int(d)] for s, d in g.edges)


def test_decoder_gene_picks_the_decoder_and_encodes_any_schedule_exactly():
    g = random_graph(80, 2)
    p = Problem(g)
    mixed = p.with_decoder_gene()
    assert mixed.num_keys == p.num_keys + 1 and p.decoder_gene is False
    keys = np.random.default_rng(1).random(mixed.num_keys)
    keys[-1] = 0.9
    assert np.array_equal(mixed.decode(keys).order, decode_postorder(g, keys[:-1]))
    keys[-1] = 0.1
    assert np.array_equal(mixed.decode(keys).order, decode_order(g, keys[:-1]))
    for sol in portfolio_solutions(p).values():
        assert np.array_equal(mixed.decode(mixed.encode(sol)).order, sol.order)


def test_a_fixed_decoder_decodes_every_chromosome_its_way():
    g = random_graph(80, 3)
    p = Problem(g)
    post = p.with_decoder("postorder")
    assert post.num_keys == p.num_keys and not post.decoder_gene
    keys = np.random.default_rng(2).random(p.num_keys)
    assert np.array_equal(post.decode(keys).order, decode_postorder(g, keys))
    assert np.array_equal(p.with_decoder("list").decode(keys).order, decode_order(g, keys))
    # from a gene problem back to a fixed decoder: the gene key goes again
    assert p.with_decoder_gene().with_decoder("list").num_keys == p.num_keys
    with pytest.raises(GraphError, match="unknown decoder 'greedy'"):
        p.with_decoder("greedy")


def test_proposal_adds_the_decoder_gene_last():
    action = np.zeros((5, OUTPUTS))
    a, b, bias = proposal(action, 1, decoder_gene=True)
    assert a.shape == b.shape == bias.shape == (6,)
    assert np.allclose(a, 1.0) and np.allclose(b, 1.0)  # uniform when the logits are 0
    action[:, 7] = 3.0
    a, b, _ = proposal(action, 1, decoder_gene=True)
    assert a[-1] / (a[-1] + b[-1]) > 0.9  # the post-order decoder, mostly


@pytest.mark.parametrize("segments", [0.0, 0.5])
@pytest.mark.parametrize("seed", range(3))
def test_peak_local_search_is_exact_valid_and_never_worse(seed, segments):
    g = random_graph(150, seed)
    p = Problem(g)
    start = best_of_portfolio(p)
    res = peak_local_search(p, start.solution, budget=400, seed=seed, segments=segments)
    validate_order(g, res.solution.order)
    assert res.value == PeakMemory(g).peak(res.solution.order)
    assert res.value <= start.value
    assert res.evaluations <= 400


def test_run_moves_take_a_whole_chain_across_the_peak():
    """Chains a (big then small) and b (small then huge end), written b first: a's big
    intermediate sits at the peak beside b's held end. Moving a's nodes one at a time never
    lowers the peak; moving the run a1-a2 before b does."""
    nodes = [
        Node("x", "input", 1, 0.0),
        Node("b1", "op", 1, 1e-6),
        Node("b2", "op", 60, 1e-6),
        Node("a1", "op", 100, 1e-6),
        Node("a2", "op", 1, 1e-6),
        Node("y", "add", 1, 1e-6, output=True),
    ]
    edges = [("x", "a1"), ("a1", "a2"), ("x", "b1"), ("b1", "b2"), ("a2", "y"), ("b2", "y")]
    g = Graph("held-end", nodes, edges)
    p = Problem(g)
    start = p.complete(np.arange(g.n))
    best = min(
        peak_memory_reference(g, list(q))
        for q in itertools.permutations(range(g.n))
        if _topological(g, q)
    )
    assert p.evaluate(start) > best
    with_runs = peak_local_search(p, start, budget=200, seed=0, segments=1.0, explore=0.0)
    assert with_runs.value == best


def test_learned_search_spends_its_budget_and_never_loses_to_the_portfolio():
    g = random_graph(200, 5)
    p = Problem(g)
    portfolio = best_of_portfolio(p).value
    w = PolicyWeights.random(hidden=8, rounds=2, seed=0)
    for action in (None, np.zeros((g.n, OUTPUTS), dtype=np.float32)):
        res = learned_search(p, w, budget=600, seed=1, action=action)
        assert res.evaluations == 600
        assert res.value <= portfolio
        assert res.value == PeakMemory(g).peak(res.solution.order)


def test_learned_search_is_deterministic_per_seed():
    g = random_graph(150, 7)
    w = PolicyWeights.random(hidden=8, rounds=2, seed=3)
    a = learned_search(Problem(g), w, budget=500, seed=4)
    b = learned_search(Problem(g), w, budget=500, seed=4)
    assert a.value == b.value and np.array_equal(a.solution.order, b.solution.order)


def test_order_keys_round_trip_under_the_list_decoder():
    g = random_graph(60, 1)
    order = best_of_portfolio(Problem(g)).solution.order
    assert np.array_equal(decode_order(g, order_keys(order)), order)
