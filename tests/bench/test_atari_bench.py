"""The Atari case of ``bench.rl``: its baseline is eager PyTorch with CleanRL's agent on the
same envpool batch, and the MLP baselines leave it alone."""

from __future__ import annotations

import pytest

pytest.importorskip("envpool")
pytest.importorskip("torch")

from bench import rl  # noqa: E402
from bench.common import Config  # noqa: E402
from bench.timerl_runner import timerl_config  # noqa: E402


def test_atari_case_runs_cleanrls_agent_and_not_the_mlp_baselines():
    (case,) = [c for c in rl.all_cases(quick=True) if c.label == "atari-pong"]
    names = ["timerl_numpy", "torch_ppo", "torch_ppo_atari"]
    chosen = [s.name for s in rl.systems_for(case, names, rl.SYSTEMS)]
    assert chosen == ["timerl_numpy", "torch_ppo_atari"]
    (other,) = [c for c in rl.all_cases(quick=True) if c.label == "cartpole-l2"]
    assert "torch_ppo_atari" not in [s.name for s in rl.systems_for(other, names, rl.SYSTEMS)]
    cfg = timerl_config(case.config)
    assert (cfg["env_backend"], cfg["policy"], cfg["clip"]) == ("envpool", "cnn", 0.1)
    assert cfg["env_kwargs"] == {"episodic_life": True, "reward_clip": True}


def test_the_eager_atari_baseline_trains_and_measures():
    from bench.baselines.torch_ppo_atari import run

    cfg = Config("Pong-v5", num_envs=2, num_steps=8, minibatches=2, iterations=2)
    result = run(cfg)
    assert result.total_env_steps == 32 and result.env_steps_per_s > 0
    assert result.peak_rss_bytes > 0
