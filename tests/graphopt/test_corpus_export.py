"""Importer from PyTorch: structure, bytes, aliases and FLOP costs of exported graphs."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from timerl.errors import GraphError  # noqa: E402
from timerl.graphopt.corpus import check_graph  # noqa: E402
from timerl.graphopt.corpus.torch_export import (  # noqa: E402
    FLOPS_PER_S,
    OP_OVERHEAD_S,
    graph_from_module,
)


def _export(model: nn.Module, inputs: tuple, training: bool = False) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return graph_from_module(model, inputs, name="tiny", training=training)


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc(x))
        return self.out(h.reshape(x.shape[0], 2, 4).transpose(1, 2).reshape(x.shape[0], 8))


@pytest.fixture(scope="module")
def tiny() -> tuple[dict, dict]:
    x = torch.randn(3, 4)
    return _export(_Tiny(), (x,)), _export(_Tiny(), (x,), training=True)


def _by_id(g: dict) -> dict[str, dict]:
    return {n["id"]: n for n in g["nodes"]}


def test_graphs_are_dags_in_program_order(tiny: tuple[dict, dict]) -> None:
    for g in tiny:
        check_graph(g)  # known ids, forward edges, aliases of predecessors, an output
        pos = {n["id"]: i for i, n in enumerate(g["nodes"])}
        assert all(pos[s] < pos[d] for s, d in g["edges"])
        assert g["name"] == "tiny"


def test_bytes_match_traced_shapes(tiny: tuple[dict, dict]) -> None:
    g, _ = tiny
    nodes = _by_id(g)
    fc = [n for n in g["nodes"] if n["op"] == "addmm"]
    assert fc[0]["bytes"] == 3 * 8 * 4  # Linear(4, 8) on a batch of 3, float32
    assert fc[-1]["bytes"] == 3 * 2 * 4 and fc[-1].get("output")
    inputs = [n for n in g["nodes"] if n["op"] == "input"]
    assert [n["bytes"] for n in inputs] == [3 * 4 * 4]
    # Weights are folded into a constant: resident under every order on one device.
    assert g["param_bytes"] == (8 * 4 + 8 + 2 * 8 + 2) * 4
    assert not any(n["op"] == "param" or "weight" in n["id"] for n in g["nodes"])
    assert all(nodes[s]["cost"] >= 0 for s in nodes)


def test_views_alias_a_predecessor(tiny: tuple[dict, dict]) -> None:
    for g in tiny:
        preds: dict[str, set[str]] = {}
        for s, d in g["edges"]:
            preds.setdefault(d, set()).add(s)
        views = [n for n in g["nodes"] if "alias_of" in n]
        assert views, "permute/view/transpose should be views"
        for n in views:
            assert n["alias_of"] in preds[n["id"]]
            assert n["op"].split(".")[0] in {
                "view", "_unsafe_view", "permute", "transpose", "t", "expand", "alias",
                "detach", "slice", "select", "squeeze", "unsqueeze", "as_strided",
            }  # fmt: skip
        compute = {n["op"] for n in g["nodes"] if "alias_of" not in n}
        assert not compute & {"view", "permute", "t", "transpose", "expand"}


def test_matmul_cost_is_two_mnk_flops() -> None:
    m, k, n = 16, 32, 24

    class MM(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a @ b

    g = _export(MM(), (torch.randn(m, k), torch.randn(k, n)))
    (mm,) = [x for x in g["nodes"] if x["op"] == "mm"]
    assert mm["cost"] == pytest.approx(2 * m * n * k / FLOPS_PER_S + OP_OVERHEAD_S)
    assert mm["bytes"] == m * n * 4 and mm.get("output")


def test_training_graph_has_backward(tiny: tuple[dict, dict]) -> None:
    inf, train = tiny
    assert len(train["nodes"]) > len(inf["nodes"])
    ops = {n["op"].split(".")[0] for n in train["nodes"]}
    assert "threshold_backward" in ops or "le" in ops  # ReLU's backward, before/after decomposition
    assert sum(1 for n in train["nodes"] if n["op"] == "mm") >= 2  # weight and input gradients
    # Outputs: the loss plus one gradient per parameter.
    assert sum(1 for n in train["nodes"] if n.get("output")) == 1 + 4


def test_conv_training_with_batchnorm_and_shared_weights() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.head = nn.Linear(4, 4)
            self.tail = nn.Linear(4, 4)
            self.tail.weight = self.head.weight  # shared parameter

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.bn(self.conv(x)).mean(dim=(2, 3))
            return self.tail(self.head(h))

    x = torch.randn(2, 3, 8, 8)
    g = _export(Net(), (x,), training=True)
    check_graph(g)
    ops = {n["op"] for n in g["nodes"]}
    assert "convolution_backward" in ops
    conv = [n for n in g["nodes"] if n["op"] == "convolution"]
    assert conv and conv[0]["cost"] > OP_OVERHEAD_S  # FLOPs were counted


def test_export_failure_names_the_model() -> None:
    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # data-dependent control flow cannot be exported
                return x * 2
            return x

    with pytest.raises(GraphError, match="badnet"):
        graph_from_module(Bad(), (torch.randn(3),), name="badnet")
