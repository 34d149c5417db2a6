"""The baselines run, report sane measurements, and (small, seeded runs) actually learn."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `bench` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench.common import BaselineUnavailable, Config, timing_summary  # noqa: E402

pytest.importorskip("torch")


def _mean(values):
    values = [v for v in values if not math.isnan(v)]
    return float(np.mean(values))


def _check_measurements(result, iterations):
    assert result.env_steps_per_s > 0 and result.seconds_per_iteration > 0
    assert result.setup_s >= 0 and result.peak_rss_bytes > 0
    assert len(result.returns) == iterations
    assert result.total_env_steps == result.config["num_envs"] * result.config["num_steps"] * (
        iterations
    )


def test_torch_ppo_learns_cartpole():
    from bench.baselines import torch_ppo

    cfg = Config("CartPole-v1", num_envs=8, num_steps=128, iterations=14, epochs=4, minibatches=4)
    result = torch_ppo.run(cfg)
    _check_measurements(result, 14)
    first, last = _mean(result.returns[:3]), _mean(result.returns[-3:])
    assert first < 40 and last > 2 * first, result.returns


def test_torch_ppo_continuous_full_batch_runs():
    from bench.baselines import torch_ppo

    cfg = Config("Synthetic-v0", num_envs=4, num_steps=50, iterations=6, hidden_layers=1)
    cfg.env_kwargs = {"obs_shape": (2, 3), "episode_length": 50}
    result = torch_ppo.run(cfg)
    _check_measurements(result, 6)
    assert all(math.isfinite(r) and r < 0 for r in result.returns)


def test_torch_reinforce_learns_cartpole():
    from bench.baselines import torch_reinforce

    cfg = Config("CartPole-v1", num_envs=16, num_steps=256, iterations=20)
    result = torch_reinforce.run(cfg)
    _check_measurements(result, 20)
    first, last = _mean(result.returns[:3]), _mean(result.returns[-3:])
    assert last > 1.5 * first, result.returns
    plain = torch_reinforce.run(Config("CartPole-v1", num_envs=4, num_steps=32, iterations=2,
                                       value_baseline=False))  # fmt: skip
    assert plain.baseline.endswith("nobaseline") and plain.env_steps_per_s > 0


@pytest.mark.parametrize(
    ("env_id", "scan", "epochs", "minibatches"),
    [("Synthetic-v0", False, 1, 2), ("CartPole-v1", True, 1, 1)],
)
def test_jax_ppo_runs(env_id, scan, epochs, minibatches):
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    from bench.baselines import jax_ppo

    cfg = Config(env_id, num_envs=4, num_steps=64, iterations=3, epochs=epochs,
                 minibatches=minibatches, hidden_layers=1)  # fmt: skip
    if env_id == "Synthetic-v0":
        cfg.env_kwargs = {"obs_shape": (3, 2), "episode_length": 32}
    result = jax_ppo.run(cfg, scan_iterations=scan)
    _check_measurements(result, 3)
    assert all(math.isfinite(r) for r in result.returns), result.returns


def test_jax_ppo_records_the_observation_each_action_was_taken_on():
    """The rollout pairs an action with the observation the policy saw, not the next one."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("optax")
    from bench.baselines import jax_ppo
    from timerl.rl.envs.jax_envs import make_jax_env

    cfg = Config("CartPole-v1", num_envs=4, num_steps=8, hidden_layers=1)
    env = make_jax_env("CartPole-v1", num_envs=4, seed=0)
    keys = jax.random.split(jax.random.key(0), 3)
    params = {
        "actor": jax_ppo.init_mlp(keys[0], 4, 2, 1, 64, 0.01),
        "critic": jax_ppo.init_mlp(keys[1], 4, 1, 1, 64, 1.0),
    }
    state, obs = env.reset(keys[2], env.params)
    zero = jax.numpy.zeros(4)
    carry = (params, state, obs, keys[2], zero, 0.0, 0.0)
    carry, traj = jax.lax.scan(jax_ppo.make_env_step(cfg, env), carry, None, length=8)
    np.testing.assert_array_equal(traj["obs"][0], obs)
    for t in range(7):  # each step's observation is where the previous step left the env
        state, obs, _, _ = env.step(state, traj["actions"][t], env.params)
        np.testing.assert_allclose(traj["obs"][t + 1], obs, rtol=1e-5, atol=1e-6)


def test_sb3_skips_cleanly_or_runs():
    from bench.baselines import sb3_ppo

    cfg = Config("CartPole-v1", num_envs=2, num_steps=32, iterations=2)
    if importlib.util.find_spec("stable_baselines3") is None:
        with pytest.raises(BaselineUnavailable, match="not installed"):
            sb3_ppo.run(cfg)
        assert sb3_ppo.main(["--iterations", "1"]) == 3
    else:
        _check_measurements(sb3_ppo.run(cfg), 2)


def test_command_line_prints_result(capsys):
    from bench.baselines import torch_ppo

    argv = ["--env", "Synthetic-v0", "--obs-shape", "2x2", "--num-envs", "2", "--num-steps", "8"]
    assert torch_ppo.main([*argv, "--iterations", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[0])
    assert out["config"]["env_kwargs"]["obs_shape"] == [2, 2] and out["env_steps_per_s"] > 0


def test_config_defaults_and_timing():
    cfg = Config("CartPole-v1").resolved()
    assert cfg.lr == 2.5e-3 and cfg.entropy_coef(True) == 0.01 and cfg.entropy_coef(False) == 0.0
    assert Config("Synthetic-v0").resolved().env_kwargs["episode_length"] == 250
    with pytest.raises(ValueError, match="must divide"):
        Config("CartPole-v1", num_envs=3, num_steps=5, minibatches=4).resolved()
    steps_per_s, per_iter, first = timing_summary([5.0, 1.0, 3.0], batch_size=100)
    assert (steps_per_s, per_iter, first) == (50.0, 2.0, 5.0)
