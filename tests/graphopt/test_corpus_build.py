"""The quick corpus: layout, index, split by family, size split and loaders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from timerl.errors import GraphError  # noqa: E402
from timerl.graphopt.corpus import (  # noqa: E402
    FAMILY_SPLIT,
    SPLITS,
    build_corpus,
    check_graph,
    load_graph,
    load_index,
)
from timerl.graphopt.corpus.build import export_model, synthetic_specs  # noqa: E402
from timerl.graphopt.corpus.models import model_specs  # noqa: E402
from timerl.graphopt.corpus.programs import timerl_specs  # noqa: E402
from timerl.graphopt.corpus.split import assign_splits  # noqa: E402
from timerl.graphopt.corpus.synthetic import GENERATORS  # noqa: E402
from timerl.rl.graph_policy.corpus_export import export_program  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    index = build_corpus(out, quick=True, progress=False, export_program=export_program)
    assert index == out / "index.json"
    return out


def test_index_lists_every_graph_file(corpus: Path) -> None:
    entries = load_index(corpus)
    data = json.loads((corpus / "index.json").read_text())
    assert data["num_failed"] == 0 and data["failed"] == []
    # every quick timerl program contributes its one largest loop body
    expected = (
        len(synthetic_specs(quick=True)) + len(model_specs(quick=True)) + len(timerl_specs(True))
    )
    assert len(entries) == expected
    files = sorted(p.relative_to(corpus).as_posix() for p in corpus.glob("*/*/*.json"))
    assert files == sorted(e["path"] for e in entries)
    for e in entries:
        assert e["path"] == f"{e['split']}/{e['family']}/{e['name']}.json"
        assert e["kind"] in {"synthetic", "model", "training", "program"}
        g = load_graph(corpus, e)
        check_graph(g)
        assert g["name"] == e["name"] and len(g["nodes"]) == e["nodes"]
    assert {e["kind"] for e in entries} == {"synthetic", "model", "training", "program"}


def test_split_by_family_and_size(corpus: Path) -> None:
    entries = load_index(corpus)
    held_out = {"test": "test", "test-large": "test"}  # test-large is the test families' tail
    groups: dict[str, set[str]] = {}
    for e in entries:
        groups.setdefault(e["family"], set()).add(held_out.get(e["split"], e["split"]))
        assert FAMILY_SPLIT[e["family"]] == held_out.get(e["split"], e["split"])
    assert all(len(s) == 1 for s in groups.values()), groups
    largest_train = max(e["nodes"] for e in entries if e["split"] == "train")
    large = [e for e in entries if e["split"] == "test-large"]
    assert large and all(e["nodes"] > largest_train for e in large)
    assert {e["split"] for e in entries} == set(SPLITS)


def test_full_spec_lists_cover_all_splits() -> None:
    entries = [{"family": s.family, "nodes": s.n} for s in synthetic_specs()]
    entries += [{"family": s.family, "nodes": 0} for s in model_specs()]
    entries += [{"family": "timerl", "nodes": 0} for _ in timerl_specs()]
    assign_splits(entries)
    assert {e["split"] for e in entries} == set(SPLITS)
    assert {e["family"] for e in entries} == set(FAMILY_SPLIT)


def test_rebuild_is_identical(corpus: Path) -> None:
    # Regenerate every synthetic graph and re-export one model; the files must not change.
    entries = {e["name"]: e for e in load_index(corpus)}
    for spec in synthetic_specs(quick=True):
        graph = GENERATORS[spec.family](spec.n, name=spec.name, **spec.kwargs)
        assert load_graph(corpus, entries[spec.name]) == graph, spec.name
    name, graph, error, _ = export_model("mlp-l4-train", quick=True)
    assert error is None
    assert (corpus / entries[name]["path"]).read_text() == json.dumps(graph, separators=(",", ":"))


def test_unreadable_corpus_is_a_graph_error(tmp_path: Path) -> None:
    with pytest.raises(GraphError, match="index"):
        load_index(tmp_path)
    with pytest.raises(GraphError, match="ghost"):
        load_graph(tmp_path, {"name": "ghost", "path": "train/x/ghost.json"})


def test_summary_counts_every_graph(corpus: Path) -> None:
    from timerl.graphopt.corpus.summary import summary_markdown, summary_rows

    entries = load_index(corpus)
    rows = summary_rows(entries)
    assert sum(r["count"] for r in rows) == len(entries)
    assert all(r["min"] <= r["max"] for r in rows)
    assert f"**{len(entries)}**" in summary_markdown(entries)
