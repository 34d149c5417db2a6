import numpy as np
import pytest

from timerl.errors import CheckpointError, GraphError
from timerl.graphopt.baselines import portfolio_solutions
from timerl.graphopt.decoders import Problem, decode_order
from timerl.graphopt.imitate import imitation_loss, load_targets, pair_index, save_targets
from timerl.graphopt.learned import mean_keys, problem_features
from timerl.graphopt.policy import PolicyWeights, key_groups, proposal
from timerl.graphopt.random_graph import random_graph

pytest.importorskip("torch")

from timerl.graphopt.train import TorchPolicy, TrainConfig, train  # noqa: E402


def _config(corpus, **kw):
    base = dict(
        corpus=str(corpus),
        budget=40,
        batch=2,
        hidden=16,
        rounds=2,
        replay_batch=2,
        runtime_max_nodes=30,
        warm_start="imitate",
        imitate_updates=6,
        imitate_budget=100,
        reward="decode",
        samples=4,
    )
    base.update(kw)
    return TrainConfig(**base)


def _fit(graph, target, steps, hidden=32, rounds=2, lr=1e-2):
    """Adam on the imitation loss of one graph; the losses along the way and the weights."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    problem = Problem(graph)
    feats = problem_features(problem, portfolio_solutions(problem))
    net = TorchPolicy(PolicyWeights.random(hidden, rounds, seed=0))
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = imitation_loss(torch, net.forward(0, feats), target, np.log(2.0))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, net.to_weights({"trained": True}), problem, feats


def test_pairs_are_earlier_then_later():
    order = np.array([4, 2, 0, 3, 1])
    first, second = pair_index(order)
    pos = np.empty(5, int)
    pos[order] = np.arange(5)
    assert len(first) == 4 + 3 + 2  # offsets 1, 2, 3 fit in five positions
    assert (pos[first] < pos[second]).all()


def test_imitation_loss_decreases():
    graph = random_graph(40, seed=5, view_prob=0.1)
    target = decode_order(graph, np.random.default_rng(1).random(graph.n))
    losses, _, _, _ = _fit(graph, target, 60, hidden=16)
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])


def test_network_trained_on_one_order_decodes_to_it():
    graph = random_graph(16, seed=3, view_prob=0.0)
    # a topological order far from program order: random priorities decoded
    target = decode_order(graph, np.random.default_rng(7).random(graph.n))
    assert not np.array_equal(target, graph.program_order)
    _, weights, problem, feats = _fit(graph, target, 400)
    # numpy inference, the proposals' Beta means, decoded as learned_search seeds them
    alpha, beta, _ = proposal(weights.forward(feats), key_groups(False, False))
    sol = problem.decode(mean_keys(alpha, beta))
    np.testing.assert_array_equal(sol.order, target)
    # the concentration asked for (a + b = 2 * exp(log 2) = 4) and the default bias
    assert np.allclose(alpha + beta, 4.0, rtol=0.1)


def test_train_with_warm_start_writes_loadable_weights(tiny_corpus, tmp_path):
    out = tmp_path / "p.npz"
    lines = []
    w = train(_config(tiny_corpus), iterations=2, out=out, log=lines.append)
    back = PolicyWeights.load(out)
    assert back.meta["imitation_updates"] == 6 and back.meta["iterations"] == 2
    assert back.meta["config"]["warm_start"] == "imitate"
    assert all(np.array_equal(back.params[k], w.params[k]) for k in back.params)
    assert any("searching imitation targets: 3 problems" in s for s in lines)
    assert any("imitation loss" in s for s in lines)
    # the targets file is reused by the next run
    assert (tmp_path / "p.targets.npz").is_file()
    lines.clear()
    train(_config(tiny_corpus), iterations=0, out=out, log=lines.append)
    assert any("imitation targets from" in s for s in lines)


def test_targets_are_at_least_as_good_as_the_portfolio(tiny_corpus, tmp_path):
    out = tmp_path / "p.npz"
    train(_config(tiny_corpus, imitate_updates=1), iterations=0, out=out, log=lambda s: None)
    got = load_targets(tmp_path / "p.targets.npz")
    assert got is not None
    targets, budget = got
    assert budget == 100 and set(targets) == {"g0:mem", "g1:mem", "g2:mem"}
    for k in range(3):
        graph = random_graph(20 + 10 * k, seed=k, view_prob=0.2)
        problem = Problem(graph)
        order, decoder = targets[f"g{k}:mem"]
        assert sorted(order.tolist()) == list(range(graph.n))
        best_portfolio = min(problem.evaluate(s) for s in portfolio_solutions(problem).values())
        assert problem.evaluate(problem.complete(order)) <= best_portfolio
        assert decoder in (0.0, 0.5, 1.0)


def test_resume_through_the_imitation_phase_continues_exactly(tiny_corpus, tmp_path):
    cfg = _config(tiny_corpus)
    targets = tmp_path / "t.npz"
    straight = train(cfg, iterations=2, out=tmp_path / "a.npz", targets=targets, log=lambda s: None)
    ckpt = tmp_path / "b.ckpt.npz"
    part = _config(tiny_corpus)

    class Stop(Exception):
        pass

    def stop_after_four(done, total, text):
        if "imitation" in text and done == 4:
            raise Stop  # killed inside the imitation phase, after the checkpoint of update 3

    with pytest.raises(Stop):
        train(
            part,
            iterations=2,
            out=tmp_path / "b.npz",
            checkpoint=ckpt,
            checkpoint_every=3,
            targets=targets,
            progress=stop_after_four,
            log=lambda s: None,
        )
    assert PolicyWeights.load(ckpt).meta["checkpoint"] is True
    resumed = train(
        part,
        iterations=2,
        out=tmp_path / "b.npz",
        checkpoint=ckpt,
        targets=targets,
        resume=True,
        log=lambda s: None,
    )
    for k in straight.params:
        np.testing.assert_allclose(resumed.params[k], straight.params[k], rtol=1e-6, atol=1e-7)
    # a checkpoint of another warm start is refused, naming the setting
    with pytest.raises(CheckpointError, match="warm_start"):
        train(
            _config(tiny_corpus, warm_start="none"),
            iterations=3,
            out=tmp_path / "b.npz",
            checkpoint=ckpt,
            resume=True,
            log=lambda s: None,
        )


def test_bad_targets_file_errors_name_it(tiny_corpus, tmp_path):
    bad = tmp_path / "t.npz"
    bad.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(CheckpointError, match="t.npz.*not a readable targets file"):
        train(_config(tiny_corpus), iterations=0, out=tmp_path / "p.npz", targets=bad)
    # an order that is not a permutation of its graph's nodes (another corpus)
    save_targets(bad, {f"g{k}:mem": (np.arange(5), 0.5) for k in range(3)}, 100)
    with pytest.raises(CheckpointError, match="t.npz: the order of g0:mem is not a permutation"):
        train(_config(tiny_corpus), iterations=0, out=tmp_path / "p.npz", targets=bad)


def test_bad_warm_start_flags(tiny_corpus, tmp_path):
    with pytest.raises(GraphError, match="--warm-start 'copy'"):
        train(_config(tiny_corpus, warm_start="copy"), iterations=0, out=tmp_path / "p.npz")
    with pytest.raises(GraphError, match="--imitate-concentration 0"):
        train(
            _config(tiny_corpus, imitate_concentration=0.0),
            iterations=0,
            out=tmp_path / "p.npz",
        )


def test_scale_keeps_the_mean_order_and_widens_the_proposals(tiny_corpus, tmp_path):
    targets = tmp_path / "t.npz"
    plain = train(_config(tiny_corpus), iterations=0, out=tmp_path / "a.npz", targets=targets)
    cfg = _config(tiny_corpus, imitate_scale=0.25)
    scaled = train(cfg, iterations=0, out=tmp_path / "b.npz", targets=targets)
    np.testing.assert_allclose(scaled.params["out.w"][:, 0], 0.25 * plain.params["out.w"][:, 0])
    np.testing.assert_allclose(scaled.params["out.w"][:, 1:], plain.params["out.w"][:, 1:])
    graph = random_graph(30, seed=1, view_prob=0.2)
    problem = Problem(graph)
    feats = problem_features(problem, portfolio_solutions(problem))
    a_plain, a_scaled = plain.forward(feats), scaled.forward(feats)
    np.testing.assert_array_equal(
        decode_order(graph, a_scaled[:, 0]), decode_order(graph, a_plain[:, 0])
    )
    assert np.abs(a_scaled[:, 0]).max() < np.abs(a_plain[:, 0]).max()
    with pytest.raises(GraphError, match="--imitate-scale 0"):
        train(_config(tiny_corpus, imitate_scale=0.0), iterations=0, out=tmp_path / "c.npz")
