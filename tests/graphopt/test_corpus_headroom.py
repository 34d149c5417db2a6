"""The headroom corpus: structured generators, training graphs, REGAL's filter and the split."""

import json

import pytest

from timerl.errors import GraphError
from timerl.graphopt.corpus import headroom, structured
from timerl.graphopt.corpus.check import check_graph
from timerl.graphopt.graph import Graph


@pytest.mark.parametrize("family", sorted(structured.GENERATORS))
def test_generators_give_valid_seeded_graphs_of_about_n_nodes(family):
    gen = structured.GENERATORS[family]
    a = gen(400, 3)
    check_graph(a)  # raises unless well formed and in program order
    assert 250 <= len(a["nodes"]) <= 700
    assert json.dumps(a) == json.dumps(gen(400, 3))
    assert json.dumps(a) != json.dumps(gen(400, 4))
    g = Graph.from_json(a)
    assert g.is_output.any()
    # heterogeneous sizes: what makes the order matter
    assert len(set(g.nbytes.tolist())) > g.n // 8


def test_randwire_uses_each_generator():
    edges = {
        kind: structured.wiring(kind, 32, seed=0).number_of_edges() for kind in ("ws", "ba", "er")
    }
    assert edges["ws"] == 64  # k = 4: two edges per node
    assert edges["ba"] == (32 - 5) * 5  # m = 5
    with pytest.raises(GraphError, match="unknown wiring"):
        structured.wiring("xx", 8, 0)


def test_training_graph_has_backward_and_updates():
    fwd = structured.GENERATORS["moe"](200, 0)
    tr = structured.with_backward(fwd, seed=0)
    check_graph(tr)
    ops = [nd["op"] for nd in tr["nodes"]]
    assert ops.count("loss") == 1
    weighted = sum(nd["op"] in structured.WEIGHTED for nd in fwd["nodes"])
    assert ops.count("update") == ops.count("wgrad") == weighted
    # updates are outputs; the forward's outputs are no longer the graph's only outputs
    outs = {nd["op"] for nd in tr["nodes"] if nd.get("output")}
    assert "update" in outs
    # the forward part comes first, unchanged
    n = len(fwd["nodes"])
    assert [nd["bytes"] for nd in tr["nodes"][:n]] == [nd["bytes"] for nd in fwd["nodes"]]


def test_backward_reads_only_what_each_op_saves():
    assert structured._saved("matmul", [1, 2], 1, 9) == []
    assert structured._saved("relu", [1], 1, 9) == [9]
    assert structured._saved("bmm", [1, 2], 1, 9) == [2]
    assert structured._saved("add", [1, 2], 1, 9) == []
    assert structured._saved("norm", [1], 1, 9) == [1]


def _record(short, long, **others):
    return {"brkga_short": short, "brkga_long": long, "others": others}


def test_filter_keeps_a_graph_where_the_budget_or_the_best_order_matters():
    assert headroom.kept(_record(100.0, 97.9))  # 50k is 2.1% lower
    assert not headroom.kept(_record(100.0, 98.5))
    assert headroom.kept(_record(100.0, 100.0, mixed=94.9))  # best known 5.1% lower
    assert not headroom.kept(_record(100.0, 99.0, mixed=95.5))
    assert not headroom.kept({"brkga_short": 0.0, "brkga_long": 0.0})


def test_split_holds_whole_families_out_and_large_test_graphs_apart():
    entries = [
        {"family": "nas", "nodes": 1000},
        {"family": "randwire_ws", "nodes": 2000},
        {"family": "randwire_ba", "nodes": 5000},
        {"family": "chains", "nodes": 1500},
        {"family": "chains", "nodes": 2500},
    ]
    headroom.assign(entries)
    assert [e["split"] for e in entries] == ["train", "train", "val", "test", "test-large"]
    splits = {headroom.HEADROOM_SPLIT[f] for f in headroom.HEADROOM_SPLIT}
    assert splits == {"train", "val", "test"}


def test_candidates_are_named_once_and_assigned_a_split():
    cands = headroom.candidates(with_torch=False)
    assert len({c.name for c in cands}) == len(cands)
    fams = {c.family for c in cands}
    assert fams == set(structured.GENERATORS)


def test_build_applies_the_filter_records(tmp_path):
    cands = [c for c in headroom.candidates(quick=True) if c.family in ("chains", "branches")]
    records = []
    for i, c in enumerate(cands):
        n = len(c.make()["nodes"])
        long = 90.0 if i % 2 == 0 else 100.0  # every other one kept
        records.append({"name": c.name, "nodes": n, **_record(100.0, long)})
    path = tmp_path / "records.json"
    headroom.write_records(records, path)
    index = headroom.build_headroom_corpus(
        tmp_path / "c", records=path, families=["chains", "branches"], quick=True, progress=print
    )
    got = json.loads(index.read_text())["graphs"]
    assert sorted(e["name"] for e in got) == sorted(c.name for c in cands[::2])
    for e in got:
        assert e["kept"] and (tmp_path / "c" / e["path"]).is_file()
    # the graphs measured so far, kept or not, each marked
    headroom.write_records(records[:3], path)
    index = headroom.build_headroom_corpus(
        tmp_path / "m",
        records=path,
        families=["chains", "branches"],
        unfiltered=True,
        measured_only=True,
        quick=True,
        progress=print,
    )
    got = {e["name"]: e["kept"] for e in json.loads(index.read_text())["graphs"]}
    assert got == {c.name: i % 2 == 0 for i, c in enumerate(cands[:3])}
    headroom.write_records(records, path)
    # a record whose node count no longer matches is refused by name
    records[0]["nodes"] += 1
    headroom.write_records(records, path)
    with pytest.raises(GraphError, match="measure again"):
        headroom.build_headroom_corpus(
            tmp_path / "d",
            records=path,
            families=["chains", "branches"],
            quick=True,
            progress=print,
        )


def test_the_cli_builds_the_headroom_corpus_and_names_an_unknown_family(tmp_path, capsys):
    from timerl.cli import main

    out = tmp_path / "h"
    argv = ["graphopt", "corpus", "--headroom", "--quick", "--unfiltered", "--out", str(out)]
    assert main([*argv, "--families", "chains", "--workers", "1"]) == 0
    got = json.loads((out / "index.json").read_text())["graphs"]
    assert got and {e["family"] for e in got} == {"chains"}
    assert all((out / e["path"]).is_file() for e in got)
    assert main([*argv, "--families", "chains,ladders"]) == 2
    assert "unknown family ladders" in capsys.readouterr().err
    assert main(["graphopt", "corpus", "--unfiltered", "--out", str(tmp_path / "x")]) == 2
    assert "apply to --headroom only" in capsys.readouterr().err
