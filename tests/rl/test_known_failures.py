"""RL-layer checks that fail today because of bugs in timerl (strict xfail: fix, then unmark).

Each test is a real check against an independent reference, the same as in the sibling modules
it is taken from.
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


EXPAND_SCALAR = (
    "torch backend: prims.py 'expand' runs x.expand(*shape), and torch's expand() needs at "
    "least one size, so expanding to shape () raises TypeError; the backward of .mean() of a "
    "0-d tensor emits such an expand (continuous policies: Normal entropy .sum(-1).mean())"
)


@pytest.mark.xfail(strict=True, raises=TypeError, reason=EXPAND_SCALAR)
def test_mean_of_scalar_gradient_on_torch():
    with tl.Context(dims=("t",)):
        x = tl.from_numpy(np.arange(3, dtype=np.float32), requires_grad=True)
        loss = x.sum(-1).mean()
        loss.backward()
    np.testing.assert_array_equal(tl.evaluate(x.grad, backend="torch"), np.ones(3))


@pytest.mark.xfail(strict=True, raises=TypeError, reason=EXPAND_SCALAR)
@pytest.mark.parametrize(
    ("norm_adv", "ent_coef", "big_clip"), [(True, 0.0, False), (False, 0.01, False)]
)
def test_continuous_ppo_loss_on_torch(norm_adv, ent_coef, big_clip):
    _sibling("test_ppo_loss").check_ppo_loss("Pendulum-v1", norm_adv, ent_coef, big_clip, "torch")


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="train.py: a resumed run appends to metrics.csv from the checkpoint's iteration + 1 "
    "without dropping the rows written after that checkpoint, so a crash between checkpoints "
    "leaves those iterations twice in metrics.csv",
)
def test_metrics_csv_has_one_row_per_iteration_after_a_crash(tmp_path):
    tt = _sibling("test_train")
    tt._interrupted_then_resumed(tmp_path, tt.N // 2)
    assert [int(r["iteration"]) for r in tt._rows(tmp_path)] == list(range(tt.N))


@pytest.mark.xfail(
    strict=True,
    raises=pytest.fail.Exception,
    reason="train.py: with resume=True the config (and iterations) passed in are replaced by the "
    "checkpoint's without comparing them, so a mismatching config is silently ignored instead "
    "of raising CheckpointError",
)
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
