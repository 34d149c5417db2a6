"""gymnax's envs as timerl's pure JAX envs (``env_id="gymnax:<id>"``, env backend "jax"): a
batch is gymnax's own single-env functions under ``vmap`` with one key per env; a PPO
program over one is one XLA program per iteration on jax and agrees with the numpy
reference; bad ids and a missing gymnax are clear errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from timerl.errors import EnvError
from timerl.rl import algos

jax = pytest.importorskip("jax")
gymnax = pytest.importorskip("gymnax")

from timerl.rl.envs.jax_envs import make_jax_env  # noqa: E402


def test_a_batch_is_gymnax_stepped_env_by_env():
    """Reset and three steps of a batch of 3: each env's observations, rewards and dones are
    those of gymnax's ``reset``/``step`` called alone with the keys the batch split."""
    import jax.numpy as jnp

    env = make_jax_env("gymnax:CartPole-v1", num_envs=3)
    assert (env.obs_shape, env.discrete, env.num_actions, env.action_shape) == ((4,), True, 2, ())
    single, params = gymnax.make("CartPole-v1")
    with jax.enable_x64(False):
        state, obs = env.reset(7, env.params)
        key, sub = jax.random.split(jax.random.key(7))
        keys = jax.random.split(sub, 3)
        alone = [single.reset(keys[k], params) for k in range(3)]
        np.testing.assert_array_equal(obs, np.stack([o for o, _ in alone]))
        states = [s for _, s in alone]
        for step in range(3):
            action = jnp.asarray([step % 2, 1, 0], dtype=jnp.int32)
            state, obs, reward, done = env.step(state, action, env.params)
            key, sub = jax.random.split(key)
            keys = jax.random.split(sub, 3)
            for k in range(3):
                out = single.step(keys[k], states[k], action[k], params)
                o, states[k], r = out[:3]
                # gymnax 1.x: (..., terminated, truncated, info); 0.0.x: (..., done, info)
                ended = out[3] | out[4] if len(out) == 6 else out[3]
                np.testing.assert_array_equal(obs[k], o)
                assert float(reward[k]) == float(r) and bool(done[k]) == bool(ended)


def test_a_box_action_space_gives_bounds():
    env = make_jax_env("gymnax:Pendulum-v1", num_envs=2)
    assert not env.discrete and env.action_shape == (1,)
    np.testing.assert_array_equal(env.action_low, [-2.0])
    np.testing.assert_array_equal(env.action_high, [2.0])


def test_ppo_over_a_gymnax_env_is_one_xla_program_and_agrees_with_numpy():
    got = {}
    for backend in ("numpy", "jax"):
        ap = algos.ppo(
            env_id="gymnax:CartPole-v1",
            env_backend="jax",
            num_envs=4,
            num_steps=8,
            epochs=1,
            minibatches=2,
            hidden=(8,),
        )
        dims = {b.name: b for b in ap.ctx.bounds}
        bounds = {dims["I"]: 3, **{dims[k]: v for k, v in ap.bounds.items()}}
        outs = [*ap.metrics.values(), ap.rollout["obs"], ap.rollout["reward"]]
        prog = ap.ctx.compile(bounds=bounds, backend=backend, outputs=outs, seed=0)
        prog.run()
        got[backend] = [np.asarray(prog.value(m), dtype=np.float64) for m in outs]
        if backend == "jax":
            assert "-> one XLA program per iteration" in prog.explain()
    for want, have in zip(got["numpy"], got["jax"], strict=True):
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-5)


def test_bad_gymnax_ids_name_the_env_and_suggest():
    with pytest.raises(EnvError, match="no gymnax environment 'Cartpole-v1'.*gymnax:CartPole-v1"):
        make_jax_env("gymnax:Cartpole-v1")
    with pytest.raises(EnvError, match="gymnax:<id>"):
        make_jax_env("Acrobot-v1")  # not built in: the error names the gymnax form


def test_bad_keywords_and_an_unsupported_action_space_name_the_env(monkeypatch):
    with pytest.raises(EnvError, match=r"gymnax:CartPole-v1: bad keyword arguments \['bogus'\]"):
        make_jax_env("gymnax:CartPole-v1", bogus=1)
    from gymnax.environments import spaces

    env, params = gymnax.make("CartPole-v1")
    dict_space = spaces.Dict({"a": spaces.Discrete(2)})
    monkeypatch.setattr(type(env), "action_space", lambda self, p=None: dict_space)
    with pytest.raises(EnvError, match="gymnax:CartPole-v1: action space Dict is not supported"):
        make_jax_env("gymnax:CartPole-v1")


def test_a_missing_gymnax_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnax", None)  # import fails as if not installed
    with pytest.raises(EnvError, match=r"timerl\[gymnax\]"):
        make_jax_env("gymnax:CartPole-v1")
