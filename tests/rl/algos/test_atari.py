"""Atari through envpool: ``--env Pong-v5`` alone picks envpool, CleanRL's Atari settings and a
CNN policy over uint8 frames; ``--policy`` overrides the network."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("envpool")

from timerl.rl.algos.policy_gradient import (  # noqa: E402
    CNNPolicy,
    Policy,
    PPOConfig,
    default_config,
    ppo,
)

TINY = {"num_envs": 2, "num_steps": 8, "minibatches": 2, "epochs": 1}


def _config(**overrides):
    return PPOConfig(env_id="Pong-v5", **{**default_config("ppo", "Pong-v5"), **TINY, **overrides})


def test_pong_defaults_are_cleanrl_atari_settings():
    cfg = default_config("ppo", "Pong-v5")
    assert cfg["env_backend"] == "envpool"
    assert cfg["env_kwargs"] == {"episodic_life": True, "reward_clip": True}
    want = {"lr": 2.5e-4, "anneal_lr": True, "clip": 0.1, "ent_coef": 0.01, "num_envs": 8}
    assert {k: cfg[k] for k in want} == want
    assert (cfg["num_steps"], cfg["epochs"], cfg["minibatches"]) == (128, 4, 4)
    assert default_config("ppo", "CartPole-v1") == {}


def test_pong_gets_a_cnn_over_uint8_frames_and_mlp_overrides_it():
    algo = ppo(_config())
    assert algo.env.obs_shape == (4, 84, 84)
    assert algo.rollout["obs"].dtype == np.uint8
    assert any("nature" in p.name for p in algo.params)
    mlp = ppo(_config(policy="mlp"))
    assert not any("nature" in p.name for p in mlp.params)
    assert CNNPolicy is not Policy


def test_a_cnn_for_flat_observations_is_refused():
    from timerl.errors import EnvError

    with pytest.raises(EnvError, match="CNN policy needs image observations"):
        ppo(PPOConfig(env_id="CartPole-v1", policy="cnn"))


def test_train_ppo_on_pong_without_extra_flags_runs(tmp_path, capsys):
    """The command line with only --env (and a tiny batch): envpool, uint8 frames, a CNN."""
    from timerl.cli import main

    argv = ["train", "ppo", "--env", "Pong-v5", "--steps", "32", "--no-progress"]
    argv += ["--num-envs", "2", "--num-steps", "8", "--minibatches", "2", "--epochs", "1"]
    assert main(argv) == 0
    assert "ppo on Pong-v5: 2 iterations, 32 env steps" in capsys.readouterr().out


def test_only_envpool_atari_ids_count_as_atari():
    from timerl.rl.envs.vector import envpool_atari

    assert envpool_atari("Pong-v5") and envpool_atari("Breakout-v5")
    assert not envpool_atari("HalfCheetah-v5") and not envpool_atari("CartPole-v1")
    assert default_config("ppo", "HalfCheetah-v5")["lr"] == 3e-4  # MuJoCo's own defaults
