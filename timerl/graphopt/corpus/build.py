"""Build the graph corpus: generate and export every graph, split by family, write files.

Layout: ``out_dir/<split>/<family>/<name>.json`` plus ``out_dir/index.json``. Model exports run
in worker processes (they dominate the build time and are independent); synthetic graphs are
generated in-process, and so are the ``timerl`` family's graphs (each of its programs compiles
in about a second and gives one graph per loop body; the caller passes the function that does
it, ``timerl.rl.graph_policy.corpus_export.export_program``, as graphopt reads no PDG itself). The result is a pure
function of the fixed spec lists and seeds, so two builds write identical files.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import timerl.graphopt.corpus.programs as program_family
import timerl.graphopt.corpus.synthetic as synthetic
from timerl.errors import GraphError
from timerl.graphopt.corpus.check import check_graph
from timerl.graphopt.corpus.split import SPLITS, assign_splits, family_split

INDEX_VERSION = 1


@dataclass(frozen=True)
class SyntheticSpec:
    """One synthetic graph: generator family, node count and generator keyword arguments."""

    name: str
    family: str
    n: int
    kwargs: dict = field(default_factory=dict)


# Memory-skew settings cycled over seeds: (log-normal sigma, share of huge buffers).
_SKEWS = ((1.0, 0.0), (1.5, 0.02), (2.5, 0.05))


def synthetic_specs(quick: bool = False) -> list[SyntheticSpec]:
    """The fixed list of synthetic graphs; test families get extra large sizes for test-large."""
    if quick:
        plan = {
            "erdos_renyi": ([60, 150], 1),
            "layered": ([60, 150], 1),
            "sbm": ([100], 1),
            "series_parallel": ([100, 600], 1),
        }
    else:
        small = [50, 100, 200, 400, 700, 1000, 1500, 2000]
        plan = {
            "erdos_renyi": (small, 3),
            "layered": (small, 3),
            "sbm": ([100, 300, 700, 1200, 2000], 2),
            "series_parallel": ([100, 300, 700, 1200, 2000, 4000, 6000, 8000], 2),
        }
    specs = []
    for family, (sizes, seeds) in plan.items():
        for n in sizes:
            for seed in range(seeds):
                skew, huge = _SKEWS[(seed + n) % len(_SKEWS)]
                kwargs: dict[str, Any] = {"seed": seed, "skew": skew, "huge_share": huge}
                if family == "layered":
                    kwargs["width"] = (4, 8, 16)[seed % 3]
                if family == "sbm":
                    kwargs["blocks"] = max(2, n // 150)
                name = f"{family}-n{n}-s{seed}"
                specs.append(SyntheticSpec(name, family, n, kwargs))
    return specs


def _model_lookup(quick: bool) -> dict[str, Any]:
    from timerl.graphopt.corpus.models import model_specs

    return {s.name: s for s in model_specs(quick)}


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence the export warnings that would drown the progress bar."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import transformers

            level = transformers.logging.get_verbosity()
            transformers.logging.set_verbosity_error()
        except ImportError:  # pragma: no cover - transformers is part of the graphopt extra
            transformers = None
        try:
            yield
        finally:
            if transformers is not None:
                transformers.logging.set_verbosity(level)


def export_model(name: str, quick: bool) -> tuple[str, dict | None, str | None, float]:
    """Build and export one model spec by name: ``(name, graph or None, error or None, s)``.

    A top-level function so worker processes can run it; errors are returned, not raised, so a
    failing model is reported by name and the build goes on.
    """
    start = time.perf_counter()
    try:
        import torch

        from timerl.graphopt.corpus.torch_export import graph_from_module

        torch.set_num_threads(1)
        spec = _model_lookup(quick)[name]
        with _quiet():
            module, inputs = spec.build(spec.training)
            graph = graph_from_module(module, inputs, name=name, training=spec.training)
        check_graph(graph)
        return name, graph, None, time.perf_counter() - start
    except Exception as e:  # report every failure with the model's name
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return name, None, msg, time.perf_counter() - start


ProgramExporter = Callable[[program_family.ProgramSpec], list[dict]]


def _export_program(
    spec: program_family.ProgramSpec, exporter: ProgramExporter
) -> tuple[list[dict], str | None]:
    """The graphs of one timerl program spec, or ``([], error)``: reported, not raised, so a
    failing program is listed by name and the build goes on."""
    try:
        graphs = exporter(spec)
        for graph in graphs:
            check_graph(graph)
        return graphs, None
    except Exception as e:  # report every failure with the program's name
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return [], msg


def _progress(enabled: bool) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        TextColumn("[bold]corpus[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        disable=not enabled,
    )


def _clear_old(out_dir: Path) -> None:
    """Remove graph files of an earlier build so the directory matches the new index."""
    for split in SPLITS:
        root = out_dir / split
        if not root.is_dir():
            continue
        for path in sorted(root.glob("*/*.json")):
            path.unlink()
        for sub in sorted(root.iterdir()):
            if sub.is_dir() and not any(sub.iterdir()):
                sub.rmdir()
        if not any(root.iterdir()):
            root.rmdir()


def build_corpus(
    out_dir: Path,
    *,
    quick: bool = False,
    progress: bool = True,
    workers: int | None = None,
    families: Sequence[str] | None = None,
    export_program: ProgramExporter | None = None,
) -> Path:
    """Build the corpus under ``out_dir`` and return the path of its ``index.json``.

    ``quick`` builds a small corpus (a few synthetic graphs, three small models and one timerl
    program graph) for tests and smoke runs. ``workers`` is the number of export processes
    (default: up to 2 for the full corpus, in-process for the quick one). ``families`` builds
    only those families (e.g. ``["timerl"]`` to evaluate one family); with no training family
    among them nothing goes to ``test-large``. Models and programs that fail to export are
    printed with their error, listed under ``failed`` in the index and skipped.
    ``export_program`` turns a spec of the ``timerl`` family into graph dicts
    (``timerl.rl.graph_policy.corpus_export.export_program``); without it that family is left out.
    """
    out_dir = Path(out_dir)
    start = time.perf_counter()
    wanted = set(families) if families is not None else None
    for family in sorted(wanted or ()):
        family_split(family)
    # Model specs import torch: skip them when only synthetic or program families are wanted.
    other = set(synthetic.GENERATORS) | {program_family.FAMILY}
    need_models = wanted is None or bool(wanted - other)
    model_specs = list(_model_lookup(quick).values()) if need_models else []
    synth = synthetic_specs(quick)
    programs = program_family.timerl_specs(quick) if export_program is not None else []
    if wanted is not None and program_family.FAMILY in wanted and export_program is None:
        raise GraphError(
            "the 'timerl' family needs a program exporter: pass "
            "export_program=timerl.rl.graph_policy.corpus_export.export_program"
        )
    if wanted is not None:
        model_specs = [s for s in model_specs if s.family in wanted]
        synth = [s for s in synth if s.family in wanted]
        programs = programs if program_family.FAMILY in wanted else []
    for spec in [*model_specs, *synth]:
        family_split(spec.family)  # fail early on a family without a split
    if programs:
        family_split(program_family.FAMILY)
    names = [s.name for s in model_specs] + [s.name for s in synth] + [s.name for s in programs]
    if len(set(names)) != len(names):
        raise GraphError("corpus specs contain duplicate graph names")
    if workers is None:
        workers = 1 if quick else max(1, min(2, os.cpu_count() or 1))

    graphs: dict[str, dict] = {}
    entries: list[dict] = []
    failed: list[dict] = []
    family_of = {s.name: s.family for s in [*model_specs, *synth]}
    kinds = {s.name: ("training" if s.training else "model") for s in model_specs}
    kinds.update({s.name: "synthetic" for s in synth})
    family_of.update({s.name: program_family.FAMILY for s in programs})
    kinds.update({s.name: program_family.KIND for s in programs})

    def record(name: str, graph: dict | None, error: str | None) -> None:
        if name in graphs:
            raise GraphError(f"corpus graph name {name!r} is produced twice")
        if graph is None:
            failed.append(
                {"name": name, "family": family_of[name], "kind": kinds[name], "error": error}
            )
            bar.console.print(f"[red]failed[/] {name}: {error}")
            return
        graphs[name] = graph
        entries.append(
            {
                "name": name,
                "family": family_of[name],
                "kind": kinds[name],
                "nodes": len(graph["nodes"]),
            }
        )

    with _progress(progress) as bar:
        task = bar.add_task("", total=len(names))
        for spec in synth:
            bar.update(task, description=spec.name)
            gen = synthetic.GENERATORS[spec.family]
            graph = gen(spec.n, name=spec.name, **spec.kwargs)
            check_graph(graph)
            record(spec.name, graph, None)
            bar.advance(task)
        for prog_spec in programs:
            bar.update(task, description=prog_spec.name)
            assert export_program is not None
            program_graphs, error = _export_program(prog_spec, export_program)
            if error is not None:
                record(prog_spec.name, None, error)
            for graph in program_graphs:
                family_of[graph["name"]] = program_family.FAMILY
                kinds[graph["name"]] = program_family.KIND
                record(graph["name"], graph, None)
            bar.advance(task)
        # Slowest exports first so the two workers finish together.
        order = sorted(model_specs, key=lambda s: (not s.training, s.name))
        if workers <= 1 or not order:
            results: Any = (export_model(s.name, quick) for s in order)
            pool = None
        else:
            pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"))
            results = pool.map(export_model, [s.name for s in order], [quick] * len(order))
        try:
            for spec in order:
                bar.update(task, description=spec.name)
                name, graph, error, _ = next(results)
                record(name, graph, error)
                bar.advance(task)
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
        bar.update(task, description="writing")

        assign_splits(entries)
        _clear_old(out_dir)
        entries.sort(key=lambda e: (SPLITS.index(e["split"]), e["family"], e["nodes"], e["name"]))
        for e in entries:
            rel = Path(e["split"]) / e["family"] / f"{e['name']}.json"
            e["path"] = rel.as_posix()
            path = out_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(graphs[e["name"]], separators=(",", ":")))
    failed.sort(key=lambda f: f["name"])
    index = {
        "version": INDEX_VERSION,
        "quick": quick,
        **({"families": sorted(set(families))} if families is not None else {}),
        "graphs": entries,
        "num_failed": len(failed),
        "failed": failed,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    index_path = out_dir / "index.json"
    index_path.write_text(json.dumps(index, indent=1) + "\n")
    if progress:
        bar.console.print(
            f"corpus: {len(entries)} graphs, {len(failed)} failed, "
            f"{time.perf_counter() - start:.0f} s -> {index_path}"
        )
    return index_path


def load_index(corpus_dir: Path) -> list[dict]:
    """The graph entries of a built corpus (``name, family, kind, split, nodes, path``)."""
    path = Path(corpus_dir) / "index.json"
    try:
        data = json.loads(path.read_text())
        return list(data["graphs"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise GraphError(f"corpus index {path}: unreadable ({e})") from e


def load_graph(corpus_dir: Path, entry: dict) -> dict:
    """Read one graph dict of the corpus given its index entry."""
    path = Path(corpus_dir) / entry["path"]
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise GraphError(f"corpus graph {entry.get('name')!r} at {path}: unreadable ({e})") from e
