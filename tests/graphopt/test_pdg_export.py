"""Translating timerl programs' loop bodies into graphopt graphs (``timerl.schedule.to_graph``:
the corpus's ``timerl`` family and the compiler's block model)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import timerl as tl
from timerl.graphopt.baselines import best_of_portfolio, portfolio_solutions
from timerl.graphopt.brkga import brkga
from timerl.graphopt.corpus import build_corpus, check_graph, load_graph, load_index
from timerl.graphopt.corpus.programs import timerl_specs
from timerl.graphopt.corpus.split import FAMILY_SPLIT
from timerl.graphopt.decoders import Problem
from timerl.graphopt.graph import Graph
from timerl.graphopt.perfmodel import PeakMemory, peak_memory_reference, validate_order
from timerl.rl.graph_policy.corpus_export import compile_algorithm, export_program, program_graphs
from timerl.schedule.to_graph import REFERENCE_FLOPS, loop_blocks
from timerl.symbolic import Const

T = 6


@pytest.fixture(scope="module")
def small():
    """A loop over t: a (4, 3) recurrence times a (3, 5) weight, a view, an accumulator that
    reads its previous timestep, two sinks. Returns (program, its one graph)."""
    ctx = tl.Context(("t",))
    (t,) = ctx.dims
    with ctx:
        w = tl.from_numpy(np.ones((3, 5), np.float32))
        x = tl.RecurrentTensor.placeholder((4, 3), "float32", (t,), name="x")
        x[0] = tl.zeros((4, 3))
        x[t + 1] = (x[t] * 0.5 + 1.0).tanh()
        y = (x @ w).named("y")
        z = y.reshape((20,)).named("z")
        tl.sink((z * 2.0).sum().named("s"), lambda v, p: None)
        acc = tl.RecurrentTensor.placeholder((4, 5), "float32", (t,), name="acc")
        acc[t.eq(0)] = y
        acc[True] = acc[t - 1] * 0.9 + y
        tl.sink(acc.sum(), lambda v, p: None)
    prog = ctx.compile(bounds={"T": T})
    graphs = program_graphs(prog, "small")
    assert len(graphs) == 1
    return prog, graphs[0]


def _node(graph: Graph, label: str):
    hits = [nd for nd in graph.nodes if nd.id.split(":", 1)[1] == label]
    assert len(hits) == 1, (label, [nd.id for nd in graph.nodes])
    return hits[0]


def _preds(graph: Graph, node_id: str) -> set[str]:
    return {graph.nodes[p].id for p in graph.preds[graph.index[node_id]]}


def test_graph_round_trips_through_json_and_is_a_dag(small):
    _, g = small
    data = g.to_json()
    check_graph(data)  # ids unique, edges forward in file order, aliases are predecessors
    again = Graph.from_json(json.loads(json.dumps(data)))
    assert again.to_json() == data
    assert again.program_order == list(range(g.n))  # file order is already topological


def test_bytes_are_numel_times_itemsize_of_each_op(small):
    prog, g = small
    (block,) = [b for b in loop_blocks(prog.schedule.body) if len(b.ops) >= 8]
    ops = iter(block.ops)
    checked = 0
    for node in g.nodes:
        if node.op == "input":
            continue
        op = next(ops)
        assert node.op == op.prim
        if op.prim == "udf":
            continue  # sinks: a bool scalar each
        assert all(isinstance(s, Const) for s in op.shape)
        numel = math.prod(s.value for s in op.shape)
        assert node.bytes == numel * np.dtype(op.dtype).itemsize, node.id
        checked += 1
    assert checked >= 10
    assert next(ops, None) is None
    assert _node(g, "y").bytes == 4 * 5 * 4
    assert _node(g, "x").bytes == 4 * 3 * 4


def test_matmul_cost_is_its_flops_at_the_reference_rate(small):
    _, g = small
    y = _node(g, "y")
    assert y.op == "matmul"
    assert y.cost == pytest.approx(2 * 4 * 3 * 5 / REFERENCE_FLOPS, rel=1e-12)
    s = _node(g, "s")  # a reduction costs its input's element count
    assert s.cost == pytest.approx(20 / REFERENCE_FLOPS, rel=1e-12)


def test_outside_reads_become_input_nodes(small):
    _, g = small
    y = _node(g, "y")
    (w,) = [p for p in _preds(g, y.id) if ":in:" in p]
    w_node = g.nodes[g.index[w]]
    assert w_node.op == "input" and w_node.cost == 0.0 and w_node.bytes == 3 * 5 * 4


def test_previous_timestep_read_is_an_input_node(small):
    _, g = small
    prev = _node(g, "in:acc")  # acc[t - 1] read by the accumulator's update
    assert prev.op == "input" and prev.bytes == 4 * 5 * 4 and prev.cost == 0.0
    acc = _node(g, "acc")
    assert acc.output  # read at the next point
    assert g.index[prev.id] < g.index[acc.id]
    assert not _preds(g, prev.id)
    # the recurrence's merge reads only outside values: it is a source that moves no data
    x = _node(g, "x")
    assert not _preds(g, x.id) and x.cost == 0.0


def test_view_prim_is_an_alias_of_its_input(small):
    _, g = small
    z = _node(g, "z")
    assert z.op == "reshape" and z.alias_of == _node(g, "y").id and z.cost == 0.0


def test_sinks_stay_in_the_graph_as_ordered_outputs(small):
    _, g = small
    sinks = [nd for nd in g.nodes if nd.op == "udf"]
    assert len(sinks) == 2 and all(nd.output for nd in sinks)
    assert sinks[0].id in _preds(g, sinks[1].id)  # effects keep their relative order


def test_peak_memory_models_agree_on_the_exported_graph(small):
    _, g = small
    order = np.arange(g.n)
    assert PeakMemory(g).peak(order) == peak_memory_reference(g, order.tolist())


# ---------------------------------------------------------------------- an RL program
PPO = {
    "env_id": "CartPole-v1",
    "num_envs": 2,
    "num_steps": 8,
    "hidden": (16, 16),
    "epochs": 2,
    "minibatches": 2,
}


@pytest.fixture(scope="module")
def ppo():
    prog, env = compile_algorithm("ppo", PPO)
    env.close()
    return prog, program_graphs(prog, "ppo")


def test_ppo_graphs_validate(ppo):
    _, graphs = ppo
    assert len(graphs) >= 4
    assert len({g.name for g in graphs}) == len(graphs)
    for g in graphs:
        data = g.to_json()
        check_graph(data)
        assert Graph.from_json(json.loads(json.dumps(data))).to_json() == data
        assert g.n >= 8


def test_env_step_is_kept_with_its_tuple_parts(ppo):
    _, graphs = ppo
    (rollout,) = [g for g in graphs if any(nd.id.endswith("CartPole-v1.step") for nd in g.nodes)]
    step = _node(rollout, "CartPole-v1.step")
    assert step.op == "udf" and step.output
    parts = {p: _node(rollout, f"CartPole-v1.{p}") for p in ("obs", "reward", "done")}
    assert all(nd.alias_of == step.id for nd in parts.values())
    assert parts["obs"].bytes == 2 * 4 * 4 and parts["reward"].bytes == 2 * 4
    assert parts["done"].bytes == 2
    assert step.bytes == sum(nd.bytes for nd in parts.values())


def test_slice_read_input_holds_every_point_of_the_slice(ppo):
    _, graphs = ppo
    hits = [nd for g in graphs for nd in g.nodes if nd.id.endswith(":in:obs")]
    assert hits
    # obs[i, 0:T]: T points of (num_envs, 4) float32
    assert max(nd.bytes for nd in hits) == 8 * 2 * 4 * 4


def test_search_gives_valid_orders_on_the_ppo_update_graph(ppo):
    _, graphs = ppo
    g = max(graphs, key=lambda x: x.n)
    problem = Problem(g)
    pm = PeakMemory(g)
    program = pm.peak(np.array(g.program_order))
    assert program > 0
    pf = best_of_portfolio(problem)
    validate_order(g, pf.solution.order)
    res = brkga(problem, budget=300, seeds=list(portfolio_solutions(problem).values()), seed=0)
    validate_order(g, res.solution.order)
    assert res.value == pm.peak(res.solution.order)
    assert res.value <= pf.value <= program


def test_export_is_deterministic_across_builds():
    (spec,) = timerl_specs(quick=True)
    first = export_program(spec)
    second = export_program(spec)  # built later in the process: every op number differs
    assert len(first) == 1
    assert json.dumps(first) == json.dumps(second)


def test_corpus_builds_the_timerl_family_alone(tmp_path: Path):
    assert FAMILY_SPLIT["timerl"] == "test"
    build_corpus(
        tmp_path, quick=True, progress=False, families=["timerl"], export_program=export_program
    )
    entries = load_index(tmp_path)
    assert len(entries) == len(timerl_specs(quick=True))
    for e in entries:
        assert (e["family"], e["kind"], e["split"]) == ("timerl", "program", "test")
        graph = load_graph(tmp_path, e)
        check_graph(graph)
        assert len(graph["nodes"]) == e["nodes"]


# ---------------------------------------------------------------------- the compiler's form
def _compiler_graphs(prog):
    from timerl.api.program import VALIDATION_SIZE
    from timerl.ir.graph import consumers
    from timerl.schedule.to_graph import block_graph

    bounds = dict(prog.static)
    bounds.update({b: c if c is not None else VALIDATION_SIZE for b, c in prog.dynamic.items()})
    readers = consumers(prog.ops)
    out = []
    for block in loop_blocks(prog.schedule.body):
        if len(block.ops) >= 4:
            g, op_of = block_graph(
                block, bounds, readers, set(prog.keep), strict_reads=True, resident_inputs=True
            )
            out.append((block, g, op_of))
    return out


def test_strict_form_keeps_every_read_of_an_earlier_block_op_after_it(ppo):
    prog, _ = ppo
    checked = 0
    for block, g, op_of in _compiler_graphs(prog):
        node_of = {op.id: nid for nid, op in op_of.items()}
        assert [op.id for op in op_of.values()] == [op.id for op in block.ops]
        pos = {op.id: k for k, op in enumerate(block.ops)}
        for op in block.ops:
            for e in op.inputs:
                if e.src.id in pos and pos[e.src.id] < pos[op.id]:
                    assert node_of[e.src.id] in _preds(g, node_of[op.id]), (op.label, e.src.label)
                    checked += 1
    assert checked > 50


def test_strict_form_charges_outside_values_only_for_slice_reads(ppo):
    prog, graphs = ppo
    strict = [g for _, g, _ in _compiler_graphs(prog)]
    plain = [nd for g in strict for nd in g.nodes if nd.op == "input" and nd.bytes == 0]
    stacked = [nd for g in strict for nd in g.nodes if nd.id.endswith(":in:obs") and nd.bytes]
    assert plain and stacked
    # the slice read obs[i, 0:T] still holds every point, as in the corpus graphs
    corpus_obs = max(nd.bytes for g in graphs for nd in g.nodes if nd.id.endswith(":in:obs"))
    assert max(nd.bytes for nd in stacked) == corpus_obs


def test_strict_form_holds_values_freed_in_the_block_from_its_start(ppo):
    """The update frees rollout values it reads: in the compiler's model those inputs hold
    their bytes from the block's start (every other source waits for them), so an order that
    reaches their last reader early lowers the block's peak."""
    from timerl.schedule.to_graph import _clean

    prog, _ = ppo
    held_seen = 0
    for block, g, _ in _compiler_graphs(prog):
        inside = {op.id for op in block.ops}
        by_label: dict[str, set] = {}
        for op in block.ops:
            for e in op.inputs:
                by_label.setdefault(_clean(e.src.label), set()).add(e.src)
        # labels without op numbers can repeat: only those naming one source are checked
        outside = {k: next(iter(v)) for k, v in by_label.items() if len(v) == 1}
        held = {
            v
            for v, nd in enumerate(g.nodes)
            if nd.op == "input"
            and (src := outside.get(nd.id.split(":in:", 1)[1])) is not None
            and src.id in block.freed
            and src.id not in inside
        }
        for v in held:
            assert g.nodes[v].bytes > 0 and not g.preds[v]
        for v in range(g.n):
            name = g.nodes[v].id.split(":in:", 1)[-1]
            if g.nodes[v].op == "input" and name not in outside:
                continue  # a source behind an ambiguous label: held or not is not known here
            if v not in held and not set(g.preds[v]) - held:  # a source but for held inputs
                assert held <= set(g.preds[v]), g.nodes[v].id
        held_seen += len(held)
    assert held_seen > 0


def test_strict_form_holds_a_merge_of_carried_values_from_the_blocks_start(ppo):
    """A merge reading only values from outside the block (a parameter, an optimiser's moment)
    hands on a buffer live since before the block: its node shares the buffer of an input held
    from the block's start, so an order gains nothing by placing the merge late."""
    prog, _ = ppo
    seen = 0
    for block, g, op_of in _compiler_graphs(prog):
        inside = {op.id for op in block.ops}
        for v, nd in enumerate(g.nodes):
            op = op_of.get(nd.id)
            if op is None or op.prim != "merge" or any(e.src.id in inside for e in op.inputs):
                continue
            base = g.alias[v]
            assert base >= 0 and g.nodes[base].op == "input" and not g.preds[base]
            assert g.nodes[base].bytes == nd.bytes > 0
            # wherever the merge runs, its buffer is live before the block's first op runs
            ops = [u for u, other in enumerate(g.nodes) if other.op != "input"]
            for order in (np.array(g.program_order), best_of_portfolio(Problem(g)).solution.order):
                pos = np.argsort(order)
                assert pos[base] < pos[ops].min()
            seen += 1
    assert seen > 0


def test_prim_categories_follow_the_registry_traits():
    # a prim declared a view or a reduction in the registry is one to the block model too,
    # with no list of names to keep in step (sumsq is a reduction no name list had); what an
    # op costs is the registry's cost model (test_matmul_cost_is_its_flops_at_the_reference_rate)
    from timerl.ir import prims
    from timerl.schedule.to_graph import op_traits

    for name, entry in prims.REGISTRY.items():
        cats = op_traits(name)
        assert ("view" in cats) == entry.traits.view, name
        assert ("reduction" in cats) == entry.traits.reduction, name
        assert ("picks" in cats) == entry.traits.piecewise, name
        assert ("tuple_part" in cats) == entry.traits.tuple_part, name
    assert "reduction" in op_traits("sumsq")
    assert {"tuple_source", "ordered"} <= op_traits("udf")
    assert "tuple_part" in op_traits("tuple_get")
    assert op_traits("not_a_registered_prim") == frozenset()
