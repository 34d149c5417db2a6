"""Your own PyTorch model into graphopt: ``from_torch``, ``timerl graphopt import``, and the
peak ``optimize`` reports, checked against an evaluator written from the graph-file definition
(DESIGN.md section 6) alone."""

from __future__ import annotations

import heapq
import json
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

from timerl.cli import main  # noqa: E402
from timerl.errors import GraphError  # noqa: E402
from timerl.graphopt import from_torch  # noqa: E402

OBS, HIDDEN, OUT, BATCH = 16, 64, 4, 8


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(OBS, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT)
    )


PARAM_BYTES = 4 * (OBS * HIDDEN + HIDDEN + HIDDEN * OUT + OUT)


def _import(training: bool, optimizer: str | None = "adam"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_torch(mlp(), torch.randn(BATCH, OBS), training=training, optimizer=optimizer)


# --- an independent evaluator of the graph file ---------------------------------------------
def definition_peak(doc: dict, order: list[str]) -> int:
    """Peak memory of ``order`` exactly as DESIGN.md section 6 defines it, from the JSON:
    running a node allocates its output (a view allocates nothing and keeps its base alive);
    a buffer is freed right after the last consumer of it and of all its views has run (a
    non-output buffer with no consumer right after its own step); outputs are kept to the
    end; the peak is the largest sum of resident bytes while any node runs."""
    nodes = {n["id"]: n for n in doc["nodes"]}

    def base(v: str) -> str:
        while nodes[v].get("alias_of") is not None:
            v = nodes[v]["alias_of"]
        return v

    step = {v: k for k, v in enumerate(order)}
    last_use: dict[str, int] = {}  # buffer -> step after which it is freed
    for v, node in nodes.items():
        if node.get("alias_of") is None:
            last_use[v] = step[v]
    for src, dst in doc["edges"]:
        b = base(src)
        last_use[b] = max(last_use[b], step[dst])
    for v, node in nodes.items():
        if node.get("output"):
            last_use[base(v)] = len(order)
    peak = 0
    for k in range(len(order)):
        resident = sum(nodes[b]["bytes"] for b, end in last_use.items() if step[b] <= k <= end)
        peak = max(peak, resident)
    return peak


def file_order(doc: dict) -> list[str]:
    """A topological order that prefers the file's order: the graph's program order."""
    ids = [n["id"] for n in doc["nodes"]]
    pos = {v: k for k, v in enumerate(ids)}
    preds = {v: set() for v in ids}
    succs = {v: [] for v in ids}
    for src, dst in doc["edges"]:
        if src not in preds[dst]:
            preds[dst].add(src)
            succs[src].append(dst)
    left = {v: len(preds[v]) for v in ids}
    heap = [pos[v] for v in ids if not left[v]]
    heapq.heapify(heap)
    order = []
    while heap:
        v = ids[heapq.heappop(heap)]
        order.append(v)
        for w in succs[v]:
            left[w] -= 1
            if not left[w]:
                heapq.heappush(heap, pos[w])
    return order


# --- from_torch ---------------------------------------------------------------------------
def test_inference_graph_of_an_mlp():
    g = _import(training=False)
    doc = g.to_json()
    assert doc["param_bytes"] == PARAM_BYTES
    assert "optimizer_state_bytes" not in doc
    ops = [n["op"] for n in doc["nodes"]]
    assert ops[0] == "input" and ops.count("addmm") == 2 and "tanh" in ops
    sizes = {n["op"]: n["bytes"] for n in doc["nodes"]}
    assert sizes["input"] == BATCH * OBS * 4 and sizes["tanh"] == BATCH * HIDDEN * 4
    outputs = [n for n in doc["nodes"] if n.get("output")]
    assert [n["bytes"] for n in outputs] == [BATCH * OUT * 4]


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_training_graph_ends_with_an_optimizer_step_per_parameter(optimizer):
    g = _import(training=True, optimizer=optimizer)
    doc = g.to_json()
    assert doc["param_bytes"] == PARAM_BYTES and doc["optimizer"] == optimizer
    assert doc["optimizer_state_bytes"] == (2 * PARAM_BYTES if optimizer == "adam" else 0)
    last = "addcdiv_" if optimizer == "adam" else "add_"
    updates = [n for n in doc["nodes"] if n["op"] == last]
    assert len(updates) == 4 and all(n.get("output") and n["bytes"] == 0 for n in updates)
    # the gradients feed the updates and are no longer kept to the end: only the loss is
    plain = _import(training=True, optimizer=None).to_json()
    grads = {n["id"] for n in plain["nodes"] if n.get("output") and n["bytes"] > 4}
    assert len(grads) >= 3
    kept = {n["id"] for n in doc["nodes"] if n.get("output") and n["op"] != last}
    assert [n["op"] for n in doc["nodes"] if n["id"] in kept] == ["mean"]
    first_step = {dst for src, dst in doc["edges"] if src in grads}
    assert len(first_step) == 4  # one update (or Adam's moments) per parameter
    if optimizer == "adam":  # Adam's temporaries: the square root and the quotient
        temps = sorted(n["bytes"] for n in doc["nodes"] if n["op"] in ("sqrt", "div"))
        params = sorted([OBS * HIDDEN * 4, HIDDEN * 4, HIDDEN * OUT * 4, OUT * 4] * 2)
        assert temps == params


def test_the_model_is_left_as_it_was():
    model = mlp().train()
    before = [p.detach().clone() for p in model.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from_torch(model, torch.randn(BATCH, OBS), training=True)
        from_torch(model, (torch.randn(BATCH, OBS),))
    assert model.training
    after = list(model.parameters())
    assert all(p.requires_grad and p.grad is None for p in after)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize(
    ("model", "inputs", "why"),
    [
        ("not a module", torch.zeros(1), "must be a torch.nn.Module"),
        (None, (), "example_inputs must be a tensor or a non-empty tuple"),
        (None, torch.zeros(2, 3), "inference export failed"),  # wrong input width
    ],
)
def test_bad_arguments_are_named(model, inputs, why):
    with pytest.raises(GraphError, match=why):
        from_torch(mlp() if model is None else model, inputs)
    with pytest.raises(GraphError, match="unknown optimizer 'rmsprop'"):
        from_torch(mlp(), torch.zeros(2, OBS), training=True, optimizer="rmsprop")


def test_importing_the_importer_loads_no_torch():
    code = (
        "import sys, timerl.graphopt, timerl.graphopt.torch_import; "
        "print('torch' in sys.modules, callable(timerl.graphopt.from_torch))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"], out.stderr


# --- the command line, and the peak against the definition ---------------------------------
MODELS = f"""
import torch


def make_mlp():
    return torch.nn.Sequential(
        torch.nn.Linear({OBS}, {HIDDEN}), torch.nn.Tanh(), torch.nn.Linear({HIDDEN}, {OUT})
    )


def with_inputs():
    return make_mlp(), (torch.randn({BATCH}, {OBS}),)
"""


@pytest.fixture
def models(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("training", [False, True])
def test_import_then_optimize_reports_the_peak_of_the_definition_in_mib(models, capsys, training):
    argv = ["graphopt", "import", "my_models:make_mlp", "--input-shape", f"{BATCH},{OBS}"]
    argv += ["--out", "g.json"] + (["--training"] if training else [])
    assert main(argv) == 0
    said = capsys.readouterr().out
    doc = json.loads((models / "g.json").read_text())
    program_peak = definition_peak(doc, file_order(doc))
    assert f"program-order peak {program_peak / 2**20:.4g} MiB" in said
    assert f"parameters ({PARAM_BYTES / 2**20:.4g} MiB)" in said

    assert main(["graphopt", "optimize", "g.json", "--budget", "300", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert sorted(result["order"]) == sorted(n["id"] for n in doc["nodes"])
    assert result["objective"] == definition_peak(doc, result["order"])
    assert result["program_order_value"] == program_peak
    assert result["unit"] == "bytes" and result["param_bytes"] == PARAM_BYTES

    assert main(["graphopt", "optimize", "g.json", "--budget", "300"]) == 0
    summary = capsys.readouterr().out
    peak = definition_peak(doc, result["order"])
    assert f"peak memory {peak / 2**20:.4g} MiB ({peak:,} bytes)" in summary
    assert f"program order {program_peak / 2**20:.4g} MiB" in summary
    assert "are not included" in summary and "parameters" in summary
    assert ("optimizer state" in summary) == training


def test_import_takes_the_factorys_own_inputs(models, capsys):
    assert main(["graphopt", "import", "my_models:with_inputs", "--out", "inf.json"]) == 0
    doc = json.loads((models / "inf.json").read_text())
    assert doc["name"] == "with_inputs" and doc["nodes"][0]["bytes"] == BATCH * OBS * 4


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["my_models:make_mlp"], "give their shapes with --input-shape"),
        (["my_models"], "expected module:factory"),
        (["no_such_module:f"], "cannot import module 'no_such_module'"),
        (["my_models:nothing", "--input-shape", "2,3"], "has no function or class 'nothing'"),
    ],
)
def test_import_errors_say_what_to_give(models, capsys, argv, why):
    assert main(["graphopt", "import", *argv]) == 2
    assert why in capsys.readouterr().err


def test_definition_peak_of_a_hand_made_graph():
    """The evaluator itself, on a graph small enough to work out by hand: a (4 bytes) feeds
    a view v and b (8); v and b feed c (2, the output). Order a, b, v, c: a lives until c
    reads its view; the peak is while c runs: 4 + 8 + 2."""
    doc = {
        "nodes": [
            {"id": "a", "op": "x", "bytes": 4, "cost": 0},
            {"id": "b", "op": "x", "bytes": 8, "cost": 0},
            {"id": "v", "op": "view", "bytes": 4, "cost": 0, "alias_of": "a"},
            {"id": "c", "op": "x", "bytes": 2, "cost": 0, "output": True},
        ],
        "edges": [["a", "v"], ["a", "b"], ["v", "c"], ["b", "c"]],
    }
    assert definition_peak(doc, ["a", "b", "v", "c"]) == 14
    doc["nodes"][3]["bytes"] = 0  # then the peak is while b runs, with a alive
    assert definition_peak(doc, ["a", "b", "v", "c"]) == 12


def test_the_documented_example_prints_what_the_docs_show(monkeypatch, capsys, tmp_path):
    """docs/graphopt.md's "Your own model" quotes these commands' output on
    examples/my_model.py: the figures there are the ones the code gives."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    docs = (root / "docs" / "graphopt.md").read_text()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(root / "examples"))
    assert (
        main(["graphopt", "import", "my_model:mlp", "--training", "--out", "mlp-train.json"]) == 0
    )
    assert main(["graphopt", "optimize", "mlp-train.json"]) == 0
    for line in capsys.readouterr().out.splitlines():
        line = line.split(" in ")[0] if line.startswith("mlp: peak") else line
        assert line in docs, line
