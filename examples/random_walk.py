"""An environment of your own: a gymnasium.Env in a module that registers it.

``timerl train ppo --env random_walk:RandomWalk-v0`` imports this module (from the current
folder or PYTHONPATH) and makes ``RandomWalk-v0``, as ``gymnasium.make`` does with
``module:EnvId``. ``examples/custom_env.py`` trains, evaluates, exports and resumes on it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class RandomWalk(gym.Env):
    """Walk left or right along ``size`` cells, starting in the middle: reaching the right
    end pays 1 and ends the episode, every other step costs 0.01 (the best return, from the
    middle of 7 cells, is 0.98). The observation is the one-hot position, as float64."""

    def __init__(self, size: int = 7) -> None:
        self.size = size
        self.observation_space = gym.spaces.Box(0.0, 1.0, (size,), np.float64)
        self.action_space = gym.spaces.Discrete(2)  # 0: left, 1: right
        self.position = size // 2

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.size)
        obs[self.position] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.position = self.size // 2
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.position = max(0, self.position + (1 if action == 1 else -1))
        arrived = self.position == self.size - 1
        return self._obs(), 1.0 if arrived else -0.01, arrived, False, {}


# an episode that never arrives is cut after 50 steps (truncated, as gymnasium's TimeLimit does)
gym.register("RandomWalk-v0", entry_point=RandomWalk, max_episode_steps=50)
