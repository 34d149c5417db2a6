"""The environment layer's contract: shapes, same-step auto-reset, seeding, errors."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from timerl.errors import EnvError
from timerl.rl.envs import GymBatchedCartPole, GymVectorEnv, make_env, synthetic
from timerl.rl.envs.protocol import VectorEnv


class _DictObsEnv(gym.Env):
    observation_space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,))})
    action_space = gym.spaces.Discrete(2)


class _MultiDiscreteActEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,))
    action_space = gym.spaces.MultiDiscrete([2, 3])


class _ImageEnv(gym.Env):
    observation_space = gym.spaces.Box(0, 255, (8, 8, 3), dtype=np.uint8)
    action_space = gym.spaces.Discrete(3, start=-1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full((8, 8, 3), 200, dtype=np.uint8), {}

    def step(self, action):
        assert action in (-1, 0, 1)
        return np.full((8, 8, 3), 100 + action, dtype=np.uint8), 1.0, False, False, {}


for _name, _cls in [("DictObs", _DictObsEnv), ("MultiAct", _MultiDiscreteActEnv)]:
    if f"TimerlTest/{_name}-v0" not in gym.registry:
        gym.register(f"TimerlTest/{_name}-v0", entry_point=_cls)
if "TimerlTest/Image-v0" not in gym.registry:
    gym.register("TimerlTest/Image-v0", entry_point=_ImageEnv, max_episode_steps=3)


@pytest.mark.parametrize(
    ("env_id", "obs_shape", "discrete", "action_shape"),
    [
        ("CartPole-v1", (4,), True, ()),
        ("Acrobot-v1", (6,), True, ()),
        ("Pendulum-v1", (3,), False, (1,)),
        ("MountainCarContinuous-v0", (2,), False, (1,)),
        ("FrozenLake-v1", (16,), True, ()),  # Discrete observations come one-hot
        ("Synthetic-v0", (3, 4, 4), False, (2,)),
    ],
)
def test_shapes_and_dtypes(env_id, obs_shape, discrete, action_shape):
    with make_env(env_id, num_envs=3, seed=0) as env:
        assert env.obs_shape == obs_shape and env.obs_dtype == np.float32
        assert env.discrete is discrete and env.action_shape == action_shape
        if discrete:
            assert env.num_actions >= 2 and env.action_low is None
            actions = np.zeros(3, dtype=np.int64)
        else:
            assert env.num_actions is None and env.action_low.shape == action_shape
            actions = np.zeros((3, *action_shape), dtype=np.float32)
        obs = env.reset()
        assert obs.shape == (3, *obs_shape) and obs.dtype == np.float32
        obs, reward, done = env.step(actions)
        assert obs.shape == (3, *obs_shape) and obs.dtype == np.float32
        assert reward.shape == (3,) and reward.dtype == np.float32
        assert done.shape == (3,) and done.dtype == bool
        assert env.terminated.shape == env.truncated.shape == (3,)


def test_image_obs_cast_to_float_and_discrete_start_offset():
    env = make_env("TimerlTest/Image-v0", num_envs=2)
    assert env.obs_shape == (8, 8, 3) and env.num_actions == 3
    assert env.reset()[0, 0, 0, 0] == 200.0
    obs, _, done = env.step(np.array([0, 2]))  # indices 0..2 map to the space's -1..1
    assert obs[:, 0, 0, 0].tolist() == [99.0, 101.0] and not done.any()
    env.step(np.array([1.0, 1.2]))  # floats are rounded to indices
    _, _, done = env.step(np.array([1, 1]))
    assert done.all() and env.truncated.all() and not env.terminated.any()


def _run_gym_reference(env_id, seed, actions_fn, steps):
    """One plain gymnasium env, reset by hand: what env 0 of a batch must reproduce."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    out = []
    for t in range(steps):
        obs, reward, terminated, truncated, _ = env.step(actions_fn(t))
        if terminated or truncated:
            obs, _ = env.reset()
        out.append((obs.astype(np.float32), float(reward), terminated or truncated))
    return out


def test_same_step_autoreset_matches_manual_resets():
    def policy(t):
        return int(t % 3 == 0)  # mostly pushes left: falls quickly

    env = make_env("CartPole-v1", num_envs=2, seed=7)
    env.reset()
    ref = _run_gym_reference("CartPole-v1", 7, policy, 60)
    ends = 0
    for t in range(60):
        obs, reward, done = env.step(np.full(2, policy(t)))
        r_obs, r_reward, r_done = ref[t]
        np.testing.assert_allclose(obs[0], r_obs, rtol=1e-6)
        assert reward[0] == r_reward and done[0] == r_done
        if done[0]:
            ends += 1
            # the returned obs is the next episode's first one; the ended one is kept aside
            assert np.all(np.abs(obs[0]) <= 0.05)
            assert np.abs(env.final_obs[0][2]) > 0.2 or np.abs(env.final_obs[0][0]) > 2.4
            assert env.terminated[0] and not env.truncated[0]
    assert ends >= 3
    returns, lengths = env.completed_returns(), env.completed_lengths()
    assert len(returns) >= ends and np.array_equal(returns, lengths.astype(float))
    assert env.completed_returns().size == 0  # cleared by the first call


def test_batched_cartpole_replays_one_gymnasium_env_per_copy():
    env = make_env("CartPole-v1", num_envs=5, seed=3)
    ref = GymVectorEnv("CartPole-v1", num_envs=5, seed=3)  # a gymnasium env per copy
    assert isinstance(env, GymBatchedCartPole)
    np.testing.assert_allclose(env.reset(), ref.reset(), rtol=1e-6)
    rng = np.random.default_rng(0)
    for _ in range(300):
        actions = rng.integers(0, 2, 5)
        obs, reward, done = env.step(actions)
        r_obs, r_reward, r_done = ref.step(actions)
        np.testing.assert_array_equal(done, r_done)
        np.testing.assert_array_equal(env.terminated, ref.terminated)
        np.testing.assert_array_equal(reward, r_reward)
        np.testing.assert_allclose(obs, r_obs, rtol=1e-6, atol=1e-7)
        if done.any():
            np.testing.assert_allclose(env.final_obs, ref.final_obs, rtol=1e-6, atol=1e-7)
    lengths = env.completed_lengths()
    assert len(lengths) > 30  # many episodes ended and restarted on the way
    np.testing.assert_array_equal(lengths, ref.completed_lengths())
    np.testing.assert_array_equal(env.completed_returns(), ref.completed_returns())


def test_batched_cartpole_resumes_the_state_of_a_per_copy_env():
    ref = GymVectorEnv("CartPole-v1", num_envs=3, seed=2)  # as checkpoints before held it
    ref.reset()
    for t in range(30):
        ref.step(np.full(3, t % 2))
    env = make_env("CartPole-v1", num_envs=3, seed=2)
    env.load_state_dict(ref.state_dict())
    for t in range(60):
        actions = np.full(3, t % 3 == 0, dtype=np.int64)
        obs, _, done = env.step(actions)
        r_obs, _, r_done = ref.step(actions)
        np.testing.assert_array_equal(done, r_done)
        np.testing.assert_allclose(obs, r_obs, rtol=1e-6, atol=1e-7)


def test_batched_cartpole_truncates_at_the_time_limit():
    env = make_env("CartPole-v1", num_envs=3, seed=1, max_episode_steps=20)
    obs = env.reset()
    for t in range(1, 46):
        balance = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
        obs, _, done = env.step(balance)
        assert done.all() == (t % 20 == 0) and not env.terminated.any()
    np.testing.assert_array_equal(env.completed_lengths(), [20] * 6)


def test_synthetic_episode_length_and_reset_obs():
    env = make_env("Synthetic-v0", num_envs=4, seed=1, episode_length=10)
    env.reset()
    p = env.params
    for t in range(1, 31):
        obs, reward, done = env.step(np.zeros((4, 2)))
        assert done.all() == (t % 10 == 0) and done.any() == (t % 10 == 0)
        assert np.all(reward < 0)
        if done.all():
            assert env.truncated.all() and not env.terminated.any()
            episode = np.full(4, t // 10, dtype=np.uint32)
            first = synthetic.initial_state(np, np.uint32(1), np.arange(4, dtype=np.uint32),
                                            episode, p.state_dim)  # fmt: skip
            expect = synthetic.observe(np, env._arrays, first).reshape(4, *p.obs_shape)
            np.testing.assert_allclose(obs, expect, rtol=1e-6)
            assert not np.allclose(env.final_obs, obs)
    assert env.completed_lengths().tolist() == [10] * 12


def test_synthetic_clips_actions_and_is_learnable():
    a = make_env("Synthetic-v0", num_envs=2, seed=0)
    b = make_env("Synthetic-v0", num_envs=2, seed=0)
    a.reset(), b.reset()
    np.testing.assert_array_equal(a.step(np.full((2, 2), 5.0))[0], b.step(np.ones((2, 2)))[0])
    # a policy that steers the hidden state onto the target does far better than doing nothing
    p = a.params
    for env, steer in [(a, True), (b, False)]:
        env.reset()
        env.completed_returns()
        for _ in range(p.episode_length):
            err = env._state - p.target
            env.step(-(err @ p.control) / p.dt if steer else np.zeros((2, 2)))
    good, idle = a.completed_returns().mean(), b.completed_returns().mean()
    assert good > -20 and idle < -100


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "Synthetic-v0"])
def test_seeding_reproducible(env_id):
    def rollout(seed):
        env = make_env(env_id, num_envs=3, seed=seed)
        rng = np.random.default_rng(0)
        obs = [env.reset()]
        for _ in range(40):
            if env.discrete:
                act = rng.integers(0, env.num_actions, 3)
            else:
                act = rng.uniform(-1, 1, (3, *env.action_shape))
            obs.append(env.step(act)[0])
        return np.stack(obs)

    first = rollout(5)
    np.testing.assert_array_equal(first, rollout(5))
    assert not np.allclose(first, rollout(6))
    assert not np.allclose(first[:, 0], first[:, 1])  # the envs of one batch differ


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Synthetic-v0"])
def test_state_dict_resumes_exactly(env_id):
    kwargs = {"episode_length": 15} if env_id == "Synthetic-v0" else {}
    env = make_env(env_id, num_envs=3, seed=2, **kwargs)
    env.reset()
    act = np.ones(3, dtype=np.int64) if env.discrete else np.full((3, 2), 0.3)
    for _ in range(9):
        env.step(act)
    state = env.state_dict()
    later = [env.step(act) for _ in range(25)]
    resumed = make_env(env_id, num_envs=3, seed=2, **kwargs)
    resumed.load_state_dict(state)
    np.testing.assert_array_equal(resumed.last_obs, state["last_obs"])
    for obs, reward, done in later:
        o, r, d = resumed.step(act)
        np.testing.assert_array_equal(o, obs)
        np.testing.assert_array_equal(r, reward)
        np.testing.assert_array_equal(d, done)
    np.testing.assert_array_equal(resumed.completed_returns(), env.completed_returns())
    with pytest.raises(EnvError, match="state is for env"):
        make_env("Synthetic-v0", num_envs=2).load_state_dict(state)


def test_action_errors():
    env = make_env("CartPole-v1", num_envs=2)
    with pytest.raises(EnvError, match="reset"):
        env.step(np.zeros(2))
    env.reset()
    with pytest.raises(EnvError, match=r"\[0, 2\)"):
        env.step(np.array([0, 2]))
    with pytest.raises(EnvError, match="do not fit"):
        env.step(np.zeros(3))
    env.step(np.array([[0.0], [1.0]]))  # (B, 1) floats: reshaped and cast
    box = make_env("Pendulum-v1", num_envs=2)
    box.reset()
    with pytest.raises(EnvError, match="NaN"):
        box.step(np.array([np.nan, 0.0]))


def test_unknown_id_and_unsupported_spaces():
    with pytest.raises(EnvError, match="CartPole-v1"):
        make_env("CartPol-v1")
    with pytest.raises(EnvError, match="unknown environment id"):
        make_env("NoSuchThing-v9")
    with pytest.raises(EnvError, match="observation space Dict"):
        make_env("TimerlTest/DictObs-v0")
    with pytest.raises(EnvError, match="action space MultiDiscrete"):
        make_env("TimerlTest/MultiAct-v0")
    with pytest.raises(EnvError, match="Synthetic-v0: bad keyword"):
        make_env("Synthetic-v0", obs_size=3)
    with pytest.raises(EnvError, match=r"CartPole-v1: bad keyword arguments \['bogus'\]"):
        make_env("CartPole-v1", bogus=1)  # the batched simulator's constructor
    with pytest.raises(EnvError, match="SyntheticVectorEnv does not render"):
        make_env("Synthetic-v0").render_first()
    with pytest.raises(EnvError, match="num_envs"):
        make_env("Synthetic-v0", num_envs=0)


def test_jax_synthetic_matches_numpy():
    jax = pytest.importorskip("jax")
    from timerl.rl.envs.jax_envs import make_jax_env

    kwargs = {"obs_shape": (2, 5), "episode_length": 12, "action_dim": 3}
    env = make_env("Synthetic-v0", num_envs=4, seed=11, **kwargs)
    jenv = make_jax_env("Synthetic-v0", num_envs=4, seed=11, **kwargs)
    np.testing.assert_array_equal(np.asarray(jenv.params.arrays["projection"]),
                                  env.params.projection)  # fmt: skip
    step = jax.jit(jenv.step)
    state, jobs = jenv.reset(11, jenv.params)
    np.testing.assert_allclose(np.asarray(jobs), env.reset(), atol=1e-6)
    rng = np.random.default_rng(3)
    for _ in range(30):  # crosses two episode boundaries
        act = rng.uniform(-1.5, 1.5, (4, 3)).astype(np.float32)
        obs, reward, done = env.step(act)
        state, jobs, jrew, jdone = step(state, act, jenv.params)
        np.testing.assert_allclose(np.asarray(jobs), obs, atol=1e-5)
        np.testing.assert_allclose(np.asarray(jrew), reward, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(jdone), done)


def test_jax_cartpole_matches_gymnasium():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from timerl.rl.envs.jax_envs import CartPoleState, make_jax_env

    jenv = make_jax_env("CartPole-v1", num_envs=1)
    ref = gym.make("CartPole-v1")
    obs, _ = ref.reset(seed=4)
    state, _ = jenv.reset(0, jenv.params)
    state = CartPoleState(jnp.asarray(obs[None]), state.t, state.key)
    step = jax.jit(jenv.step)
    for t in range(200):
        action = int(t % 4 != 0)
        obs, reward, terminated, truncated, _ = ref.step(action)
        state, jobs, jrew, jdone = step(state, jnp.array([action]), jenv.params)
        assert bool(jdone[0]) == (terminated or truncated) and float(jrew[0]) == reward
        if terminated:
            assert np.all(np.abs(np.asarray(jobs)) <= 0.05)  # already the next episode
            break
        np.testing.assert_allclose(np.asarray(jobs[0]), obs, atol=1e-4)
    else:
        pytest.fail("the reference episode never ended")
    with pytest.raises(EnvError, match="no JAX version"):
        make_jax_env("Pendulum-v1")


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize(
    ("env_id", "kwargs"), [("CartPole-v1", {}), ("Synthetic-v0", {"obs_shape": (3, 4, 4)})]
)
def test_a_step_declares_the_bytes_it_returns(env_id, kwargs, full):
    # the meter counts a step's result by its declared size instead of measuring it
    import timerl as tl

    env = tl.rl.make_env(env_id, num_envs=3, seed=0, **kwargs)
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        obs = tl.RecurrentTensor.placeholder(env.batch_obs_shape, "float32", (t,), name="obs")
        obs[0] = env.reset()
        shape = (env.num_envs, *env.action_shape)
        kind = "int64" if env.discrete else "float32"
        action = tl.full(shape, 0, dtype=kind) + obs.sum() * 0
        parts = env.step(action, full=full)
    step = parts[0].view.op.inputs[0].src
    env.vec.reset()
    returned = step.attrs["fn"](np.zeros(shape, dtype=kind))
    assert len(returned) == len(parts)
    assert step.attrs["result_nbytes"] == sum(a.nbytes for a in returned)
    # and their dtypes, which a backend then does not cast again
    assert step.attrs["result_dtypes"] == tuple(a.dtype for a in returned)


class _CounterInPlace(VectorEnv):
    """Observations are a step counter written into one buffer the env keeps reusing."""

    def __init__(self, num_envs: int = 2) -> None:
        super().__init__("CounterInPlace-v0", num_envs, seed=0)
        self.obs_shape = (3,)
        self.discrete = True
        self.num_actions = 2
        self.action_shape = ()
        self.action_dtype = np.dtype(np.int64)
        self.action_low = self.action_high = None
        self._buffer = np.zeros((num_envs, 3), dtype=np.float32)

    def _reset_batch(self):
        self._buffer[:] = 0.0
        return self._buffer

    def _step_batch(self, actions):
        self._buffer += 1.0
        zeros = np.zeros(self.num_envs, dtype=bool)
        return self._buffer, np.zeros(self.num_envs, np.float32), zeros, zeros, None


@pytest.mark.parametrize("fresh", [False, True])
def test_a_rollout_keeps_its_observations_whether_or_not_the_env_reuses_its_buffer(fresh):
    # an env that writes its next observations into the array it returned gets copied; one
    # whose arrays are new at every step (fresh_outputs) is kept as it is, without a copy
    import timerl as tl
    from timerl.rl.envs.program import Env

    def make():
        return synthetic.SyntheticVectorEnv(2, obs_shape=(3,)) if fresh else _CounterInPlace()

    env = Env(make())
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        obs = tl.RecurrentTensor.placeholder(env.batch_obs_shape, "float32", (t,), name="obs")
        obs[0] = env.reset()
        kind = "int64" if env.discrete else "float32"
        action = tl.full((env.num_envs, *env.action_shape), 0, dtype=kind) + obs.sum() * 0
        obs[t + 1] = env.step(action)[0]
    (got,) = tl.evaluate([obs], bounds={T: 5})
    vec = make()  # the same steps again, each observation copied as it comes
    want = [np.array(vec.reset())]
    for _ in range(4):
        zeros = np.zeros((vec.num_envs, *vec.action_shape), dtype=vec.action_dtype)
        want.append(np.array(vec.step(zeros)[0]))
    np.testing.assert_array_equal(got, np.stack(want))
    if not fresh:
        assert got[4, 0, 0] == 4.0  # each row its own step's, not the buffer's last value


def test_an_env_with_fresh_outputs_hands_its_observations_to_the_program_uncopied():
    import timerl as tl

    env = tl.rl.make_env("Synthetic-v0", num_envs=2, seed=0, obs_shape=(3, 4, 4))
    assert env.vec.fresh_outputs
    ctx = tl.Context(dims=("t",))
    with ctx:
        action = tl.zeros((2, *env.action_shape))
        step = env.step(action)[0].view.op.inputs[0].src
    env.vec.reset()
    obs = step.attrs["fn"](np.zeros((2, *env.action_shape), np.float32))[0]
    assert obs is env.vec.last_obs or obs.base is env.vec.last_obs.base
