"""gymnax's envs on the host: ``make_env("gymnax:<id>")`` as a :class:`VectorEnv`.

A run trained with a gymnax env inside the program (``env_backend="jax"``, see
:mod:`timerl.rl.envs.pure`) is evaluated, exported and plotted against a host batch of the
same env: this one. It runs :func:`timerl.rl.envs.jax_envs.make_jax_env`'s pure functions,
jitted once, with numpy arrays in and out; the env's state (the key of its random steps
included) stays a jax pytree between steps.

Seeds are the program's: the first :meth:`~VectorEnv.reset` draws from ``jax.random.key(seed)``
as :class:`~timerl.rl.envs.pure.PureEnv` does, so the same ``(env_id, num_envs, seed)`` and
the same actions give the program's trajectories. A later reset continues from a key folded
from the seed and the number of resets, so separate resets see different episodes while one
seed still fixes the whole run.

Each step is the pure env's ``full_step``: the same states, observations and rewards as the
program's step, plus what its auto-reset drops, which off-policy learners need to bootstrap
through time limits: ``final_obs``, and an end at gymnax's ``max_steps_in_episode`` reported
as truncated rather than terminated (gymnax 0.0.x has one done flag; an episode that really
ends on its last allowed step counts as truncated too). gymnax envs draw no frames:
``render_mode`` is refused with a clear error.

jax and gymnax are optional: this module imports neither until an env is made.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from timerl.errors import EnvError
from timerl.rl.envs.jax_envs import make_jax_env
from timerl.rl.envs.protocol import VectorEnv


class GymnaxVectorEnv(VectorEnv):
    """``num_envs`` copies of a gymnax env stepped by the jitted pure functions of
    :func:`~timerl.rl.envs.jax_envs.make_jax_env` (same-step auto-reset is gymnax's own).

    ``image_layout`` is the pure env's: ``"HWC"`` for MinAtar's planes, else None. Resuming
    (:meth:`state_dict`) is exact: the state's leaves (keys as their raw data) are saved."""

    fresh_outputs = True  # every step's arrays are new numpy copies of jax's results

    def __init__(self, env_id: str, num_envs: int = 1, seed: int = 0, **kwargs: Any) -> None:
        if "render_mode" in kwargs:
            raise EnvError(
                f"{env_id}: gymnax environments draw no frames (render_mode="
                f"{kwargs['render_mode']!r}); videos of them are not supported"
            )
        super().__init__(env_id, num_envs, seed)
        jenv = make_jax_env(env_id, self.num_envs, self.seed, **kwargs)
        import jax

        self._jax = jax
        self._jenv = jenv
        self.obs_shape = tuple(jenv.obs_shape)
        self.image_layout = jenv.image_layout
        self.discrete = jenv.discrete
        self.num_actions = jenv.num_actions
        self.action_shape = tuple(jenv.action_shape)
        if jenv.discrete:
            self.action_dtype = np.dtype(np.int32)
            self.action_low = self.action_high = None
        else:
            self.action_dtype = np.dtype(np.float32)
            self.action_low = np.asarray(jenv.action_low, np.float32)
            self.action_high = np.asarray(jenv.action_high, np.float32)
        # jitted once; params are an argument, so no constant is baked into the programs
        self._reset_fn = jax.jit(jenv.reset)
        self._step_fn = jax.jit(jenv.full_step)
        self._state: Any = None
        self._resets = 0  # how many resets the key stream has served
        with jax.enable_x64(False):
            shapes, _ = jax.eval_shape(jenv.reset, jax.random.key(0), jenv.params)
        leaves, self._treedef = jax.tree_util.tree_flatten(shapes)
        self._keyed = [jax.numpy.issubdtype(x.dtype, jax.dtypes.prng_key) for x in leaves]

    def _reset_key(self) -> Any:
        key = self._jax.random.key(self.seed)
        return key if self._resets == 0 else self._jax.random.fold_in(key, self._resets)

    def _reset_batch(self) -> np.ndarray:
        with self._jax.enable_x64(False):
            self._state, obs = self._reset_fn(self._reset_key(), self._jenv.params)
        self._resets += 1
        return np.array(obs, dtype=np.float32)

    def _step_batch(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        # actions are cast by ``_prepare_actions``: int64 indices or clipped float32
        acts = actions.astype(np.int32) if self.discrete else actions.astype(np.float32)
        with self._jax.enable_x64(False):
            self._state, *out = self._step_fn(self._state, acts, self._jenv.params)
        obs, reward, terminated, truncated, last = (np.asarray(x) for x in out)
        ended = terminated | truncated
        final_obs = np.array(last, dtype=np.float32) if ended.any() else None
        return (
            np.array(obs, dtype=np.float32),
            np.array(reward, np.float32),
            terminated,
            truncated,
            final_obs,
        )

    def _sim_state(self) -> dict[str, Any]:
        if self._state is None:
            return {"resets": self._resets, "leaves": None}
        jax = self._jax
        leaves = jax.tree_util.tree_leaves(self._state)
        raw = [
            np.array(jax.random.key_data(x) if k else x)
            for x, k in zip(leaves, self._keyed, strict=True)
        ]
        return {"resets": self._resets, "leaves": raw}

    def _load_sim_state(self, state: dict[str, Any]) -> bool:
        jax = self._jax
        self._resets = int(state.get("resets", 0))
        raw = state.get("leaves")
        if raw is None:
            self._state = None
            return False
        if len(raw) != len(self._keyed):
            raise EnvError(
                f"{self.env_id}: saved state has {len(raw)} leaves, the env's has "
                f"{len(self._keyed)} (saved with another gymnax version?)"
            )
        leaves = [
            jax.random.wrap_key_data(jax.numpy.asarray(x)) if k else jax.numpy.asarray(x)
            for x, k in zip(raw, self._keyed, strict=True)
        ]
        self._state = jax.tree_util.tree_unflatten(self._treedef, leaves)
        return True

    def close(self) -> None:
        """Drop the env's state (nothing else is held)."""
        self._state = None
        super().close()
