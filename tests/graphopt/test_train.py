import numpy as np
import pytest

from timerl.errors import CheckpointError, GraphError
from timerl.graphopt.policy import PolicyWeights

pytest.importorskip("torch")

from timerl.graphopt.train import TrainConfig, train  # noqa: E402


def _config(corpus, **kw):
    base = dict(
        corpus=str(corpus),
        budget=40,
        batch=2,
        hidden=8,
        rounds=1,
        replay_batch=2,
        runtime_max_nodes=30,
    )
    base.update(kw)
    return TrainConfig(**base)


def test_train_writes_loadable_weights_and_learns_something(tiny_corpus, tmp_path):
    out = tmp_path / "p.npz"
    lines = []
    w = train(_config(tiny_corpus), iterations=3, out=out, log=lines.append)
    back = PolicyWeights.load(out)
    assert back.meta["trained"] is True and back.meta["iterations"] == 3
    untrained = PolicyWeights.random(8, 1, seed=0)
    # the updates changed the parameters
    assert any(not np.array_equal(back.params[k], untrained.params[k]) for k in back.params)
    assert all(np.array_equal(back.params[k], w.params[k]) for k in back.params)
    assert any("training problems" in line for line in lines)
    # both objectives among the problems (graphs of 20 and 30 nodes also get a runtime one)
    assert "5 training problems" in lines[0]


def test_resume_continues_exactly(tiny_corpus, tmp_path):
    cfg = _config(tiny_corpus)
    straight = train(cfg, iterations=4, out=tmp_path / "a.npz", log=lambda s: None)
    ckpt = tmp_path / "b.ckpt.npz"
    train(cfg, iterations=2, out=tmp_path / "b.npz", checkpoint=ckpt, log=lambda s: None)
    resumed = train(
        cfg,
        iterations=4,
        out=tmp_path / "b.npz",
        checkpoint=ckpt,
        resume=True,
        log=lambda s: None,
    )
    assert PolicyWeights.load(tmp_path / "b.npz").meta["iterations"] == 4
    for k in straight.params:
        assert np.allclose(straight.params[k], resumed.params[k], atol=1e-6), k


def test_resume_with_other_settings_is_refused(tiny_corpus, tmp_path):
    ckpt = tmp_path / "c.ckpt.npz"
    train(
        _config(tiny_corpus),
        iterations=1,
        out=tmp_path / "c.npz",
        checkpoint=ckpt,
        log=lambda s: None,
    )
    with pytest.raises(CheckpointError, match="budget=40.*budget=50"):
        train(
            _config(tiny_corpus, budget=50),
            iterations=2,
            out=tmp_path / "c.npz",
            checkpoint=ckpt,
            resume=True,
            log=lambda s: None,
        )


def test_resume_without_checkpoint_names_it(tiny_corpus, tmp_path):
    with pytest.raises(CheckpointError, match="missing.npz: file not found"):
        train(
            _config(tiny_corpus),
            iterations=1,
            out=tmp_path / "x.npz",
            checkpoint=tmp_path / "missing.npz",
            resume=True,
            log=lambda s: None,
        )


def test_no_training_graphs_is_an_error(tiny_corpus, tmp_path):
    with pytest.raises(GraphError, match="no graphs of 8 to 10 nodes"):
        train(_config(tiny_corpus, max_nodes=10), iterations=1, out=tmp_path / "x.npz")


def test_torch_beta_params_match_the_numpy_proposal():
    import torch

    from timerl.graphopt.policy import proposal
    from timerl.graphopt.train import beta_params

    rng = np.random.default_rng(3)
    action = rng.normal(scale=3.0, size=(11, 7)).astype(np.float32)
    for groups in (1, 2, 3, -2):
        a_np, b_np, _ = proposal(action, groups)
        a_t, b_t = beta_params(torch, torch.tensor(action), groups)
        assert np.allclose(a_t.numpy(), a_np, rtol=1e-5), groups
        assert np.allclose(b_t.numpy(), b_np, rtol=1e-5), groups


def _mean_decoded(weights, tiny_corpus, samples=64):
    """Mean peak over keys drawn from the policy's proposals, relative to the portfolio's."""
    from timerl.graphopt.baselines import portfolio_solutions
    from timerl.graphopt.decoders import Problem
    from timerl.graphopt.graph import Graph
    from timerl.graphopt.learned import problem_features
    from timerl.graphopt.policy import key_groups, proposal

    rng = np.random.default_rng(123)
    out = []
    for k in range(3):
        problem = Problem(Graph.load(tiny_corpus / f"train/rand/g{k}.json"))
        seeds = portfolio_solutions(problem)
        ref = min(problem.evaluate(s) for s in seeds.values())
        action = weights.forward(problem_features(problem, seeds))
        a, b, _ = proposal(action, key_groups(False, False))
        keys = rng.beta(a, b, (samples, len(a)))
        out.append(np.mean([problem.fitness(row)[0] for row in keys]) / ref)
    return float(np.mean(out))


def test_decode_reward_lowers_the_peak_of_sampled_schedules(tiny_corpus, tmp_path):
    cfg = _config(tiny_corpus, reward="decode", samples=8, runtime_share=0.0, lr=2e-2, hidden=16)
    lines = []
    w = train(cfg, iterations=40, out=tmp_path / "d.npz", log=lines.append)
    assert w.meta["samples"] == 40 * 2 * 8
    assert "decoded vs portfolio" in lines[-2]
    before = _mean_decoded(PolicyWeights.random(16, 1, seed=0), tiny_corpus)
    after = _mean_decoded(w, tiny_corpus)
    assert after < before


def test_decode_reward_resumes_exactly(tiny_corpus, tmp_path):
    cfg = _config(tiny_corpus, reward="decode", samples=4)
    straight = train(cfg, iterations=4, out=tmp_path / "a.npz", log=lambda s: None)
    ckpt = tmp_path / "b.ckpt.npz"
    train(cfg, iterations=2, out=tmp_path / "b.npz", checkpoint=ckpt, log=lambda s: None)
    resumed = train(
        cfg, iterations=4, out=tmp_path / "b.npz", checkpoint=ckpt, resume=True, log=lambda s: None
    )
    for k in straight.params:
        assert np.allclose(straight.params[k], resumed.params[k], atol=1e-6), k


def test_bad_reward_settings_name_the_flag(tiny_corpus, tmp_path):
    with pytest.raises(GraphError, match="--reward 'best'"):
        train(_config(tiny_corpus, reward="best"), iterations=1, out=tmp_path / "x.npz")
    with pytest.raises(GraphError, match="--samples 1"):
        train(
            _config(tiny_corpus, reward="decode", samples=1), iterations=1, out=tmp_path / "x.npz"
        )


def test_runtime_only_training_learns_runtime_and_keeps_checkpoints(tiny_corpus, tmp_path):
    cfg = _config(tiny_corpus, reward="decode", samples=4, runtime_share=1.0, runtime_max_nodes=40)
    lines = []
    out = tmp_path / "rt.npz"
    w = train(cfg, iterations=4, out=out, checkpoint_every=2, keep=True, log=lines.append)
    assert "6 training problems" in lines[0]  # every graph, up to 40 nodes, also for runtime
    # only runtime problems were drawn: the weights say so, and steer nothing else
    assert w.meta["objectives"] == ["runtime"]
    assert PolicyWeights.load(out).objectives == ("runtime",)
    # every checkpoint's weights, named by its update count, readable as a weights file
    for it in (2, 4):
        snap = PolicyWeights.load(tmp_path / f"rt-{it}.npz")
        assert snap.meta["iterations"] == it and snap.objectives == ("runtime",)
    final = PolicyWeights.load(tmp_path / "rt-4.npz")
    for k in w.params:
        assert np.array_equal(final.params[k], w.params[k]), k


def test_trained_objectives_follow_the_problems_drawn():
    from timerl.graphopt.policy import trained_objectives

    assert trained_objectives(False, 0.3) == ("peak-memory",)  # imitation only
    assert trained_objectives(True, 0.0) == ("peak-memory",)
    assert trained_objectives(True, 0.3) == ("peak-memory", "runtime")
    assert trained_objectives(True, 1.0) == ("runtime",)
    assert trained_objectives(True, 1.0, imitated=True) == ("peak-memory", "runtime")
