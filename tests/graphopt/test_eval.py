import json

from timerl.cli import main
from timerl.graphopt.evaluate import (
    METHODS,
    evaluate_corpus,
    headroom_by_family,
    summarise,
    to_markdown,
)
from timerl.graphopt.random_graph import random_graph


def write_corpus(root):
    graphs = []
    for i, (kind, split, n) in enumerate(
        [
            ("synthetic", "test", 12),
            ("model", "test", 20),
            ("training", "test", 30),
            ("synthetic", "train", 10),
        ]
    ):
        g = random_graph(n, seed=i)
        rel = f"graphs/{kind}-{i}.json"
        (root / "graphs").mkdir(exist_ok=True)
        g.save(root / rel)
        graphs.append(
            {
                "name": g.name,
                "family": "random",
                "kind": kind,
                "split": split,
                "nodes": n,
                "path": rel,
            }
        )
    (root / "index.json").write_text(json.dumps({"graphs": graphs}))


def test_evaluate_corpus_and_summary(tmp_path):
    write_corpus(tmp_path)
    recs = evaluate_corpus(tmp_path, "test", budget=150, exact_nodes=15, exact_time=5)
    assert [r.kind for r in recs] == ["synthetic", "model", "training"]
    for r in recs:
        assert r.values["portfolio"] <= r.values["program"]
        assert r.values["brkga"] <= r.values["portfolio"]
        assert r.best_known == min(r.values.values())
        assert 0 < r.lower_bound <= r.best_known
    assert "exact" in recs[0].values and recs[0].optimum == recs[0].best_known
    assert "exact" not in recs[2].values
    rows = summarise(recs, METHODS)
    brk = [r for r in rows if r["method"] == "brkga" and r["kind"] == "all"][0]
    assert brk["wtl"] == "0/3/0" and brk["vs_brkga_mean"] == 0.0
    prog = [r for r in rows if r["method"] == "program" and r["kind"] == "all"][0]
    assert prog["vs_program_mean"] == 0.0
    assert {r["kind"] for r in rows} == {"synthetic", "model", "training", "all"}
    assert to_markdown(rows).count("\n") == len(rows) + 1
    fam = headroom_by_family(recs)
    assert [(r["kind"], r["graphs"]) for r in fam] == [
        ("model", 1),
        ("synthetic", 1),
        ("training", 1),
    ]
    for row, rec in zip(fam, [recs[1], recs[0], recs[2]], strict=True):
        prog = rec.values["program"]
        assert row["headroom_mean"] == 100 * (prog - rec.best_known) / prog


def test_eval_cli_prints_table(tmp_path, capsys):
    write_corpus(tmp_path)
    md = tmp_path / "t.md"
    rc = main(
        [
            "graphopt",
            "eval",
            "--corpus",
            str(tmp_path),
            "--budget",
            "100",
            "--methods",
            "program",
            "portfolio",
            "brkga",
            "--no-progress",
            "--markdown",
            str(md),
            "--limit",
            "2",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "BRKGA" in out and "portfolio" in out
    assert "| all | brkga | 2 |" in md.read_text()


def test_eval_cli_runtime_under_memory_limit(tmp_path, capsys):
    write_corpus(tmp_path)
    out = tmp_path / "recs.json"
    rc = main(
        [
            "graphopt",
            "eval",
            "--corpus",
            str(tmp_path),
            "--budget",
            "60",
            "--objective",
            "runtime",
            "--devices",
            "2",
            "--host",
            "--memory-fraction",
            "0.5",
            "--no-progress",
            "--limit",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    (rec,) = json.loads(out.read_text())
    assert "exact" not in rec["values"]  # exact is single-device peak memory only
    assert set(rec["feasible"]) == {"program", "portfolio", "local", "brkga", "learned"}
    assert rec["feasible"]["program"] is False  # all on one device at twice the limit
    if rec["limit_unreachable"]:
        assert not any(rec["feasible"].values())
    assert rec["values"]["brkga"] <= rec["values"]["portfolio"] <= rec["values"]["program"]
    assert "runtime, 2 device(s) + host, limit 0.5 x program peak" in capsys.readouterr().out


def test_unseeded_searches_start_from_no_portfolio_schedule(tmp_path, capsys):
    from timerl.graphopt.brkga import brkga
    from timerl.graphopt.decoders import Problem
    from timerl.graphopt.graph import Graph
    from timerl.graphopt.learned import learned_search, load_policy

    write_corpus(tmp_path)
    methods = ["portfolio", "brkga", "learned"]
    seeded = evaluate_corpus(tmp_path, "test", methods=methods, budget=40, seed=3)
    unseeded = evaluate_corpus(tmp_path, "test", methods=methods, budget=40, seed=3, seeded=False)
    entries = json.loads((tmp_path / "index.json").read_text())["graphs"]
    tested = [e for e in entries if e["split"] == "test"]
    for entry, a, b in zip(tested, seeded, unseeded, strict=True):
        problem = Problem(Graph.load(tmp_path / entry["path"]))
        # seeded, never worse than the portfolio; unseeded, exactly the searches from nothing
        assert a.values["brkga"] <= a.values["portfolio"]
        assert a.values["learned"] <= a.values["portfolio"]
        assert b.values["brkga"] == brkga(problem, budget=40, seeds=[], seed=3).value
        alone = learned_search(problem, load_policy(), budget=40, seed=3, seeds={})
        assert b.values["learned"] == alone.value
    # at 40 evaluations a search from nothing misses what the portfolio finds somewhere
    assert any(b.values["brkga"] > a.values["brkga"] for a, b in zip(seeded, unseeded, strict=True))
    rc = main(
        ["graphopt", "eval", "--corpus", str(tmp_path), "--budget", "40", "--unseeded"]
        + ["--methods", "brkga", "--no-progress"]
    )
    assert rc == 0 and "searches unseeded" in capsys.readouterr().out
