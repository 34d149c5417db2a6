"""Short, seeded runs of DQN, A2C and SAC that must clearly beat where they started."""

from __future__ import annotations

import math

import numpy as np
import pytest

from timerl.rl.train import train


def _finite(records, keys):
    for rec in records:
        for key in keys:
            assert math.isfinite(rec[key]), (key, rec)


@pytest.mark.slow
def test_dqn_learns_cartpole():
    records = []
    cfg = {
        "env_id": "CartPole-v1",
        "learning_starts": 1000,
        "buffer_size": 10_000,
        "anneal_lr": False,
        "seed": 0,
    }
    res = train("dqn", cfg, iterations=130, progress=False, on_iteration=records.append)
    returns = np.array(res.returns)
    _finite(records, ("loss", "q_mean", "epsilon"))
    # a random CartPole policy scores about 20; epsilon starts at 1 (all random)
    assert returns[:3].mean() < 40, returns
    assert records[0]["epsilon"] == 1.0 and records[-1]["epsilon"] == pytest.approx(0.01)
    assert returns[-10:].mean() > 100, returns
    # Q-values grow toward the discounted return of long episodes
    assert records[-1]["q_mean"] > 5 * max(records[10]["q_mean"], 1.0)


@pytest.mark.slow
def test_a2c_learns_cartpole():
    records = []
    cfg = {"env_id": "CartPole-v1", "seed": 0}
    res = train("a2c", cfg, iterations=120, progress=False, on_iteration=records.append)
    returns = np.array(res.returns)
    _finite(records, ("loss", "policy_loss", "value_loss", "entropy"))
    assert returns[:3].mean() < 40, returns
    # 120 iterations are ~20k steps: seeds 0-3 end at 75-101 (a random policy scores ~20)
    assert returns[-10:].mean() > 60 and returns[-10:].mean() > 3 * returns[:3].mean(), returns
    assert records[-1]["entropy"] < records[0]["entropy"]


# A small continuous-control task: the 4-number observation is a linear image of the distance
# to a target that the 1-d action moves; random actions score about -45 per 50-step episode.
SAC_SYNTHETIC = {
    "env_id": "Synthetic-v0",
    "env_kwargs": {"obs_shape": [4], "episode_length": 50},
    "hidden": [32, 32],
    "batch_size": 64,
    "learning_starts": 256,
    "gamma": 0.9,
    "init_alpha": 0.05,
    "lr": 3e-3,
    "policy_lr": 1e-3,
    "seed": 0,
}


@pytest.mark.slow
def test_sac_learns_a_small_continuous_task():
    records = []
    res = train("sac", SAC_SYNTHETIC, iterations=56, progress=False, on_iteration=records.append)
    returns = np.array([r for r in res.returns if math.isfinite(r)])
    _finite(records[10:], ("q_loss", "actor_loss", "alpha_loss", "entropy", "alpha"))
    first, last = returns[:2].mean(), returns[-3:].mean()
    assert first < -30, returns
    assert last > -15 and last > first + 25, returns
    # the temperature adapts (falls) from its initial value once learning starts
    assert records[-1]["alpha"] < 0.05


class _Stop(Exception):
    pass


def _stop_at(iteration):
    def hook(record):
        if record["iteration"] == iteration:
            raise _Stop

    return hook


@pytest.mark.parametrize(
    ("algo", "cfg"),
    [
        ("dqn", {"env_id": "CartPole-v1", "learning_starts": 32, "hidden": [16]}),
        ("sac", {"env_id": "Pendulum-v1", "learning_starts": 32, "hidden": [8]}),
    ],
)
def test_replay_state_survives_resume_bit_for_bit(algo, cfg, tmp_path):
    """The replay ring is program state like the weights: a resumed run must continue from
    it exactly (the ring wraps before the checkpoint: a window of 4 iterations)."""
    cfg = dict(cfg, num_envs=2, num_steps=8, buffer_size=64, batch_size=16)
    cfg["updates_per_iteration"] = 2
    n = 10
    full = train(
        algo, cfg, iterations=n, log_dir=tmp_path / "a", checkpoint_every=5, progress=False
    )
    with pytest.raises(_Stop):
        train(
            algo,
            cfg,
            iterations=n,
            log_dir=tmp_path / "b",
            checkpoint_every=5,
            progress=False,
            on_iteration=_stop_at(6),
        )
    resumed = train(algo, None, log_dir=tmp_path / "b", resume=True, progress=False)
    assert len(resumed.returns) == n
    np.testing.assert_array_equal(resumed.returns, full.returns)
    rows = [(tmp_path / d / "metrics.csv").read_text().splitlines() for d in ("a", "b")]
    loss = "loss" if algo == "dqn" else "q_loss"
    header = rows[0][0].split(",")
    col = header.index(loss)
    assert [r.split(",")[col] for r in rows[0][1:]] == [r.split(",")[col] for r in rows[1][1:]]
