"""Block stores (runtime/stores.py) are allocated uninitialised: no row is read before written."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.rl.train import train
from timerl.runtime.numpy_backend import NumpyBackend


@pytest.fixture
def poisoned_blocks(monkeypatch):
    """Blocks full of NaN (or -1 for integers): a row read before it is written shows."""

    made: list[tuple] = []

    def empty(self, shape, dtype):
        made.append(shape)
        fill = np.nan if np.dtype(dtype).kind == "f" else -1
        return np.full(shape, fill, dtype=dtype)

    def poison() -> list[tuple]:
        monkeypatch.setattr(NumpyBackend, "empty", empty)
        return made  # the blocks made since: the programs below hold some

    return poison


def _ppo_metrics() -> list[dict]:
    records: list[dict] = []
    cfg = {"env_id": "CartPole-v1", "num_envs": 4, "num_steps": 32, "hidden": [16], "seed": 3}
    train("ppo", cfg, iterations=3, progress=False, on_iteration=records.append)
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


def test_ppo_never_reads_a_block_row_before_writing_it(poisoned_blocks):
    plain = _ppo_metrics()
    made = poisoned_blocks()
    poisoned = _ppo_metrics()
    assert len(made) >= 10
    assert all(np.isfinite(v) for r in poisoned for v in r.values())
    assert poisoned == plain
