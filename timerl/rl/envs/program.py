"""Environments as side-effecting ops: ``obs[i, 0] = env.reset(); obs[i, t+1], r, d = env.step(a)``.

Each call is one op marked as an effect: a root of the program that is never duplicated,
vectorised or reordered, executed in the schedule's time order. The simulator behind it is a
numpy :class:`~timerl.rl.envs.vector.VectorEnv` (same-step auto-reset, so ``done`` masks keep returns
inside episodes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from timerl.api.calls import Result, host_call
from timerl.api.tensor import RecurrentTensor
from timerl.errors import EnvError
from timerl.rl.envs.ids import env_id_of
from timerl.rl.envs.vector import VectorEnv
from timerl.rl.envs.vector import make_env as make_vector_env

if TYPE_CHECKING:
    from timerl.rl.envs.pure import PureEnv


def _owned(obs: np.ndarray, vec: VectorEnv) -> np.ndarray:
    """Observations the program may keep: the env's own array where the env never writes
    into it again (``VectorEnv.fresh_outputs``), else a copy. A step's observations are
    most of what a rollout of images moves: 1.5 MiB a step for 32 envs of 3 x 64 x 64."""
    dtype = vec.obs_dtype
    return np.asarray(obs, dtype=dtype) if vec.fresh_outputs else np.array(obs, dtype)


class Env:
    """A batch of ``num_envs`` environments seen from a timerl program: the host batch's
    :class:`~timerl.rl.envs.protocol.EnvSpaces`, with reset and step as host calls."""

    def __init__(self, vec: VectorEnv) -> None:
        self.vec = vec
        vec.keep_final_obs = False  # until a step asks for it (``step(full=True)``)
        self.env_id = vec.env_id
        self.num_envs = vec.num_envs
        self.obs_shape = tuple(vec.obs_shape)
        self.discrete = vec.discrete
        self.num_actions = vec.num_actions
        self.action_shape = tuple(vec.action_shape)

    @property
    def obs_dtype(self) -> str:
        """The observations' dtype in the program: uint8 frames stay bytes, else float32."""
        return str(self.vec.obs_dtype)

    @property
    def image_layout(self) -> str | None:
        """The simulator's own layout (``"HWC"`` for gymnax's MinAtar planes), else ``"CHW"``
        for frames of bytes (envpool's Atari stacks), None for other observations: what
        ``--policy auto`` reads to give a CNN (``rl/algos/policy_gradient.py``)."""
        layout = getattr(self.vec, "image_layout", None)
        if layout is not None:
            return layout
        return "CHW" if len(self.obs_shape) == 3 and self.obs_dtype == "uint8" else None

    @property
    def batch_obs_shape(self) -> tuple[int, ...]:
        return (self.num_envs, *self.obs_shape)

    def reset(self) -> RecurrentTensor:
        """Observations of fresh episodes, shape ``(num_envs, *obs_shape)``.

        Assigned into ``obs[i, 0]`` it runs once per ``i``; anywhere else, once.
        """
        vec = self.vec
        return host_call(
            lambda: _owned(vec.reset(), vec),
            result=Result(self.batch_obs_shape, self.obs_dtype),
            name=f"{vec.env_id}.reset",
            where_assigned=True,
        )

    def step(self, action: RecurrentTensor, *, full: bool = False) -> tuple[RecurrentTensor, ...]:
        """One step of every env: ``(next_obs, reward, done)``; ended episodes auto-reset.

        ``full=True`` adds ``terminated`` (the episode really ended, so no bootstrapping) and
        ``final_obs`` (the true next observation: the last one of an ended episode, where
        ``next_obs`` already starts the next). Off-policy learners need both to bootstrap
        correctly through time-limit truncations.
        """
        vec = self.vec
        if full:
            vec.keep_final_obs = True
        want = (self.num_envs, *self.action_shape)
        if tuple(action.shape) != want:
            raise EnvError(
                f"{vec.env_id}.step: actions must have shape {want}, got {tuple(action.shape)}"
            )

        def step(a: np.ndarray) -> tuple[np.ndarray, ...]:
            obs, reward, done = vec.step(a)
            out = (_owned(obs, vec), reward.astype(np.float32), done.astype(bool))
            if not full:
                return out
            final = out[0] if vec.final_obs is None else _owned(vec.final_obs, vec)
            return (*out, vec.terminated.astype(bool), final)

        parts = [
            (self.batch_obs_shape, self.obs_dtype, "obs"),
            ((self.num_envs,), "float32", "reward"),
            ((self.num_envs,), bool, "done"),
        ]
        if full:
            parts += [
                ((self.num_envs,), bool, "terminated"),
                (self.batch_obs_shape, self.obs_dtype, "final_obs"),
            ]
        return host_call(
            step,
            action,
            results=[Result(shape, dtype, f"{vec.env_id}.{what}") for shape, dtype, what in parts],
            name=f"{vec.env_id}.step",
            # ``step`` casts and shapes every part exactly as declared
            exact=True,
            # an env stepped elsewhere (Ray workers) can be started and waited for apart, so
            # the program computes what does not need the step meanwhile
            start=getattr(vec, "step_async", None),
        )

    def state_dict(self) -> dict[str, Any]:
        return self.vec.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.vec.load_state_dict(state)

    def close(self) -> None:
        self.vec.close()


def make_env(
    env_id: str | Callable[..., Any],
    num_envs: int = 1,
    seed: int = 0,
    backend: str = "gymnasium",
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    **kwargs: Any,
) -> Env | PureEnv:
    """``tl.rl.make_env``: a seeded batch of environments usable inside a program.

    ``env_id``: a registered id, ``"module:EnvId"``, or a ``gymnasium.Env`` subclass or a
    function returning a new env (see :mod:`timerl.rl.envs.ids`);
    ``backend="envpool"`` simulates it with envpool (``pip install "timerl[envpool]"``);
    ``backend="jax"`` takes the env's pure JAX version (``rl/envs/jax_envs.py``), whose state the
    program carries (``rl/envs/pure.py``).

    ``workers=N`` (N >= 1) steps the batch on N Ray actors (``pip install "timerl[ray]"``),
    joining the Ray cluster at ``ray_address`` or starting a local one; same seed, same
    trajectories. ``None`` takes the enclosing :func:`timerl.rl.envs.ray_env.env_workers` setting
    (0, no Ray, outside one)."""
    from timerl.rl.envs.ray_env import placement

    env_id = env_id_of(env_id)  # a class or factory is known by "module:qualname"
    workers, ray_address = placement(workers, ray_address)
    if workers < 0:
        raise EnvError(f"{env_id}: workers must be 0 (no Ray) or more, got {workers}")
    if backend == "jax":
        if workers:
            raise EnvError(
                f'{env_id}: env backend "jax" runs inside the program; it cannot be split '
                f"over {workers} Ray workers"
            )
        from timerl.rl.envs.pure import PureEnv

        return PureEnv(env_id, num_envs, seed, **kwargs)
    if workers:
        from timerl.rl.envs.ray_env import RayVectorEnv

        return Env(
            RayVectorEnv(
                env_id,
                num_envs,
                seed,
                backend,
                workers=workers,
                ray_address=ray_address,
                **kwargs,
            )
        )
    return Env(make_vector_env(env_id, num_envs=num_envs, seed=seed, backend=backend, **kwargs))
