"""Checkpoint files: what they hold, which are kept, atomic writes, and the logs beside them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from timerl.errors import CheckpointError
from timerl.rl.train import checkpoint as ck
from timerl.rl.train import train
from timerl.rl.train.checkpoint import checkpoint_files, latest_checkpoint, load_checkpoint

CFG = {"num_envs": 4, "num_steps": 32, "hidden": [8], "epochs": 1, "minibatches": 1, "seed": 1}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    log = tmp_path_factory.mktemp("run")
    notes = []
    res = train(
        "ppo",
        CFG,
        iterations=6,
        log_dir=log,
        checkpoint_every=1,
        keep_checkpoints=2,
        progress=False,
        echo=notes.append,
    )
    return log, res, notes


def test_the_last_k_and_the_best_are_kept(run):
    log, res, _ = run
    assert [i for i, _ in checkpoint_files(log)] == [4, 5]
    best = load_checkpoint(log / "checkpoints" / "best.npz")
    history = best.header["history"]
    scores = []
    for i in range(len(res.returns)):
        tail = [r for r in res.returns[max(0, i - 9) : i + 1] if np.isfinite(r)]
        scores.append(np.mean(tail) if tail else -np.inf)
    assert best.iteration == int(np.argmax(scores))  # first iteration reaching the best score
    assert best.header["best_score"] == pytest.approx(max(scores))
    assert len(history) == best.iteration + 1


def test_header_holds_config_rng_and_metrics_position(run):
    log, _, _ = run
    ckpt = load_checkpoint(latest_checkpoint(log))
    h = ckpt.header
    assert h["config"]["num_steps"] == 32 and h["config"]["seed"] == 1
    assert h["rng"] == {"seed": 1, "next_iteration": 6}
    assert h["metrics_rows"] == 6 and h["iteration"] == 5 and h["env_steps"] == 6 * 128
    assert h["seconds"] == pytest.approx(h["history"][-1]["seconds"])
    assert h["param_names"][:2] == ["actor.0.weight", "actor.0.bias"]
    env = ckpt.env_state()
    assert env["env_id"] == "CartPole-v1" and env["running_return"].shape == (4,)
    # the numpy generators' states survive as exact Python ints
    assert isinstance(env["sim"]["envs"][0]["np_random"]["state"]["state"], int)


def test_a_crash_while_writing_keeps_the_previous_file(run, tmp_path, monkeypatch):
    log, _, _ = run
    src = latest_checkpoint(log)
    target = tmp_path / "ckpt.npz"
    target.write_bytes(src.read_bytes())
    ckpt = load_checkpoint(target)

    def crash(fh, **arrays):
        fh.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(ck.np, "savez", crash)
    with pytest.raises(OSError, match="disk full"):
        ck.save_checkpoint(
            target,
            {"iteration": 99},
            params=ckpt.params,
            state={},
            snapshot=ckpt.snapshot(),
            env_state=None,
        )
    assert target.read_bytes() == src.read_bytes()
    assert load_checkpoint(target).iteration == 5


def test_a_corrupt_header_names_the_file(tmp_path):
    path = tmp_path / "x.npz"
    with open(path, "wb") as fh:
        np.savez(fh, __header__=np.frombuffer(b"{not json", np.uint8))
    with pytest.raises(CheckpointError, match="x.npz has a corrupt header"):
        load_checkpoint(path)
    with open(path, "wb") as fh:
        header = {"kind": ck.KIND, "format": 1}
        np.savez(fh, __header__=np.frombuffer(json.dumps(header).encode(), np.uint8))
    with pytest.raises(CheckpointError, match="x.npz has checkpoint format 1"):
        load_checkpoint(path)


def test_tensorboard_event_files_beside_the_csv(run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log, res, notes = run
    acc = EventAccumulator(str(log / "tb"))
    acc.Reload()
    events = acc.Scalars("episodic_return")
    assert [e.step for e in events] == [128 * (k + 1) for k in range(6)]
    finite = [(e.value, r) for e, r in zip(events, res.returns, strict=True) if np.isfinite(r)]
    assert all(v == pytest.approx(r) for v, r in finite)
    assert "loss" in acc.Tags()["scalars"]
    assert not [n for n in notes if "tensorboard" in n]
    assert res.tensorboard and "TensorBoard" in res.summary()


def test_without_tensorboard_a_one_line_notice_and_csv_only(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    notes = []
    res = train("ppo", CFG, iterations=1, log_dir=tmp_path, progress=False, echo=notes.append)
    assert len(notes) == 1 and "tensorboard is not installed" in notes[0]
    assert "timerl[train]" in notes[0]
    assert not (tmp_path / "tb").exists() and (tmp_path / "metrics.csv").exists()
    assert not res.tensorboard


def test_parameters_that_are_never_updated_are_noted_not_fatal(tmp_path):
    """REINFORCE without a baseline leaves the critic untrained: it is no carried state."""
    notes = []
    cfg = {"num_envs": 2, "num_steps": 16, "hidden": [8], "baseline": False}
    train("reinforce", cfg, iterations=2, log_dir=tmp_path, progress=False, echo=notes.append)
    assert [n for n in notes if "critic.0.weight" in n and "not carried" in n]
    ckpt = load_checkpoint(latest_checkpoint(tmp_path))
    assert "actor.0.weight" in ckpt.params and "critic.0.weight" not in ckpt.params
    assert set(ckpt.header["param_names"]) == set(ckpt.params)


def test_run_directories_may_be_given_as_strings(run):
    log, _, _ = run
    assert load_checkpoint(latest_checkpoint(str(log))).iteration == 5
    assert [i for i, _ in checkpoint_files(str(log))] == [4, 5]
    assert load_checkpoint(str(log)).iteration == 5  # a directory: its latest checkpoint
