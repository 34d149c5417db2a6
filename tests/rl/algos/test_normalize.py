"""Observation normalisation and reward scaling as recurrences over the iteration dim."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as tl
from timerl.api.functional import rand, sink
from timerl.rl.algos.normalize import CLIP, EPS, running_moments
from timerl.rl.train import build, make_config
from timerl.rl.train.evaluation import ObsNormalizer, obs_normalizer, policy_spec

I = 4  # iterations run


def _collect(tensor, into):
    sink(tensor, lambda v, pt: into.__setitem__(tuple(pt.values()), np.array(v)))


def test_running_moments_are_numpys_over_every_batch_seen_and_normalise_by_the_formula():
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    got: dict[str, dict] = {k: {} for k in ("x", "mean", "var", "count", "y")}
    with ctx:
        # batches whose location and spread change with i, wide enough to reach the clip
        x = (rand((5, 3), key_at=(i,)) - 0.3) * (tl.full((), i, dtype="float32") + 1.0) * 40.0
        stats = running_moments(x, i, (3,), "x")
        y = stats.normalize(x * 3.0, i)
        for name, t in (("x", x), ("mean", stats.mean), ("var", stats.var)):
            _collect(t, got[name])
        _collect(stats.count, got["count"])
        _collect(y, got["y"])
    ctx.compile(bounds={"I": I}).run()
    np.testing.assert_array_equal(got["mean"][(0,)], np.zeros(3))
    np.testing.assert_array_equal(got["var"][(0,)], np.ones(3))
    assert got["count"][(0,)] == 0
    for k in range(1, I):
        seen = np.concatenate([got["x"][(j,)] for j in range(k)]).astype(np.float64)
        np.testing.assert_allclose(got["mean"][(k,)], seen.mean(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["var"][(k,)], seen.var(0), rtol=1e-5)
        assert got["count"][(k,)] == len(seen)
    clipped = 0
    for k in range(I):
        mean, var = got["mean"][(k,)], got["var"][(k,)]
        want = np.clip((got["x"][(k,)] * 3.0 - mean) / np.sqrt(var + np.float32(EPS)), -CLIP, CLIP)
        np.testing.assert_allclose(got["y"][(k,)], want, rtol=1e-5, atol=1e-6)
        clipped += int(np.sum(np.abs(want) == CLIP))
    assert clipped > 0  # the clip was exercised


CFG = {
    "env_id": "Pendulum-v1",
    "num_envs": 2,
    "num_steps": 8,
    "hidden": [8],
    "epochs": 2,
    "minibatches": 2,
    "gamma": 0.9,
    "norm_obs": True,
    "norm_reward": True,
}


@pytest.fixture(scope="module")
def ppo_run():
    """A small PPO program with both normalisations: its rollout, statistics and checkpoints."""
    program = build("ppo", CFG)
    ro = program.rollout
    got: dict[str, dict] = {k: {} for k in ("obs", "action", "logp", "reward", "done")}
    with program.ctx:
        for name in got:
            _collect(ro[name], got[name])
    prog = program.ctx.compile(bounds={"I": I, **program.bounds})
    ex = prog.executor()
    state: dict[int, dict[str, np.ndarray]] = {}
    ex.run(on_iteration=lambda k: state.__setitem__(k, prog.carried_state(ex.snapshot(), k)))
    return program, got, state


def _per_iteration(got, k, T):
    return np.stack([got[(k, t)] for t in range(T)])


def test_observation_statistics_are_numpys_over_every_observation_seen(ppo_run):
    _, got, state = ppo_run
    T = CFG["num_steps"]
    for k in range(I - 1):
        seen = np.concatenate([_per_iteration(got["obs"], j, T) for j in range(k + 1)])
        seen = seen.reshape(-1, 3).astype(np.float64)
        np.testing.assert_allclose(state[k]["obs_mean"], seen.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state[k]["obs_var"], seen.var(0), rtol=1e-4, atol=1e-6)
        assert state[k]["obs_count"] == len(seen)


def test_reward_scale_is_the_variance_of_the_discounted_return_carried_across_iterations(
    ppo_run,
):
    _, got, state = ppo_run
    T, gamma = CFG["num_steps"], CFG["gamma"]
    g = np.zeros(CFG["num_envs"])
    estimates = []
    keep = np.ones(CFG["num_envs"])
    for k in range(I - 1):
        for t in range(T):
            g = g * keep * gamma + got["reward"][(k, t)]
            keep = 1.0 - got["done"][(k, t)]
            estimates.append(g.copy())
        seen = np.concatenate(estimates)
        np.testing.assert_allclose(state[k]["return_var"], seen.var(), rtol=1e-4)


def test_the_policy_acts_on_the_normalised_input_that_eval_rebuilds_from_a_checkpoint(ppo_run):
    """The program's log-probabilities at iteration k + 1 equal those of the Gaussian
    ``timerl eval`` rebuilds from the state after iteration k, on the raw observations."""
    program, got, state = ppo_run
    T = CFG["num_steps"]
    assert program.obs_norm is not None
    for k in range(I - 1):
        header = {"obs_norm": program.obs_norm}
        norm = obs_normalizer(header, state[k])
        assert isinstance(norm, ObsNormalizer)
        spec = policy_spec(state[k], program.env.vec, "tanh", norm)
        obs = _per_iteration(got["obs"], k + 1, T).reshape(-1, 3)
        action = _per_iteration(got["action"], k + 1, T).reshape(-1, 1)
        mean = spec.forward(obs)
        log_std = spec.log_std.astype(np.float64)
        logp = (
            -0.5 * ((action - mean) / np.exp(log_std)) ** 2 - log_std - 0.5 * np.log(2 * np.pi)
        ).sum(-1)
        np.testing.assert_allclose(
            logp, _per_iteration(got["logp"], k + 1, T).reshape(-1), rtol=1e-4, atol=1e-4
        )
        # the statistics matter here: the raw observations give other actions
        raw = policy_spec(state[k], program.env.vec, "tanh").forward(obs)
        assert not np.allclose(raw, mean, atol=1e-3)


def test_a_checkpoint_missing_its_statistics_is_a_clear_error():
    header = {"obs_norm": {"mean": "obs_mean", "var": "obs_var", "eps": EPS, "clip": CLIP}}
    with pytest.raises(tl.errors.CheckpointError, match="obs_var"):
        obs_normalizer(header, {"obs_mean": np.zeros(3)})


def test_normalisation_is_on_for_mujoco_and_off_for_cartpole():
    for env_id in ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5"):
        cfg = make_config("ppo", {"env_id": env_id})
        assert cfg.norm_obs and cfg.norm_reward, env_id
    cfg = make_config("ppo", {"env_id": "CartPole-v1"})
    assert not cfg.norm_obs and not cfg.norm_reward
    assert build("ppo", {"num_envs": 2, "num_steps": 4, "hidden": [4]}).obs_norm is None


class _Stop(Exception):
    pass


def _stop_after(iteration):
    def cb(record):
        if record["iteration"] == iteration:
            raise _Stop

    return cb


def test_resume_with_normalisation_is_bit_for_bit(tmp_path):
    """Stopped after the checkpoint of iteration 1, resumed to 4: the statistics, parameters
    and every carried store equal the uninterrupted run's."""
    from timerl.rl.train import train
    from timerl.rl.train.checkpoint import latest_checkpoint, load_checkpoint

    opts = {"iterations": 4, "checkpoint_every": 2, "progress": False}
    full = train("ppo", CFG, log_dir=tmp_path / "full", **opts)
    with pytest.raises(_Stop):
        train("ppo", CFG, log_dir=tmp_path / "cut", on_iteration=_stop_after(1), **opts)
    resumed = train("ppo", None, log_dir=tmp_path / "cut", resume=True, **opts)
    a = load_checkpoint(latest_checkpoint(tmp_path / "full"))
    b = load_checkpoint(latest_checkpoint(tmp_path / "cut"))
    assert a.iteration == b.iteration == 3
    assert {"obs_mean", "obs_var", "obs_count", "return_var"} <= set(a.state)
    assert a.header["obs_norm"]["mean"] == "obs_mean"
    for name in a.state:
        np.testing.assert_array_equal(a.state[name], b.state[name], err_msg=name)
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name], err_msg=name)
    sa, sb = a.snapshot(), b.snapshot()
    assert sa.keys() == sb.keys()
    for k in sa:
        for p in sa[k]:
            np.testing.assert_array_equal(sa[k][p], sb[k][p], err_msg=f"store {k} at {p}")
    np.testing.assert_array_equal(resumed.returns, full.returns)
    keys = ("loss", "value_loss", "approx_kl", "reward_mean")
    rows = [[h[k] for k in keys] for h in b.header["history"]]
    assert rows == [[h[k] for k in keys] for h in a.header["history"]]
