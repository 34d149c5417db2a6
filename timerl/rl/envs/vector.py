"""Batched environments on the host: gymnasium's, envpool's and timerl's own behind one
:func:`make_env` (the contract is :mod:`timerl.rl.envs.protocol`'s ``VectorEnv``).

timerl programs call ``obs[i, 0] = env.reset(); obs[i, t+1], reward, done = env.step(action)``,
so every environment here is a batch of ``num_envs`` copies stepped together and returns plain
numpy arrays. Episodes reset on the *same* step they end: when ``done[b]`` is set, ``obs[b]`` is
already the first observation of env ``b``'s next episode while ``reward[b]`` is the last reward
of the one that ended. A return masked by ``done`` therefore never mixes two episodes, and the
time dimension of a program never has to skip a step for a reset.

Two kinds of environment sit behind :func:`make_env`: gymnasium ids (run through gymnasium's
synchronous vector env in same-step autoreset mode, or for CartPole through gymnasium's batched
simulator with the same trajectories) and timerl's own fully vectorised ones (``Synthetic-v0``,
see :mod:`timerl.rl.envs.synthetic`); envpool's with ``backend="envpool"``, and gymnax's
(``"gymnax:<id>"``) through :mod:`timerl.rl.envs.gymnax_host`. This module is numpy-only on
purpose: the runtime may call it from any backend (gymnax's envs import jax when made).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

import numpy as np

from timerl.errors import EnvError
from timerl.rl.envs.gymnax_host import GymnaxVectorEnv
from timerl.rl.envs.ids import env_id_of, gym_target
from timerl.rl.envs.jax_envs import is_gymnax_id
from timerl.rl.envs.protocol import _NATIVE, VectorEnv, register_native  # noqa: F401 (re-exported)
from timerl.rl.envs.synthetic import SyntheticVectorEnv  # noqa: F401  (registers Synthetic-v0)


class GymVectorEnv(VectorEnv):
    """A gymnasium id run as ``num_envs`` copies in gymnasium's same-step autoreset mode.

    Observation spaces: ``Box`` of any dtype (images included, cast to float32 unscaled) and
    ``Discrete`` (one-hot encoded, so that networks see a vector). Action spaces: ``Discrete``
    (actions are indices ``0..n-1``; a non-zero ``start`` is added for the simulator) and
    ``Box`` (actions are clipped into the box).

    Resuming (:meth:`state_dict`) is exact for envs whose whole dynamic state is the
    ``state`` attribute of the unwrapped env plus the time-limit counter, which holds for
    gymnasium's classic-control family. For other envs (Box2D, MuJoCo, ...) only the random
    generators are restored and episodes restart at the next :meth:`reset`.
    """

    def __init__(self, env_id: str, num_envs: int = 1, seed: int = 0, **kwargs: Any) -> None:
        import gymnasium as gym
        from gymnasium.spaces import Box, Discrete

        super().__init__(env_id, num_envs, seed)

        target = gym_target(env_id)

        def make_one() -> Any:
            return gym.make(target, **kwargs)

        try:
            probe = make_one()
        except gym.error.DependencyNotInstalled as err:
            hint = (
                '; install MuJoCo with pip install "timerl[mujoco]"'
                if "mujoco" in str(err).lower()
                else ""
            )
            raise EnvError(f"{env_id}: gymnasium could not create it: {err}{hint}") from err
        except gym.error.Error as err:
            raise EnvError(f"{env_id}: gymnasium could not create it: {err}") from err
        except TypeError as err:
            raise EnvError(f"{env_id}: bad keyword arguments {sorted(kwargs)}: {err}") from err
        except Exception as err:  # the user's own env failing in its constructor
            raise EnvError(f"{env_id}: creating it failed: {type(err).__name__}: {err}") from err
        obs_space, act_space = probe.observation_space, probe.action_space
        probe.close()

        if isinstance(obs_space, Box):
            self.obs_shape = tuple(int(d) for d in obs_space.shape)
            self._obs_onehot = 0
        elif isinstance(obs_space, Discrete):
            self.obs_shape = (int(obs_space.n),)
            self._obs_onehot = int(obs_space.n)
            self._obs_start = int(obs_space.start)
        else:
            raise EnvError(
                f"{env_id}: observation space {type(obs_space).__name__} ({obs_space}) is not "
                "supported; use Box or Discrete observations"
            )
        self._action_start = _describe_actions(self, act_space, f"{env_id}: action space")

        self._vec = gym.vector.SyncVectorEnv(
            [make_one] * self.num_envs,
            copy=False,
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        self._seeded = False

    def _encode(self, obs: np.ndarray) -> np.ndarray:
        if self._obs_onehot:
            idx = np.asarray(obs, dtype=np.int64).reshape(-1) - self._obs_start
            return np.eye(self._obs_onehot, dtype=np.float32)[idx]
        # Always a copy: the vector env (copy=False) reuses its observation buffer.
        return np.array(obs, dtype=np.float32)

    def _reset_batch(self) -> np.ndarray:
        # Seed only the first reset: later resets continue the same streams, so one seed
        # fixes the whole run while separate resets still see different episodes.
        obs, _ = self._vec.reset(seed=None if self._seeded else self.seed)
        self._seeded = True
        return self._encode(obs)

    def _step_batch(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        if self.discrete and self._action_start:
            actions = actions + self._action_start
        obs, reward, terminated, truncated, infos = self._vec.step(actions)
        obs = self._encode(obs)
        final_obs = None
        ended = np.logical_or(terminated, truncated)
        if ended.any() and "final_obs" in infos:
            final_obs = obs.copy()
            for b in np.flatnonzero(ended):
                final_obs[b] = self._encode(np.asarray(infos["final_obs"][b])[None])[0]
        return obs, reward, terminated, truncated, final_obs

    def render_first(self) -> np.ndarray:
        return np.asarray(self._vec.envs[0].render())

    def _sim_state(self) -> dict[str, Any]:
        envs = []
        for env in self._vec.envs:
            unwrapped = env.unwrapped
            entry: dict[str, Any] = {
                "np_random": unwrapped.np_random.bit_generator.state,
                "state": _copy_value(getattr(unwrapped, "state", None)),
                "elapsed": _elapsed_steps(env),
            }
            if not hasattr(unwrapped, "state"):
                entry["attrs"] = _plain_attributes(unwrapped)
            envs.append(entry)
        return {
            "seeded": self._seeded,
            "envs": envs,
            "obs": np.array(self._vec._observations, copy=True),
            "autoreset": np.array(self._vec._autoreset_envs, copy=True),
        }

    def _load_sim_state(self, state: dict[str, Any]) -> bool:
        if len(state["envs"]) != self.num_envs:
            raise EnvError(f"{self.env_id}: state holds {len(state['envs'])} envs")
        # A reset first satisfies gymnasium's reset-before-step checks on a fresh env; every
        # piece of state it touches is overwritten below.
        self._vec.reset(seed=self.seed)
        self._seeded = bool(state["seeded"])
        exact = True
        for env, entry in zip(self._vec.envs, state["envs"], strict=True):
            unwrapped = env.unwrapped
            unwrapped.np_random.bit_generator.state = entry["np_random"]
            if entry["state"] is not None and hasattr(unwrapped, "state"):
                unwrapped.state = _copy_value(entry["state"])
            elif entry.get("attrs") is not None and not hasattr(unwrapped, "state"):
                for name, value in entry["attrs"].items():
                    setattr(unwrapped, name, _copy_value(value))
            else:
                exact = False
            exact = _set_elapsed_steps(env, entry["elapsed"]) and exact
        if exact:
            self._vec._observations = np.array(state["obs"], copy=True)
            self._vec._autoreset_envs = np.array(state["autoreset"], copy=True)
        return exact

    def close(self) -> None:
        """Close the gymnasium sub-envs."""
        self._vec.close()
        super().close()


class GymBatchedCartPole(VectorEnv):
    """CartPole-v0/v1 stepped by gymnasium's own batched simulator (its ``vector_entry_point``).

    The batched simulator steps every copy with one set of numpy ops instead of a Python env
    per copy: at 16 envs a step costs about a third of the per-copy vector env's, which was
    most of a CartPole training run's time. Its episodes are reset here, not by it: gymnasium
    resets an ended copy on the *next* step (ignoring that step's action) from one generator
    for the batch, while copy ``k`` here is reset on the step it ends (the same-step contract)
    from its own generator seeded ``seed + k``, drawn as a single ``gym.make`` env draws. So
    copy ``k`` replays the env :class:`GymVectorEnv` runs for it (to the last bit where numpy's
    batched and scalar ``sin``/``cos`` agree), a batch split over Ray workers steps the same
    envs, and the simulator state saved in checkpoints has :class:`GymVectorEnv`'s format.
    """

    def __init__(self, env_id: str, num_envs: int = 1, seed: int = 0, **kwargs: Any) -> None:
        import gymnasium as gym

        super().__init__(env_id, num_envs, seed)
        try:
            self._sim = gym.make_vec(
                env_id, num_envs=self.num_envs, vectorization_mode="vector_entry_point", **kwargs
            )
        except TypeError as err:
            raise EnvError(f"{env_id}: bad keyword arguments {sorted(kwargs)}: {err}") from err
        except gym.error.Error as err:
            raise EnvError(f"{env_id}: gymnasium could not create it: {err}") from err
        self.obs_shape = tuple(int(d) for d in self._sim.single_observation_space.shape)
        _describe_actions(self, self._sim.single_action_space, f"{env_id}: action space")
        self._rngs: list[np.random.Generator] = []

    def _draw_starts(self, copies: np.ndarray) -> np.ndarray:
        """First states ``(4, len(copies))`` of new episodes of ``copies``."""
        sim = self._sim
        draws = [self._rngs[k].uniform(low=sim.low, high=sim.high, size=(4,)) for k in copies]
        return np.stack(draws, axis=1)

    def _reset_batch(self) -> np.ndarray:
        from gymnasium.utils.seeding import np_random

        sim = self._sim
        sim.reset(seed=self.seed)  # the counters and flags; the states are drawn below
        if not self._rngs:  # the first reset seeds each copy; later ones continue its stream
            self._rngs = [np_random(self.seed + k)[0] for k in range(self.num_envs)]
        sim.state = self._draw_starts(np.arange(self.num_envs))
        return sim.state.T.astype(np.float32, order="C")

    def _step_batch(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        sim = self._sim
        obs, reward, terminated, truncated, _ = sim.step(actions)
        obs = np.ascontiguousarray(obs, dtype=np.float32)
        ended = np.logical_or(terminated, truncated)
        final_obs = None
        if ended.any():
            final_obs, obs = obs, obs.copy()
            fresh = self._draw_starts(np.flatnonzero(ended))
            sim.state[:, ended] = fresh
            sim.steps[ended] = 0
            sim.prev_done[:] = False  # reset already: the next step must not reset them again
            obs[ended] = fresh.T
        return obs, reward, terminated, truncated, final_obs

    def render_first(self) -> np.ndarray:
        return np.asarray(self._sim.render()[0])

    def _sim_state(self) -> dict[str, Any]:
        sim = self._sim
        started = sim.state is not None and bool(self._rngs)
        envs = [
            {
                "np_random": self._rngs[k].bit_generator.state if self._rngs else None,
                "state": np.array(sim.state[:, k]) if started else None,
                "elapsed": int(sim.steps[k]),
            }
            for k in range(self.num_envs)
        ]
        obs = sim.state.T.astype(np.float32) if started else np.zeros((self.num_envs, 4))
        return {
            "seeded": bool(self._rngs),
            "envs": envs,
            "obs": obs,
            "autoreset": np.zeros(self.num_envs, dtype=bool),
        }

    def _load_sim_state(self, state: dict[str, Any]) -> bool:
        from gymnasium.utils.seeding import np_random

        if len(state["envs"]) != self.num_envs:
            raise EnvError(f"{self.env_id}: state holds {len(state['envs'])} envs")
        sim = self._sim
        sim.reset(seed=self.seed)
        self._rngs = []
        if not state["seeded"]:
            return True
        self._rngs = [np_random(self.seed + k)[0] for k in range(self.num_envs)]
        for rng, entry in zip(self._rngs, state["envs"], strict=True):
            rng.bit_generator.state = entry["np_random"]
        if any(entry["state"] is None for entry in state["envs"]):
            return False
        sim.state = np.stack([np.asarray(e["state"], dtype=np.float64) for e in state["envs"]], 1)
        sim.steps = np.array([e["elapsed"] or 0 for e in state["envs"]], dtype=np.int32)
        sim.prev_done = np.zeros(self.num_envs, dtype=bool)
        return True

    def close(self) -> None:
        """Close the gymnasium simulator."""
        self._sim.close()
        super().close()


def _copy_value(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, tuple | list):
        return type(value)(_copy_value(v) for v in value)
    return value


# attributes of a gymnasium env that are its settings or handled on their own, not its state
_NOT_STATE = {"_np_random", "_np_random_seed", "np_random", "spec", "render_mode", "metadata"}


def _plain_attributes(env: Any) -> dict[str, Any] | None:
    """The whole state of an env that keeps it in plain attributes (numbers, strings, numpy
    arrays, and lists, tuples and dicts of them), as an env of one's own mostly does; None
    when any attribute holds something else (a physics engine's handle, a window), whose
    state cannot be saved without pickling it: episodes then restart on resume."""
    from gymnasium.spaces import Space

    out: dict[str, Any] = {}
    for name, value in vars(env).items():
        if name in _NOT_STATE or isinstance(value, Space):
            continue
        if not _is_plain(value):
            return None
        out[name] = _copy_value(value)
    return out


def _is_plain(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | float | str | np.generic):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "biufc"
    if isinstance(value, tuple | list):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def _elapsed_steps(env: Any) -> int | None:
    """The TimeLimit wrapper's counter, or None when the env has no time limit."""
    while env is not None:
        if hasattr(env, "_elapsed_steps"):
            return env._elapsed_steps
        env = getattr(env, "env", None)
    return None


def _set_elapsed_steps(env: Any, value: int | None) -> bool:
    if value is None:
        return True
    while env is not None:
        if hasattr(env, "_elapsed_steps"):
            env._elapsed_steps = value
            return True
        env = getattr(env, "env", None)
    return False


def _describe_actions(env: VectorEnv, act_space: Any, what: str) -> int:
    """Set ``env``'s action attributes from a gymnasium space (every simulator's actions are
    described the same way); return the first action of a Discrete space."""
    from gymnasium.spaces import Box, Discrete

    if isinstance(act_space, Discrete):
        env.discrete = True
        env.num_actions = int(act_space.n)
        env.action_shape = ()
        env.action_dtype = np.dtype(np.int64)
        env.action_low = env.action_high = None
        return int(act_space.start)
    if isinstance(act_space, Box):
        env.discrete = False
        env.num_actions = None
        env.action_shape = tuple(int(d) for d in act_space.shape)
        env.action_dtype = np.dtype(np.float32)
        env.action_low = np.asarray(act_space.low, dtype=np.float32)
        env.action_high = np.asarray(act_space.high, dtype=np.float32)
        return 0
    raise EnvError(
        f"{what} {type(act_space).__name__} ({act_space}) is not supported; "
        "use Discrete or Box actions"
    )


class EnvpoolVectorEnv(VectorEnv):
    """An envpool id run as one C++ batch of ``num_envs`` envs (``env_backend="envpool"``).

    envpool resets an ended episode on the *next* step, ignoring that step's action; to keep
    the same-step contract, the ended envs are stepped once more at once (a reset) and their
    first observations replace the returned ones, while ``final_obs`` keeps the last
    observations of the ended episodes. Resuming restores episode statistics only: episodes
    restart at the next :meth:`reset`.
    """

    fresh_outputs = True  # envpool's arrays are copied (``np.array``) before they are returned

    def __init__(self, env_id: str, num_envs: int = 1, seed: int = 0, **kwargs: Any) -> None:
        try:
            import envpool
        except ModuleNotFoundError:
            raise EnvError(
                f'{env_id}: env backend "envpool" needs envpool; pip install "timerl[envpool]"'
            ) from None
        from gymnasium.spaces import Box

        super().__init__(env_id, num_envs, seed)
        known = list(envpool.list_all_envs())
        if env_id not in known:
            close = difflib.get_close_matches(env_id, known, n=5, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise EnvError(f"unknown envpool environment id {env_id!r}{hint}")
        try:
            self._pool = envpool.make(
                env_id, env_type="gymnasium", num_envs=self.num_envs, seed=self.seed, **kwargs
            )
        except (TypeError, ValueError, RuntimeError) as err:
            raise EnvError(f"{env_id}: envpool could not create it: {err}") from err
        obs_space, act_space = self._pool.observation_space, self._pool.action_space
        if not isinstance(obs_space, Box):
            raise EnvError(
                f"{env_id}: envpool observation space {obs_space} is not supported; use Box"
            )
        self.obs_shape = tuple(int(d) for d in obs_space.shape)
        if np.dtype(obs_space.dtype) == np.uint8:  # frames stay bytes; the policy scales them
            self.obs_dtype = np.dtype(np.uint8)
        _describe_actions(self, act_space, f"{env_id}: envpool action space")

    def _reset_batch(self) -> np.ndarray:
        obs, _ = self._pool.reset()
        return np.array(obs, dtype=self.obs_dtype)

    def _step_batch(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        obs, reward, terminated, truncated, info = self._pool.step(actions)
        order = np.asarray(info["env_id"])
        obs = np.array(obs, dtype=self.obs_dtype)
        if not np.array_equal(order, np.arange(self.num_envs)):
            # results come back in env_id order of arrival; put them in env order
            back = np.argsort(order)
            obs, reward = obs[back], np.asarray(reward)[back]
            terminated, truncated = np.asarray(terminated)[back], np.asarray(truncated)[back]
        ended = np.flatnonzero(np.logical_or(terminated, truncated))
        final_obs = None
        if len(ended):
            final_obs = obs.copy()
            idle = np.zeros((len(ended), *self.action_shape), dtype=self.action_dtype)
            first, *_, info2 = self._pool.step(idle, env_id=ended)
            first = np.asarray(first, dtype=self.obs_dtype)
            obs[np.asarray(info2["env_id"])] = first
        return obs, reward, terminated, truncated, final_obs

    def close(self) -> None:
        """Release the envpool batch."""
        close = getattr(self._pool, "close", None)
        if close is not None:
            close()
        super().close()


ENV_BACKENDS = ("gymnasium", "envpool")

# gymnasium ids whose registered batched simulator :class:`GymBatchedCartPole` runs
BATCHED_CARTPOLE = "gymnasium.envs.classic_control.cartpole:CartPoleVectorEnv"


# CleanRL's Atari settings for envpool's Atari ids: a lost life ends the episode the agent
# learns from, rewards clipped to their sign
ATARI_KWARGS = {"episodic_life": True, "reward_clip": True}


def envpool_atari(env_id: str) -> bool:
    """Whether ``env_id`` is one of envpool's Atari ids (``Pong-v5``), with envpool installed."""
    if not isinstance(env_id, str) or not env_id.endswith("-v5"):
        return False
    try:
        from envpool.registration import registry
    except ModuleNotFoundError:
        return False
    spec = registry.specs.get(env_id)
    return spec is not None and spec[0] == "envpool.atari"


def available_env_ids() -> list[str]:
    """Ids :func:`make_env` accepts: timerl's native envs and every registered gymnasium id."""
    import gymnasium as gym

    register_gymnasium()
    return sorted(set(_NATIVE) | set(gym.registry))


def make_env(
    env_id: str | Callable[..., Any],
    num_envs: int = 1,
    seed: int = 0,
    backend: str = "gymnasium",
    **kwargs: Any,
) -> VectorEnv:
    """Create ``num_envs`` seeded copies of ``env_id`` behind the :class:`VectorEnv` contract.

    ``env_id``: a registered id, gymnasium's ``"module:EnvId"`` (the module is imported
    first), or a ``gymnasium.Env`` subclass or function returning a new env
    (:mod:`timerl.rl.envs.ids`). The same ``(env_id, num_envs, seed, kwargs)`` gives the same
    trajectories for the same actions. CartPole runs as gymnasium's batched simulator
    (:class:`GymBatchedCartPole`), every other gymnasium env as one env per copy
    (:class:`GymVectorEnv`). ``"gymnax:<id>"`` is gymnax's env stepped by its jitted pure
    functions (:class:`~timerl.rl.envs.gymnax_host.GymnaxVectorEnv`: the trajectories of the
    program's ``env_backend="jax"`` env with the same seed). ``kwargs`` go to the env's
    constructor (``gymnasium.make`` for gymnasium envs, ``envpool.make`` with
    ``backend="envpool"``, ``gymnax.make`` for gymnax's).
    """
    env_id = env_id_of(env_id)
    if backend not in ENV_BACKENDS:
        raise EnvError(f"unknown env backend {backend!r}; choose one of {list(ENV_BACKENDS)}")
    if is_gymnax_id(env_id):
        if backend != "gymnasium":
            raise EnvError(f"{env_id} is a gymnax env: env backend {backend!r} does not apply")
        return GymnaxVectorEnv(env_id, num_envs=num_envs, seed=seed, **kwargs)
    if env_id in _NATIVE:
        if backend != "gymnasium":
            raise EnvError(f"{env_id} is a timerl env: env backend {backend!r} does not apply")
        return _NATIVE[env_id](num_envs=num_envs, seed=seed, **kwargs)
    if backend == "envpool":
        return EnvpoolVectorEnv(env_id, num_envs=num_envs, seed=seed, **kwargs)
    import gymnasium as gym

    register_gymnasium()
    if env_id == NO_VEL_ID:
        return BatchedCartPoleNoVel(env_id, num_envs=num_envs, seed=seed, **kwargs)
    if gym_target(env_id) is None and envpool_atari(env_id):  # envpool runs Atari ids
        return EnvpoolVectorEnv(env_id, num_envs=num_envs, seed=seed, **kwargs)
    if gym_target(env_id) is None:
        close = difflib.get_close_matches(env_id, available_env_ids(), n=5, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise EnvError(
            f"unknown environment id {env_id!r}; {hint}For an environment of your own, give "
            "'module:EnvId' (the module is imported first and registers EnvId with gymnasium, "
            "or defines it as a class), or register it with gymnasium.register before training"
        )
    if env_id in gym.registry and gym.registry[env_id].vector_entry_point == BATCHED_CARTPOLE:
        return GymBatchedCartPole(env_id, num_envs=num_envs, seed=seed, **kwargs)
    return GymVectorEnv(env_id, num_envs=num_envs, seed=seed, **kwargs)


# --- partially observed envs: memory tasks for recurrent policies ------------------------------
# ``CartPoleNoVel-v1`` is CartPole-v1 with only the cart position and the pole angle observed
# (no velocities), the usual small POMDP: a feed-forward policy sees one frame and cannot tell
# which way the pole is moving; a recurrent one can infer it from two.

NO_VEL_ID = "CartPoleNoVel-v1"
OBSERVED = (0, 2)  # cart position, pole angle (of x, x_dot, theta, theta_dot)


def cartpole_no_vel(**kwargs: Any) -> Any:
    """One gymnasium ``CartPole-v1`` with the velocities removed from its observations."""
    import gymnasium as gym
    from gymnasium.spaces import Box

    env = gym.make("CartPole-v1", **kwargs)
    space = env.observation_space
    low, high = space.low[list(OBSERVED)], space.high[list(OBSERVED)]
    return gym.wrappers.TransformObservation(
        env, lambda obs: np.asarray(obs, np.float32)[list(OBSERVED)], Box(low, high)
    )


def register_gymnasium() -> None:
    """Register ``CartPoleNoVel-v1`` with gymnasium (once), so ``gym.make`` knows it too."""
    import gymnasium as gym

    if NO_VEL_ID not in gym.registry:
        gym.register(NO_VEL_ID, entry_point=f"{__name__}:cartpole_no_vel")


class BatchedCartPoleNoVel(GymBatchedCartPole):
    """``CartPoleNoVel-v1`` on gymnasium's batched CartPole simulator (same trajectories as
    :class:`GymBatchedCartPole`'s CartPole-v1, observations cut to position and angle)."""

    def __init__(self, env_id: str, num_envs: int = 1, seed: int = 0, **kwargs: Any) -> None:
        super().__init__("CartPole-v1", num_envs, seed, **kwargs)
        self.env_id = env_id
        self.obs_shape = (len(OBSERVED),)

    def _reset_batch(self) -> np.ndarray:
        return np.ascontiguousarray(super()._reset_batch()[:, OBSERVED])

    def _step_batch(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        obs, reward, terminated, truncated, final = super()._step_batch(actions)
        if final is not None:
            final = np.ascontiguousarray(final[:, OBSERVED])
        return np.ascontiguousarray(obs[:, OBSERVED]), reward, terminated, truncated, final

    def _sim_state(self) -> dict[str, Any]:
        state = super()._sim_state()
        state["obs"] = np.ascontiguousarray(np.asarray(state["obs"])[:, OBSERVED])
        return state
