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


def test_a_freed_block_is_reused_only_once_no_view_of_it_is_alive():
    from timerl.runtime.stores import BlockStore

    store = BlockStore(4, (3,), np.float32, NumpyBackend())
    store.keep_spare(fault_in=False)
    store.allocate((0,))
    rows = store.blocks[(0,)][0]
    view = rows[1:3]
    store.free_prefix((0,))
    store.allocate((1,))
    assert store.blocks[(1,)][0] is not rows  # a view could still read the freed rows
    del view, rows
    first = id(store.blocks[(1,)][0])  # (a reference held here would be one more reader)
    store.blocks[(1,)][1][:] = True
    store.free_prefix((1,))
    store.allocate((2,))
    assert id(store.blocks[(2,)][0]) == first
    assert not store.blocks[(2,)][1].any()  # no row of the new block is written yet
    store.allocate((3,))
    store.free_all()
    assert len(store.spare) == 1  # one block's rows at most


def test_a_spare_made_at_setup_has_its_pages_touched():
    from timerl.runtime.stores import BlockStore

    store = BlockStore(8, (1024,), np.float32, NumpyBackend())
    store.keep_spare(fault_in=True)
    (rows,) = store.spare
    assert rows.shape == (8, 1024) and not rows.any()
    made = id(rows)
    del rows
    store.allocate((0,))
    assert id(store.blocks[(0,)][0]) == made and not store.spare


def test_a_torch_block_reuses_the_numpy_rows_under_it_once_no_view_is_alive():
    # a torch view holds the storage, which holds the numpy array under the block
    pytest.importorskip("torch")
    from timerl.runtime.stores import BlockStore
    from timerl.runtime.torch_backend import TorchBackend

    store = BlockStore(4, (3,), np.float32, TorchBackend())
    store.keep_spare(fault_in=False)
    store.allocate((0,))
    view = store.blocks[(0,)][0][1:3]
    first = store.blocks[(0,)][0].data_ptr()
    store.free_prefix((0,))
    store.allocate((1,))
    assert store.blocks[(1,)][0].data_ptr() != first  # the view could still read them
    del view
    second = store.blocks[(1,)][0].data_ptr()
    store.free_prefix((1,))
    store.allocate((2,))
    assert store.blocks[(2,)][0].data_ptr() == second
    assert len(store.bases) == 1  # the live block's; none left of the freed ones
