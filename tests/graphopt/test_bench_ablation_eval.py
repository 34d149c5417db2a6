"""bench/graphopt_ablation.py --merge on `timerl graphopt eval --out` records (peak memory):
the baselines of a seed and a weights file evaluated separately give the ablation's tables,
with eval's values as they are."""

import json

import pytest
from bench_helpers import load_bench

from timerl.cli import main
from timerl.graphopt.policy import PolicyWeights


def _bench():
    return load_bench("graphopt_ablation")


def _eval(corpus, out, methods, seed, weights=None):
    argv = ["graphopt", "eval", "--corpus", str(corpus), "--split", "train", "--budget", "30"]
    argv += ["--seed", str(seed), "--no-progress", "--out", str(out), "--methods", *methods]
    if weights is not None:
        argv += ["--weights", str(weights)]
    assert main(argv) == 0
    return out


def test_eval_records_merge_per_seed(tiny_corpus, tmp_path, capsys):
    bench = _bench()
    w = PolicyWeights.random(8, 1, seed=3)
    w.meta["uniform_share"] = 0.5
    w_path = tmp_path / "u50.npz"
    w.save(w_path)
    files = []
    for seed in (0, 1):
        base = _eval(tiny_corpus, tmp_path / f"base{seed}.json", ["portfolio", "brkga"], seed)
        mine = _eval(tiny_corpus, tmp_path / f"u{seed}.json", ["learned"], seed, w_path)
        files += [f"{mine}@{seed}:learned=u50", f"{base}@{seed}"]
    records = bench.merge(files, 30)
    assert {r["seed"] for r in records} == {0, 1}
    for r in records:
        base = {x["name"]: x for x in json.loads((tmp_path / f"base{r['seed']}.json").read_text())}
        mine = {x["name"]: x for x in json.loads((tmp_path / f"u{r['seed']}.json").read_text())}
        assert r["portfolio"] == base[r["name"]]["values"]["portfolio"]
        assert r["values"]["30"] == {
            "uniform": base[r["name"]]["values"]["brkga"],
            "u50": mine[r["name"]]["values"]["learned"],
        }
    capsys.readouterr()
    assert bench.main(["--budgets", "30", "--merge", *files]) == 0
    text = capsys.readouterr().out
    assert "seeds [0, 1], 4 files" in text
    row = next(line for line in text.splitlines() if line.startswith("| u50 |"))
    assert row.rstrip("|").split("|")[-1].strip() == "0"  # never worse than the portfolio
    # --kind keeps the graphs of one kind (the tiny corpus has synthetic graphs only)
    assert bench.main(["--budgets", "30", "--kind", "synthetic", "--merge", *files]) == 0
    assert row in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no graphs of kind 'program'"):
        bench.main(["--budgets", "30", "--kind", "program", "--merge", *files])


def test_eval_records_need_one_budget_and_the_portfolio(tiny_corpus, tmp_path):
    bench = _bench()
    only = _eval(tiny_corpus, tmp_path / "b.json", ["brkga"], 0)
    with pytest.raises(SystemExit, match="exactly one of --budgets"):
        bench.main(["--budgets", "30", "40", "--merge", str(only)])
    with pytest.raises(SystemExit, match="portfolio"):
        bench.main(["--budgets", "30", "--merge", str(only)])
