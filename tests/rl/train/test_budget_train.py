"""Training under a memory budget that streams the rollout to disk gives the same run."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.ir import rowwise
from timerl.rl.train import build, train
from timerl.rl.train.checkpoint import load_checkpoint

CONFIG = {
    "env_id": "Synthetic-v0",
    "env_kwargs": {"obs_shape": (3, 8, 8), "episode_length": 50, "action_dim": 2},
    "num_envs": 2,
    "num_steps": 128,
    "epochs": 2,
    "minibatches": 4,
    "hidden": (16,),
    "seed": 3,
}
OBS_BLOCK = 128 * 2 * 3 * 8 * 8 * 4  # one iteration's observations (float32)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of 4 observation rows: these minibatches (far below the 4 MiB of a real chunk)
    are then gathers of several chunks, read by take_matmul as a large rollout's are."""
    monkeypatch.setattr(rowwise, "CHUNK_BYTES", 4 * 3 * 8 * 8 * 4)


def _run(tmp_path, name: str, budget: int | None):
    events: list[str] = []  # on_start (a benchmark's mark after compiling) comes first, once
    out = train(
        "ppo",
        dict(CONFIG),
        iterations=3,
        memory_budget=budget,
        log_dir=tmp_path / name,
        checkpoint_every=1,
        progress=False,
        echo=lambda line: None,
        on_start=lambda: events.append("start"),
        on_iteration=lambda rec: events.append("iteration"),
    )
    assert events == ["start"] + ["iteration"] * 3
    return out, load_checkpoint(tmp_path / name)


def test_same_seed_same_returns_and_parameters_with_and_without_a_budget(tmp_path):
    program = build("ppo", dict(CONFIG))
    need = program.ctx.compile(bounds={"I": 4, **program.bounds}).planned_peak().peak_bytes
    budget = need - OBS_BLOCK // 2  # only reachable with the observations on disk
    free, free_ckpt = _run(tmp_path, "free", None)
    tight, tight_ckpt = _run(tmp_path, "tight", budget)
    assert tight.planned_peak_bytes is not None and tight.planned_peak_bytes <= budget
    assert tight.peak_bytes == tight.planned_peak_bytes < free.peak_bytes
    assert tight.swapped_bytes > 0 and free.swapped_bytes == 0
    np.testing.assert_allclose(tight.returns, free.returns, rtol=1e-6)
    assert free_ckpt.params.keys() == tight_ckpt.params.keys()
    for name, value in free_ckpt.params.items():
        np.testing.assert_allclose(tight_ckpt.params[name], value, rtol=1e-5, atol=1e-7)
