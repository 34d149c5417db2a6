"""gymnax's envs on the host (``make_env("gymnax:<id>")``): the trajectories of the pure JAX
env a program steps with the same seed, episode returns counted as every host env counts
them, an exact resume, and runs trained with the env inside the program evaluated by
``timerl eval``."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from timerl.errors import EnvError
from timerl.rl.envs import make_env

jax = pytest.importorskip("jax")
gymnax = pytest.importorskip("gymnax")

from timerl.rl.envs.gymnax_host import GymnaxVectorEnv  # noqa: E402
from timerl.rl.envs.jax_envs import make_jax_env  # noqa: E402
from timerl.rl.envs.program import Env  # noqa: E402

CARTPOLE = "gymnax:CartPole-v1"
BREAKOUT = "gymnax:Breakout-MinAtar"


def _pure_rollout(env_id, num_envs, seed, actions):
    """Observations, rewards and dones of the pure env, called op by op (no jit), from the
    key a program's reset uses for ``seed``."""
    jenv = make_jax_env(env_id, num_envs, seed)
    with jax.enable_x64(False):
        state, obs = jenv.reset(jax.random.key(seed), jenv.params)
        out = [np.asarray(obs)]
        rewards, dones = [], []
        for a in actions:
            state, obs, reward, done = jenv.step(state, jax.numpy.asarray(a), jenv.params)
            out.append(np.asarray(obs))
            rewards.append(np.asarray(reward))
            dones.append(np.asarray(done))
    return np.stack(out), np.stack(rewards), np.stack(dones)


def _host_rollout(env, actions):
    obs = [env.reset()]
    rewards, dones = [], []
    for a in actions:
        o, r, d = env.step(a)
        obs.append(o)
        rewards.append(r)
        dones.append(d)
    return np.stack(obs), np.stack(rewards), np.stack(dones)


def test_the_host_env_replays_the_pure_env_for_the_same_seed_and_actions():
    actions = np.random.default_rng(0).integers(0, 2, (300, 4))
    env = make_env(CARTPOLE, num_envs=4, seed=3)
    assert isinstance(env, GymnaxVectorEnv)
    assert (env.obs_shape, env.discrete, env.num_actions, env.action_shape) == ((4,), True, 2, ())
    obs, rewards, dones = _host_rollout(env, actions)
    want_obs, want_rewards, want_dones = _pure_rollout(CARTPOLE, 4, 3, actions.astype(np.int32))
    assert dones.sum() > 20  # random pushes end many episodes: the auto-resets are compared too
    np.testing.assert_array_equal(dones, want_dones)
    np.testing.assert_array_equal(rewards, want_rewards)
    # jit may fuse float ops where op-by-op calls do not (equal to the bit on x86 here)
    np.testing.assert_allclose(obs, want_obs, rtol=1e-6, atol=1e-7)
    assert obs.dtype == np.float32 and rewards.dtype == np.float32 and dones.dtype == bool


def test_time_limit_ends_are_truncations_with_the_last_observation_kept():
    """Pendulum's episodes end only at gymnax's 200-step limit: off-policy learners must
    bootstrap there, from the ended episode's last observation, not the next one's first."""
    env = make_env("gymnax:Pendulum-v1", num_envs=2, seed=0)
    env.reset()
    previous = None
    for step in range(200):
        obs, _, done = env.step(np.zeros((2, 1), np.float32))
        if step < 199:
            assert not done.any() and env.final_obs is None
            previous = obs
    assert done.all() and env.truncated.all() and not env.terminated.any()
    final = env.final_obs
    assert final is not None and not np.allclose(final, obs)  # obs starts the next episode
    # the last step moved on from the previous observation (cos, sin of the angle stay unit)
    np.testing.assert_allclose(np.hypot(final[:, 0], final[:, 1]), 1.0, rtol=1e-5)
    assert not np.allclose(final, previous)


def test_a_fallen_pole_is_terminated_and_its_last_observation_is_past_the_threshold():
    env = make_env(CARTPOLE, num_envs=1, seed=0)
    env.reset()
    for _ in range(100):  # pushing one way drops the pole within a few dozen steps
        obs, _, done = env.step(np.ones(1, np.int64))
        if done[0]:
            break
    assert done[0] and env.terminated[0] and not env.truncated[0]
    final = env.final_obs[0]
    assert abs(final[2]) > 12 * 2 * math.pi / 360 or abs(final[0]) > 2.4
    assert abs(obs[0, 2]) < 0.05  # the next episode's first observation


def test_minatar_planes_come_channels_last_as_the_pure_env_gives_them():
    actions = np.random.default_rng(1).integers(0, 3, (60, 2))
    env = make_env(BREAKOUT, num_envs=2, seed=5)
    assert env.obs_shape == (10, 10, 4) and env.image_layout == "HWC"
    assert Env(env).image_layout == "HWC"  # what --policy auto reads in a program
    obs, rewards, dones = _host_rollout(env, actions)
    want = _pure_rollout(BREAKOUT, 2, 5, actions.astype(np.int32))
    for have, expected in zip((obs, rewards, dones), want, strict=True):
        np.testing.assert_array_equal(have, expected)


def test_a_seed_fixes_every_reset_and_later_resets_see_new_episodes():
    a, b = make_env(CARTPOLE, 3, seed=11), make_env(CARTPOLE, 3, seed=11)
    first = a.reset()
    np.testing.assert_array_equal(first, b.reset())
    assert not np.array_equal(first, make_env(CARTPOLE, 3, seed=12).reset())
    second = a.reset()
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(second, b.reset())


def test_completed_returns_are_the_ended_episodes_sums():
    env = make_env(CARTPOLE, num_envs=3, seed=0)
    env.reset()
    rng = np.random.default_rng(2)
    running = np.zeros(3)
    want: list[float] = []
    got: list[float] = []
    for _ in range(200):
        _, reward, done = env.step(rng.integers(0, 2, 3))
        running += reward
        want.extend(running[done].tolist())
        running[done] = 0.0
        got.extend(env.completed_returns().tolist())
    assert len(want) > 10 and got == want
    # CartPole pays 1 a step: each return is its episode's length
    env2 = make_env(CARTPOLE, num_envs=3, seed=0)
    env2.reset()
    rng = np.random.default_rng(2)
    for _ in range(200):
        env2.step(rng.integers(0, 2, 3))
    np.testing.assert_array_equal(env2.completed_lengths(), np.asarray(want))


def test_a_state_dict_continues_the_episodes_exactly():
    rng = np.random.default_rng(4)
    actions = rng.integers(0, 2, (80, 2))
    env = make_env(CARTPOLE, num_envs=2, seed=7)
    env.reset()
    for a in actions[:40]:
        env.step(a)
    saved = env.state_dict()
    again = make_env(CARTPOLE, num_envs=2, seed=7)
    again.load_state_dict(saved)
    for a in actions[40:]:
        for have, want in zip(again.step(a), env.step(a), strict=True):
            np.testing.assert_array_equal(have, want)
    np.testing.assert_array_equal(again.completed_returns(), env.completed_returns())


def test_bad_requests_are_clear_errors(monkeypatch):
    with pytest.raises(EnvError, match="no gymnax environment 'Cartpole-v1'"):
        make_env("gymnax:Cartpole-v1")
    with pytest.raises(EnvError, match="gymnax env: env backend 'envpool' does not apply"):
        make_env(CARTPOLE, backend="envpool")
    with pytest.raises(EnvError, match="gymnax:CartPole-v1: gymnax environments draw no frames"):
        make_env(CARTPOLE, render_mode="rgb_array")
    env = make_env(CARTPOLE, num_envs=2)
    with pytest.raises(EnvError, match="call reset"):
        env.step([0, 1])
    env.reset()
    with pytest.raises(EnvError, match=r"discrete actions must lie in \[0, 2\)"):
        env.step([0, 2])
    monkeypatch.setitem(sys.modules, "gymnax", None)  # import fails as if not installed
    with pytest.raises(EnvError, match=r"timerl\[gymnax\]"):
        make_env(CARTPOLE)


def test_box_actions_are_clipped_into_the_bounds():
    env = make_env("gymnax:Pendulum-v1", num_envs=2, seed=0)
    assert not env.discrete and env.action_shape == (1,)
    np.testing.assert_array_equal(env.action_high, [2.0])
    env.reset()
    clipped = env.step([[50.0], [-50.0]])
    fresh = make_env("gymnax:Pendulum-v1", num_envs=2, seed=0)
    fresh.reset()
    for have, want in zip(clipped, fresh.step([[2.0], [-2.0]]), strict=True):
        np.testing.assert_array_equal(have, want)


def test_importing_timerl_and_its_envs_imports_no_jax():
    code = (
        "import sys, timerl, timerl.rl.envs, timerl.rl.train.evaluation\n"
        "assert 'jax' not in sys.modules and 'gymnax' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("env_id", "config"),
    [
        (CARTPOLE, {"num_envs": 4, "num_steps": 16, "hidden": (8,)}),
        # the MinAtar CNN over channels-last planes: the acting records' permute must fit
        (BREAKOUT, {"num_envs": 4, "num_steps": 8, "minibatches": 2, "epochs": 1}),
    ],
)
def test_a_run_trained_with_the_env_in_the_program_is_evaluated(env_id, config, tmp_path):
    from timerl.rl.train import train
    from timerl.rl.train.evaluation import evaluate_run

    run = tmp_path / "run"
    cfg = {"env_id": env_id, "env_backend": "jax", "epochs": 1, "minibatches": 1, **config}
    train("ppo", cfg, iterations=2, log_dir=run, progress=False, echo=lambda line: None)
    report = evaluate_run(run, episodes=2, deterministic=True)
    assert report.env_id == env_id and report.iteration == 1
    assert len(report.returns) == 2 and all(math.isfinite(r) for r in report.returns)
    if env_id == CARTPOLE:  # 1 a step, at most 500 steps
        assert all(r == int(r) and 1 <= r <= 500 for r in report.returns)
    # the same seed, the same episodes
    assert evaluate_run(run, episodes=2, deterministic=True).returns == report.returns
