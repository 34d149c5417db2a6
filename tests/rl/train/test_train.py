"""The training driver: resume is bit for bit, metrics, checkpoints, errors, and the CLI."""

from __future__ import annotations

import csv
import math
import os
import signal
import threading

import gymnasium as gym
import numpy as np
import pytest

from timerl.errors import CheckpointError, EnvError, NumericalError
from timerl.rl.train import METRICS, train
from timerl.rl.train.checkpoint import latest_checkpoint, load_checkpoint

CFG = {
    "env_id": "CartPole-v1",
    "num_envs": 4,
    "num_steps": 32,
    "hidden": [16, 16],
    "epochs": 2,
    "minibatches": 2,
    "seed": 3,
}
N = 6


class _NaNRewardEnv(gym.Env):
    """Rewards turn NaN after ``nan_after`` steps of a sub-env (counted across episodes)."""

    observation_space = gym.spaces.Box(-1, 1, (3,))
    action_space = gym.spaces.Discrete(2)

    def __init__(self, nan_after: int = 10**9) -> None:
        self.nan_after, self.count, self.n = nan_after, 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.count += 1
        self.n += 1
        reward = float("nan") if self.count > self.nan_after else 1.0
        return np.full(3, 0.1 * action, np.float32), reward, self.n >= 10, False, {}


class _Box2DActionEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (3,))
    action_space = gym.spaces.Box(-1, 1, (2, 2))


class _MultiDiscreteActionEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (3,))
    action_space = gym.spaces.MultiDiscrete([2, 3])


for _id, _cls in [
    ("TimerlRLTest/NaNReward-v0", _NaNRewardEnv),
    ("TimerlRLTest/Box2DAction-v0", _Box2DActionEnv),
    ("TimerlRLTest/MultiDiscreteAction-v0", _MultiDiscreteActionEnv),
]:
    if _id not in gym.registry:
        gym.register(_id, entry_point=_cls)


def _rows(log_dir):
    with open(log_dir / METRICS, newline="") as fh:
        return list(csv.DictReader(fh))


def _comparable(rows):
    """Metric rows without the wall-clock column."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def _ckpt(log_dir):
    return load_checkpoint(latest_checkpoint(log_dir))


def _rewrite_header(src, dst, **changes):
    """A copy of checkpoint ``src`` at ``dst`` with header entries replaced."""
    import json

    with np.load(src, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    header = json.loads(bytes(arrays["__header__"]).decode())
    for key, value in changes.items():
        if isinstance(value, dict):
            header[key].update(value)
        else:
            header[key] = value
    arrays["__header__"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "wb") as fh:
        np.savez(fh, **arrays)


def _assert_same_stores(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].keys() == b[k].keys(), k
        for p in a[k]:
            np.testing.assert_array_equal(a[k][p], b[k][p], err_msg=f"store {k} at {p}")


class _Stop(Exception):
    pass


def _stop_at(iteration):
    def cb(record):
        if record["iteration"] == iteration:
            raise _Stop

    return cb


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    log = tmp_path_factory.mktemp("full")
    res = train("ppo", CFG, iterations=N, log_dir=log, checkpoint_every=N // 2, progress=False)
    return log, res


def test_full_run_writes_metrics_and_checkpoint(full_run):
    log, res = full_run
    rows = _rows(log)
    assert [int(r["iteration"]) for r in rows] == list(range(N))
    assert [int(r["env_steps"]) for r in rows] == [(k + 1) * 4 * 32 for k in range(N)]
    for key in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "reward_mean"):
        assert all(math.isfinite(float(r[key])) for r in rows), key
    ckpt = _ckpt(log)
    assert ckpt.header["algo"] == "ppo" and ckpt.iteration == N - 1
    assert ckpt.header["iterations"] == N
    assert ckpt.header["config"]["num_steps"] == 32
    # the trained weights are in the last checkpoint, by name (they were lost before)
    assert {"actor.0.weight", "critic.0.weight"} <= set(ckpt.params)
    assert ckpt.params["actor.0.weight"].shape == (4, 16)
    assert any(name.startswith("adam_m(") for name in ckpt.state)
    assert res.iterations == N and res.env_steps == N * 128
    assert len(res.returns) == N
    assert res.compile_seconds > 0 and res.peak_bytes > 0 and res.steps_per_second > 0
    assert not [p for p in (log / "checkpoints").iterdir() if p.name.endswith(".tmp")]


def _interrupted_then_resumed(log_dir, stop_at):
    with pytest.raises(_Stop):
        train(
            "ppo",
            CFG,
            iterations=N,
            log_dir=log_dir,
            checkpoint_every=N // 2,
            progress=False,
            on_iteration=_stop_at(stop_at),
        )
    assert _ckpt(log_dir).iteration == N // 2 - 1
    return train("ppo", None, log_dir=log_dir, resume=True, checkpoint_every=N // 2, progress=False)


def test_resume_is_bit_for_bit(full_run, tmp_path):
    """Stopped right after the checkpoint of iteration N/2 - 1, then resumed to N."""
    full_log, full = full_run
    res = _interrupted_then_resumed(tmp_path, N // 2 - 1)
    a = _ckpt(full_log)
    b = _ckpt(tmp_path)
    assert b.iteration == N - 1
    _assert_same_stores(a.snapshot(), b.snapshot())
    _assert_same_stores({0: a.params}, {0: b.params})
    assert res.returns == full.returns
    assert _comparable(_rows(tmp_path)) == _comparable(_rows(full_log))
    assert len(b.header["history"]) == N


def test_resume_after_a_crash_between_checkpoints_is_bit_for_bit(full_run, tmp_path):
    """A crash in iteration N/2 (after its metrics row, before its checkpoint)."""
    full_log, full = full_run
    res = _interrupted_then_resumed(tmp_path, N // 2)
    _assert_same_stores(_ckpt(full_log).snapshot(), _ckpt(tmp_path).snapshot())
    assert res.returns == full.returns
    # the rows of each iteration (the last written wins) equal the uninterrupted run's
    by_iter = {r["iteration"]: r for r in _comparable(_rows(tmp_path))}
    assert list(by_iter.values()) == _comparable(_rows(full_log))


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="needs the main thread"
)
def test_ctrl_c_checkpoints_and_resume_is_bit_for_bit(full_run, tmp_path):
    full_log, full = full_run

    def interrupt(record):
        if record["iteration"] == 1:
            os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt, match="checkpoint saved"):
        train(
            "ppo",
            CFG,
            iterations=N,
            log_dir=tmp_path,
            checkpoint_every=100,
            progress=False,
            on_iteration=interrupt,
        )
    # the handler lets the running iteration finish and checkpoints it
    assert _ckpt(tmp_path).iteration in (1, 2)
    assert signal.getsignal(signal.SIGINT) is before
    res = train("ppo", None, log_dir=tmp_path, resume=True, checkpoint_every=100, progress=False)
    _assert_same_stores(_ckpt(full_log).snapshot(), _ckpt(tmp_path).snapshot())
    assert res.returns == full.returns
    assert _comparable(_rows(tmp_path)) == _comparable(_rows(full_log))


def test_resume_without_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        train("ppo", None, log_dir=tmp_path, resume=True, progress=False)
    with pytest.raises(CheckpointError, match="resume=True needs log_dir"):
        train("ppo", None, resume=True, progress=False)


def _first_checkpoint_path(log_dir):
    return log_dir / "checkpoints" / "ckpt-0000000.npz"


@pytest.mark.parametrize(
    ("garbage", "why"),
    [
        (b"", "is damaged: the file is empty"),
        (b"PK\x03\x04garbage", "is damaged \\(truncated or corrupt\\)"),
        (b"not a checkpoint at all", "is not a timerl checkpoint: .*a text file starting with"),
        (b"\x80\x04K\x01.", "is not a timerl checkpoint: .*looks like a pickle"),
    ],
)
def test_a_file_that_cannot_be_resumed_from_says_what_it_is(tmp_path, garbage, why):
    path = _first_checkpoint_path(tmp_path)
    path.parent.mkdir()
    path.write_bytes(garbage)
    with pytest.raises(CheckpointError, match=f"no intact checkpoint.*{path.name} {why}") as info:
        train("ppo", None, log_dir=tmp_path, resume=True, progress=False)
    assert "allow_pickle" not in str(info.value)


def test_truncated_checkpoint(full_run, tmp_path):
    data = latest_checkpoint(full_run[0]).read_bytes()
    path = _first_checkpoint_path(tmp_path)
    path.parent.mkdir()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="is damaged"):
        train("ppo", None, log_dir=tmp_path, resume=True, progress=False)


def test_npz_that_is_not_a_checkpoint(tmp_path):
    path = _first_checkpoint_path(tmp_path)
    path.parent.mkdir()
    with open(path, "wb") as fh:
        np.savez(fh, weights=np.zeros(3))
    with pytest.raises(CheckpointError, match=f"{path.name} is not a timerl checkpoint"):
        train("ppo", None, log_dir=tmp_path, resume=True, progress=False)


def test_an_old_pickle_checkpoint_is_refused_not_loaded(tmp_path):
    (tmp_path / "checkpoint.pkl").write_bytes(b"\x80\x05K\x01.")
    with pytest.raises(CheckpointError, match="checkpoint.pkl is a pickle"):
        train("ppo", None, log_dir=tmp_path, resume=True, progress=False)


def test_checkpoint_of_another_algorithm(tmp_path):
    cfg = {"env_id": "CartPole-v1", "num_envs": 2, "num_steps": 16, "hidden": [8]}
    train("reinforce", cfg, iterations=1, log_dir=tmp_path, progress=False)
    with pytest.raises(CheckpointError, match="'reinforce'.*'ppo'"):
        train("ppo", None, log_dir=tmp_path, resume=True, progress=False)


def test_checkpoint_of_a_different_program(full_run, tmp_path):
    """A checkpoint whose configuration no longer builds the program it was taken from."""
    src = latest_checkpoint(full_run[0])
    _rewrite_header(src, _first_checkpoint_path(tmp_path), config={"num_steps": 16}, iteration=1)
    with pytest.raises(CheckpointError, match="different program"):
        train("ppo", None, log_dir=tmp_path, resume=True, progress=False)


def test_unknown_env_id_is_named():
    with pytest.raises(EnvError, match="CartPole-v9"):
        train("ppo", dict(CFG, env_id="CartPole-v9"), iterations=1, progress=False)


@pytest.mark.parametrize(
    ("env_id", "match"),
    [
        ("TimerlRLTest/Box2DAction-v0", "flat Box"),
        ("TimerlRLTest/MultiDiscreteAction-v0", "MultiDiscrete"),
    ],
)
@pytest.mark.parametrize("algo", ["ppo", "reinforce"])
def test_unsupported_action_space(env_id, match, algo):
    cfg = {"env_id": env_id, "num_envs": 2, "num_steps": 8, "hidden": [8]}
    with pytest.raises(EnvError, match=f"{env_id}.*{match}"):
        train(algo, cfg, iterations=1, progress=False)


def test_nan_raises_and_keeps_the_last_good_checkpoint(tmp_path):
    cfg = {
        "env_id": "TimerlRLTest/NaNReward-v0",
        "env_kwargs": {"nan_after": 40},  # steps 33..48 are iteration 2 with num_steps=16
        "num_envs": 2,
        "num_steps": 16,
        "hidden": [8],
        "epochs": 1,
        "minibatches": 2,
    }
    with pytest.raises(NumericalError) as info:
        train("ppo", cfg, iterations=5, log_dir=tmp_path, checkpoint_every=1, progress=False)
    msg = str(info.value)
    assert "iteration 2" in msg and "reward_mean" in msg and "loss" in msg
    assert "iteration 1" in msg  # the checkpoint kept
    ckpt = _ckpt(tmp_path)
    assert ckpt.iteration == 1
    for value in ckpt.arrays.values():
        if np.issubdtype(value.dtype, np.floating):
            assert np.all(np.isfinite(value))
    assert [int(r["iteration"]) for r in _rows(tmp_path)] == [0, 1]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_an_overflowing_lr_raises_at_the_first_iteration(tmp_path):
    cfg = dict(CFG, lr=1e38, anneal_lr=False)  # finite, so the config takes it
    with pytest.raises(NumericalError, match="iteration 0:.*loss") as info:
        train("ppo", cfg, iterations=2, log_dir=tmp_path, checkpoint_every=1, progress=False)
    assert "was none" in str(info.value)
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


@pytest.mark.parametrize(
    ("algo", "setting", "why"),
    [
        ("ppo", {"lr": float("inf")}, "lr must be a number >= 0, got inf (config['lr'])"),
        ("ppo", {"gamma": 1.5}, "gamma must be a number in [0, 1]"),
        ("ppo", {"num_steps": 0}, "num_steps must be an integer >= 1, got 0 (config['num_steps'])"),
        ("ppo", {"num_envs": 2.5}, "num_envs must be an integer >= 1"),
        ("ppo", {"epochs": True}, "epochs must be an integer >= 1"),
        ("ppo", {"hidden": (64, 0)}, "hidden must be a sequence of positive integers"),
        ("ppo", {"hidden": 64}, "hidden must be a sequence of positive integers"),
        ("ppo", {"ent_coef": -0.1}, "ent_coef must be a number >= 0 or None"),
        ("reinforce", {"seed": -1}, "seed must be an integer >= 0"),
        ("a2c", {"gae_lambda": 2.0}, "gae_lambda must be a number in [0, 1]"),
        ("dqn", {"tau": 0.0}, "tau must be a number in (0, 1]"),
        ("sac", {"init_alpha": -1.0}, "init_alpha must be a positive number"),
        ("ppo", {"env_kwargs": [1, 2]}, "env_kwargs must be a mapping of keyword arguments"),
    ],
)
def test_a_bad_hyper_parameter_is_refused_by_name_before_anything_runs(algo, setting, why):
    from timerl.errors import ProgramError
    from timerl.rl.train import make_config

    with pytest.raises(ProgramError) as info:
        make_config(algo, setting)
    assert why in str(info.value)
    assert "--" not in str(info.value)  # a Python caller is told its parameters, not flags


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"total_steps": -5}, "total_steps must be at least 1, got -5"),
        ({"iterations": 0}, "iterations must be at least 1"),
        ({"keep_checkpoints": 0}, "keep_checkpoints must be at least 1"),
        ({"log_every": -1}, "log_every and workers must not be negative"),
        ({"minutes": 0}, "minutes must be positive"),
        ({"iterations": 2, "total_steps": 64}, "iterations=2 or total_steps=64, not both"),
        ({"config": "CartPole-v1"}, "config must be a dict of hyper-parameters"),
    ],
)
def test_a_bad_run_length_or_log_setting_is_refused(kwargs, why):
    from timerl.errors import TimerlError

    kwargs = {"config": CFG, **kwargs}
    with pytest.raises(TimerlError) as info:
        train("ppo", progress=False, **kwargs)
    assert why in str(info.value)
    assert "--" not in str(info.value)  # a Python caller is told its parameters, not flags


def test_unknown_hyper_parameter():
    from timerl.errors import ProgramError

    with pytest.raises(ProgramError, match="bogus"):
        train("ppo", dict(CFG, bogus=1), iterations=1, progress=False)
    with pytest.raises(ProgramError, match="unknown algorithm"):
        train("a2c-nope", CFG, iterations=1, progress=False)


# --- CLI ---------------------------------------------------------------------------------------
def test_cli_train_prints_a_summary(tmp_path, capsys):
    from timerl.cli import main

    argv = ["train", "ppo", "--env", "CartPole-v1", "--steps", "2048", "--num-envs", "4"]
    argv += ["--num-steps", "64", "--log-dir", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "mean return" in out
    assert "steps/s" in out
    assert "compile" in out
    assert "peak memory" in out
    assert len(_rows(tmp_path)) == 2048 // (4 * 64)
    ckpt = _ckpt(tmp_path)
    assert ckpt.header["config"]["num_envs"] == 4 and ckpt.header["config"]["num_steps"] == 64


def test_cli_reports_errors(capsys):
    from timerl.cli import main

    assert main(["train", "ppo", "--env", "CartPole-v9", "--steps", "64", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "CartPole-v9" in err and "error" in err
    argv = ["train", "reinforce", "--clip", "0.1", "--steps", "64", "--no-progress"]
    with pytest.raises(SystemExit) as exit_:  # reinforce has no --clip: argparse says so
        main(argv)
    assert exit_.value.code == 2
    assert "--clip" in capsys.readouterr().err
    for kwargs, why in (("[1, 2]", "expected a JSON object"), ("{bad", "not valid JSON")):
        with pytest.raises(SystemExit):
            main(["train", "ppo", "--env-kwargs", kwargs, "--no-progress"])
        assert why in capsys.readouterr().err
