"""graphopt's policy trained by a timerl program (``rl/graph_policy/policy.py``): the padded network
equals graphopt's, the loss's gradient equals the torch trainer's, and the program trains,
resumes exactly and exports weights that ``graphopt optimize`` reads."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

import timerl as tl
from timerl.cli import main
from timerl.errors import GraphError
from timerl.graphopt.policy import PolicyWeights, key_columns, used_columns
from timerl.graphopt.random_graph import random_graph
from timerl.rl.graph_policy import GraphNet, beta_params, decode_loss, policy_loss
from timerl.rl.graph_policy.problems import GraphPolicyConfig, GraphProblems


def test_padded_network_equals_graphopts_on_every_real_node(tiny_corpus):
    problems = GraphProblems(GraphPolicyConfig(corpus=str(tiny_corpus), num_envs=2))
    weights = PolicyWeights.random(8, 2, seed=3)
    # every problem padded to the largest graph: padding must not reach real nodes
    ks = list(range(len(problems.tasks)))
    x, *edges, mask, _ = problems.batch_arrays(ks)
    with tl.Context():
        net = GraphNet(weights, ())
        edge_list = tuple(tl.from_numpy(a) for a in edges)
        got = tl.evaluate(net.mean_action(tl.from_numpy(x), edge_list, tl.from_numpy(mask)))
    assert got.shape == (len(ks), problems.nodes, 7)
    for b, k in enumerate(ks):
        task = problems.tasks[k]
        want = weights.forward(task.feats)
        np.testing.assert_allclose(got[b, : task.problem.n], want, rtol=1e-4, atol=1e-5)


@contextlib.contextmanager
def _network_on(weights, x, edges, mask):
    """An active context over ``i`` with ``weights``' network, the network at ``i`` and its
    mean action on a padded batch: ``(net, pi, mean)``."""
    with tl.Context(dims=("i",)) as ctx:
        (i,) = ctx.dims
        net = GraphNet(weights, (i,))
        pi = net.at(i)
        edge_list = tuple(tl.from_numpy(a) for a in edges)
        yield net, pi, pi.mean_action(tl.from_numpy(x), edge_list, tl.from_numpy(mask))


def _loss_and_grads(net, loss):
    """The network's parameters, the loss's value and its gradient for each of them."""
    params = net.parameters()
    loss.backward(inputs=params)
    got = tl.evaluate([loss, *(p.grad for p in params)], bounds={"I": 1})
    return params, got[0], got[1:]


def test_loss_gradient_equals_the_torch_trainers(tiny_corpus):
    torch = pytest.importorskip("torch")
    from timerl.graphopt.train import TorchPolicy

    problems = GraphProblems(GraphPolicyConfig(corpus=str(tiny_corpus), num_envs=3))
    weights = PolicyWeights.random(8, 2, seed=1)
    ks = [0, 3, 4]  # peak memory and running time problems: different used outputs
    x, *edges, mask, cols = problems.batch_arrays(ks)
    rng = np.random.default_rng(0)
    z = rng.standard_normal((3, problems.nodes, 7)).astype(np.float32)
    adv = np.array([0.3, -0.1, 0.05], dtype=np.float32)
    entropy = 0.01
    with _network_on(weights, x, edges, mask) as (net, pi, mean):
        loss = policy_loss(
            mean,
            pi.log_std(),
            tl.from_numpy(mask),
            tl.from_numpy(cols),
            tl.from_numpy(z),
            tl.from_numpy(adv),
            entropy,
        )
        params, got_loss, grads = _loss_and_grads(net, loss)

    ref = TorchPolicy(weights)
    norm = adv / (adv.std() + 1e-4)
    want = 0.0
    for b, k in enumerate(ks):
        task = problems.tasks[k]
        out = ref.forward(k, task.feats)
        lp = ref.mean_logp(out, torch.tensor(z[b, : task.problem.n]), used_columns(task.groups))
        want = want - lp * float(norm[b]) / len(ks)
    want = want - entropy * ref.log_std().sum()
    want.backward()
    assert math.isclose(float(got_loss[0]), want.item(), rel_tol=1e-4, abs_tol=1e-6)
    for p, g in zip(params, grads, strict=True):
        np.testing.assert_allclose(
            g[0], ref.params[p.name].grad.numpy(), rtol=2e-3, atol=1e-6, err_msg=p.name
        )


def _train(corpus, out, iterations, *extra):
    argv = ["graphopt", "train", "--engine", "program", "--corpus", str(corpus)]
    argv += ["--out", str(out), "--iterations", str(iterations), "--budget", "30"]
    argv += ["--batch", "2", "--hidden", "8", "--rounds", "2", "--checkpoint-every", "1"]
    assert main([*argv, *extra]) == 0


def test_trains_resumes_exactly_and_exports_weights(tiny_corpus, tmp_path, capsys):
    _train(tiny_corpus, tmp_path / "whole.npz", 3)
    _train(tiny_corpus, tmp_path / "cut.npz", 1)
    _train(tiny_corpus, tmp_path / "cut.npz", 3, "--resume")
    whole = PolicyWeights.load(tmp_path / "whole.npz")
    cut = PolicyWeights.load(tmp_path / "cut.npz")
    assert (whole.hidden, whole.rounds) == (8, 2)
    init = PolicyWeights.random(8, 2, seed=0)
    assert any(not np.array_equal(whole.params[k], init.params[k]) for k in init.params)
    for k in whole.params:
        assert np.array_equal(whole.params[k], cut.params[k]), k
    metrics = (tmp_path / "whole.run" / "metrics.csv").read_text().splitlines()
    assert len(metrics) == 4 and "reward" in metrics[0]
    # graphopt's own search reads the weights
    graph = tmp_path / "g.json"
    random_graph(30, seed=9).save(graph)
    args = ["graphopt", "optimize", str(graph), "--weights", str(tmp_path / "whole.npz")]
    assert main([*args, "--budget", "50"]) == 0
    assert "peak" in capsys.readouterr().out


def test_searches_in_two_processes_train_the_same_weights(tiny_corpus, tmp_path):
    _train(tiny_corpus, tmp_path / "one.npz", 2)
    _train(tiny_corpus, tmp_path / "two.npz", 2, "--workers", "2")
    one, two = PolicyWeights.load(tmp_path / "one.npz"), PolicyWeights.load(tmp_path / "two.npz")
    for k in one.params:
        assert np.array_equal(one.params[k], two.params[k]), k


def test_a_time_limit_writes_the_weights_reached(tiny_corpus, tmp_path):
    _train(tiny_corpus, tmp_path / "w.npz", 1000, "--minutes", "0.0001")
    rows = (tmp_path / "w.run" / "metrics.csv").read_text().splitlines()
    assert 2 <= len(rows) < 100  # the header and the few updates before the limit
    assert PolicyWeights.load(tmp_path / "w.npz").hidden == 8


def test_settings_the_program_lacks_are_refused_by_name(tiny_corpus, tmp_path, capsys):
    argv = ["graphopt", "train", "--engine", "program", "--corpus", str(tiny_corpus)]
    argv += ["--out", str(tmp_path / "w.npz"), "--iterations", "1"]
    assert main([*argv, "--ray-address", "auto"]) != 0
    assert "--ray-address auto: not implemented by --engine program" in capsys.readouterr().err
    assert main([*argv, "--reward", "decode", "--samples", "1"]) != 0
    assert "samples must be an integer >= 2" in capsys.readouterr().err
    assert main([*argv, "--batch", "1"]) != 0
    assert "at least 2" in capsys.readouterr().err
    with pytest.raises(GraphError, match="all equal"):
        from timerl.rl.graph_policy import graph_policy

        graph_policy(GraphPolicyConfig(corpus=str(tiny_corpus), hidden=(8, 16)))


def _imitate(corpus, tmp_path, engine, out, *extra):
    argv = ["graphopt", "train", "--engine", engine, "--corpus", str(corpus)]
    argv += ["--out", str(tmp_path / out), "--warm-start", "imitate", "--imitate-updates", "3"]
    argv += ["--imitate-budget", "100", "--batch", "2", "--hidden", "8", "--rounds", "2"]
    argv += ["--targets", str(tmp_path / "targets.npz"), "--checkpoint-every", "1"]
    argv += ["--budget", "30", "--imitate-scale", "0.5"]
    assert main([*argv, *extra]) == 0
    return PolicyWeights.load(tmp_path / out)


def test_imitation_program_takes_the_torch_trainers_steps(tiny_corpus, tmp_path):
    """Same initial network, same batches, same targets: after three Adam steps the two
    trainers' weights agree to float rounding, while each moved far more from the start."""
    pytest.importorskip("torch")
    by_torch = _imitate(tiny_corpus, tmp_path, "torch", "torch.npz", "--iterations", "0")
    by_program = _imitate(tiny_corpus, tmp_path, "program", "program.npz", "--iterations", "0")
    init = PolicyWeights.random(8, 2, seed=0)
    for k, want in by_torch.params.items():
        moved = np.abs(want - init.params[k]).max()
        assert k == "log_std" or moved > 1e-3, k
        np.testing.assert_allclose(by_program.params[k], want, atol=1e-6, rtol=0, err_msg=k)


def test_imitation_then_search_resumes_phase_by_phase(tiny_corpus, tmp_path):
    whole = _imitate(tiny_corpus, tmp_path, "program", "whole.npz", "--iterations", "2")
    _imitate(tiny_corpus, tmp_path, "program", "cut.npz", "--iterations", "0")
    cut = _imitate(tiny_corpus, tmp_path, "program", "cut.npz", "--iterations", "2", "--resume")
    assert (tmp_path / "cut.run" / "imitate" / "metrics.csv").is_file()
    assert (tmp_path / "cut.run" / "search" / "metrics.csv").is_file()
    for k in whole.params:
        assert np.array_equal(whole.params[k], cut.params[k]), k


def test_replayed_batches_enter_the_loss_with_their_own_advantages(tiny_corpus, tmp_path):
    """With a learning rate of 0 the network never changes, so every importance ratio is 1
    and a replayed batch adds exactly minus its mean advantage: the loss with two replayed
    iterations is the loss without, less the previous two iterations' mean advantages
    (none before there are any), over 3."""
    from timerl.rl.train import train

    base = {"corpus": str(tiny_corpus), "num_envs": 2, "budget": 30, "lr": 0.0, "hidden": [8, 8]}
    runs = {}
    for replay in (0, 2):
        out = tmp_path / f"r{replay}"
        train("graph-policy", {**base, "replay": replay}, iterations=5, log_dir=out, progress=False)
        runs[replay] = np.genfromtxt(out / "metrics.csv", delimiter=",", names=True)
    plain, replayed = runs[0], runs[2]
    np.testing.assert_array_equal(plain["reward"], replayed["reward"])
    entropy = 1e-3 * 7 * math.log(0.5)  # entropy x sum(log_std) at the initial log_std
    for i in range(5):
        earlier = sum(plain["advantage"][i - b] for b in (1, 2) if i - b >= 0)
        want = (plain["loss"][i] + entropy - earlier) / 3 - entropy
        assert math.isclose(replayed["loss"][i], want, rel_tol=1e-5, abs_tol=1e-6), i


def test_running_baseline_is_graphopt_trainers_running_mean():
    """Per problem: the first reward sets the baseline, each later one moves it by 0.1 (as
    ``graphopt.train`` keeps it); the advantage reads it before this iteration's update."""
    from timerl.rl.graph_policy import running_baseline

    rng = np.random.default_rng(0)
    iters, batch, problems = 6, 2, 3
    picks = rng.integers(problems, size=(iters, batch))
    picks[:, 1] = (picks[:, 0] + 1) % problems  # no problem twice in one batch
    rewards = rng.standard_normal((iters, batch)).astype(np.float32)
    onehot = np.eye(problems, dtype=np.float32)[picks]
    with tl.Context(dims=("i",)) as ctx:
        (i,) = ctx.dims
        before = running_baseline(
            tl.from_numpy(rewards, domain=(i,)), tl.from_numpy(onehot, domain=(i,)), i
        )
        got = tl.evaluate(before, bounds={"I": iters})
    base = np.full(problems, np.nan)
    for it in range(iters):
        want = [0.0 if np.isnan(base[k]) else base[k] for k in picks[it]]
        np.testing.assert_allclose(got[it], want, rtol=1e-6, atol=1e-7)
        for k, r in zip(picks[it], rewards[it], strict=True):
            base[k] = r if np.isnan(base[k]) else 0.9 * base[k] + 0.1 * r


def test_decode_loss_and_its_gradient_equal_the_torch_trainers(tiny_corpus):
    """The decode reward's loss on the same keys and rewards: per problem, the keys' Beta
    log-density over its own genes (its nodes, its key groups) weighted by the reward
    against its other samples, plus the entropy; ``graphopt.train.decode_loss``'s terms."""
    torch = pytest.importorskip("torch")
    from timerl.graphopt.train import TorchPolicy
    from timerl.graphopt.train import beta_params as torch_beta_params

    problems = GraphProblems(GraphPolicyConfig(corpus=str(tiny_corpus), num_envs=3))
    weights = PolicyWeights.random(8, 2, seed=4)
    ks = [0, 3, 4]  # peak memory (one key group) and running time (three): different genes
    x, *edges, mask, cols = problems.batch_arrays(ks)
    samples, n = 5, problems.nodes
    rng = np.random.default_rng(2)
    keys = rng.uniform(0.01, 0.99, (3, samples, n, 3)).astype(np.float32)
    reward = rng.standard_normal((3, samples)).astype(np.float32)
    entropy = 0.01
    with _network_on(weights, x, edges, mask) as (net, _, mean):
        a, b = beta_params(mean)
        loss = decode_loss(
            a,
            b,
            tl.from_numpy(mask),
            tl.from_numpy(cols),
            tl.from_numpy(keys),
            tl.from_numpy(reward),
            entropy,
        )
        params, got_loss, grads = _loss_and_grads(net, loss)

    ref = TorchPolicy(weights)
    want = 0.0
    for row, k in enumerate(ks):
        task = problems.tasks[k]
        ta, tb = torch_beta_params(torch, ref.forward(k, task.feats), task.groups)
        groups = [c // 2 for c in key_columns(task.groups)]
        rows = np.concatenate([keys[row, :, : task.problem.n, g] for g in groups], axis=1)
        r = reward[row].astype(np.float64)
        adv = (r - r.mean()) / (r.std() + 1e-4)
        dist = torch.distributions.Beta(ta, tb)
        logp = dist.log_prob(torch.tensor(rows)).mean(dim=1)
        term = (torch.tensor(adv, dtype=torch.float32) * logp).mean()
        want = want - (term + entropy * dist.entropy().mean()) / len(ks)
    want.backward()
    assert math.isclose(float(got_loss[0]), want.item(), rel_tol=1e-4, abs_tol=1e-6)
    for p, g in zip(params, grads, strict=True):
        grad = ref.params[p.name].grad  # None: the loss does not read it (the Gaussian's std)
        expected = np.zeros_like(g[0]) if grad is None else grad.numpy()
        np.testing.assert_allclose(g[0], expected, rtol=2e-3, atol=1e-6, err_msg=p.name)


def test_the_decode_reward_trains_resumes_exactly_and_exports_weights(tiny_corpus, tmp_path):
    decode = ("--reward", "decode", "--samples", "4")
    _train(tiny_corpus, tmp_path / "whole.npz", 3, *decode)
    _train(tiny_corpus, tmp_path / "cut.npz", 1, *decode)
    _train(tiny_corpus, tmp_path / "cut.npz", 3, *decode, "--resume")
    whole = PolicyWeights.load(tmp_path / "whole.npz")
    cut = PolicyWeights.load(tmp_path / "cut.npz")
    init = PolicyWeights.random(8, 2, seed=0)
    assert any(not np.array_equal(whole.params[k], init.params[k]) for k in init.params)
    for k in whole.params:
        assert np.array_equal(whole.params[k], cut.params[k]), k
    assert set(whole.meta["objectives"]) == {"peak-memory", "runtime"}
    header, *rows = (tmp_path / "whole.run" / "metrics.csv").read_text().splitlines()
    assert len(rows) == 3 and "reward" in header
