"""An environment of one's own, end to end, and checkpoints that fail well.

The first test is what a user following docs/training.md does, from a shell: a module of
their own registers an env, ``timerl train --env module:EnvId`` trains on it, and ``eval``,
``export``, ``plot`` and ``--resume`` work on the run, from another folder too; a damaged
latest checkpoint is passed over for the newest intact one, and a text file given as a
checkpoint is named as not a timerl checkpoint.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from timerl.errors import CheckpointError, EnvError, TimerlError
from timerl.rl.train import train
from timerl.rl.train.checkpoint import checkpoint_files, latest_checkpoint, load_checkpoint
from timerl.rl.train.evaluation import evaluate_run, format_return

ROOT = Path(__file__).resolve().parents[3]

WALK = '''
import gymnasium as gym
import numpy as np


class Walk(gym.Env):
    """Right along SIZE cells pays 1 at the end, each other step costs 0.01."""

    def __init__(self, size=5):
        self.size = size
        self.observation_space = gym.spaces.Box(0.0, 1.0, (size,), np.float64)
        self.action_space = gym.spaces.Discrete(2)
        self.position = size // 2

    def _obs(self):
        obs = np.zeros(self.size)
        obs[self.position] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = self.size // 2
        return self._obs(), {}

    def step(self, action):
        self.position = max(0, self.position + (1 if action == 1 else -1))
        done = self.position == self.size - 1
        return self._obs(), 1.0 if done else -0.01, done, False, {}


def make_walk(size=5):
    return Walk(size)


gym.register("Walk-v0", entry_point=Walk, max_episode_steps=30)
'''

SMALL = ["--num-envs", "2", "--num-steps", "32", "--hidden", "16", "--epochs", "1"]
SMALL += ["--minibatches", "1", "--no-progress"]
CFG = {"num_envs": 2, "num_steps": 32, "hidden": [16], "epochs": 1, "minibatches": 1}


def _timerl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "timerl.cli", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def walk_module(tmp_path, monkeypatch):
    """``walk_env.py`` in a folder of its own, importable in this process too."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "walk_env.py").write_text(WALK)
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    sys.modules.pop("walk_env", None)
    import gymnasium as gym

    gym.registry.pop("Walk-v0", None)


def _documented_env_module() -> str:
    """The env module docs/training.md's "Your own environment" shows."""
    text = (ROOT / "docs" / "training.md").read_text()
    section = text[text.index("## Your own environment") :]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_a_shell_user_trains_evaluates_exports_and_resumes_on_their_own_env(tmp_path):
    """With the module exactly as the docs show it, in a folder of its own."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "walk_env.py").write_text(_documented_env_module())
    train_cmd = ["train", "ppo", "--env", "walk_env:RandomWalk-v0", *SMALL, "--log-dir", "run"]
    done = _timerl(*train_cmd, "--steps", "640", "--checkpoint-every", "5", cwd=project)
    assert done.returncode == 0, done.stderr
    assert "ppo on walk_env:RandomWalk-v0: 10 iterations" in done.stdout
    run = project / "run"
    record = json.loads((run / "config.json").read_text())["env"]
    assert record == {"id": "walk_env:RandomWalk-v0", "path": str(project.resolve())}

    # eval and export from another folder: the module is found where the run found it
    shown = _timerl("eval", str(run), "--episodes", "3", "--deterministic", cwd=elsewhere)
    assert shown.returncode == 0, shown.stderr
    assert "walk_env:RandomWalk-v0: return" in shown.stdout and "after iteration 9" in shown.stdout
    policy = elsewhere / "policy.pt2"
    made = _timerl("export", str(run), "--out", str(policy), cwd=elsewhere)
    assert made.returncode == 0 and policy.exists(), made.stderr
    plotted = _timerl("plot", str(run), "--out", str(elsewhere / "c.png"), cwd=elsewhere)
    assert plotted.returncode == 0 and (elsewhere / "c.png").exists(), plotted.stderr

    # the latest checkpoint damaged: eval says so and uses the one before
    latest = latest_checkpoint(run)
    assert latest.name == "ckpt-0000009.npz"
    data = latest.read_bytes()
    latest.write_bytes(data[: len(data) // 3])
    shown = _timerl("eval", str(run), "--episodes", "2", cwd=elsewhere)
    assert shown.returncode == 0, shown.stderr
    assert "ckpt-0000009.npz is damaged (truncated or corrupt)" in shown.stdout
    assert "using" in shown.stdout and "ckpt-0000004.npz" in shown.stdout
    assert "after iteration 4" in shown.stdout

    # --resume does the same, sets the damaged file aside and trains from iteration 5 on
    more = _timerl(*train_cmd[:2], "--log-dir", "run", "--resume", "--steps", "960", cwd=project)
    assert more.returncode == 0, more.stderr
    assert "ckpt-0000009.npz is damaged" in more.stdout and "ckpt-0000004.npz" in more.stdout
    assert "resumed at iteration 5" in more.stdout and "15 iterations" in more.stdout
    assert (run / "checkpoints" / "ckpt-0000009.npz.damaged").exists()
    assert [i for i, _ in checkpoint_files(run)][-1] == 14
    with open(run / "metrics.csv", newline="") as fh:
        assert [int(r["iteration"]) for r in csv.DictReader(fh)] == list(range(15))

    # a text file given as a checkpoint is named for what it is, with no advice on pickles
    notes = elsewhere / "notes.txt"
    notes.write_text("hyper-parameters I tried\n")
    shown = _timerl("eval", str(run), "--checkpoint", str(notes), cwd=elsewhere)
    assert shown.returncode == 2
    assert f"{notes} is not a timerl checkpoint" in shown.stderr
    assert "a text file starting with 'hyper-parameters I tried'" in shown.stderr
    assert "allow_pickle" not in shown.stderr


def test_an_env_module_missing_from_the_path_is_named(tmp_path):
    done = _timerl(
        "train", "ppo", "--env", "no_such_env_module:Walk-v0", "--steps", "64", cwd=tmp_path
    )
    assert done.returncode == 2
    assert "cannot import module 'no_such_env_module'" in done.stderr
    assert "run from the folder that holds it" in done.stderr


def test_an_id_registered_by_the_training_script_is_rebuilt_from_the_run(walk_module, tmp_path):
    """``gymnasium.register`` in the user's own code, then ``train(..., {"env_id": id})``:
    a fresh process has no such id, and rebuilds it from the run's record of its entry
    point."""
    import gymnasium as gym
    import walk_env

    gym.register("MyWalk-v3", entry_point=walk_env.Walk, max_episode_steps=20, kwargs={"size": 4})
    try:
        run = tmp_path / "run"
        train("ppo", {**CFG, "env_id": "MyWalk-v3"}, iterations=2, log_dir=run, progress=False)
    finally:
        gym.registry.pop("MyWalk-v3")
    record = json.loads((run / "config.json").read_text())["env"]
    assert record["entry_point"] == "walk_env:Walk"
    assert record["registration"]["kwargs"] == {"size": 4}
    shown = _timerl("eval", str(run), "--episodes", "2", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "MyWalk-v3: return" in shown.stdout


def test_a_class_or_factory_from_python_trains_and_is_rebuilt(walk_module, tmp_path):
    import walk_env

    run = tmp_path / "run"
    cfg = {**CFG, "env_id": walk_env.make_walk, "env_kwargs": {"size": 4}}
    res = train("ppo", cfg, iterations=2, log_dir=run, progress=False)
    assert res.env_id == "walk_env:make_walk"
    saved = json.loads((run / "config.json").read_text())
    assert saved["config"]["env_id"] == "walk_env:make_walk"
    report = evaluate_run(run, episodes=2)
    assert report.env_id == "walk_env:make_walk" and len(report.returns) == 2
    # ... and the class itself, resumed with the same class given again
    run2 = tmp_path / "run2"
    train("ppo", {**CFG, "env_id": walk_env.Walk}, iterations=1, log_dir=run2, progress=False)
    more = train(
        "ppo", {"env_id": walk_env.Walk}, iterations=2, log_dir=run2, resume=True, progress=False
    )
    assert more.iterations == 2 and more.env_id == "walk_env:Walk"


def test_resuming_an_env_of_ones_own_is_bit_for_bit(walk_module, tmp_path):
    """The env keeps its state in plain attributes (a position): the checkpoint holds them, so
    a resumed run computes what the uninterrupted one did."""
    cfg = {**CFG, "env_id": "walk_env:Walk-v0", "seed": 3, "anneal_lr": False}
    whole = train("ppo", cfg, iterations=6, log_dir=tmp_path / "whole", progress=False)
    cut = tmp_path / "cut"
    train("ppo", cfg, iterations=3, log_dir=cut, progress=False)
    env_state = load_checkpoint(cut).env_state()["sim"]["envs"][0]
    assert set(env_state["attrs"]) == {"size", "position"}
    resumed = train("ppo", None, iterations=6, log_dir=cut, resume=True, progress=False)
    assert resumed.returns[3:] == whole.returns[3:]
    a, b = load_checkpoint(tmp_path / "whole"), load_checkpoint(cut)
    for name, value in a.params.items():
        assert np.array_equal(value, b.params[name]), name


def test_an_env_in_the_training_script_itself_needs_the_env_again(tmp_path):
    """A class of ``__main__`` cannot be imported by another process: eval says what to do,
    and ``--env`` gives it."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "walk_env.py").write_text(WALK)
    script = textwrap.dedent(
        """
        import sys
        from walk_env import Walk

        class Here(Walk):
            pass

        from timerl.rl.train import train
        cfg = {"env_id": Here, "num_envs": 2, "num_steps": 32, "hidden": [16], "epochs": 1,
               "minibatches": 1}
        train("ppo", cfg, iterations=1, log_dir="run", progress=False)
        """
    )
    (project / "script.py").write_text(script)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    ran = subprocess.run(
        [sys.executable, "script.py"], cwd=project, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    shown = _timerl("eval", "run", "--episodes", "1", cwd=project)
    assert shown.returncode == 2
    assert "__main__:Here" in shown.stderr and "training script itself" in shown.stderr
    shown = _timerl("eval", "run", "--episodes", "1", "--env", "walk_env:Walk-v0", cwd=project)
    assert shown.returncode == 0, shown.stderr
    assert "walk_env:Walk-v0: return" in shown.stdout


def test_an_env_object_is_refused_naming_the_python_parameter(walk_module):
    import walk_env

    with pytest.raises(EnvError) as info:
        train("ppo", {"env_id": walk_env.Walk()}, iterations=1, progress=False)
    text = str(info.value)
    assert "config['env_id']: got an environment object (Walk)" in text
    assert "pass its class" in text and "--" not in text
    with pytest.raises(EnvError, match="config\\['env_id'\\] must be an environment id"):
        train("ppo", {"env_id": 3}, iterations=1, progress=False)


def test_the_command_line_names_flags_where_python_names_parameters(tmp_path, capsys):
    from timerl.cli import main

    assert main(["train", "ppo", "--gamma", "1.5", "--steps", "64"]) == 2
    assert "gamma must be a number in [0, 1], got 1.5 (--gamma)" in capsys.readouterr().err
    with pytest.raises(TimerlError) as info:
        train("ppo", {"gamma": 1.5}, iterations=1, progress=False)
    assert "(config['gamma'])" in str(info.value)
    with pytest.raises(TimerlError) as info:
        evaluate_run(tmp_path, episodes=0)
    assert str(info.value) == "episodes must be at least 1, got 0"


# --- checkpoints ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("cp")
    cfg = {**CFG, "env_id": "CartPole-v1"}
    train("ppo", cfg, iterations=4, log_dir=run, checkpoint_every=2, progress=False)
    return run


def test_eval_falls_back_to_the_newest_intact_checkpoint(cartpole_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(cartpole_run, run)
    latest = latest_checkpoint(run)
    latest.write_bytes(b"")  # as a full disk leaves a file
    report = evaluate_run(run, episodes=1)
    assert report.iteration == 1 and report.checkpoint.endswith("ckpt-0000001.npz")
    assert report.notes and "ckpt-0000003.npz is damaged: the file is empty" in report.notes[0]
    assert report.summary().startswith("warning: ")
    assert latest.exists()  # eval reads; only a resume sets files aside
    for _, path in checkpoint_files(run):
        path.write_bytes(b"PK\x03\x04")  # every numbered one damaged: best.npz is the last resort
    report = evaluate_run(run, episodes=1)
    assert report.checkpoint.endswith("best.npz")
    (run / "checkpoints" / "best.npz").write_text("gone")
    with pytest.raises(
        CheckpointError, match="no intact checkpoint in .*ckpt-0000003.npz is damaged"
    ):
        evaluate_run(run, episodes=1)


def test_a_crash_while_copying_the_best_leaves_the_old_best_and_no_temporary(
    cartpole_run, tmp_path, monkeypatch
):
    from timerl.rl.train import checkpoint as ck

    best = tmp_path / "best.npz"
    best.write_bytes(b"old best")

    def crash(fh):
        fh.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        ck.write_atomically(best, crash)
    assert best.read_bytes() == b"old best"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.npz"]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\x93NUMPY\x01\x00", "a single NumPy .npy array"),
        (b"\x80\x04\x95", "looks like a pickle, which timerl never loads"),
        (b"\x00\x01\x02\x03binary", "binary data starting with"),
    ],
)
def test_a_foreign_file_says_what_it_is(tmp_path, content, why):
    path = tmp_path / "weights.npz"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    text = str(info.value)
    assert text.startswith(f"{path} is not a timerl checkpoint") and why in text
    assert "allow_pickle" not in text


def test_an_npz_holding_objects_is_not_loaded(tmp_path):
    path = tmp_path / "objects.npz"
    np.savez(path, data=np.array([{"a": 1}], dtype=object))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert "is not a timerl checkpoint" in str(info.value)
    assert "allow_pickle" not in str(info.value)


# --- what eval and export give back ----------------------------------------------------------
@pytest.mark.parametrize(
    ("mean", "std", "text"),
    [
        (0.93125, 0.0021, "0.9313 ± 0.0021"),
        (500.0, 0.0, "500.0 ± 0.0"),
        (4564.27, 65.2, "4564.3 ± 65.2"),
        (-184.33, 12.0, "-184.3 ± 12.0"),
        (0.0123, 0.0, "0.01230 ± 0.00000"),
        (0.0, 0.0, "0.0 ± 0.0"),
    ],
)
def test_returns_are_printed_to_four_significant_digits(mean, std, text):
    assert format_return(mean, std) == text


def test_the_exported_policy_takes_float64_observations(cartpole_run, tmp_path):
    torch = pytest.importorskip("torch")
    from timerl.rl.train.export import export_run

    path = export_run(cartpole_run, out=tmp_path / "p.pt2")
    policy = torch.export.load(str(path)).module()
    obs = np.random.default_rng(0).standard_normal((5, 4))
    as64 = policy(torch.from_numpy(obs))
    as32 = policy(torch.from_numpy(obs.astype(np.float32)))
    assert as64.shape == (5,) and torch.equal(as64, as32)
    one = policy(torch.from_numpy(obs[:1]))  # one observation: a batch of one
    assert one.shape == (1,) and one[0] == as32[0]
