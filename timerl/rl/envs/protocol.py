"""What an environment offers, whatever simulates it: the one contract of ``timerl.rl.envs``.

Every environment is a batch of ``num_envs`` copies stepped together, with the spaces of
:class:`EnvSpaces` (``env_id``, ``num_envs``, ``obs_shape``, ``discrete``, ``num_actions``,
``action_shape``) and same-step auto-reset: where ``done[b]``, ``obs[b]`` is already the first
observation of env ``b``'s next episode and ``reward[b]`` the last reward of the one that
ended. It comes in two forms:

- on the host, :class:`VectorEnv`: ``reset() -> obs`` and ``step(actions) -> (obs, reward,
  done)`` on numpy arrays, with episode statistics and a state dict. gymnasium ids and user
  envs (``vector.GymVectorEnv``, ``GymBatchedCartPole``), envpool (``EnvpoolVectorEnv``), Ray
  workers (``ray_env.RayVectorEnv``), gymnax's envs (``gymnax_host.GymnaxVectorEnv``, their
  pure functions jitted) and timerl's own ``Synthetic-v0`` are its subclasses;
- as pure functions, ``jax_envs.JaxEnv``: ``reset(key, params) -> (state, obs)`` and
  ``step(state, action, params) -> (state, obs, reward, done)``, traced into a program.

Inside a program both become ``obs[i, 0] = env.reset(); obs[i, t + 1], reward, done =
env.step(action)``: ``program.Env`` (host calls of a :class:`VectorEnv`) and ``pure.PureEnv``
(pure calls of a ``JaxEnv``), which offer the same :class:`EnvSpaces`.

This module also holds the registry of timerl's own (native) environments; it is kept apart
from ``vector`` so that native simulators (``synthetic``) can subclass ``VectorEnv`` while
``vector.make_env`` imports them: no import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from timerl.errors import EnvError


@runtime_checkable
class EnvSpaces(Protocol):
    """The batch and spaces every environment form offers (host, pure, in a program)."""

    env_id: str
    num_envs: int
    obs_shape: tuple[int, ...]
    discrete: bool
    num_actions: int | None  # of a discrete env; None for a Box one
    action_shape: tuple[int, ...]  # () for a discrete env


# Native environments: id -> factory(num_envs, seed, **kwargs). Filled by the modules that
# define them (imported by ``timerl.rl.envs.vector``) so that make_env finds them before gymnasium.
_NATIVE: dict[str, Callable[..., VectorEnv]] = {}


def register_native(env_id: str, factory: Callable[..., VectorEnv]) -> None:
    """Make ``env_id`` resolvable by :func:`make_env` without going through gymnasium."""
    _NATIVE[env_id] = factory


# ``EpisodeTally.add_steps`` loops over the steps from this many envs on (see there)
STEP_LOOP_FROM_ENVS = 128


class EpisodeTally:
    """Running return and length of each env's episode, and the episodes ended since last asked.

    Shared by every kind of env (stepped on the host, or pure ops of the program whose rewards
    are counted after the rollout), so the training driver reads one format."""

    def __init__(self, num_envs: int) -> None:
        self.running_return = np.zeros(num_envs, dtype=np.float64)
        self.running_length = np.zeros(num_envs, dtype=np.int64)
        self.done_returns: list[float] = []
        self.done_lengths: list[int] = []

    def restart(self) -> None:
        """Every env starts a new episode (its partial return is dropped)."""
        self.running_return[:] = 0.0
        self.running_length[:] = 0

    def add(self, reward: np.ndarray, done: np.ndarray) -> None:
        """One step of every env; ``done`` ends the episodes it marks (this reward included)."""
        self.running_return += reward
        self.running_length += 1
        if done.any():
            idx = np.flatnonzero(done)
            self.done_returns.extend(self.running_return[idx].tolist())
            self.done_lengths.extend(self.running_length[idx].tolist())
            self.running_return[idx] = 0.0
            self.running_length[idx] = 0

    def add_steps(self, rewards: np.ndarray, dones: np.ndarray) -> None:
        """``T`` steps of every env at once (``(T, num_envs)`` arrays): the same sums, in the
        same order, as ``T`` calls of ``add``. Two exact ways, picked by the number of envs:
        whole-array passes cost per element, a loop over the steps per step (measured here,
        numpy on one core: 250 steps x 256 envs 6.5 ms by passes, 1.6 ms by steps; 128 x 16
        0.28 and 0.55 ms; 1,000 x 8 0.56 and 2.0 ms; 128 x 64 about equal)."""
        rewards = np.asarray(rewards, dtype=np.float64)
        dones = np.asarray(dones, dtype=bool)
        if rewards.shape[0] == 0:
            return
        if rewards.shape[1] >= STEP_LOOP_FROM_ENVS:
            self._add_by_steps(rewards, dones)
        else:
            self._add_by_passes(rewards, dones)

    def _add_by_passes(self, rewards: np.ndarray, dones: np.ndarray) -> None:
        """Each episode's sum is one column of a matrix (the running return or 0.0 in row 0,
        then its rewards) summed down by one sequential ``np.add.accumulate``, so no Python
        loop runs over the steps or the episodes (a loop over CartPole's short episodes cost
        0.4 ms an iteration)."""
        steps, n = rewards.shape
        tt = np.arange(steps)[:, None]
        # segment of each step within its env (dones strictly before it) and its position
        before = np.cumsum(dones, axis=0) - dones
        reset = np.where(dones, tt + 1, 0)
        first = np.maximum.accumulate(np.concatenate([np.zeros((1, n), int), reset[:-1]]), 0)
        pos = tt - first
        per_env = dones.sum(0) + 1  # its episodes ending here, and the one running on
        offset = np.concatenate([[0], np.cumsum(per_env)[:-1]])
        seg = before + offset
        sums = np.zeros((int(pos.max()) + 2, int(per_env.sum())))
        sums[0, offset] = self.running_return
        sums[pos + 1, seg] = rewards
        sums = np.add.accumulate(sums, axis=0)
        length0 = np.zeros(sums.shape[1], np.int64)
        length0[offset] = self.running_length
        # the episodes that end: (t, env) in the order ``add`` meets them
        t_end, j_end = np.nonzero(dones)
        s_end = seg[t_end, j_end]
        p_end = pos[t_end, j_end]
        self.done_returns.extend(sums[p_end + 1, s_end].tolist())
        self.done_lengths.extend((length0[s_end] + p_end + 1).tolist())
        # the episode running on after the last step: it starts after the env's last done
        last = offset + per_env - 1
        ran = np.where(dones[-1], 0, steps - first[-1])
        self.running_return[:] = sums[ran, last]
        self.running_length[:] = length0[last] + ran

    def _add_by_steps(self, rewards: np.ndarray, dones: np.ndarray) -> None:
        """The running returns summed row by row, as ``add`` does; the ends' lengths and the
        running lengths in closed form (an episode ending at row ``t`` began after its env's
        previous end, or ``running_length`` rows before row 0)."""
        steps = rewards.shape[0]
        t_end, j_end = np.nonzero(dones)  # row-major: the order ``add`` meets the ends
        by_env = np.argsort(j_end, kind="stable")
        t_env, j_env = t_end[by_env], j_end[by_env]
        first = np.ones(len(j_env), dtype=bool)
        first[1:] = j_env[1:] != j_env[:-1]
        began = np.empty_like(t_env)
        began[first] = -self.running_length[j_env[first]]
        began[~first] = t_env[:-1][~first[1:]] + 1
        lengths = np.empty_like(t_env)
        lengths[by_env] = t_env + 1 - began
        ret = self.running_return
        cut = np.searchsorted(t_end, np.arange(steps + 1))  # row k's ends: cut[k]:cut[k + 1]
        returns = np.empty(len(t_end))
        for k, row in enumerate(rewards):
            np.add(ret, row, out=ret)
            a, b = cut[k], cut[k + 1]
            if a != b:
                idx = j_end[a:b]
                returns[a:b] = ret[idx]
                ret[idx] = 0.0
        self.done_returns.extend(returns.tolist())
        self.done_lengths.extend(lengths.tolist())
        last_end = np.full(len(ret), -1)
        last_end[j_env] = t_env  # each env's latest end (written last)
        ended = last_end >= 0
        self.running_length[:] = np.where(ended, steps - 1 - last_end, self.running_length + steps)

    def completed_returns(self) -> np.ndarray:
        """Returns of the episodes finished since the last call (then forgotten)."""
        out = np.asarray(self.done_returns, dtype=np.float64)
        self.done_returns = []
        return out

    def completed_lengths(self) -> np.ndarray:
        """Lengths of the episodes finished since the last call (then forgotten)."""
        out = np.asarray(self.done_lengths, dtype=np.int64)
        self.done_lengths = []
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "running_return": self.running_return.copy(),
            "running_length": self.running_length.copy(),
            "done_returns": list(self.done_returns),
            "done_lengths": list(self.done_lengths),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.running_return = np.array(state["running_return"], dtype=np.float64)
        self.running_length = np.array(state["running_length"], dtype=np.int64)
        self.done_returns = list(state["done_returns"])
        self.done_lengths = list(state["done_lengths"])


class VectorEnv:
    """A batch of ``num_envs`` environments with same-step auto-reset, on the host: the
    :class:`EnvSpaces` with ``reset`` and ``step`` on numpy arrays.

    Subclasses implement ``_reset_batch`` and ``_step_batch`` on prepared arrays; this base class
    owns what must be identical for every simulator: action checking, casting and clipping,
    float32 outputs, episode statistics and the state-dict format.
    """

    env_id: str
    num_envs: int
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    discrete: bool
    num_actions: int | None
    action_shape: tuple[int, ...]
    action_dtype: np.dtype
    action_low: np.ndarray | None
    action_high: np.ndarray | None
    # True where ``_reset_batch`` and ``_step_batch`` return observations computed anew on
    # every call, which the simulator never writes into afterwards: a program may then keep
    # them as they are. Otherwise (a simulator that updates one state buffer in place, as
    # gymnasium's may) whoever keeps them past the next step must copy them.
    fresh_outputs: bool = False
    # "HWC" where the observations are images with their channels last (gymnax's MinAtar
    # planes), "CHW" with them first; None where the simulator does not say (a program's
    # ``Env`` then takes 3-d uint8 frames as "CHW")
    image_layout: str | None = None

    def __init__(self, env_id: str, num_envs: int, seed: int) -> None:
        if int(num_envs) < 1:
            raise EnvError(f"{env_id}: num_envs must be at least 1, got {num_envs}")
        self.env_id = env_id
        self.num_envs = int(num_envs)
        self.seed = int(seed)
        self.obs_dtype = np.dtype(np.float32)
        # Outcome of the last step, kept apart from `done` so that learners can bootstrap
        # from the value of the final observation when an episode was only truncated.
        self.terminated = np.zeros(self.num_envs, dtype=bool)
        self.truncated = np.zeros(self.num_envs, dtype=bool)
        # Last observation of each episode that ended at the last step (rows where done);
        # the returned obs already belong to the next episode.
        self.final_obs: np.ndarray | None = None
        # Whether step() keeps ``final_obs``: a program whose steps never ask for it turns
        # this off (``environment.Env``), or a batch of observations would stay alive until
        # the next step, through a whole update where the rollout ends every episode (32 envs
        # of 3x64x64 images: 1.5 MiB that no value of the program holds).
        self.keep_final_obs = True
        # The obs returned by the last reset()/step(), so a resumed learner can pick up.
        self.last_obs: np.ndarray | None = None
        self._needs_reset = True
        self._restart_on_step = False  # set by a resume that could not restore the simulators
        self.episodes = EpisodeTally(self.num_envs)

    # -- contract ------------------------------------------------------------------------
    def reset(self) -> np.ndarray:
        """Start a fresh episode in every env; returns obs of shape ``(B, *obs_shape)``."""
        obs = self._reset_batch()
        self._restart_on_step = False
        self.episodes.restart()
        self.terminated[:] = False
        self.truncated[:] = False
        self.final_obs = None
        self._needs_reset = False
        self.last_obs = self._as_obs(obs)
        return self.last_obs

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Advance every env by one step; returns ``(obs, reward, done)``.

        ``done[b]`` means env ``b``'s episode ended here (terminated or truncated), ``obs[b]``
        is then the first observation of its next episode, and ``reward[b]`` the last reward
        of the ended one.
        """
        if self._restart_on_step:
            # resumed without the simulators' state: episodes restart here, and the actions
            # (chosen for the checkpoint's observations) act on the first observations of the
            # new episodes
            self.reset()
        if self._needs_reset:
            raise EnvError(f"{self.env_id}: call reset() before step()")
        acts = self._prepare_actions(actions)
        obs, reward, terminated, truncated, final_obs = self._step_batch(acts)
        reward = np.asarray(reward, dtype=np.float32).reshape(self.num_envs)
        self.terminated = np.asarray(terminated, dtype=bool).reshape(self.num_envs)
        self.truncated = np.asarray(truncated, dtype=bool).reshape(self.num_envs) & ~self.terminated
        done = self.terminated | self.truncated
        keep = final_obs is not None and self.keep_final_obs
        self.final_obs = self._as_obs(final_obs) if keep else None
        self.episodes.add(reward, done)
        self.last_obs = self._as_obs(obs)
        return self.last_obs, reward, done

    def completed_returns(self) -> np.ndarray:
        """Returns of the episodes finished since the last call (then forgotten)."""
        return self.episodes.completed_returns()

    def completed_lengths(self) -> np.ndarray:
        """Lengths of the episodes finished since the last call (then forgotten)."""
        return self.episodes.completed_lengths()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue this batch later; plain Python/numpy values."""
        return {
            "env_id": self.env_id,
            "num_envs": self.num_envs,
            "seed": self.seed,
            "needs_reset": self._needs_reset,
            **self.episodes.state_dict(),
            "last_obs": None if self.last_obs is None else self.last_obs.copy(),
            "sim": self._sim_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` of an env made with the same id and size."""
        if state.get("env_id") != self.env_id or state.get("num_envs") != self.num_envs:
            raise EnvError(
                f"{self.env_id}: state is for env {state.get('env_id')!r} with "
                f"{state.get('num_envs')} envs, not {self.env_id!r} with {self.num_envs}"
            )
        self.seed = int(state["seed"])
        self.episodes.load_state_dict(state)
        self._needs_reset = bool(state["needs_reset"])
        last = state.get("last_obs")
        self.last_obs = None if last is None else np.array(last, dtype=self.obs_dtype)
        exact = self._load_sim_state(state["sim"])
        if not exact and not self._needs_reset:
            # Only the random streams could be restored: episodes restart at the next step
            # (or reset), as a program that carries its last observation on never resets.
            self._restart_on_step = True
            self.episodes.restart()

    def close(self) -> None:
        """Release simulator resources; the env cannot be used afterwards."""
        self._needs_reset = True

    def render_first(self) -> np.ndarray:
        """An RGB frame of env 0 (made with ``render_mode="rgb_array"``), for videos."""
        raise EnvError(f"{self.env_id}: {type(self).__name__} does not render")

    def __enter__(self) -> VectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = f"Discrete({self.num_actions})" if self.discrete else f"Box{self.action_shape}"
        return (
            f"{type(self).__name__}({self.env_id!r}, num_envs={self.num_envs}, "
            f"obs_shape={self.obs_shape}, action={kind})"
        )

    # -- for subclasses ------------------------------------------------------------------
    def _reset_batch(self) -> np.ndarray:
        raise NotImplementedError

    def _step_batch(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Returns ``(obs, reward, terminated, truncated, final_obs_or_None)``."""
        raise NotImplementedError

    def _sim_state(self) -> dict[str, Any]:
        return {}

    def _load_sim_state(self, state: dict[str, Any]) -> bool:
        """Restore the simulator; return True when episodes can continue mid-way."""
        return False

    # -- helpers -------------------------------------------------------------------------
    def _as_obs(self, obs: Any) -> np.ndarray:
        return np.asarray(obs, dtype=self.obs_dtype).reshape((self.num_envs, *self.obs_shape))

    def _prepare_actions(self, actions: Any) -> np.ndarray:
        """Cast, reshape and clip a batch of actions; reject what cannot be one."""
        a = np.asarray(actions)
        want = (self.num_envs, *self.action_shape)
        if a.shape != want:
            if a.size != int(np.prod(want)):
                raise EnvError(
                    f"{self.env_id}: actions of shape {a.shape} do not fit {self.num_envs} envs "
                    f"with action shape {self.action_shape} (expected {want})"
                )
            a = a.reshape(want)
        if a.dtype.kind not in "biuf":
            raise EnvError(f"{self.env_id}: actions must be numeric, got dtype {a.dtype}")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise EnvError(f"{self.env_id}: actions contain NaN or infinity")
        if self.discrete:
            if a.dtype.kind == "f":
                a = np.rint(a)
            a = a.astype(np.int64)
            if a.min() < 0 or a.max() >= self.num_actions:
                raise EnvError(
                    f"{self.env_id}: discrete actions must lie in [0, {self.num_actions}), "
                    f"got values in [{a.min()}, {a.max()}]"
                )
            return a
        return np.clip(a.astype(self.action_dtype), self.action_low, self.action_high)
