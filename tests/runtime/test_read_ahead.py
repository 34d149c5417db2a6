"""Streamed blocks read ahead: the next chunk is read on a thread while the kernel computes on
this one; the chunks are counted by the plan and the meter, and a failed read is raised in the
kernel's caller."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import timerl as tl
from timerl.ir import rowwise
from timerl.memory import streams as budget_pass
from timerl.rl.algos import ppo
from timerl.runtime import streams as stores

OBS = {"obs_shape": (3, 8, 8), "episode_length": 1000, "action_dim": 2}
OBS_ROW = 3 * 8 * 8 * 4  # one env's observation (float32)


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("timerl-read-ahead")]


def _rows(n: int = 12, ahead: bool = True) -> tuple[stores.RowFile, np.ndarray]:
    data = np.arange(n * 2 * 3, dtype=np.float32).reshape(n, 2, 3) / 7
    rows = stores.RowFile(n, (2, 3), np.float32, [0], "obs", chunk_bytes=2 * 24, ahead=ahead)
    for k in range(n):
        rows[k] = data[k]
    return rows, data


def _ppo_budgeted(minibatches: int, epochs: int):
    algo = ppo(
        env_id="Synthetic-v0",
        num_envs=2,
        num_steps=128,
        epochs=epochs,
        minibatches=minibatches,
        hidden=(16,),
        env_kwargs=OBS,
    )
    bounds = {"I": 3, **algo.bounds}
    metrics = list(algo.metrics.values())
    need = algo.ctx.compile(bounds=bounds, outputs=metrics).planned_peak().peak_bytes
    budget = need - 128 * 2 * OBS_ROW // 2  # reached only with the observations on disk
    return algo.ctx.compile(bounds=bounds, outputs=metrics, memory_budget=budget), metrics


@pytest.mark.parametrize("minibatches,epochs", [(1, 1), (4, 2)], ids=["whole", "minibatches"])
def test_ppo_values_are_bit_identical_with_and_without_read_ahead(monkeypatch, minibatches, epochs):
    monkeypatch.setattr(rowwise, "CHUNK_BYTES", 4 * OBS_ROW)  # many chunks a read
    runs = []
    for ahead in ("1", "0"):
        monkeypatch.setenv(stores.READ_AHEAD_ENV, ahead)
        prog, metrics = _ppo_budgeted(minibatches, epochs)
        obs = next(op for op in prog.ops if op.name == "obs")
        assert prog.compiled.storage[obs.id].streamed
        assert prog.compiled.storage[obs.id].read_ahead  # planned so; the knob turns it off
        prog.run()
        runs.append((prog, metrics, prog.stats()))
    (fast, m1, s1), (slow, m0, s0) = runs
    for a, b in zip(m1, m0, strict=True):
        np.testing.assert_array_equal(fast.value(a), slow.value(b))
    # the same bytes moved and the same planned and metered peak; only the overlap differs
    assert s1["swapped_bytes"] == s0["swapped_bytes"] > 0
    assert s1["peak_bytes"] == s1["planned_peak_bytes"] == s0["peak_bytes"]
    assert s1["read_ahead_hits"] + s1["read_ahead_misses"] > 0
    assert s0["read_ahead_hits"] == 0 and s0["read_ahead_misses"] > 0
    assert s1["read_wait_seconds"] >= 0.0 and s0["read_wait_seconds"] > 0.0
    assert not _readers()


def test_row_file_reads_ahead_the_same_rows_through_its_views():
    rows, data = _rows()
    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    flat = data.reshape(24, 3)
    split = rows.reshape((24, 3))  # a view of the same file: 3-float rows
    assert isinstance(split, stores.RowFile) and split.step() == 4
    np.testing.assert_array_equal(split.matmul(w), flat @ w)
    g = np.ones((24, 2), dtype=np.float32)
    # (a transposed product is summed chunk by chunk: another order of additions)
    np.testing.assert_allclose(split.permute((1, 0)).matmul(g), flat.T @ g, rtol=1e-6)
    part = split[5:19]
    np.testing.assert_array_equal(part.read(0, 14), flat[5:19])
    ids = np.array([[23, 0], [1, 2], [7, 7], [11, 3]])
    np.testing.assert_array_equal(rowwise.take_matmul(split, ids, w), (flat[ids] @ w))
    np.testing.assert_allclose(
        rowwise.take_matmul(split, ids, g[:8], trans=True),
        flat[ids.reshape(-1)].T @ g[:8],
        rtol=1e-6,
    )
    assert rows.counter[2] + rows.counter[3] > 0  # chunks came through the read-ahead
    rows.close()
    assert not _readers()


def test_a_failed_background_read_is_raised_in_the_caller_naming_the_block(monkeypatch):
    rows, data = _rows()
    real = os.preadv

    def failing(fd, buffers, offset):
        if threading.current_thread() is not threading.main_thread():
            raise OSError(5, "Input/output error")
        return real(fd, buffers, offset)

    monkeypatch.setattr(stores.os, "preadv", failing)
    w = np.ones((6, 2), dtype=np.float32)
    with pytest.raises(OSError, match=r"rows \d+:\d+ of the streamed block obs .*Input/output"):
        rows.matmul(w)
    assert not _readers()  # no thread left behind, and none waits forever
    rows.close()


def test_an_abandoned_read_leaves_no_thread_behind():
    rows, data = _rows()
    parts = rows.chunks(2)
    a, b, first = next(parts)
    np.testing.assert_array_equal(first, data[a:b])
    assert _readers()  # the next chunk is being read
    parts.close()  # a kernel interrupted mid-way (its ``closing`` block)
    assert not _readers()
    rows.close()
    with pytest.raises(OSError, match="streamed block obs .*closed"):
        rows.read(0, 2)  # the block was freed: an error, never another file's bytes


def test_a_kernel_interrupted_mid_read_leaves_no_thread_behind(monkeypatch):
    rows, data = _rows()
    calls = []

    def interrupted(out, chunk, g):
        calls.append(len(chunk))
        if len(calls) == 2:  # Ctrl-C while the third chunk is being read ahead
            raise KeyboardInterrupt

    monkeypatch.setattr(rowwise, "add_transposed_product", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rows.reshape((24, 3)).permute((1, 0)).matmul(np.ones((24, 2), dtype=np.float32))
    assert calls == [4, 4]
    assert not _readers()
    rows.close()


def test_the_plan_counts_two_chunks_and_reads_one_at_a_time_when_two_do_not_fit(
    monkeypatch, sliced_matmul
):
    row = 256 * 4  # bytes of one row of x
    monkeypatch.setattr(rowwise, "CHUNK_BYTES", 8 * row)
    monkeypatch.setattr(budget_pass, "SHRINK", 1)  # chunks of 8 rows, then 4
    ctx, out = sliced_matmul()
    ref = ctx.compile(bounds={"T": 64}, outputs=[out], optimize=False)
    ref.run()
    need = ctx.compile(bounds={"T": 64}, outputs=[out]).planned_peak().peak_bytes

    def compile_(budget):
        ctx2, out2 = sliced_matmul()
        return ctx2.compile(bounds={"T": 64}, outputs=[out2], memory_budget=budget), out2

    def streamed(prog):
        (st,) = [s for s in prog.compiled.storage.values() if s.streamed]
        return st

    roomy, _ = compile_(need - 32 * row)
    st = streamed(roomy)
    assert (st.chunk_bytes, st.read_ahead) == (8 * row, True)
    # the matmul holds two chunks of 8 rows (this one and the next, read ahead)
    (reads,) = [s.read_bytes for s in roomy.compiled.storage.values() if s.read_bytes]
    assert reads == 2 * 8 * row
    peak = roomy.planned_peak()
    assert "chunks of streamed rows" in peak.holders[0][0]  # the chunks set this peak
    # a byte less: chunks of 4 rows, two of them (the room of one chunk of 8)
    halved, _ = compile_(peak.peak_bytes - 1)
    st = streamed(halved)
    assert (st.chunk_bytes, st.read_ahead) == (4 * row, True)
    assert halved.planned_peak().peak_bytes == peak.peak_bytes - 8 * row
    # room for one chunk of 4 rows, not two: read without reading ahead
    single, out2 = compile_(peak.peak_bytes - 8 * row - 1)
    st = streamed(single)
    assert (st.chunk_bytes, st.read_ahead) == (4 * row, False)
    assert "not read ahead" in single.explain()
    smallest = single.planned_peak().peak_bytes
    assert smallest == peak.peak_bytes - 12 * row
    single.run()
    np.testing.assert_array_equal(single.value(out2), ref.value(out))
    stats = single.stats()
    assert stats["peak_bytes"] == stats["planned_peak_bytes"] == smallest
    assert stats["read_ahead_hits"] == 0
    # below that: refused at compile time, naming the smallest budget
    with pytest.raises(tl.MemoryBudgetError, match=f"memory_budget={smallest}"):
        compile_(smallest - 1)


@pytest.fixture
def made(monkeypatch) -> list:
    """One entry per chunk array a row file allocates."""
    made: list = []
    empty = stores.RowFile._empty
    monkeypatch.setattr(
        stores.RowFile, "_empty", lambda self, request: made.append(1) or empty(self, request)
    )
    return made


@pytest.mark.parametrize("ahead", [True, False])
def test_chunks_a_kernel_let_go_of_are_read_into_again(made, ahead):
    # a new array per chunk is mapped and faulted in under a budget: the generator reads into
    # the chunks its caller dropped, and never into one the caller still holds
    rows, data = _rows(ahead=ahead)
    for a, b, chunk in rows.chunks(2):
        np.testing.assert_array_equal(chunk, data[a:b])
        del chunk
    assert len(made) == (2 if ahead else 1)  # of 6 chunks
    made.clear()
    kept = [(a, b, chunk) for a, b, chunk in rows.chunks(2)]  # the caller keeps every chunk
    assert len(made) == len(kept) == 6
    for a, b, chunk in kept:
        np.testing.assert_array_equal(chunk, data[a:b])


@pytest.mark.parametrize("ahead", [True, False])
def test_a_shorter_last_chunk_is_read_into_a_spare_not_a_new_array(made, ahead):
    # 12 rows by 5: the last chunk has 2 rows; a new array for it would sit beside the spare
    # full chunk, one chunk more than the plan counts
    rows, data = _rows(ahead=ahead)
    got = []
    for a, b, chunk in rows.chunks(5):
        got.append((a, b))
        np.testing.assert_array_equal(chunk, data[a:b])
        del chunk
    assert got == [(0, 5), (5, 10), (10, 12)]
    assert len(made) == (2 if ahead else 1)
    made.clear()
    ids = np.array([11, 3, 4, 5, 0, 9, 8], dtype=np.int64)
    for a, chunk in rows.gathers(ids, 3):
        np.testing.assert_array_equal(chunk, data[ids[a : a + 3]])
        del chunk
    assert len(made) == (2 if ahead else 1)


def test_the_row_just_written_is_read_without_the_file_once():
    # a rollout's step reads the observation it has just written: the array written, shown in
    # the reader's row shape, with no read of the file and no new array
    rows, data = _rows(ahead=False)
    moved = rows.counter[0]
    flat = rows.reshape((12, 6))
    again = flat[11]
    assert again.shape == (6,) and np.shares_memory(again, data[11])
    np.testing.assert_array_equal(again, data[11].reshape(6))
    assert rows.counter[0] == moved
    # kept for that one read: the next comes from the file, into an array of its own
    back = rows[11]
    assert rows.counter[0] == moved + 24 and not np.shares_memory(back, data[11])
    np.testing.assert_array_equal(back, data[11])


def test_a_read_or_write_between_drops_the_row_written_last():
    rows, data = _rows(ahead=False)
    rows[3] = data[0]  # written last now: row 3
    moved = rows.counter[0]
    np.testing.assert_array_equal(rows[11], data[11])  # another row: from the file
    assert rows.counter[0] == moved + 24
    np.testing.assert_array_equal(rows[3], data[0])  # dropped by that read: from the file too
    assert rows.counter[0] == moved + 48
    rows[5] = data[1]
    whole = np.concatenate([c for _, _, c in rows.chunks(4)])  # a chunked read drops it
    np.testing.assert_array_equal(whole[5], data[1])
    assert not np.shares_memory(rows[5], data[1])
    # through a view of rows 1.. the written row 2 is that view's row 1, and only that one
    rows[2] = data[2]
    assert not np.shares_memory(rows[1:][0], data[2])
    rows[2] = data[2]
    assert np.shares_memory(rows[1:][1], data[2])
