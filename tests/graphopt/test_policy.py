import json
import zipfile

import numpy as np
import pytest

from timerl.errors import CheckpointError
from timerl.graphopt.baselines import best_of_portfolio, portfolio_solutions
from timerl.graphopt.decoders import Problem
from timerl.graphopt.features import (
    FEATURE_VERSION,
    NUM_FEATURES,
    OP_BUCKETS,
    depth_height,
    graph_features,
    op_bucket,
)
from timerl.graphopt.graph import Graph, Node
from timerl.graphopt.learned import learned_search, load_policy, problem_features
from timerl.graphopt.perfmodel import Cluster, PeakMemory
from timerl.graphopt.policy import (
    OUTPUTS,
    SHIPPED,
    PolicyWeights,
    key_groups,
    proposal,
)
from timerl.graphopt.random_graph import random_graph


def _diamond() -> Graph:
    nodes = [
        Node("a", "input", 100, 0.0),
        Node("b", "matmul", 400, 1e-6),
        Node("c", "relu", 200, 1e-7),
        Node("v", "view", 200, 0.0, alias_of="c"),
        Node("d", "add", 50, 1e-7, output=True),
    ]
    edges = [("a", "b"), ("a", "c"), ("c", "v"), ("b", "d"), ("v", "d")]
    return Graph("diamond", nodes, edges)


def test_depth_and_height_are_longest_paths():
    depth, height = depth_height(_diamond())
    assert depth.tolist() == [0, 1, 1, 2, 3]
    assert height.tolist() == [3, 1, 2, 1, 0]


def test_features_describe_nodes():
    g = _diamond()
    f = graph_features(g)
    assert f.x.shape == (5, NUM_FEATURES)
    # one op bucket per node, the stable crc32 bucket
    assert f.x[:, :OP_BUCKETS].sum(axis=1).tolist() == [1.0] * 5
    assert f.x[1, op_bucket("matmul")] == 1.0
    s = f.x[:, OP_BUCKETS:]
    assert s[1, 2] == 1.0  # the largest buffer
    assert s[:, 9].tolist() == [0, 0, 0, 1, 0]  # view flag
    assert s[:, 10].tolist() == [0, 0, 0, 0, 1]  # output flag
    assert s[:, 17].tolist() == [0] * 5  # peak-memory objective
    rt = graph_features(g, objective="runtime", devices=2, host=True).x[:, OP_BUCKETS:]
    assert (rt[:, 17] == 1).all() and (rt[:, 19] == 1).all() and (rt[:, 18] > 0).all()
    assert sorted(zip(f.src.tolist(), f.dst.tolist(), strict=True)) == [
        tuple(e) for e in g.edges.tolist()
    ]


def test_zero_action_is_plain_brkga():
    a, b, bias = proposal(np.zeros((4, OUTPUTS)), 1)
    assert np.allclose(a, 1.0) and np.allclose(b, 1.0) and np.allclose(bias, 0.7)
    a3, _, bias3 = proposal(np.zeros((4, OUTPUTS)), 3)
    assert a3.shape == bias3.shape == (12,)


def test_proposal_layout_matches_problem_keys():
    g = random_graph(30, seed=1)
    for cluster in (None, Cluster.make(2), Cluster.make(1, host=True), Cluster.make(2, host=True)):
        obj = "peak-memory" if cluster is None else "runtime"
        p = Problem(g, obj, cluster)
        a, b, bias = proposal(np.zeros((g.n, OUTPUTS)), key_groups(p.place, p.swaps))
        assert a.shape == b.shape == bias.shape == (p.num_keys,)


def test_mean_action_moves_beta_mean():
    action = np.zeros((3, OUTPUTS))
    action[0, 0] = 3.0  # high priority mean for node 0
    action[1, 0] = -3.0
    a, b, _ = proposal(action, 1)
    means = a / (a + b)
    assert means[0] > 0.9 and means[1] < 0.1 and abs(means[2] - 0.5) < 1e-9


def test_numpy_forward_matches_torch():
    pytest.importorskip("torch")
    from timerl.graphopt.train import TorchPolicy

    g = random_graph(60, seed=3)
    f = graph_features(g)
    w = PolicyWeights.random(hidden=16, rounds=2, seed=4)
    ref = TorchPolicy(w).forward(0, f).detach().numpy()
    out = w.forward(f)
    assert out.shape == (60, OUTPUTS)
    assert np.allclose(out, ref, atol=1e-4)


def test_save_load_round_trip(tmp_path):
    w = PolicyWeights.random(hidden=8, rounds=2, seed=1)
    w.meta["note"] = "x"
    path = tmp_path / "w.npz"
    w.save(path)
    back = PolicyWeights.load(path)
    assert back.hidden == 8 and back.rounds == 2 and back.meta["note"] == "x"
    for k, v in w.params.items():
        assert np.array_equal(back.params[k], v)
    f = graph_features(random_graph(20, seed=0))
    assert np.array_equal(back.forward(f), w.forward(f))


def test_missing_weights_file_names_it(tmp_path):
    with pytest.raises(CheckpointError, match="nope.npz: file not found"):
        PolicyWeights.load(tmp_path / "nope.npz")


def test_truncated_weights_file_is_refused(tmp_path):
    path = tmp_path / "w.npz"
    PolicyWeights.random(hidden=8, rounds=1).save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"w\.npz: not a readable \.npz"):
        PolicyWeights.load(path)


def _rewrite_meta(path, change):
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["meta"].tobytes().decode())
    change(meta)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def test_other_feature_version_is_refused(tmp_path):
    path = tmp_path / "w.npz"
    PolicyWeights.random(hidden=8, rounds=1).save(path)
    _rewrite_meta(path, lambda m: m.update(feature_version=FEATURE_VERSION + 7))
    with pytest.raises(CheckpointError, match=f"feature version {FEATURE_VERSION + 7}"):
        PolicyWeights.load(path)


def test_wrong_shape_is_refused(tmp_path):
    path = tmp_path / "w.npz"
    PolicyWeights.random(hidden=8, rounds=1).save(path)
    _rewrite_meta(path, lambda m: m.update(hidden=16))
    with pytest.raises(CheckpointError, match="parameter 'in.w' has shape"):
        PolicyWeights.load(path)


def test_not_a_policy_archive_is_refused(tmp_path):
    path = tmp_path / "w.npz"
    with open(path, "wb") as f:
        np.savez(f, a=np.zeros(3))
    with pytest.raises(CheckpointError, match="no 'meta' entry"):
        PolicyWeights.load(path)
    assert zipfile.is_zipfile(path)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_learned_search_never_worse_than_portfolio(seed):
    g = random_graph(50, seed=seed, view_prob=0.2)
    p = Problem(g)
    w = PolicyWeights.random(hidden=8, rounds=2, seed=seed)
    res = learned_search(p, w, budget=150, seed=seed)
    assert res.value <= best_of_portfolio(p).value
    assert res.value == PeakMemory(g).peak(res.solution.order)
    assert res.evaluations == 150 and res.method == "learned"


def test_learned_search_places_and_swaps():
    g = random_graph(40, seed=2)
    cluster = Cluster.make(2, memory_limit=200_000, host=True)
    p = Problem(g, "runtime", cluster)
    w = PolicyWeights.random(hidden=8, rounds=1)
    res = learned_search(p, w, budget=60)
    assert res.solution.placement is not None and res.solution.swap is not None
    assert res.value <= best_of_portfolio(p).value


def test_weights_know_which_objectives_they_learned():
    random = PolicyWeights.random(hidden=8, rounds=1)
    assert random.objectives == ("peak-memory", "runtime")  # the ablation's control: everywhere
    imitated = PolicyWeights(random.params, 8, 1, {"trained": True, "iterations": 0})
    assert imitated.objectives == ("peak-memory",)  # imitation fits peak-memory orders only
    rewarded = {"trained": True, "iterations": 5, "config": {"runtime_share": 0.3}}
    assert PolicyWeights(random.params, 8, 1, rewarded).objectives == ("peak-memory", "runtime")
    no_runtime = {**rewarded, "config": {"runtime_share": 0.0}}
    assert PolicyWeights(random.params, 8, 1, no_runtime).objectives == ("peak-memory",)
    told = {"trained": True, "objectives": ["runtime"]}
    assert PolicyWeights(random.params, 8, 1, told).objectives == ("runtime",)
    assert load_policy().objectives == ("peak-memory",)  # the shipped file: imitation only


def test_learned_search_does_not_steer_an_objective_the_weights_never_learned():
    g = random_graph(40, seed=2)
    cluster = Cluster.make(2, memory_limit=200_000, host=True)
    p = Problem(g, "runtime", cluster)
    random = PolicyWeights.random(hidden=8, rounds=1, seed=3)
    imitated = PolicyWeights(random.params, 8, 1, {"trained": True, "objectives": ["peak-memory"]})
    # the same search with all-zero outputs: uniform proposals and move weights
    zero = np.zeros((p.n, OUTPUTS), dtype=np.float32)
    uniform = learned_search(p, None, budget=60, seed=1, action=zero)
    res = learned_search(p, imitated, budget=60, seed=1)
    assert res.value == uniform.value and "uniform" in res.method
    assert np.array_equal(res.solution.order, uniform.solution.order)
    steered = learned_search(p, random, budget=60, seed=1)  # the untrained network steers
    assert steered.method == "learned"


def test_features_reuse_portfolio_orders():
    g = random_graph(30, seed=5)
    p = Problem(g)
    seeds = portfolio_solutions(p)
    a = problem_features(p, seeds).x
    b = graph_features(g).x
    assert np.array_equal(a, b)


def test_shipped_weights_load():
    assert SHIPPED.is_file(), "the package ships trained policy weights"
    w = load_policy()
    assert w.meta.get("trained") is True
    assert SHIPPED.stat().st_size < 200_000
