import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timerl.graphopt.baselines import best_of_portfolio, portfolio_solutions
from timerl.graphopt.brkga import brkga
from timerl.graphopt.decoders import Problem, decode_order, order_keys
from timerl.graphopt.perfmodel import Cluster, PeakMemory, validate_order
from timerl.graphopt.random_graph import random_graph


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    seed=st.integers(0, 10_000),
    keys=st.lists(st.floats(0, 1), min_size=40, max_size=40),
)
def test_every_decoded_order_is_topological(n, seed, keys):
    g = random_graph(n, seed=seed)
    order = decode_order(g, np.array(keys[:n]))
    validate_order(g, order)  # raises if not a topological permutation


@pytest.mark.parametrize("seed", range(5))
def test_order_keys_decode_back_to_the_order(seed):
    g = random_graph(60, seed=seed)
    order = decode_order(g, np.random.default_rng(seed).random(g.n))
    assert decode_order(g, order_keys(order)).tolist() == order.tolist()


def test_decoder_follows_priorities():
    g = random_graph(30, seed=1)
    pr = np.random.default_rng(0).random(g.n)
    order = decode_order(g, pr).tolist()
    done: set[int] = set()
    for v in order:  # v has the highest priority among the ready ops when it runs
        ready = [u for u in range(g.n) if u not in done and set(g.preds[u]) <= done]
        assert pr[v] == max(pr[u] for u in ready)
        done.add(v)


@pytest.mark.parametrize("seed", range(6))
def test_brkga_never_worse_than_seeded_portfolio(seed):
    g = random_graph(80, seed=seed)
    p = Problem(g)
    pf = best_of_portfolio(p)
    res = brkga(p, budget=300, seeds=list(portfolio_solutions(p).values()), seed=seed)
    assert res.value <= pf.value
    assert res.evaluations == 300
    validate_order(g, res.solution.order)
    assert PeakMemory(g).peak(res.solution.order) == res.value
    assert all(a >= b for a, b in zip(res.history, res.history[1:], strict=False))


def test_brkga_finds_brute_force_optimum_on_tiny_graphs(all_orders):
    for seed in range(5):
        g = random_graph(7, seed=seed, view_prob=0.3, output_prob=0.2)
        pm = PeakMemory(g)
        best = min(pm.peak(np.array(o)) for o in all_orders(g))
        assert brkga(Problem(g), budget=400, seed=seed).value == best


def test_brkga_samples_proposals_from_per_node_beta():
    g = random_graph(20, seed=2)
    seen: list[np.ndarray] = []

    class Recording(Problem):
        def fitness(self, keys):
            seen.append(keys.copy())
            return super().fitness(keys)

    a = np.ones(g.n)
    b = np.ones(g.n)
    a[0], b[1:] = 50.0, 50.0  # node 0 keys near 1, all others near 0
    res = brkga(Recording(g), budget=40, population=40, alpha=a, beta=b, bias=np.full(g.n, 0.8))
    keys = np.stack(seen)
    assert keys.shape == (40, g.n)
    assert keys[:, 0].mean() > 0.9 and keys[:, 1:].mean() < 0.1
    validate_order(g, res.solution.order)
    with pytest.raises(ValueError):
        brkga(Problem(g), budget=10, alpha=np.ones(3))


def test_brkga_is_deterministic_per_seed():
    g = random_graph(40, seed=4)
    r1 = brkga(Problem(g), budget=200, seed=7)
    r2 = brkga(Problem(g), budget=200, seed=7)
    assert r1.value == r2.value and r1.solution.order.tolist() == r2.solution.order.tolist()


@pytest.mark.parametrize("objective", ["peak-memory", "runtime"])
def test_brkga_multi_device_decodes_valid_placements(objective):
    g = random_graph(40, seed=3)
    cl = Cluster.make(3, memory_limit=2_000_000, host=True)
    p = Problem(g, objective, cl)
    assert p.num_keys == 3 * g.n
    seeds = list(portfolio_solutions(p).values())
    res = brkga(p, budget=200, seeds=seeds, seed=0)
    sol = res.solution
    validate_order(g, sol.order)
    assert sol.placement is not None and set(sol.placement.tolist()) <= {0, 1, 2}
    # views sit with their base buffer
    assert np.array_equal(sol.placement, sol.placement[g.root])
    assert res.value <= min(p.evaluate(s) for s in seeds)


def test_search_uses_swaps_to_meet_a_memory_limit():
    # x (1000 B) feeds the first and the last op of a chain whose middle holds 500 B buffers:
    # no order keeps x resident under the limit, swapping it out across the middle does.
    from timerl.graphopt.graph import Graph

    sizes = [10, 10, 500, 500, 500, 500, 10, 10]  # small ends: room for x in flight
    nodes = [{"id": "x", "op": "op", "bytes": 1000, "cost": 1.0}]
    nodes += [{"id": f"m{i}", "op": "op", "bytes": b, "cost": 1.0} for i, b in enumerate(sizes)]
    nodes.append({"id": "f", "op": "op", "bytes": 10, "cost": 1.0, "output": True})
    edges = [[f"m{i}", f"m{i + 1}"] for i in range(len(sizes) - 1)]
    edges += [["x", "m0"], ["x", "f"], ["m7", "f"]]
    g = Graph.from_json({"name": "swap", "nodes": nodes, "edges": edges})
    limit = 1200
    assert PeakMemory(g).peak(np.array(g.program_order)) == 2000
    cl = Cluster(("acc",), memory_limit=limit, host=True, host_bandwidth=1e4, host_latency=0.0)
    p = Problem(g, "runtime", cl)
    seeds = list(portfolio_solutions(p).values())
    assert min(p.evaluate(s) for s in seeds) > 5 * g.cost.sum()  # all infeasible: penalised
    res = brkga(p, budget=300, seeds=seeds, seed=0)
    sim = p.sim.run(res.solution.order, res.solution.placement, res.solution.swap)
    assert sim.peaks[0] <= limit
    assert sim.swapped[g.index["x"]]
    assert res.value == pytest.approx(sim.makespan)


@pytest.mark.parametrize("seed", range(4))
def test_encode_decode_round_trip_with_placement_and_swaps(seed):
    g = random_graph(40, seed=seed, view_prob=0.25)
    p = Problem(g, "runtime", Cluster.make(3, host=True))
    rng = np.random.default_rng(seed)
    sol = p.decode(rng.random(p.num_keys))
    back = p.decode(p.encode(sol))
    assert back.order.tolist() == sol.order.tolist()
    assert back.placement.tolist() == sol.placement.tolist()
    assert back.swap.tolist() == sol.swap.tolist()
    assert p.evaluate(back) == p.evaluate(sol)


def test_pinned_nodes_stay_on_their_device():
    from timerl.graphopt.graph import Graph

    data = random_graph(30, seed=6).to_json()
    data["nodes"][3]["device"] = "d1"
    data["nodes"][10]["device"] = "d0"
    g = Graph.from_json(data)
    p = Problem(g, "runtime", Cluster.make(2))
    res = brkga(p, budget=100, seeds=list(portfolio_solutions(p).values()))
    assert g.alias[3] < 0 and g.alias[10] < 0  # not views (a view follows its base)
    assert res.solution.placement[3] == 1 and res.solution.placement[10] == 0
    for seed in range(5):
        sol = p.decode(np.random.default_rng(seed).random(p.num_keys))
        assert sol.placement[3] == 1 and sol.placement[10] == 0


def test_scoring_over_processes_gives_the_same_search():
    """``jobs`` only spreads a generation's scoring: same best, history and evaluation count,
    for memory and for runtime with placement (budget not a multiple of the population)."""
    g = random_graph(120, seed=3)
    for p in (Problem(g), Problem(g, "runtime", Cluster.make(2, memory_limit=None))):
        seeds = list(portfolio_solutions(p).values())
        one = brkga(p, budget=437, seeds=seeds, seed=5)
        two = brkga(p, budget=437, seeds=seeds, seed=5, jobs=2)
        assert (one.value, one.evaluations, one.history) == (
            two.value,
            two.evaluations,
            two.history,
        )
        assert one.solution.order.tolist() == two.solution.order.tolist()


def test_a_job_count_below_one_is_refused():
    from timerl.errors import GraphError

    with pytest.raises(GraphError, match="--jobs must be at least 1, got 0"):
        brkga(Problem(random_graph(10, seed=0)), budget=10, jobs=0)


@pytest.mark.parametrize("seed", range(4))
def test_patience_stops_after_that_many_generations_without_a_better_schedule(seed):
    p = Problem(random_graph(80, seed=seed))
    full = brkga(p, budget=1000, seed=seed)
    early = brkga(p, budget=1000, seed=seed, patience=3)
    h = early.history
    # the same search up to where it stopped, then three generations in a row found nothing
    assert h == full.history[: len(h)]
    assert early.evaluations < full.evaluations
    assert h[-1] == h[-4] and (len(h) == 4 or h[-5] > h[-4])
    assert early.value == h[-1] and early.value >= full.value
