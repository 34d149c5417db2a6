"""``timerl plot``: learning curves of runs, grouped across seeds."""

from __future__ import annotations

import csv
import json
import shutil
import sys

import numpy as np
import pytest

from timerl.cli import main
from timerl.rl.train.plotting import learning_curves

TINY = ["--num-envs", "4", "--num-steps", "32", "--hidden", "8", "--epochs", "1"]
TINY += ["--minibatches", "1", "--no-progress", "--log-every", "0", "--steps", "512"]


def _returns(run):
    with open(run / "metrics.csv", newline="") as fh:
        return np.array([float(r["episodic_return"]) for r in csv.DictReader(fh)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for seed in (0, 1):
        argv = ["train", "ppo", *TINY, "--seed", str(seed), "--log-dir", str(root / f"s{seed}")]
        assert main(argv) == 0
    # another configuration (what a different --lr run's directory holds)
    shutil.copytree(root / "s0", root / "other")
    doc = json.loads((root / "other" / "config.json").read_text())
    doc["config"]["lr"] = 1e-4
    (root / "other" / "config.json").write_text(json.dumps(doc))
    return root


def test_runs_that_differ_only_in_seed_are_one_mean_and_std_curve(runs):
    curves = learning_curves([runs / "s0", runs / "s1", runs / "other"])
    assert [c.label for c in curves] == ["ppo CartPole-v1 (2 seeds)", "ppo CartPole-v1 seed 0"]
    both = np.stack([_returns(runs / "s0"), _returns(runs / "s1")])
    np.testing.assert_allclose(curves[0].mean, both.mean(0))
    np.testing.assert_allclose(curves[0].std, both.std(0))
    np.testing.assert_array_equal(curves[0].env_steps, [128, 256, 384, 512])
    np.testing.assert_allclose(curves[1].mean, _returns(runs / "other"))
    ungrouped = learning_curves([runs / "s0", runs / "s1"], group=False)
    assert len(ungrouped) == 2


def test_plot_writes_a_png(runs, tmp_path, capsys):
    pil = pytest.importorskip("PIL.Image")
    out = tmp_path / "curve.png"
    argv = ["plot", str(runs / "s0"), str(runs / "s1"), str(runs / "other"), "--out", str(out)]
    assert main(argv) == 0
    assert str(out) in capsys.readouterr().out
    with pil.open(out) as img:
        assert img.format == "PNG" and img.size[0] > 400


def test_plot_errors_name_the_problem(runs, tmp_path, capsys, monkeypatch):
    assert main(["plot", str(tmp_path)]) == 2
    assert "no metrics.csv" in capsys.readouterr().err
    assert main(["plot", str(runs / "s0"), "--metric", "bogus"]) == 2
    assert "no column 'bogus'" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["plot", str(runs / "s0"), "--out", str(tmp_path / "x.png")]) == 2
    assert "timerl[train]" in capsys.readouterr().err
