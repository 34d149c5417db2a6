"""Pure-JAX environments, so that a learner can compile rollout and update into one program.

Each env is a pair of pure functions over a batch of ``num_envs`` copies::

    state, obs = reset(key, params)
    state, obs, reward, done = step(state, action, params)

with the same same-step auto-reset as :mod:`timerl.rl.envs.vector`: where ``done``, ``obs`` is already
the next episode's first observation and ``reward`` the ended episode's last reward. ``params``
is a pytree whose array leaves are the env's constants and whose shape information is static,
so it can be passed through ``jax.jit`` as an ordinary argument.

- ``Synthetic-v0`` runs the very dynamics of :mod:`timerl.rl.envs.synthetic` (the code is shared),
  with the same projection for the same seed; ``reset`` given the integer seed used for
  :func:`timerl.rl.envs.vector.make_env` reproduces that env's trajectories exactly (up to float32
  rounding of the matrix products).
- ``CartPole-v1`` follows gymnasium's CartPole-v1 (Euler integration, +1 per step including the
  last, termination at |x| > 2.4 or |theta| > 12 degrees, truncation after 500 steps), computed
  in float32 where gymnasium uses float64, and with JAX's random numbers for the first state.
- ``gymnax:<id>`` is any env of gymnax's registry (``pip install 'timerl[gymnax]'``), e.g.
  ``gymnax:Acrobot-v1``: gymnax's single-env functions, batched by ``jax.vmap``, with the key
  for its random steps carried in the state. gymnax resets ended episodes inside ``step`` as
  timerl's envs do, so nothing is adapted but the batch.

jax is optional: this module imports without it, and :func:`make_jax_env` raises
:class:`~timerl.errors.EnvError` when it is missing.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

import timerl.rl.envs.synthetic as synthetic
from timerl.errors import EnvError

_REGISTERED = False


def _jax() -> tuple[Any, Any]:
    """Import jax on first use, registering this module's pytrees once."""
    global _REGISTERED
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise EnvError(
            "JAX environments need jax; install it with `pip install 'timerl[jax]'`"
        ) from err
    if not _REGISTERED:
        for cls in (SyntheticJaxParams, CartPoleParams):
            jax.tree_util.register_pytree_node(cls, cls._flatten, cls._unflatten)
        _REGISTERED = True
    return jax, jnp


def _seed_from_key(key: Any) -> Any:
    """A uint32 seed from an int, a uint32 scalar, or a JAX PRNG key (new or raw style)."""
    jax, jnp = _jax()
    if isinstance(key, int | np.integer):
        return jnp.asarray(int(key) % 2**32, dtype=jnp.uint32)
    key = jnp.asarray(key) if not hasattr(key, "dtype") else key
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.bits(key, (), jnp.uint32)
    if key.ndim == 0:
        return key.astype(jnp.uint32)
    return jax.random.bits(key, (), jnp.uint32)


def _as_key(key: Any) -> Any:
    """A PRNG key from an int or a key."""
    jax, jnp = _jax()
    if isinstance(key, int | np.integer):
        return jax.random.key(int(key))
    return key


# -- Synthetic-v0 -----------------------------------------------------------------------


@dataclass(frozen=True)
class _SyntheticStatic:
    """The hashable (static under jit) part of Synthetic-v0's params."""

    seed: int
    obs_shape: tuple[int, ...]
    action_dim: int
    state_dim: int
    episode_length: int
    num_envs: int
    dt: float
    action_cost: float
    state_bound: float


@dataclass(frozen=True)
class SyntheticJaxParams:
    """Synthetic-v0's constants as JAX arrays plus static sizes."""

    static: _SyntheticStatic
    arrays: dict[str, Any] = field(default_factory=dict)

    def _flatten(self) -> tuple[tuple[Any, ...], _SyntheticStatic]:
        return (self.arrays["projection"], self.arrays["control"], self.arrays["target"]), (
            self.static
        )

    @classmethod
    def _unflatten(cls, static: _SyntheticStatic, leaves: Any) -> SyntheticJaxParams:
        projection, control, target = leaves
        return cls(static, {"projection": projection, "control": control, "target": target})


class SyntheticState(NamedTuple):
    """The batch state of Synthetic-v0: hidden states, step counters, episode numbers, seed."""

    s: Any  # (B, state_dim) float32
    t: Any  # (B,) int32
    episode: Any  # (B,) uint32
    seed: Any  # () uint32


def synthetic_params(
    num_envs: int = 1,
    seed: int = 0,
    obs_shape: tuple[int, ...] = (3, 4, 4),
    episode_length: int = 250,
    action_dim: int = 2,
    state_dim: int | None = None,
) -> SyntheticJaxParams:
    """Synthetic-v0's params; the same seed gives the numpy env's projection and targets."""
    _, jnp = _jax()
    p = synthetic.make_params(seed, obs_shape, episode_length, action_dim, state_dim)
    static = _SyntheticStatic(
        seed=p.seed,
        obs_shape=p.obs_shape,
        action_dim=p.action_dim,
        state_dim=p.state_dim,
        episode_length=p.episode_length,
        num_envs=int(num_envs),
        dt=p.dt,
        action_cost=p.action_cost,
        state_bound=p.state_bound,
    )
    arrays = {
        "projection": jnp.asarray(p.projection),
        "control": jnp.asarray(p.control),
        "target": jnp.asarray(p.target),
    }
    return SyntheticJaxParams(static, arrays)


def synthetic_reset(key: Any, params: SyntheticJaxParams) -> tuple[SyntheticState, Any]:
    """First episode of every env. An int ``key`` equal to make_env's seed reproduces it."""
    _, jnp = _jax()
    st = params.static
    seed = _seed_from_key(key)
    env_index = jnp.arange(st.num_envs, dtype=jnp.uint32)
    episode = jnp.zeros(st.num_envs, dtype=jnp.uint32)
    s = synthetic.initial_state(jnp, seed, env_index, episode, st.state_dim)
    obs = synthetic.observe(jnp, params.arrays, s).reshape((st.num_envs, *st.obs_shape))
    return SyntheticState(s, jnp.zeros(st.num_envs, dtype=jnp.int32), episode, seed), obs


def synthetic_step(
    state: SyntheticState, action: Any, params: SyntheticJaxParams
) -> tuple[SyntheticState, Any, Any, Any]:
    """One step of every env with same-step auto-reset; returns (state, obs, reward, done)."""
    _, jnp = _jax()
    st = params.static
    action = jnp.reshape(action, (st.num_envs, st.action_dim))
    nxt, reward, obs = synthetic.transition(jnp, params.arrays, st, state.s, action)
    t = state.t + 1
    done = t >= st.episode_length
    episode = state.episode + done.astype(jnp.uint32)
    env_index = jnp.arange(st.num_envs, dtype=jnp.uint32)
    fresh = synthetic.initial_state(jnp, state.seed, env_index, episode, st.state_dim)
    nxt = jnp.where(done[:, None], fresh, nxt)
    obs = jnp.where(done[:, None], synthetic.observe(jnp, params.arrays, fresh), obs)
    t = jnp.where(done, 0, t)
    obs = obs.reshape((st.num_envs, *st.obs_shape))
    return SyntheticState(nxt, t, episode, state.seed), obs, reward, done


# -- CartPole-v1 ------------------------------------------------------------------------


@dataclass(frozen=True)
class CartPoleParams:
    """CartPole-v1's constants; all static (they are Python floats baked into the program)."""

    num_envs: int = 1
    max_episode_steps: int = 500
    gravity: float = 9.8
    masscart: float = 1.0
    masspole: float = 0.1
    length: float = 0.5  # half the pole's length
    force_mag: float = 10.0
    tau: float = 0.02
    theta_threshold: float = 12 * 2 * math.pi / 360
    x_threshold: float = 2.4

    def _flatten(self) -> tuple[tuple[()], CartPoleParams]:
        return (), self

    @classmethod
    def _unflatten(cls, static: CartPoleParams, leaves: Any) -> CartPoleParams:
        return static


class CartPoleState(NamedTuple):
    """Physics ``(x, x_dot, theta, theta_dot)`` per env, step counters, and the PRNG key."""

    physics: Any  # (B, 4) float32
    t: Any  # (B,) int32
    key: Any


def cartpole_reset(key: Any, params: CartPoleParams) -> tuple[CartPoleState, Any]:
    """Every env's first state uniform in [-0.05, 0.05]^4, as gymnasium draws it."""
    jax, jnp = _jax()
    key, sub = jax.random.split(_as_key(key))
    physics = jax.random.uniform(sub, (params.num_envs, 4), jnp.float32, -0.05, 0.05)
    t = jnp.zeros(params.num_envs, dtype=jnp.int32)
    return CartPoleState(physics, t, key), physics


def cartpole_step(
    state: CartPoleState, action: Any, params: CartPoleParams
) -> tuple[CartPoleState, Any, Any, Any]:
    """One Euler step of every env with same-step auto-reset; action 1 pushes right."""
    jax, jnp = _jax()
    p = params
    x, x_dot, theta, theta_dot = (state.physics[:, k] for k in range(4))
    action = jnp.reshape(action, (p.num_envs,))
    force = jnp.where(action == 1, p.force_mag, -p.force_mag).astype(jnp.float32)
    total_mass = p.masspole + p.masscart
    polemass_length = p.masspole * p.length
    cos, sin = jnp.cos(theta), jnp.sin(theta)
    temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
    thetaacc = (p.gravity * sin - cos * temp) / (
        p.length * (4.0 / 3.0 - p.masspole * cos**2 / total_mass)
    )
    xacc = temp - polemass_length * thetaacc * cos / total_mass
    physics = jnp.stack(
        [
            x + p.tau * x_dot,
            x_dot + p.tau * xacc,
            theta + p.tau * theta_dot,
            theta_dot + p.tau * thetaacc,
        ],
        axis=1,
    )
    terminated = (jnp.abs(physics[:, 0]) > p.x_threshold) | (
        jnp.abs(physics[:, 2]) > p.theta_threshold
    )
    t = state.t + 1
    done = terminated | (t >= p.max_episode_steps)
    reward = jnp.ones(p.num_envs, dtype=jnp.float32)
    key, sub = jax.random.split(state.key)
    fresh = jax.random.uniform(sub, (p.num_envs, 4), jnp.float32, -0.05, 0.05)
    physics = jnp.where(done[:, None], fresh, physics)
    t = jnp.where(done, 0, t)
    return CartPoleState(physics, t, key), physics, reward, done


# -- lookup -----------------------------------------------------------------------------


@dataclass(frozen=True)
class JaxEnv:
    """An env id's pure functions, params and spaces: ``env.reset(key, env.params)``."""

    env_id: str
    num_envs: int
    obs_shape: tuple[int, ...]
    discrete: bool
    num_actions: int | None
    action_shape: tuple[int, ...]
    action_low: np.ndarray | None
    action_high: np.ndarray | None
    params: Any
    reset: Any
    step: Any
    # "HWC" where the observations are images with their channels last (gymnax's MinAtar
    # planes), None otherwise: what ``--policy auto`` reads to give a CNN
    image_layout: str | None = None
    # gymnax's: ``step`` that also returns what auto-reset drops, for a host batch (off-policy
    # learners bootstrap through time limits): ``(state, obs, reward, terminated, truncated,
    # final_obs)``, the first three and ``terminated | truncated`` equal to ``step``'s
    full_step: Any = None


JAX_ENV_IDS = ("Synthetic-v0", "CartPole-v1")
GYMNAX_PREFIX = "gymnax:"  # "gymnax:Acrobot-v1": that env of gymnax's registry
MINATAR_SUFFIX = "-MinAtar"  # gymnax's MinAtar games: 10x10 images of C binary planes (HWC)


def is_gymnax_id(env_id: Any) -> bool:
    """Whether ``env_id`` names one of gymnax's envs (``"gymnax:Acrobot-v1"``)."""
    return isinstance(env_id, str) and env_id.startswith(GYMNAX_PREFIX)


def gymnax_minatar(env_id: str) -> bool:
    """Whether ``env_id`` names one of gymnax's MinAtar games (``gymnax:Breakout-MinAtar``)."""
    return is_gymnax_id(env_id) and env_id.endswith(MINATAR_SUFFIX)


class GymnaxState(NamedTuple):
    """A batch of gymnax states and the key its next step splits."""

    inner: Any
    key: Any


@contextlib.contextmanager
def _gymnax_bool_scatters() -> Iterator[None]:
    """gymnax's MinAtar games draw their boolean observation planes with ``.at[...].set(1)``
    (an int, or the float brick map, written into a bool array), which jax warns about each
    time the function is traced ("scatter inputs have incompatible types", a FutureWarning).
    The values are 0 and 1, so the cast is exact; the code is gymnax's, not ours: that one
    warning is silenced, around gymnax's own calls only."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="scatter inputs have incompatible types", category=FutureWarning
        )
        yield


def _gymnax_env(env_id: str, num_envs: int, **kwargs: Any) -> JaxEnv:
    """``env_id`` (``gymnax:<name>``) as a batch of ``num_envs`` gymnax envs.

    gymnax's functions take one env and a key per call; a batch is their ``vmap`` with one key
    per env, split from the key in the state, so a step stays a pure function of the state.
    """
    jax, jnp = _jax()
    name = env_id[len(GYMNAX_PREFIX) :]
    try:
        import gymnax
        from gymnax.environments import spaces
    except ImportError as err:
        raise EnvError(
            f"{env_id}: gymnax environments need gymnax ({err}); install it with "
            "`pip install 'timerl[gymnax]'`"
        ) from err
    if name not in gymnax.registered_envs:
        close = difflib.get_close_matches(name, gymnax.registered_envs, n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(GYMNAX_PREFIX + c for c in close)}?" if close else ""
        raise EnvError(f"no gymnax environment {name!r}{hint}")
    try:
        with _gymnax_bool_scatters():
            env, env_params = gymnax.make(name, **kwargs)
    except TypeError as err:
        raise EnvError(f"{env_id}: bad keyword arguments {sorted(kwargs)}: {err}") from err
    with _gymnax_bool_scatters():
        obs_space = env.observation_space(env_params)
        act_space = env.action_space(env_params)
    if isinstance(act_space, spaces.Discrete):
        discrete, num_actions, action_shape = True, int(act_space.n), ()
        low = high = None
    elif isinstance(act_space, spaces.Box):
        discrete, num_actions = False, None
        action_shape = tuple(int(d) for d in act_space.shape)
        low = np.broadcast_to(np.asarray(act_space.low, np.float32), action_shape).copy()
        high = np.broadcast_to(np.asarray(act_space.high, np.float32), action_shape).copy()
    else:
        raise EnvError(
            f"{env_id}: action space {type(act_space).__name__} is not supported "
            "(Discrete or Box only)"
        )
    batch_reset = jax.vmap(env.reset, in_axes=(0, None))
    batch_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def reset(key: Any, params: Any) -> tuple[GymnaxState, Any]:
        key, sub = jax.random.split(_as_key(key))
        with _gymnax_bool_scatters():
            obs, inner = batch_reset(jax.random.split(sub, num_envs), params)
        return GymnaxState(inner, key), obs

    def step(state: GymnaxState, action: Any, params: Any) -> tuple[GymnaxState, Any, Any, Any]:
        key, sub = jax.random.split(state.key)
        with _gymnax_bool_scatters():
            out = batch_step(jax.random.split(sub, num_envs), state.inner, action, params)
        obs, inner, reward = out[:3]
        # gymnax 1.x returns (terminated, truncated), 0.0.x one done flag; an episode ends
        # at either
        done = out[3] | out[4] if len(out) == 6 else out[3]
        return GymnaxState(inner, key), obs, reward, jnp.asarray(done, bool)

    def one_full_step(key: Any, inner: Any, action: Any, params: Any) -> tuple[Any, ...]:
        # gymnax's own auto-reset ``step`` taken apart (the same key split), to keep what it
        # drops: the ended episode's last observation, and whether it ended at the time
        # limit. 0.0.x has one done flag: an end at ``max_steps_in_episode`` counts as
        # truncated (also where the episode really ended on that same step, which is rare)
        key_step, key_reset = jax.random.split(key)
        out = env.step_env(key_step, inner, action, params)
        obs_st, inner_st, reward = out[:3]
        if len(out) == 6:
            terminated, truncated = jnp.asarray(out[3], bool), jnp.asarray(out[4], bool)
        else:
            done = jnp.asarray(out[3], bool)
            time = getattr(inner_st, "time", None)
            limit = getattr(params, "max_steps_in_episode", None)
            timed = time is not None and limit is not None
            truncated = done & (time >= limit) if timed else jnp.zeros_like(done)
            terminated = done & ~truncated
        ended = terminated | truncated
        obs_re, inner_re = env.reset_env(key_reset, params)
        inner = jax.tree_util.tree_map(
            lambda fresh, old: jax.lax.select(ended, fresh, old), inner_re, inner_st
        )
        obs = jax.lax.select(ended, obs_re, obs_st)
        return inner, obs, reward, terminated, truncated, obs_st

    batch_full_step = jax.vmap(one_full_step, in_axes=(0, 0, 0, None))

    def full_step(state: GymnaxState, action: Any, params: Any) -> tuple[Any, ...]:
        key, sub = jax.random.split(state.key)
        with _gymnax_bool_scatters():
            inner, *out = batch_full_step(
                jax.random.split(sub, num_envs), state.inner, action, params
            )
        return (GymnaxState(inner, key), *out)

    obs_shape = tuple(int(d) for d in obs_space.shape)
    return JaxEnv(
        env_id,
        num_envs,
        obs_shape,
        discrete,
        num_actions,
        action_shape,
        low,
        high,
        env_params,
        reset,
        step,
        "HWC" if name.endswith(MINATAR_SUFFIX) and len(obs_shape) == 3 else None,
        full_step,
    )


def make_jax_env(env_id: str, num_envs: int = 1, seed: int = 0, **kwargs: Any) -> JaxEnv:
    """The JAX version of ``env_id``; ``seed`` fixes its constants (Synthetic-v0's projection)."""
    _jax()
    if is_gymnax_id(env_id):
        return _gymnax_env(env_id, num_envs, **kwargs)
    if env_id == "Synthetic-v0":
        try:
            params = synthetic_params(num_envs, seed, **kwargs)
        except TypeError as err:
            raise EnvError(f"{env_id}: bad keyword arguments {sorted(kwargs)}: {err}") from err
        st = params.static
        ones = np.ones(st.action_dim, dtype=np.float32)
        return JaxEnv(
            env_id,
            num_envs,
            st.obs_shape,
            False,
            None,
            (st.action_dim,),
            -ones,
            ones,
            params,
            synthetic_reset,
            synthetic_step,
        )
    if env_id == "CartPole-v1":
        try:
            params = CartPoleParams(num_envs=num_envs, **kwargs)
        except TypeError as err:
            raise EnvError(f"{env_id}: bad keyword arguments {sorted(kwargs)}: {err}") from err
        return JaxEnv(
            env_id, num_envs, (4,), True, 2, (), None, None, params, cartpole_reset, cartpole_step
        )
    raise EnvError(
        f"no JAX version of environment {env_id!r}; available: {', '.join(JAX_ENV_IDS)}, "
        f"and {GYMNAX_PREFIX}<id> for gymnax's (`pip install 'timerl[gymnax]'`)"
    )
