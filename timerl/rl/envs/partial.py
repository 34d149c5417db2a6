"""Partially observed versions of gymnasium's envs: memory tasks for recurrent policies.

``CartPoleNoVel-v1`` is CartPole-v1 with only the cart position and the pole angle observed
(no velocities), the usual small POMDP: a feed-forward policy sees one frame and cannot tell
which way the pole is moving; a recurrent one can infer it from two.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from timerl.rl.envs.vector import GymBatchedCartPole

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
