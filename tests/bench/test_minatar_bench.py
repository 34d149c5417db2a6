"""The MinAtar case of ``bench.rl``: timerl on jax against the jitted JAX PPO, both with the
MinAtar CNN over gymnax's Breakout-MinAtar (the baseline's own network, written in JAX)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("gymnax")

from bench import rl  # noqa: E402
from bench.common import Config  # noqa: E402
from bench.timerl_runner import timerl_config  # noqa: E402


def test_minatar_case_runs_timerl_jax_against_jax_ppo_only():
    (case,) = [c for c in rl.all_cases(quick=True) if c.label == "minatar-breakout"]
    names = ["timerl_numpy", "timerl_jax", "torch_ppo", "jax_ppo", "torch_ppo_atari"]
    assert [s.name for s in rl.systems_for(case, names, rl.SYSTEMS)] == ["timerl_jax", "jax_ppo"]
    cfg = timerl_config(case.config, backend="jax")
    assert (cfg["env_backend"], cfg["policy"], cfg["num_envs"], cfg["num_steps"]) == (
        "jax",
        "cnn",
        64,
        128,
    )
    assert (cfg["epochs"], cfg["minibatches"], cfg["lr"], cfg["clip"]) == (4, 8, 5e-4, 0.2)


def test_jax_ppo_runs_the_minatar_cnn():
    import jax

    from bench.baselines import jax_ppo

    params = jax_ppo.init_minatar_cnn(jax.random.key(0), (10, 10, 4), 3)
    shapes = {k: tuple(tuple(a.shape) for a in v) for k, v in params.items()}
    # timerl's MinAtarCNN: conv (16, 4, 3, 3) and linear (16 * 8 * 8, 128), heads on 128
    assert shapes == {
        "conv": ((3, 3, 4, 16), (16,)),
        "dense": (((16 * 8 * 8), 128), (128,)),
        "pi": ((128, 3), (3,)),
        "v": ((128, 1), (1,)),
    }
    cfg = Config("gymnax:Breakout-MinAtar", num_envs=4, num_steps=16, iterations=2)
    cfg.epochs, cfg.minibatches, cfg.policy = 1, 2, "minatar_cnn"
    result = jax_ppo.run(cfg)
    assert result.total_env_steps == 2 * 4 * 16 and result.env_steps_per_s > 0
    assert len(result.returns) == 2 and not any(math.isinf(r) for r in result.returns)
