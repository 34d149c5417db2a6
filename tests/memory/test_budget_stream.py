"""A block streamed to disk under a memory budget: rows written as computed, read by rows."""

from __future__ import annotations

import os

import numpy as np
import pytest

import timerl as tl
from timerl.ir import rowwise
from timerl.memory.streams import streamable
from timerl.rl.algos import ppo
from timerl.runtime import stores, streams

OBS = {"obs_shape": (3, 8, 8), "episode_length": 1000, "action_dim": 2}


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 4 observation rows: these minibatches (far below the 4 MiB of a real chunk)
    are then gathers of several chunks, read by take_matmul as a large rollout's are."""
    monkeypatch.setattr(rowwise, "CHUNK_BYTES", 4 * 3 * 8 * 8 * 4)


def _ppo(minibatches: int = 1, epochs: int = 1, steps: int = 128):
    algo = ppo(
        env_id="Synthetic-v0",
        num_envs=2,
        num_steps=steps,
        epochs=epochs,
        minibatches=minibatches,
        hidden=(16,),
        env_kwargs=OBS,
    )
    return algo, {"I": 3, **algo.bounds}


def _obs_bytes(steps: int = 128) -> int:
    return steps * 2 * 3 * 8 * 8 * 4  # rows x (envs x obs) float32: one iteration's block


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("minibatches,epochs", [(1, 1), (4, 2)], ids=["whole", "minibatches"])
def test_ppo_rollout_streams_to_disk_and_runs_at_its_planned_peak(minibatches, epochs):
    # each program steps its own envs (a program built once steps the same env objects)
    algo, bounds = _ppo(minibatches, epochs)
    metrics = list(algo.metrics.values())
    free = algo.ctx.compile(bounds=bounds, outputs=metrics)
    need = free.planned_peak().peak_bytes
    obs = next(op for op in free.ops if op.name == "obs")
    assert streamable(obs.id, free.ops, free.compiled.storage, free.static) is None
    budget = need - _obs_bytes() // 2
    algo2, _ = _ppo(minibatches, epochs)
    streamed = list(algo2.metrics.values())
    prog = algo2.ctx.compile(bounds=bounds, outputs=streamed, memory_budget=budget)
    obs = next(op for op in prog.ops if op.name == "obs")
    text = prog.explain()
    assert "stream: obs" in text and "streamed to disk" in text
    assert prog.compiled.storage[obs.id].streamed
    free.run()
    prog.run()
    stats = prog.stats()
    assert stats["peak_bytes"] == stats["planned_peak_bytes"] <= budget
    # the block leaves the peak, less the chunks of it a reader holds (two: one read ahead)
    held = 2 * rowwise.CHUNK_BYTES
    assert stats["peak_bytes"] <= free.stats()["peak_bytes"] - _obs_bytes() + held
    # every row written once per iteration and read back at least once
    assert stats["swapped_bytes"] >= 2 * 3 * _obs_bytes()
    # one iteration's observations on disk at a time (a block's file closes when it frees)
    assert stats["swap_tier"] == "disk" and stats["swap_tier_peak_bytes"] == _obs_bytes()
    for m, m2 in zip(metrics, streamed, strict=True):
        np.testing.assert_allclose(prog.value(m2), free.value(m), rtol=1e-5, atol=1e-6)


def test_streamed_values_equal_the_unoptimised_reference_in_small_chunks(monkeypatch):
    monkeypatch.setattr(rowwise, "CHUNK_BYTES", 5 * 2 * 3 * 8 * 8 * 4)  # 5 steps' rows
    algo, bounds = _ppo(4, 2, steps=64)
    metrics = list(algo.metrics.values())
    ref = algo.ctx.compile(bounds=bounds, outputs=metrics, optimize=False)
    need = algo.ctx.compile(bounds=bounds, outputs=metrics).planned_peak().peak_bytes
    algo2, _ = _ppo(4, 2, steps=64)
    streamed = list(algo2.metrics.values())
    prog = algo2.ctx.compile(
        bounds=bounds, outputs=streamed, memory_budget=need - _obs_bytes(64) // 2
    )
    assert "stream: obs" in prog.explain()
    ref.run()
    prog.run(compiled=False)  # the reference honours the streamed store too
    for m, m2 in zip(metrics, streamed, strict=True):
        np.testing.assert_allclose(prog.value(m2), ref.value(m), rtol=1e-4, atol=1e-6)


def test_a_block_read_whole_by_an_elementwise_op_is_not_streamed():
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((256,), domain=(t,))
        x[0] = tl.full((256,), 1.0)
        x[t + 1] = x[t] * 0.5 + 1.0
        out = (x[0:T] * 2.0).sum()
    prog = ctx.compile(bounds={T: 64}, outputs=[out])
    block = next(i for i, s in prog.compiled.storage.items() if s.kind == "block")
    why = streamable(block, prog.ops, prog.compiled.storage, prog.static)
    assert why is not None and "reads a slice of it" in why


def test_row_file_writes_and_reads_rows_explicitly(monkeypatch, tmp_path):
    monkeypatch.setenv(stores.SWAP_DIR_ENV, str(tmp_path / "swap"))
    monkeypatch.setattr(stores, "_SWAP_DIR", [])
    counter = [0]
    rows = streams.RowFile(6, (2, 3), np.float32, counter)
    data = np.arange(36, dtype=np.float32).reshape(6, 2, 3)
    for k in range(6):
        rows[k] = data[k]
    # the file is already unlinked: only its descriptor names it, so nothing is left behind
    (made,) = os.listdir(tmp_path / "swap")
    assert made.startswith(f"timerl-swap-{os.getpid()}-")
    assert os.listdir(tmp_path / "swap" / made) == []
    np.testing.assert_array_equal(rows.read(1, 4), data[1:4])
    np.testing.assert_array_equal(rows.take(np.array([5, 0, 1, 2])), data[[5, 0, 1, 2]])
    np.testing.assert_array_equal(rows[2, ...], data[2])
    split = rows.reshape((12, 3))  # each row of (2, 3) becomes two rows of 3
    np.testing.assert_array_equal(split.read(3, 8), data.reshape(12, 3)[3:8])
    np.testing.assert_array_equal(split.take(np.array([11, 4, 5])), data.reshape(12, 3)[[11, 4, 5]])
    w = np.ones((3, 2), dtype=np.float32)
    np.testing.assert_allclose(split.matmul(w), data.reshape(12, 3) @ w)
    np.testing.assert_allclose(
        split.permute((1, 0)).matmul(np.ones((12, 1))), data.reshape(12, 3).T @ np.ones((12, 1))
    )
    assert counter[0] >= 6 * 24 * 2  # every byte written, then read back at least once
    rows.close()
    with pytest.raises(ValueError, match="does not fit"):
        streams.RowFile(2, (3,), np.float32, [0]).__setitem__(0, np.ones(4))


def test_an_output_block_is_not_streamed():
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        w = tl.from_numpy(np.ones((256, 4), dtype=np.float32))
        x = tl.RecurrentTensor.placeholder((256,), domain=(t,))
        x[0] = tl.full((256,), 1.0)
        x[t + 1] = x[t] * 0.5 + 1.0
        out = x[0:T] @ w  # read by rows: streamable, unless x's values are asked for
    prog = ctx.compile(bounds={T: 64}, outputs=[out])
    block = next(i for i, s in prog.compiled.storage.items() if s.kind == "block")
    assert streamable(block, prog.ops, prog.compiled.storage, prog.static) is None
    kept = prog.compiled.spec.keep | {block}
    why = streamable(block, prog.ops, prog.compiled.storage, prog.static, kept)
    assert why is not None and "is an output" in why


@pytest.mark.parametrize("compiled", [True, False], ids=["generated", "reference"])
def test_a_block_sliced_into_a_matmul_streams_and_keeps_its_values(
    compiled, monkeypatch, sliced_matmul
):
    # chunks of 8 rows (8 KiB): the 64 KiB block read whole as one chunk would save nothing
    monkeypatch.setattr(rowwise, "CHUNK_BYTES", 8 * 256 * 4)

    ctx, out = sliced_matmul()
    ref = ctx.compile(bounds={"T": 64}, outputs=[out], optimize=False)
    ref.run()
    ctx, out2 = sliced_matmul()
    need = ctx.compile(bounds={"T": 64}, outputs=[out2]).planned_peak().peak_bytes
    prog = ctx.compile(bounds={"T": 64}, outputs=[out2], memory_budget=need - 32 * 1024)
    assert "streamed to disk" in prog.explain()
    prog.run(compiled=compiled)
    np.testing.assert_allclose(prog.value(out2), ref.value(out), rtol=1e-5, atol=1e-6)
    assert prog.stats()["peak_bytes"] == prog.stats()["planned_peak_bytes"]


def _block_read_by(read) -> str | None:
    """Why the block of ``x`` (rows of (4, 8)) read as ``read(x[0:T])`` cannot stream."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((4, 8), domain=(t,))
        x[0] = tl.full((4, 8), 1.0)
        x[t + 1] = x[t] * 0.5 + 1.0
        out = read(x[0:T], T).sum()
    prog = ctx.compile(bounds={T: 16}, outputs=[out])
    block = next(i for i, s in prog.compiled.storage.items() if s.kind == "block")
    return streamable(block, prog.ops, prog.compiled.storage, prog.static)


def test_which_views_and_products_read_a_block_by_rows():
    w = np.ones((8, 2), dtype=np.float32)
    batch = np.ones((1, 8, 2), dtype=np.float32)
    # rows kept whole by a reshape, then multiplied by one matrix: streamable
    assert _block_read_by(lambda xs, T: xs.reshape(T * 4, 8) @ tl.from_numpy(w)) is None
    # the same rows multiplied by a matrix per row: a batched product reads them whole
    why = _block_read_by(lambda xs, T: xs @ tl.from_numpy(batch))
    assert why is not None and "batch of matrices" in why
    # a permute other than the 2-D transpose does not keep the rows
    why = _block_read_by(lambda xs, T: xs.permute(0, 2, 1).reshape(T * 8, 4) @ tl.from_numpy(w[:4]))
    assert why is not None and "permutes its axes" in why
