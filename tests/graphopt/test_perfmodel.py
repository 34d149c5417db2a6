import numpy as np
import pytest

from timerl.errors import GraphError
from timerl.graphopt.graph import Graph
from timerl.graphopt.perfmodel import (
    Cluster,
    PeakMemory,
    Simulator,
    as_order,
    max_working_set,
    peak_memory,
    peak_memory_reference,
)
from timerl.graphopt.random_graph import random_graph


def mk(nodes, edges):
    return Graph.from_json(
        {
            "name": "t",
            "nodes": [{"id": i, "op": "op", "bytes": b, "cost": 1.0, **kw} for i, b, kw in nodes],
            "edges": [list(e) for e in edges],
        }
    )


def test_chain_hand_computed():
    # a(10) -> b(20) -> c(5, output): steps: a=10, b=10+20, c=20+5 -> peak 30
    g = mk([("a", 10, {}), ("b", 20, {}), ("c", 5, {"output": True})], [("a", "b"), ("b", "c")])
    pm = PeakMemory(g)
    assert pm.profile(np.array([0, 1, 2])).tolist() == [10, 30, 25]
    assert peak_memory(g, ["a", "b", "c"]) == 30


def test_unconsumed_buffer_freed_after_own_step_and_outputs_kept():
    # a(100) unconsumed dies after its step; o(7) is an output, stays to the end
    g = mk([("a", 100, {}), ("o", 7, {"output": True}), ("z", 1, {})], [])
    pm = PeakMemory(g)
    assert pm.profile(np.array([0, 1, 2])).tolist() == [100, 7, 8]
    assert pm.profile(np.array([1, 0, 2])).tolist() == [7, 107, 8]


def test_view_keeps_base_alive_and_allocates_nothing():
    # a(50) -> v (view of a, 50) -> c(1); a also feeds b(2). a must live until c runs.
    g = mk(
        [("a", 50, {}), ("v", 50, {"alias_of": "a"}), ("b", 2, {}), ("c", 1, {})],
        [("a", "v"), ("a", "b"), ("v", "c")],
    )
    pm = PeakMemory(g)
    # order a v b c: a=50, v=50, b=52 (b unconsumed), c=51
    assert pm.profile(np.array([0, 1, 2, 3])).tolist() == [50, 50, 52, 51]
    # order a b v c: a=50, b=52, v=50, c=51
    assert pm.profile(np.array([0, 2, 1, 3])).tolist() == [50, 52, 50, 51]


def test_output_view_keeps_base_to_end():
    g = mk(
        [("a", 30, {}), ("v", 30, {"alias_of": "a", "output": True}), ("b", 4, {})],
        [("a", "v")],
    )
    assert PeakMemory(g).profile(np.array([0, 1, 2])).tolist() == [30, 30, 34]


def test_alias_chain_resolves_to_root():
    g = mk(
        [("a", 9, {}), ("v", 9, {"alias_of": "a"}), ("w", 9, {"alias_of": "v"}), ("c", 1, {})],
        [("a", "v"), ("v", "w"), ("w", "c")],
    )
    assert PeakMemory(g).profile(np.array([0, 1, 2, 3])).tolist() == [9, 9, 9, 10]


@pytest.mark.parametrize("seed", range(40))
def test_fast_equals_reference_on_all_orders_of_small_graphs(seed, all_orders):
    g = random_graph(int(3 + seed % 6), seed=seed, view_prob=0.3, output_prob=0.25)
    pm = PeakMemory(g)
    orders = list(all_orders(g))
    fast = [pm.peak(np.array(o)) for o in orders]
    assert fast == [peak_memory_reference(g, o) for o in orders]
    assert pm.peak_batch(np.array(orders)).tolist() == fast


@pytest.mark.parametrize("seed", range(6))
def test_fast_equals_reference_on_larger_graphs(seed):
    g = random_graph(70, seed=100 + seed, view_prob=0.2)
    pm = PeakMemory(g)
    rng = np.random.default_rng(seed)
    from timerl.graphopt.decoders import decode_order

    for _ in range(3):
        order = decode_order(g, rng.random(g.n))
        assert pm.peak(order) == peak_memory_reference(g, order.tolist())


def test_order_validation():
    g = mk([("a", 1, {}), ("b", 1, {})], [("a", "b")])
    with pytest.raises(GraphError, match="'b' before its input 'a'"):
        as_order(g, ["b", "a"])
    with pytest.raises(GraphError, match="permutation"):
        as_order(g, [0, 0])
    with pytest.raises(GraphError, match="unknown node"):
        as_order(g, ["a", "q"])


@pytest.mark.parametrize("seed", range(8))
def test_single_device_simulation_matches_step_model(seed):
    g = random_graph(40, seed=seed, view_prob=0.2)
    sim = Simulator(g, Cluster.make(1))
    order = np.array(g.program_order)
    res = sim.run(order, np.zeros(g.n, dtype=np.int64), None)
    assert res.peaks.tolist() == [PeakMemory(g).peak(order)]
    assert res.makespan == pytest.approx(g.cost.sum())


def two_chain_graph():
    return mk(
        [("a", 100, {}), ("b", 100, {}), ("c", 1, {"output": True})],
        [("a", "b"), ("b", "c")],
    )


def test_cross_device_transfer_time_and_memory():
    g = two_chain_graph()
    cl = Cluster(("x", "y"), bandwidth=100.0, latency=0.5)
    res = Simulator(g, cl).run(np.array([0, 1, 2]), np.array([0, 1, 1]), None)
    # a on x: [0,1]; send 100 B at 100 B/s + 0.5 s latency -> arrives 2.5; b [2.5,3.5]; c [3.5,4.5]
    assert res.start.tolist() == [0.0, 2.5, 3.5]
    assert res.makespan == pytest.approx(4.5)
    # x holds a until sent (100); y holds the copy (100) + b (100) while b runs
    assert res.peaks.tolist() == [100, 200]


def test_transfers_overlap_compute():
    # a on x feeds b on y; independent d on x runs while a is in flight
    g = mk(
        [("a", 100, {}), ("b", 1, {}), ("d", 1, {})],
        [("a", "b")],
    )
    cl = Cluster(("x", "y"), bandwidth=100.0, latency=0.0)
    res = Simulator(g, cl).run(np.array([0, 2, 1]), np.array([0, 1, 0]), None)
    assert res.start.tolist() == [0.0, 2.0, 1.0]
    assert res.makespan == pytest.approx(3.0)


def test_swap_lowers_peak_and_costs_time():
    # a(100) used by f at the end; m1, m2 (100 each) in between on one device
    g = mk(
        [("a", 100, {}), ("m1", 100, {}), ("m2", 100, {}), ("m3", 1, {}), ("f", 1, {})],
        [("m1", "m2"), ("m2", "m3"), ("a", "f"), ("m3", "f")],
    )
    order = np.array([0, 1, 2, 3, 4])
    place = np.zeros(5, dtype=np.int64)
    cl = Cluster(("x",), host=True, host_bandwidth=1000.0, host_latency=0.0)
    sim = Simulator(g, cl)
    plain = sim.run(order, place, None)
    swap = np.zeros(5, dtype=bool)
    swap[0] = True
    swapped = sim.run(order, place, swap)
    assert plain.peaks.tolist() == [300]
    assert swapped.swapped[0]
    # a leaves after its own step (0.1 s out): m1 at t=1 -> 100, m2 -> 200, a back before f
    assert swapped.peaks.tolist() == [201]
    assert swapped.makespan >= plain.makespan
    # with a slow link the swap-in delays f
    slow = Simulator(g, Cluster(("x",), host=True, host_bandwidth=10.0, host_latency=0.0))
    assert slow.run(order, place, swap).makespan > plain.makespan


def test_runtime_penalty_over_limit():
    g = two_chain_graph()
    cl = Cluster(("x",), memory_limit=150)
    sim = Simulator(g, cl)
    res = sim.run(np.array([0, 1, 2]), np.zeros(3, dtype=np.int64), None)
    # makespan 3 + 10 x serial time 3 x excess 50/150
    assert sim.objective(res, "runtime") == pytest.approx(3.0 + 10.0 * 3.0 * 50 / 150)
    assert sim.objective(res, "peak-memory") == 200


@pytest.mark.parametrize("seed", range(10))
def test_simulation_invariants_on_random_placements(seed):
    g = random_graph(50, seed=seed, view_prob=0.2)
    rng = np.random.default_rng(seed)
    cl = Cluster.make(3, host=True)
    sim = Simulator(g, cl)
    order = np.array(g.program_order)
    place = sim.normalise(rng.integers(0, 3, g.n))
    res = sim.run(order, place, rng.random(g.n) > 0.7)
    # every op runs after its inputs and for its cost; a device runs one op at a time
    for s, d in g.edges.tolist():
        assert res.start[d] >= res.finish[s] - 1e-12
    assert np.allclose(res.finish - res.start, g.cost)
    for d in range(3):
        ops = [v for v in order.tolist() if place[v] == d]
        assert all(
            res.start[b] >= res.finish[a] - 1e-12 for a, b in zip(ops, ops[1:], strict=False)
        )
        # while an op runs its own output is resident on its device
        biggest = max((g.nbytes[v] for v in ops if g.alias[v] < 0), default=0)
        assert res.peaks[d] >= biggest
    assert res.makespan >= max(g.cost[place == d].sum() for d in range(3)) - 1e-12
    # no transfers and no swaps: all on one device equals the step model
    one = sim.run(order, np.zeros(g.n, dtype=np.int64), None)
    assert one.peaks[0] == PeakMemory(g).peak(order) and one.peaks[1:].sum() == 0


@pytest.mark.parametrize("seed", range(20))
def test_max_working_set_bounds_every_order(seed, all_orders):
    g = random_graph(3 + seed % 6, seed=seed, view_prob=0.3)
    pm = PeakMemory(g)
    ws = max_working_set(g)
    assert ws <= min(pm.peak(np.array(o)) for o in all_orders(g))
    # and it is attained by some op's own inputs and output
    assert any(
        ws == sum(int(g.nbytes[b]) for b in {int(g.root[u]) for u in g.preds[v]} | {int(g.root[v])})
        for v in range(g.n)
    )
