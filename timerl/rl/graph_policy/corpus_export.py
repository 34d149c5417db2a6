"""Timerl's own programs as graphopt graphs: the ``timerl`` family of graphopt's corpus.

The block translator is ``timerl.schedule.to_graph`` (shared with the compiler's op order),
which ``timerl.api.graphs`` applies to a compiled program's blocks; this module compiles the
training programs, so it sits above both the API and the RL layer. graphopt never imports
it: ``timerl graphopt corpus`` receives ``export_program`` as an argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from timerl.api.functional import sink
from timerl.api.graphs import program_graphs
from timerl.api.program import Program
from timerl.api.tensor import stack
from timerl.rl.train.driver import build


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
