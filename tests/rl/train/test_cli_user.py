"""``timerl train`` and friends driven the way a user drives them: through the CLI.

Each test names the failure it guards against (the eight of the "train as a tool" issue).
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from timerl.cli import main
from timerl.rl.train.checkpoint import checkpoint_files, latest_checkpoint, load_checkpoint

ROOT = Path(__file__).resolve().parents[3]
SMALL = ["--num-envs", "4", "--num-steps", "32", "--hidden", "16", "--epochs", "1"]
SMALL += ["--minibatches", "2", "--no-progress"]


def _argv(log_dir: Path, steps: int, *extra: str) -> list[str]:
    head = ["train", "ppo", "--env", "CartPole-v1", "--steps", str(steps), *SMALL]
    return [*head, "--log-dir", str(log_dir), *extra]


def _rows(log_dir: Path) -> list[dict[str, str]]:
    with open(log_dir / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _subprocess(*args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "timerl.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=kw.pop("stdout", subprocess.PIPE),
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """512 steps (4 iterations of 128), summary and lines captured."""
    log = tmp_path_factory.mktemp("run")
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(_argv(log, 512, "--log-every", "2", "--checkpoint-every", "2"))
    assert code == 0
    return log, out.getvalue()


# --- 1 and 7: resuming to more steps, summary, seconds column, non-terminal output --------------
def test_resume_to_more_steps_continues_and_reports_real_figures(first_run, tmp_path, capsys):
    import shutil

    log = tmp_path / "run"
    shutil.copytree(first_run[0], log)
    before = _rows(log)
    assert len(before) == 4
    assert main(_argv(log, 1024, "--resume", "--log-every", "2")) == 0
    out = capsys.readouterr().out
    rows = _rows(log)
    assert [int(r["iteration"]) for r in rows] == list(range(8))
    assert rows[:4] == before  # the first rows are kept as they were
    # the seconds column continues instead of restarting at 0
    seconds = [float(r["seconds"]) for r in rows]
    assert seconds == sorted(seconds) and seconds[4] > seconds[3]
    assert "8 iterations, 1,024 env steps" in out and "resumed at iteration 4" in out
    sps = float(out.split("env steps/s:")[1].split()[0].replace(",", ""))
    peak = out.split("peak memory:")[1].split()
    assert sps > 0 and float(peak[0]) > 0 and peak[1] in ("KiB", "MiB")
    assert load_checkpoint(latest_checkpoint(log)).iteration == 7
    # the same command once more has nothing left to do and says so
    assert main(_argv(log, 1024, "--resume")) == 2
    assert "pass a larger --steps" in capsys.readouterr().err


def test_without_a_terminal_lines_come_during_the_run_and_the_summary_says_where(first_run):
    log, out = first_run
    lines = out.splitlines()
    progress = [line for line in lines if line.startswith("iteration ")]
    # numbered from 0, as in metrics.csv and the checkpoints' names, with the count beside
    assert [p.split("  ")[0] for p in progress] == ["iteration 1 (2 of 4)", "iteration 3 (4 of 4)"]
    assert lines.index(progress[0]) < lines.index(next(x for x in lines if "mean return" in x))
    assert f"metrics: {log / 'metrics.csv'}" in out
    assert f"checkpoint: {log / 'checkpoints' / 'ckpt-0000003.npz'}" in out


def test_lines_are_printed_while_a_subprocess_trains(tmp_path):
    """Redirected output (a pipe): the first line arrives long before the run ends."""
    proc = _subprocess(*_argv(tmp_path, 10**7, "--log-every", "1"))
    try:
        line = proc.stdout.readline()
        assert line.startswith("iteration 0 (1 of "), line  # (stderr: still being written)
        assert proc.poll() is None  # still training
    finally:
        proc.kill()
        proc.wait()


# --- 2: resuming with other settings ------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--lr", "0.1"], "lr=0.1"), (["--env", "Acrobot-v1"], "env_id='Acrobot-v1'")],
)
def test_resume_with_a_different_setting_is_an_error_naming_it(
    first_run, tmp_path, capsys, flags, named
):
    import shutil

    log = tmp_path / "run"
    shutil.copytree(first_run[0], log)
    argv = ["train", "ppo", "--steps", "1024", "--log-dir", str(log), "--resume", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert named in err and "different config" in err
    assert len(_rows(log)) == 4  # nothing ran


# --- 3: the trained weights are in the last checkpoint ------------------------------------------
def test_last_checkpoint_holds_the_trained_weights(first_run):
    ckpt = load_checkpoint(latest_checkpoint(first_run[0]))
    assert ckpt.iteration == 3
    names = set(ckpt.params)
    assert {"actor.0.weight", "actor.0.bias", "actor.1.weight", "critic.1.bias"} <= names
    assert ckpt.params["actor.1.weight"].shape == (16, 2)
    # after four updates the weights have moved away from the iteration-1 checkpoint's
    older = load_checkpoint(first_run[0] / "checkpoints" / "ckpt-0000001.npz")
    assert not np.array_equal(older.params["actor.0.weight"], ckpt.params["actor.0.weight"])


# --- 4: an existing run is never overwritten silently -------------------------------------------
def test_rerunning_into_a_used_log_dir_is_an_error_unless_overwrite(first_run, tmp_path, capsys):
    import shutil

    log = tmp_path / "run"
    shutil.copytree(first_run[0], log)
    before = (log / "metrics.csv").read_bytes()
    assert main(_argv(log, 256)) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "--overwrite" in err and str(log) in err
    assert (log / "metrics.csv").read_bytes() == before
    assert main(_argv(log, 256, "--overwrite")) == 0
    assert len(_rows(log)) == 2
    assert [i for i, _ in checkpoint_files(log)] == [1]


# --- 5: Ctrl-C, a closed pipe, bad MLP sizes, missing OR-Tools ----------------------------------
def test_ctrl_c_saves_a_checkpoint_and_exits_130_without_a_traceback(tmp_path):
    proc = _subprocess(*_argv(tmp_path, 10**7, "--log-every", "1", "--checkpoint-every", "1000"))
    try:
        line = proc.stdout.readline()
        assert line.startswith("iteration"), line + proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "interrupted after iteration" in lines[0], err
    assert "checkpoint saved to" in lines[0]
    ckpt = load_checkpoint(latest_checkpoint(tmp_path))
    assert ckpt.iteration >= 0 and str(ckpt.path) in lines[0]


def test_show_into_a_closed_pipe_has_no_traceback():
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write, like `| head` after its lines
    proc = _subprocess("show", "ppo", stdout=write)
    os.close(write)
    _, err = proc.communicate(timeout=300)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 141


def test_mlp_with_a_bad_size_names_it():
    import timerl as tl

    with tl.Context(dims=("i", "t")), pytest.raises(tl.ProgramError, match=r"sizes\[0\].*None"):
        tl.nn.MLP([None, 64])
    with tl.Context(dims=("i", "t")), pytest.raises(tl.ProgramError, match=r"sizes\[1\].*0"):
        tl.nn.MLP([4, 0, 2])


def test_graphopt_exact_without_ortools_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ortools", None)
    monkeypatch.setitem(sys.modules, "ortools.sat", None)
    monkeypatch.setitem(sys.modules, "ortools.sat.python", None)
    graph = tmp_path / "g.json"
    graph.write_text("{}")
    assert main(["graphopt", "optimize", str(graph), "--method", "exact"]) == 2
    err = capsys.readouterr().err
    assert "OR-Tools" in err and "timerl[graphopt]" in err and "Traceback" not in err


# --- 6: loading never unpickles -----------------------------------------------------------------
def test_loading_and_resuming_never_use_pickle(first_run, tmp_path, monkeypatch):
    import pickle
    import shutil

    def refuse(*args, **kwargs):
        raise AssertionError("pickle used while loading a checkpoint")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    log = tmp_path / "run"
    shutil.copytree(first_run[0], log)
    ckpt = load_checkpoint(latest_checkpoint(log))
    assert ckpt.params["actor.0.weight"].shape == (4, 16)
    assert main(_argv(log, 640, "--resume")) == 0


# --- 8: bench without matplotlib ----------------------------------------------------------------
def test_bench_rl_out_without_matplotlib_skips_the_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.chdir(ROOT)
    argv = ["bench", "rl", "--quick", "--configs", "cartpole-l1", "--systems", "timerl_numpy"]
    argv += ["--repeats", "1", "--iterations", "1", "--in-process", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "matplotlib is not installed" in out and "0 plot(s)" in out
    assert (tmp_path / "results.csv").exists()


def test_version_and_defaults_in_help(capsys):
    from timerl import __version__

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"timerl {__version__}"
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for expected in (
        "--checkpoint-every CHECKPOINT_EVERY iterations between checkpoints (default: 10)",
        "--keep-checkpoints KEEP_CHECKPOINTS",
        "(default: 3)",
        "--lr LR learning rate (default: 0.0025)",
        "--clip CLIP PPO probability-ratio clip (default: 0.2)",
        "(default: 500,000; on --resume: the run's own)",
        "(default: CartPole-v1)",
        "--overwrite",
    ):
        assert expected in text, expected


def test_a_time_limit_stops_with_a_checkpoint_and_resume_finishes(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "reinforce", "--num-envs", "4", "--num-steps", "32", "--steps", "512"]
    argv += ["--log-dir", str(run), "--no-progress"]
    # 6e-8 s: past before the first iteration ends, however fast it runs
    assert main([*argv, "--minutes", "1e-9"]) == 0
    out = capsys.readouterr().out
    assert "stopping at the time limit" in out and "after iteration 0\n" in out
    assert len((run / "metrics.csv").read_text().splitlines()) == 2
    assert latest_checkpoint(run).name.endswith("0000000.npz")
    assert main([*argv[:2], "--log-dir", str(run), "--no-progress", "--resume"]) == 0
    assert len((run / "metrics.csv").read_text().splitlines()) == 5  # 4 iterations of 128
    assert main([*argv, "--minutes", "0"]) != 0
    assert "--minutes must be positive" in capsys.readouterr().err


def test_without_env_an_algorithm_trains_on_its_own_default(tmp_path):
    """SAC needs a continuous action space: its default is Pendulum-v1, not CartPole-v1."""
    run = tmp_path / "sac"
    assert main(["train", "sac", "--steps", "64", "--log-dir", str(run), "--no-progress"]) == 0
    assert '"env_id": "Pendulum-v1"' in (run / "config.json").read_text()


def test_a_terminal_gets_a_progress_bar_instead_of_lines(tmp_path):
    import pty

    main_fd, child_fd = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="120")
    argv = [*_argv(tmp_path, 256, "--log-every", "1")]
    argv.remove("--no-progress")
    proc = subprocess.Popen(
        [sys.executable, "-m", "timerl.cli", *argv],
        cwd=ROOT,
        env=env,
        stdout=child_fd,
        stderr=child_fd,
    )
    os.close(child_fd)
    chunks = []
    while True:
        try:
            data = os.read(main_fd, 4096)
        except OSError:  # the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=300)
    os.close(main_fd)
    text = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, text
    assert "train" in text and "steps/s" in text and "256/256" in text
    assert "iteration 1/" not in text  # no plain lines on a terminal
    assert "mean return" in text


def test_threads_must_be_at_least_one(tmp_path, capsys):
    argv = ["train", "reinforce", "--steps", "64", "--log-dir", str(tmp_path / "r")]
    assert main([*argv, "--threads", "0"]) != 0
    assert "--threads must be at least 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # refused before any work
