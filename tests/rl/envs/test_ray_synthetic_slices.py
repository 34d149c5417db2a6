"""What splitting Synthetic-v0 over workers relies on (no Ray needed): slices numbered from
``first_env`` step exactly the whole batch's envs, and ``step_cost_us`` costs that much time."""

from __future__ import annotations

import time

import numpy as np
import pytest

from timerl.errors import EnvError
from timerl.rl.envs import make_env


def test_slices_from_first_env_are_the_whole_batch():
    whole = make_env("Synthetic-v0", num_envs=5, seed=4, episode_length=3)
    parts = [
        make_env("Synthetic-v0", num_envs=2, seed=4, episode_length=3),
        make_env("Synthetic-v0", num_envs=3, seed=4, episode_length=3, first_env=2),
    ]
    rng = np.random.default_rng(1)
    got = np.concatenate([p.reset() for p in parts])
    np.testing.assert_array_equal(whole.reset(), got)
    for _ in range(8):  # crosses two episode ends
        a = rng.uniform(-1, 1, size=(5, 2))
        obs, r, d = whole.step(a)
        outs = [parts[0].step(a[:2]), parts[1].step(a[2:])]
        for k in range(3):
            np.testing.assert_array_equal(np.concatenate([o[k] for o in outs]), (obs, r, d)[k])
    # a slice not numbered from its first index would repeat env 0's episodes
    other = make_env("Synthetic-v0", num_envs=3, seed=4, episode_length=3)
    assert not np.array_equal(other.reset(), parts[1].reset())


def test_step_cost_is_busy_time_per_env_step():
    env = make_env("Synthetic-v0", num_envs=8, seed=0, step_cost_us=500)
    env.reset()
    t0 = time.perf_counter()
    for _ in range(5):
        env.step(np.zeros((8, 2)))
    assert time.perf_counter() - t0 >= 5 * 8 * 500e-6
    with pytest.raises(EnvError, match="must not be negative"):
        make_env("Synthetic-v0", num_envs=1, step_cost_us=-1)
