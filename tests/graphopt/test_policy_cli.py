"""``timerl graphopt train`` and ``optimize --method learned`` (the default) from the CLI."""

from __future__ import annotations

import json

import pytest

from timerl.cli import main
from timerl.graphopt.baselines import best_of_portfolio
from timerl.graphopt.decoders import Problem
from timerl.graphopt.graph import Graph
from timerl.graphopt.perfmodel import PeakMemory, as_order
from timerl.graphopt.policy import PolicyWeights
from timerl.graphopt.random_graph import random_graph


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "g.json"
    random_graph(40, seed=7, view_prob=0.2).save(path)
    return path


@pytest.fixture
def broken_weights(tmp_path):
    path = tmp_path / "broken.npz"
    PolicyWeights.random(hidden=8, rounds=1).save(path)
    path.write_bytes(path.read_bytes()[:200])
    return path


def test_optimize_defaults_to_the_learned_method(graph_file, tmp_path):
    out = tmp_path / "r.json"
    assert (
        main(["graphopt", "optimize", str(graph_file), "--budget", "200", "--out", str(out)]) == 0
    )
    res = json.loads(out.read_text())
    g = Graph.load(graph_file)
    assert res["method"] == "learned"
    assert res["objective"] == PeakMemory(g).peak(as_order(g, res["order"]))
    assert res["objective"] <= best_of_portfolio(Problem(g)).value


def test_broken_weights_are_named_and_brkga_still_works(graph_file, broken_weights, capsys):
    rc = main(["graphopt", "optimize", str(graph_file), "--weights", str(broken_weights)])
    assert rc == 2
    err = capsys.readouterr().err
    assert str(broken_weights) in err and "truncated or corrupt" in err
    rc = main(
        [
            "graphopt",
            "optimize",
            str(graph_file),
            "--method",
            "brkga",
            "--budget",
            "100",
            "--weights",
            str(broken_weights),
            "--json",
        ]
    )
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["method"] == "brkga"


def test_train_then_optimize_with_the_trained_weights(tmp_path, graph_file, capsys):
    pytest.importorskip("torch")
    corpus = tmp_path / "corpus"
    (corpus / "train" / "rand").mkdir(parents=True)
    entries = []
    for k in range(2):
        g = random_graph(24, seed=10 + k)
        g.save(corpus / "train" / "rand" / f"r{k}.json")
        entries.append(
            {
                "name": f"r{k}",
                "family": "rand",
                "kind": "synthetic",
                "split": "train",
                "nodes": g.n,
                "path": f"train/rand/r{k}.json",
            }
        )
    (corpus / "index.json").write_text(json.dumps({"graphs": entries}))
    weights = tmp_path / "p.npz"
    args = ["graphopt", "train", "--corpus", str(corpus), "--out", str(weights)]
    args += ["--budget", "30", "--batch", "2", "--hidden", "8", "--rounds", "1"]
    assert main([*args, "--iterations", "2"]) == 0
    assert "2/2" in capsys.readouterr().out  # progress lines when not on a terminal
    assert PolicyWeights.load(weights).meta["iterations"] == 2
    assert main([*args, "--iterations", "3", "--resume"]) == 0
    assert PolicyWeights.load(weights).meta["iterations"] == 3
    out = tmp_path / "r.json"
    opt = ["graphopt", "optimize", str(graph_file), "--weights", str(weights)]
    assert main([*opt, "--budget", "100", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["detail"] == "learned"
    # the decode reward's flags reach the run and its weights' record of the settings
    dec = ["--reward", "decode", "--samples", "4", "--entropy", "0.01", "--iterations", "2"]
    assert main([*args, "--checkpoint", str(tmp_path / "d.ckpt.npz"), *dec]) == 0
    assert "decoded vs portfolio" in capsys.readouterr().out
    config = PolicyWeights.load(weights).meta["config"]
    assert (config["reward"], config["samples"], config["entropy"]) == ("decode", 4, 0.01)
    # the imitation warm start's flags, and its targets file next to --targets
    imit = ["--warm-start", "imitate", "--imitate-updates", "3", "--imitate-budget", "50"]
    imit += ["--imitate-concentration", "3", "--targets", str(tmp_path / "t.npz")]
    assert main([*args, "--checkpoint", str(tmp_path / "i.ckpt.npz"), *imit, *dec]) == 0
    assert "imitation loss" in capsys.readouterr().out
    meta = PolicyWeights.load(weights).meta
    assert meta["imitation_updates"] == 3 and meta["config"]["imitate_concentration"] == 3.0
    assert (tmp_path / "t.npz").is_file()
