"""``Synthetic-v0``: a cheap, learnable continuous-control env whose observation size is free.

Benchmarks need an env whose cost is negligible next to the learner and whose observation can
be made as large as an image, yet where a policy can measurably improve. The env hides a
low-dimensional state ``s`` (``state_dim``, by default ``action_dim``) driven by the action
through simple integrator dynamics::

    s' = clip(s + dt * C @ clip(a, -1, 1), -bound, bound)
    reward = -|s' - target| - action_cost * |a|^2
    obs = reshape(P @ (s' - target), obs_shape)

``C`` (a random rotation), ``target`` and the projection ``P`` are fixed by the seed. The
observation is a linear image of the error to the target, so a policy that learns the (linear)
inverse map drives the error to zero: with the default 250-step episodes (every episode runs
to its end; nothing terminates early), zero or random actions score about -240 and the best
policy about -5.

``step_cost_us`` makes each env step cost that many microseconds of busy CPU work (thread CPU
time; default 0): a stand-in for a real simulator, so that scaling the envs out over processes (see
:mod:`timerl.rl.envs.ray_env`) has something to spread. ``first_env`` numbers the envs from that
index, so a batch split into slices (``first_env=0, 32, ...``) steps exactly the envs of the
whole batch.

Randomness (the first state of each episode) comes from a counter-based hash of
``(seed, env index, episode number)`` rather than from a stateful generator, so the numpy
version here and the JAX version in :mod:`timerl.rl.envs.jax_envs` run the very same arithmetic
(the dynamics are written once, over an array module ``xp``) and produce the same trajectories.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from timerl.errors import EnvError
from timerl.rl.envs.protocol import VectorEnv, register_native

ENV_ID = "Synthetic-v0"


@dataclass(frozen=True)
class SyntheticParams:
    """The fixed, seed-derived constants of one Synthetic-v0 configuration (numpy arrays)."""

    seed: int
    obs_shape: tuple[int, ...]
    action_dim: int
    state_dim: int
    episode_length: int
    projection: np.ndarray  # (obs_size, state_dim) float32
    control: np.ndarray  # (state_dim, action_dim) float32
    target: np.ndarray  # (state_dim,) float32
    dt: float = 0.1
    action_cost: float = 0.01
    state_bound: float = 3.0

    @property
    def obs_size(self) -> int:
        return int(np.prod(self.obs_shape))


def make_params(
    seed: int = 0,
    obs_shape: tuple[int, ...] = (3, 4, 4),
    episode_length: int = 250,
    action_dim: int = 2,
    state_dim: int | None = None,
) -> SyntheticParams:
    """Derive the env's constants from ``seed``; the same seed gives the same projection."""
    obs_shape = tuple(int(d) for d in np.atleast_1d(obs_shape))
    state_dim = action_dim if state_dim is None else int(state_dim)
    if not obs_shape or min(obs_shape) < 1:
        raise EnvError(f"{ENV_ID}: obs_shape must be a non-empty tuple of positive sizes")
    if int(episode_length) < 1:
        raise EnvError(f"{ENV_ID}: episode_length must be at least 1, got {episode_length}")
    if int(action_dim) < 1 or state_dim < 1:
        raise EnvError(f"{ENV_ID}: action_dim and state_dim must be at least 1")
    rng = np.random.default_rng(np.uint32(int(seed) % 2**32))
    obs_size = int(np.prod(obs_shape))
    projection = rng.standard_normal((obs_size, state_dim)) / np.sqrt(state_dim)
    # A random orthonormal control map: every state direction reachable when
    # state_dim <= action_dim, equally fast, so learning difficulty does not hinge on the seed.
    q, _ = np.linalg.qr(rng.standard_normal((max(state_dim, action_dim),) * 2))
    control = q[:state_dim, :action_dim]
    target = rng.uniform(-0.5, 0.5, size=state_dim)
    return SyntheticParams(
        seed=int(seed),
        obs_shape=obs_shape,
        action_dim=int(action_dim),
        state_dim=state_dim,
        episode_length=int(episode_length),
        projection=projection.astype(np.float32),
        control=control.astype(np.float32),
        target=target.astype(np.float32),
    )


# -- the dynamics, written once over an array module (numpy or jax.numpy) --------------------


def _hash32(xp: Any, x: Any) -> Any:
    """A 32-bit integer mixer (lowbias32): wraps identically in numpy and XLA."""
    x = x ^ (x >> xp.uint32(16))
    x = x * xp.uint32(0x7FEB352D)
    x = x ^ (x >> xp.uint32(15))
    x = x * xp.uint32(0x846CA68B)
    return x ^ (x >> xp.uint32(16))


def initial_state(xp: Any, seed: Any, env_index: Any, episode: Any, state_dim: int) -> Any:
    """First state of each env's episode, uniform in [-1, 1): shape ``(B, state_dim)``.

    ``seed`` is a uint32 scalar, ``env_index`` and ``episode`` uint32 arrays of shape (B,).
    """
    # Broadcast the seed to an array first: numpy warns about wrap-around on scalars only.
    seeds = xp.zeros(env_index.shape, dtype=xp.uint32) + xp.asarray(seed, dtype=xp.uint32)
    h = _hash32(xp, seeds ^ xp.uint32(0x9E3779B9))
    h = _hash32(xp, h ^ env_index.astype(xp.uint32))
    h = _hash32(xp, h ^ (episode.astype(xp.uint32) * xp.uint32(0x85EBCA6B)))
    h = _hash32(xp, h[:, None] ^ xp.arange(1, state_dim + 1, dtype=xp.uint32)[None, :])
    unit = (h >> xp.uint32(8)).astype(xp.float32) * xp.float32(2.0**-24)
    return unit * xp.float32(2.0) - xp.float32(1.0)


def transition(xp: Any, arrays: dict[str, Any], p: SyntheticParams, state: Any, action: Any):
    """One step without resets: returns ``(next_state, reward, obs_of_next_state_flat)``."""
    a = xp.clip(action.astype(xp.float32), -1.0, 1.0)
    moved = state + xp.float32(p.dt) * (a @ arrays["control"].T)
    nxt = xp.clip(moved, -p.state_bound, p.state_bound)
    err = nxt - arrays["target"]
    reward = -xp.sqrt(xp.sum(err * err, axis=-1)) - xp.float32(p.action_cost) * xp.sum(
        a * a, axis=-1
    )
    return nxt, reward.astype(xp.float32), observe(xp, arrays, nxt)


def observe(xp: Any, arrays: dict[str, Any], state: Any) -> Any:
    """The flat observation ``P @ (s - target)`` of a batch of states: ``(B, obs_size)``."""
    return (state - arrays["target"]) @ arrays["projection"].T


# -- the numpy vector env ----------------------------------------------------------------


class SyntheticVectorEnv(VectorEnv):
    """``num_envs`` copies of Synthetic-v0 stepped as whole arrays (no per-env Python loop)."""

    fresh_outputs = True  # every step computes its observations into a new array

    def __init__(
        self,
        num_envs: int = 1,
        seed: int = 0,
        obs_shape: tuple[int, ...] = (3, 4, 4),
        episode_length: int = 250,
        action_dim: int = 2,
        state_dim: int | None = None,
        step_cost_us: float = 0.0,
        first_env: int = 0,
    ) -> None:
        super().__init__(ENV_ID, num_envs, seed)
        if float(step_cost_us) < 0 or int(first_env) < 0:
            raise EnvError(
                f"{ENV_ID}: step_cost_us and first_env must not be negative, "
                f"got {step_cost_us} and {first_env}"
            )
        self.step_cost_us = float(step_cost_us)
        self.params = make_params(seed, obs_shape, episode_length, action_dim, state_dim)
        p = self.params
        self._arrays = {"projection": p.projection, "control": p.control, "target": p.target}
        self.obs_shape = p.obs_shape
        self.discrete = False
        self.num_actions = None
        self.action_shape = (p.action_dim,)
        self.action_dtype = np.dtype(np.float32)
        self.action_low = -np.ones(p.action_dim, dtype=np.float32)
        self.action_high = np.ones(p.action_dim, dtype=np.float32)
        self._seed32 = np.uint32(self.seed % 2**32)
        self._env_index = np.arange(first_env, first_env + self.num_envs, dtype=np.uint32)
        self._episode = np.zeros(self.num_envs, dtype=np.uint32)
        self._t = np.zeros(self.num_envs, dtype=np.int64)
        self._state = np.zeros((self.num_envs, p.state_dim), dtype=np.float32)
        self._started = False

    def _reset_batch(self) -> np.ndarray:
        if self._started:  # a later reset starts the *next* episode of every env
            self._episode += np.uint32(1)
        self._started = True
        self._t[:] = 0
        self._state = initial_state(
            np, self._seed32, self._env_index, self._episode, self.params.state_dim
        )
        return observe(np, self._arrays, self._state)

    def _step_batch(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        p = self.params
        if self.step_cost_us:
            _busy(self.step_cost_us * self.num_envs * 1e-6)
        nxt, reward, obs = transition(np, self._arrays, p, self._state, actions)
        self._t += 1
        truncated = self._t >= p.episode_length
        final_obs = None
        if truncated.any():
            final_obs = obs  # ``obs`` is bound to a new array below, not written
            self._episode = self._episode + truncated.astype(np.uint32)
            fresh = initial_state(np, self._seed32, self._env_index, self._episode, p.state_dim)
            nxt = np.where(truncated[:, None], fresh, nxt)
            obs = np.where(truncated[:, None], observe(np, self._arrays, fresh), obs)
            self._t[truncated] = 0
        self._state = nxt
        return obs, reward, np.zeros(self.num_envs, dtype=bool), truncated, final_obs

    def _sim_state(self) -> dict[str, Any]:
        return {
            "started": self._started,
            "episode": self._episode.copy(),
            "t": self._t.copy(),
            "state": self._state.copy(),
        }

    def _load_sim_state(self, state: dict[str, Any]) -> bool:
        self._started = bool(state["started"])
        self._episode = np.array(state["episode"], dtype=np.uint32)
        self._t = np.array(state["t"], dtype=np.int64)
        self._state = np.array(state["state"], dtype=np.float32)
        return True


def _busy(seconds: float) -> None:
    """Spin for ``seconds`` of this thread's CPU time: CPU work, as a simulator's, so that on a
    loaded machine it takes longer, as a real simulator would."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _make(num_envs: int = 1, seed: int = 0, **kwargs: Any) -> SyntheticVectorEnv:
    try:
        return SyntheticVectorEnv(num_envs=num_envs, seed=seed, **kwargs)
    except TypeError as err:
        raise EnvError(f"{ENV_ID}: bad keyword arguments {sorted(kwargs)}: {err}") from err


register_native(ENV_ID, _make)
