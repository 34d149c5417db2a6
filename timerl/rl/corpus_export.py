"""Timerl's own programs as graphopt graphs: the ``timerl`` family of graphopt's corpus.

The block translator is ``timerl.schedule.to_graph`` (shared with the compiler's op order);
this module compiles the training programs and cuts their schedules into blocks, so it sits
above both the API and the RL layer. graphopt never imports it: ``timerl graphopt corpus``
receives ``export_program`` as an argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from timerl.api.functional import sink
from timerl.api.program import Program
from timerl.api.tensor import stack
from timerl.compiler.spec import VALIDATION_SIZE
from timerl.graphopt.graph import Graph
from timerl.ir.graph import consumers
from timerl.rl.train import build
from timerl.schedule.to_graph import MIN_OPS, block_graph, loop_blocks
from timerl.symbolic import Bound


def program_graphs(prog: Program, name: str, *, min_ops: int = MIN_OPS) -> list[Graph]:
    """One graph per block of ``prog``'s loop bodies with at least ``min_ops`` ops.

    Graphs are named ``{name}-{k}-{dims}``: ``k`` numbers the exported blocks in schedule order,
    ``dims`` lists the enclosing loops (``i_t``: the ``t`` loop inside the ``i`` loop).
    """
    bounds: dict[Bound, int] = dict(prog.static)
    for bound, cap in prog.dynamic.items():
        bounds[bound] = cap if cap is not None else VALIDATION_SIZE
    readers = consumers(prog.ops)
    keep = set(prog.keep)
    graphs = []
    for block in loop_blocks(prog.schedule.body):
        if len(block.ops) < min_ops:
            continue
        dims = "_".join(d.name for d in block.dims)
        label = f"{name}-{len(graphs)}-{dims}"
        graphs.append(block_graph(block, bounds, readers, keep, label)[0])
    return graphs


def compile_algorithm(
    algo: str, config: Mapping[str, Any], iterations: int = 2
) -> tuple[Program, Any]:
    """Build and compile an algorithm program as ``timerl train`` runs it: ``(program, env)``.

    The training driver adds a sink of the per-iteration metrics before compiling; so does this
    (with a callback that drops the values), so the exported loop bodies are the ones training
    executes. Two iterations are enough: the loop bodies do not depend on the iteration count.
    The caller closes the environment.
    """
    program = build(algo, dict(config))
    with program.ctx:
        row = stack([program.metrics[k].float() for k in program.metrics])
        sink(row, lambda value, point: None)
    bounds = {"I": iterations, **program.bounds}
    try:
        prog = program.ctx.compile(bounds=bounds, backend="numpy", seed=program.config.seed)
    except BaseException:
        program.env.close()
        raise
    return prog, program.env


def export_program(spec: Any) -> list[dict[str, Any]]:
    """The graph dicts of one program spec of the corpus, named ``{spec.name}-{k}-{dims}``.

    ``build_corpus`` takes this function as its ``export_program`` argument: graphopt itself
    reads no PDG."""
    prog, env = compile_algorithm(spec.algo, spec.config)
    try:
        graphs = program_graphs(prog, spec.name)
    finally:
        env.close()
    if spec.largest_only and graphs:
        graphs = [max(graphs, key=lambda g: g.n)]
    return [g.to_json() for g in graphs]
