"""bench/graphopt_runtime.py: records of separate eval runs of one seed, merged, give what one
run of all their methods gives (the searches are deterministic per seed)."""

import json

import pytest
from bench_helpers import load_bench

from timerl.cli import main


def _bench():
    return load_bench("graphopt_runtime")


def _eval(corpus, out, methods, seed=1):
    argv = ["graphopt", "eval", "--corpus", str(corpus), "--split", "train", "--budget", "30"]
    argv += ["--objective", "runtime", "--devices", "2", "--host", "--memory-fraction", "0.8"]
    argv += ["--seed", str(seed), "--no-progress", "--out", str(out), "--methods", *methods]
    assert main(argv) == 0
    return out


def test_merged_runs_equal_one_run(tiny_corpus, tmp_path, capsys):
    bench = _bench()
    base = _eval(tiny_corpus, tmp_path / "base.json", ["portfolio", "brkga"])
    # a runtime-trained file stands in for the one under test (the ablation's network)
    steer = _eval(tiny_corpus, tmp_path / "steer.json", ["untrained"])
    whole = _eval(tiny_corpus, tmp_path / "whole.json", ["portfolio", "brkga", "untrained"])
    merged = bench.merge([str(base), f"{steer}:untrained=net"])
    one = {r["name"]: r for r in json.loads(whole.read_text())}
    for rec in merged:
        assert rec.values["brkga"] == one[rec.name]["values"]["brkga"]
        assert rec.values["net"] == one[rec.name]["values"]["untrained"]
        assert rec.best_known == min(one[rec.name]["values"].values())
    got = bench.compare(merged, "net")
    assert got["graphs"] == 3 and got["worse_than_portfolio"] == 0
    assert sum(int(x) for x in got["wtl"].split("/")) == 3
    assert bench.main([f"s1={base},{steer}"]) == 0
    assert "s1 untrained:" in capsys.readouterr().out
    assert bench.main(["--by-group", f"s1={base},{steer}", f"s2={base},{steer}"]) == 0
    out = capsys.readouterr().out
    reach = sum(not r.limit_unreachable for r in merged)
    assert f"s1 untrained, limit reachable: {reach} runs" in out or reach == 0
    kinds = {r.kind for r in merged}
    assert all(
        f"all groups pooled, untrained, {name}: " in out
        for name, keep in bench.SUBSETS.items()
        if any(keep(r) for r in merged)
    )
    assert "series-parallel: 6 runs" in out or "synthetic" not in kinds


def test_files_of_other_graphs_are_refused(tiny_corpus, tmp_path):
    bench = _bench()
    base = _eval(tiny_corpus, tmp_path / "base.json", ["portfolio", "brkga"])
    recs = json.loads(base.read_text())[:2]
    short = tmp_path / "short.json"
    short.write_text(json.dumps(recs))
    with pytest.raises(SystemExit, match="other graphs"):
        bench.merge([str(base), str(short)])
