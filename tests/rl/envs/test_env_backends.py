"""envpool as an env backend, MuJoCo through gymnasium, and the new algorithms on the CLI."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import timerl as tl
from timerl.cli import main
from timerl.errors import EnvError
from timerl.rl.envs import make_env


def test_envpool_keeps_the_same_step_reset_contract():
    pytest.importorskip("envpool")
    env = make_env("CartPole-v1", 4, seed=0, backend="envpool")
    ref = make_env("CartPole-v1", 4, seed=0)
    assert (env.obs_shape, env.num_actions, env.discrete) == (ref.obs_shape, 2, True)
    obs = env.reset()
    assert obs.shape == (4, 4) and obs.dtype == np.float32
    ended = 0
    for step in range(200):
        prev = obs
        obs, reward, done = env.step(np.full(4, step % 3 == 0, dtype=np.int64))
        np.testing.assert_array_equal(reward, 1.0)
        if done.any():
            ended += int(done.sum())
            np.testing.assert_array_equal(env.terminated, done)
            # the returned obs already start new episodes; final_obs holds where they fell
            assert (np.abs(obs[done]) < 0.05).all()
            assert (np.abs(env.final_obs[done][:, 2]) > 0.2).all()
            np.testing.assert_array_equal(env.final_obs[~done], obs[~done])
        else:
            assert np.abs(obs - prev).max() < 1.0  # continuing episodes move smoothly
    returns = env.completed_returns()
    assert ended >= 10 and len(returns) == ended
    assert (returns >= 8).all() and (returns < 100).all()
    env.close()
    ref.close()


def test_envpool_continuous_actions_and_seeding():
    pytest.importorskip("envpool")
    a = make_env("Pendulum-v1", 2, seed=3, backend="envpool")
    b = make_env("Pendulum-v1", 2, seed=3, backend="envpool")
    assert a.action_shape == (1,) and not a.discrete
    np.testing.assert_array_equal(a.reset(), b.reset())
    act = np.array([[5.0], [-0.5]], np.float32)  # 5 is clipped into the box [-2, 2]
    oa, ra, _ = a.step(act)
    ob, rb, _ = b.step(np.clip(act, -2, 2))
    np.testing.assert_array_equal(oa, ob)
    np.testing.assert_array_equal(ra, rb)


def test_env_backend_errors_are_clear(monkeypatch):
    with pytest.raises(EnvError, match="unknown env backend 'brax'"):
        make_env("CartPole-v1", 1, backend="brax")
    with pytest.raises(EnvError, match="Synthetic-v0 is a timerl env"):
        make_env("Synthetic-v0", 1, backend="envpool")
    if "envpool" in sys.modules or _has_envpool():
        with pytest.raises(EnvError, match="unknown envpool environment id 'CartPoel-v1'"):
            make_env("CartPoel-v1", 1, backend="envpool")
    monkeypatch.setitem(sys.modules, "envpool", None)  # as if the extra were not installed
    with pytest.raises(EnvError, match=r'pip install "timerl\[envpool\]"'):
        make_env("CartPole-v1", 1, backend="envpool")


def _has_envpool() -> bool:
    try:
        import envpool  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


def test_mujoco_halfcheetah_through_gymnasium_trains():
    pytest.importorskip("mujoco")
    env = make_env("HalfCheetah-v5", 2, seed=0)
    assert env.obs_shape == (17,) and env.action_shape == (6,)
    env.close()
    from timerl.rl.train import train

    cfg = {"env_id": "HalfCheetah-v5", "num_envs": 2, "num_steps": 16, "hidden": [16]}
    cfg.update({"epochs": 1, "minibatches": 2})
    res = train("ppo", cfg, iterations=2, progress=False)
    assert res.env_steps == 64
    assert res.iterations == 2


def test_missing_mujoco_names_the_extra(monkeypatch):
    gym = pytest.importorskip("gymnasium")

    def refuse(*args, **kwargs):
        raise gym.error.DependencyNotInstalled(
            'MuJoCo is not installed, run `pip install "mujoco"`'
        )

    monkeypatch.setattr(gym, "make", refuse)
    with pytest.raises(EnvError, match=r"timerl\[mujoco\]"):
        make_env("HalfCheetah-v5", 1)


@pytest.mark.parametrize(
    ("algo", "env_id", "extra"),
    [
        ("dqn", "CartPole-v1", []),
        ("a2c", "CartPole-v1", ["--num-steps", "8"]),
        ("sac", "Pendulum-v1", ["--num-steps", "4"]),
        ("ppo", "CartPole-v1", ["--env-backend", "envpool", "--num-steps", "8"]),
    ],
)
def test_cli_trains_every_algorithm(algo, env_id, extra, tmp_path, capsys):
    if "envpool" in extra:
        pytest.importorskip("envpool")
    args = ["train", algo, "--env", env_id, "--steps", "64", "--num-envs", "2", "--no-progress"]
    code = main([*args, *extra, "--log-dir", str(tmp_path / algo)])
    assert code == 0
    out = capsys.readouterr().out
    assert f"{algo} on {env_id}" in out
    assert (tmp_path / algo / "metrics.csv").read_text().count("\n") >= 2


def test_dqn_and_sac_reject_the_wrong_action_space():
    from timerl.rl.algos.dqn import dqn
    from timerl.rl.algos.sac import sac

    with pytest.raises(EnvError, match="DQN needs discrete actions"):
        dqn(env_id="Pendulum-v1", num_envs=1)
    with pytest.raises(EnvError, match="SAC needs a flat Box action space"):
        sac(env_id="CartPole-v1", num_envs=1)
    with pytest.raises(tl.ProgramError, match="batch_size must be at least 1"):
        dqn(batch_size=0)
