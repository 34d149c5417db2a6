"""The torch backend on a scalar mean's gradient, and resuming a run safely.

Each test is a real check against an independent reference, the same as in the sibling modules
it borrows from.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import timerl as tl


def _sibling(name):
    """A sibling test module (the tests use importlib mode: no package imports)."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_timerl_rl_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_mean_of_scalar_gradient_on_torch():
    """The backward of .mean() of a 0-d value expands to shape (): torch needs it special-cased."""
    with tl.Context(dims=("t",)):
        x = tl.from_numpy(np.arange(3, dtype=np.float32), requires_grad=True)
        loss = x.sum(-1).mean()
        loss.backward()
    np.testing.assert_array_equal(tl.evaluate(x.grad, backend="torch"), np.ones(3))


def test_metrics_csv_has_one_row_per_iteration_after_a_crash(tmp_path):
    tt = _sibling("test_train")
    tt._interrupted_then_resumed(tmp_path, tt.N // 2)
    assert [int(r["iteration"]) for r in tt._rows(tmp_path)] == list(range(tt.N))


def test_resume_with_a_mismatching_config_raises(tmp_path):
    from timerl.errors import CheckpointError
    from timerl.rl.train import train

    cfg = {"env_id": "CartPole-v1", "num_envs": 2, "num_steps": 16, "hidden": [8], "seed": 0}
    train("ppo", cfg, iterations=2, log_dir=tmp_path, checkpoint_every=1, progress=False)
    with pytest.raises(CheckpointError, match="config"):
        train(
            "ppo",
            dict(cfg, num_steps=32, lr=0.1),
            iterations=2,
            log_dir=tmp_path,
            resume=True,
            progress=False,
        )
