import json

import pytest

from timerl.cli import main
from timerl.graphopt.graph import Graph
from timerl.graphopt.perfmodel import PeakMemory, as_order
from timerl.graphopt.random_graph import random_graph


@pytest.fixture
def graph_file(tmp_path):
    g = random_graph(25, seed=5, view_prob=0.2)
    path = tmp_path / "g.json"
    g.save(path)
    return path


@pytest.mark.parametrize(
    "method", ["program", "portfolio", "local", "brkga", "learned", "untrained", "exact"]
)
def test_optimize_round_trip(graph_file, tmp_path, method):
    out = tmp_path / "r.json"
    rc = main(
        [
            "graphopt",
            "optimize",
            str(graph_file),
            "--method",
            method,
            "--budget",
            "200",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    g = Graph.load(graph_file)
    order = as_order(g, res["order"])  # a topological permutation of all node ids
    assert sorted(res["order"]) == sorted(g.ids)
    assert res["objective"] == PeakMemory(g).peak(order)
    assert res["objective"] <= res["program_order_value"]
    assert res["placement"] == {} and res["swap"] == []
    assert res["seconds"] >= 0 and res["method"] == method
    assert res["detail"].startswith(method)


def test_optimize_runtime_multi_device(graph_file, tmp_path):
    out = tmp_path / "r.json"
    rc = main(
        [
            "graphopt",
            "optimize",
            str(graph_file),
            "--objective",
            "runtime",
            "--devices",
            "2",
            "--memory-limit",
            "1000000",
            "--host",
            "--budget",
            "150",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert set(res["placement"]) == set(Graph.load(graph_file).ids)
    assert set(res["placement"].values()) <= {"d0", "d1"}
    assert res["objective"] <= res["program_order_value"]


def test_optimize_bad_graph_reports_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "name": "b",
                "nodes": [{"id": "a", "op": "x", "bytes": 1, "cost": 1}],
                "edges": [["a", "q"]],
            }
        )
    )
    assert main(["graphopt", "optimize", str(bad)]) == 2
    assert "'q'" in capsys.readouterr().err


def test_exact_refuses_multi_device(graph_file, capsys):
    rc = main(["graphopt", "optimize", str(graph_file), "--method", "exact", "--devices", "2"])
    assert rc == 2
    assert "one device" in capsys.readouterr().err


def test_corpus_command_calls_build_corpus(monkeypatch, tmp_path, capsys):
    import timerl.graphopt.corpus as corpus

    calls = []

    def fake(out_dir, *, quick=False, progress=True, export_program=None):
        calls.append((out_dir, quick, progress))
        assert callable(export_program)  # the top-level command hands graphopt the exporter
        return out_dir / "index.json"

    monkeypatch.setattr(corpus, "build_corpus", fake)
    assert main(["graphopt", "corpus", "--out", str(tmp_path), "--quick"]) == 0
    assert calls == [(tmp_path, True, True)]
    assert str(tmp_path / "index.json") in capsys.readouterr().out


@pytest.mark.parametrize("budget", ["0", "-5", "many"])
def test_an_evaluation_budget_that_is_not_a_positive_count_is_refused(budget, capsys):
    with pytest.raises(SystemExit) as info:
        main(["graphopt", "optimize", "graph.json", "--budget", budget])
    assert info.value.code == 2
    assert "argument --budget:" in capsys.readouterr().err
