"""The headroom corpus: candidate graphs of the families where ordering has room, REGAL's
filter, and the split by family and size.

Candidates are the structured generators' graphs (``structured.py``: forward graphs and their
training graphs) and graphs exported from PyTorch (``families.py``'s networks and the
``transformers`` models of ``models.py``; training graphs with an Adam update per gradient).
REGAL's filter keeps a graph where uniform BRKGA at 50,000 evaluations is at least 2% below
uniform BRKGA at 5,000, or the best order known (that BRKGA, the peak-directed local search
and a BRKGA over both decoders followed by the local search, each at 50,000 evaluations) at
least 5% below it: on the others a search's budget hardly matters, so
there is nothing for a policy to win. The filter's measurements are shipped
(``data/headroom-filter.json``): a build applies them without searching again.

Families are split whole (``HEADROOM_SPLIT``); ``test-large`` holds the test families'
graphs larger than every training graph (training graphs are kept small, as the size split
asks: train on smaller graphs, test on larger).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from timerl.errors import GraphError
from timerl.graphopt.corpus import structured

#: The filter's thresholds (REGAL): the long search's gain, or the best known order's gain,
#: relative to uniform BRKGA at the short budget.
LONG_GAIN = 0.02
BEST_GAIN = 0.05
SHORT_BUDGET = 5000
LONG_BUDGET = 50000
#: the long run stops after this many generations (of 80 new schedules) without a better
#: one: a stalled BRKGA rarely improves later, and the filter costs hours on two cores
LONG_PATIENCE = 125

HEADROOM_SPLIT: dict[str, str] = {
    "randwire_ws": "train",
    "nas": "train",
    "moe": "train",
    "unet": "train",
    "gpt2": "train",
    "llama": "train",
    "randwire_ba": "val",
    "bert": "val",
    "chains": "test",
    "branches": "test",
    "randwire_er": "test",
    "t5": "test",
    "vit": "test",
}


@dataclass(frozen=True)
class Candidate:
    """One candidate graph: ``make()`` returns its graph dict (``torch``: needs torch)."""

    name: str
    family: str
    kind: str  # "synthetic" (a forward graph), "training", or "model" (torch inference)
    make: Callable[[], dict]
    torch: bool = False


def _structured(family: str, n: int, seed: int, training: bool) -> dict:
    gen = structured.GENERATORS[family]
    if not training:
        return gen(n, seed, name=f"{family}-n{n}-s{seed}")
    fwd = gen(n, seed, name=f"{family}-n{n}-s{seed}")
    return structured.with_backward(fwd, seed=seed)


def _torch_graph(name: str, build: Any, training: bool) -> dict:
    import torch

    from timerl.graphopt.corpus.build import _quiet
    from timerl.graphopt.corpus.torch_export import graph_from_module

    torch.set_num_threads(1)
    with _quiet():
        module, inputs = build(training)
        return graph_from_module(module, inputs, name=name, training=training, optimizer="adam")


#: forward sizes of the structured candidates (training graphs are about 2.5x their forward)
SIZES = (300, 800, 1600)
TRAIN_SIZES = (300,)
LARGE_SIZES = (4000,)


def structured_candidates(quick: bool = False) -> list[Candidate]:
    out = []
    for family in structured.GENERATORS:
        test = HEADROOM_SPLIT[family] == "test"
        sizes = [(n, s) for n in SIZES for s in ((0, 1) if test else (0,))]
        if test:
            sizes += [(n, 0) for n in LARGE_SIZES]
        if quick:
            sizes = [(120, 0)]
        for n, seed in sizes:
            name = f"{family}-n{n}-s{seed}"
            out.append(
                Candidate(name, family, "synthetic", partial(_structured, family, n, seed, False))
            )
        for n in TRAIN_SIZES if not quick else ():
            name = f"{family}-n{n}-s2-train"
            out.append(
                Candidate(name, family, "training", partial(_structured, family, n, 2, True))
            )
    return out


def torch_candidates() -> list[Candidate]:
    from timerl.graphopt.corpus import families as fam
    from timerl.graphopt.corpus import models

    specs: list[tuple[str, str, Any, bool]] = [
        (f"randwire_{k}-torch-n16", f"randwire_{k}", fam.randwire(k, 16), False)
        for k in ("ws", "ba", "er")
    ]
    specs += [
        ("nas-torch-c1", "nas", fam.nas(1, seed=0), False),
        ("nas-torch-c2", "nas", fam.nas(2, seed=1), False),
        ("unet-torch-d4-train", "unet", fam.unet(4), True),
        ("moe-mixtral-l2-train", "moe", fam.moe("mixtral", 2, 128, 8), True),
        ("gpt2-l2-train", "gpt2", models.gpt2(2, 128, 4), True),
        ("llama-l2-train", "llama", models.llama(2, 128, 4, 2), True),
        ("bert-l2-train", "bert", models.bert(2, 128, 4), True),
        ("vit-l2-train", "vit", models.vit(2, 128, 4), True),
        ("t5-l1-train", "t5", models.t5(1, 128, 4), True),
    ]
    return [
        Candidate(
            name, family, "training" if tr else "model", partial(_torch_graph, name, b, tr), True
        )
        for name, family, b, tr in specs
    ]


def candidates(quick: bool = False, with_torch: bool = True) -> list[Candidate]:
    """Every candidate of the headroom corpus, in a fixed order (names unique)."""
    out = structured_candidates(quick)
    if with_torch and not quick:
        out += torch_candidates()
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise GraphError("headroom candidates contain duplicate names")
    for c in out:
        if c.family not in HEADROOM_SPLIT:
            raise GraphError(f"headroom family {c.family!r} has no split")
    return out


def kept(record: dict[str, Any]) -> bool:
    """REGAL's filter on one graph's measurements (values of the same objective)."""
    short = record["brkga_short"]
    if short <= 0:
        return False
    best = min([record["brkga_long"], *record.get("others", {}).values()])
    return record["brkga_long"] <= (1 - LONG_GAIN) * short or best <= (1 - BEST_GAIN) * short


def assign(entries: list[dict[str, Any]]) -> None:
    """Each entry's split: its family's, and test families' graphs larger than every
    training graph go to ``test-large``."""
    largest = max(
        (e["nodes"] for e in entries if HEADROOM_SPLIT[e["family"]] == "train"), default=0
    )
    for e in entries:
        split = HEADROOM_SPLIT[e["family"]]
        if split == "test" and largest and e["nodes"] > largest:
            split = "test-large"
        e["split"] = split


# ------------------------------------------------------------------------------ the filter
def measure(candidate: Candidate, graph: dict) -> dict[str, Any]:
    """The filter's measurements of one graph (peak memory on one device, seed 0): uniform
    BRKGA seeded with the portfolio at the short and the long budget (the long run's first
    generations are the short run's: same population and seed; it stops early once stalled
    for ``LONG_PATIENCE`` generations), and the peak-directed local
    search at the long budget, and a BRKGA over both decoders (``Problem.with_decoder_gene``)
    for four fifths of it followed by the local search with run moves. A graph whose best
    portfolio order meets the dependence bound is optimal already and is not searched."""
    import time

    from timerl.graphopt.baselines import best_of_portfolio, portfolio_solutions
    from timerl.graphopt.brkga import brkga
    from timerl.graphopt.decoders import Problem
    from timerl.graphopt.exact import peak_lower_bound
    from timerl.graphopt.graph import Graph
    from timerl.graphopt.localsearch import peak_local_search

    t0 = time.perf_counter()
    problem = Problem(Graph.from_json(graph))
    portfolio = best_of_portfolio(problem).value
    record: dict[str, Any] = {
        "name": candidate.name,
        "family": candidate.family,
        "kind": candidate.kind,
        "nodes": problem.n,
        "portfolio": portfolio,
    }
    if problem.n <= 3000 and portfolio <= peak_lower_bound(problem.graph):
        # a portfolio order meets the dependence bound: it is optimal, no search can win
        return {**record, "brkga_short": portfolio, "brkga_long": portfolio, "proven": True}
    seeds = list(portfolio_solutions(problem).values())
    short = brkga(problem, budget=SHORT_BUDGET, seeds=seeds, seed=0)
    long = brkga(problem, budget=LONG_BUDGET, seeds=seeds, seed=0, patience=LONG_PATIENCE)
    start = best_of_portfolio(problem).solution
    peak = peak_local_search(problem, start, budget=LONG_BUDGET, seed=0)
    # a long search over both decoders (list scheduling and post-order), then the local
    # search with run moves: the search of ``learned`` with uniform proposals, fixed here
    mixed = brkga(
        problem.with_decoder_gene(),
        budget=LONG_BUDGET - LONG_BUDGET // 5,
        seeds=seeds,
        seed=0,
        patience=LONG_PATIENCE,
    )
    both = peak_local_search(problem, mixed.solution, budget=LONG_BUDGET // 5, seed=0, segments=0.3)
    return {
        **record,
        "brkga_short": short.value,
        "brkga_long": long.value,
        "others": {"peak-local": peak.value, "mixed": both.value},
        # the best order found, by node index: a target the policy's imitation can reuse
        "best_order": min((long, peak, both), key=lambda r: r.value).solution.order.tolist(),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _measure_named(name: str) -> dict[str, Any]:
    """Build the candidate of this name and measure it (a worker process's task)."""
    from timerl.graphopt.corpus.check import check_graph

    cand = {c.name: c for c in candidates()}[name]
    graph = cand.make()
    check_graph(graph)
    return measure(cand, graph)


def run_filter(
    log: Path, *, workers: int = 2, names: Sequence[str] | None = None, progress: Any = print
) -> list[dict[str, Any]]:
    """Measure every candidate not yet in ``log`` (one JSON record per line, appended as
    each finishes, so an interrupted run resumes), ``workers`` at a time; returns all the
    log's records. Takes hours on two cores: the shipped records are its output."""
    import json
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    done = {r["name"] for r in read_log(log)}
    todo = [c.name for c in candidates() if (names is None or c.name in names)]
    family = {c.name: c.family for c in candidates()}
    todo = sorted((n for n in todo if n not in done), key=lambda n: _priority(n, family[n]))
    log.parent.mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max(1, workers), mp_context=ctx) as pool:
        futures = {pool.submit(_measure_named, n): n for n in todo}
        for fut in as_completed(futures):
            rec = fut.result()
            with open(log, "a") as f:
                f.write(json.dumps(rec) + "\n")
            progress(
                f"{rec['name']}: {rec['nodes']} nodes, kept={kept(rec)}, {rec.get('seconds', 0)} s"
            )
    return read_log(log)


def read_log(log: Path) -> list[dict[str, Any]]:
    import json

    if not log.is_file():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _priority(name: str, family: str) -> tuple[int, int]:
    """The order candidates are measured in: test families first (the results need them;
    training reads its own build of the training families, unfiltered), then validation,
    then training, each smallest first (training graphs ~3x their target)."""
    import re

    m = re.search(r"-n(\d+)-", name)
    size = int(m.group(1)) if m and "torch" not in name else 1500
    size *= 3 if name.endswith("-train") else 1
    return ({"test": 0, "val": 1, "train": 2}[HEADROOM_SPLIT[family]], size)


# ------------------------------------------------------------------------------ the build
#: the filter's measurements, as shipped (``write_records``): values only, no orders
SHIPPED_RECORDS = Path(__file__).resolve().parent.parent / "data" / "headroom-filter.json"


def write_records(records: list[dict[str, Any]], path: Path = SHIPPED_RECORDS) -> None:
    """The filter's records without their orders, sorted by name (what the build reads)."""
    import json

    slim = [{k: v for k, v in r.items() if k != "best_order"} for r in records]
    slim.sort(key=lambda r: r["name"])
    path.write_text(json.dumps({"version": 1, "records": slim}, indent=0) + "\n")


def read_records(path: Path = SHIPPED_RECORDS) -> dict[str, dict[str, Any]]:
    import json

    try:
        data = json.loads(Path(path).read_text())
        return {r["name"]: r for r in data["records"]}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise GraphError(f"headroom filter records {path}: unreadable ({err})") from err


def _make_named(name: str, quick: bool = False) -> tuple[str, dict | None, str | None]:
    """Build one candidate by name: ``(name, graph or None, error or None)`` (a worker's
    task; errors are returned so the build reports them by name)."""
    from timerl.graphopt.corpus.check import check_graph

    try:
        graph = {c.name: c for c in candidates(quick)}[name].make()
        check_graph(graph)
        return name, graph, None
    except Exception as e:  # report every failure with the graph's name
        return (
            name,
            None,
            f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
        )


def build_headroom_corpus(
    out_dir: Path,
    *,
    records: Path = SHIPPED_RECORDS,
    unfiltered: bool = False,
    measured_only: bool = False,
    families: Sequence[str] | None = None,
    workers: int = 2,
    quick: bool = False,
    progress: Any = print,
) -> Path:
    """Write the headroom corpus under ``out_dir`` (``<split>/<family>/<name>.json`` and
    ``index.json``, as ``build_corpus`` does) and return the index's path.

    Validation and test families: the graphs REGAL's filter keeps, by the measurements in
    ``records``. Training families: every candidate (the policy learns from all of them;
    the filter is what makes the held-out results about graphs where search has room). With
    ``unfiltered`` every candidate of every family is written; ``measured_only`` writes only
    the candidates ``records`` holds (with ``unfiltered``: every graph the filter measured so
    far, kept or not, for results before the filter has finished). The index marks each graph
    ``kept`` or not. A measured candidate whose node count differs from its record's (the
    generators changed) is an error: measure again (``run_filter``). ``quick``: the small
    candidates (tests)."""
    import json
    import multiprocessing
    import time
    from concurrent.futures import ProcessPoolExecutor

    from timerl.graphopt.corpus.build import _clear_old

    t0 = time.perf_counter()
    measured = read_records(records)
    chosen = [c for c in candidates(quick) if families is None or c.family in families]
    if measured_only:
        chosen = [c for c in chosen if c.name in measured]
    filtered = [c for c in chosen if not unfiltered and HEADROOM_SPLIT[c.family] != "train"]
    missing = [c.name for c in filtered if c.name not in measured]
    if missing:
        raise GraphError(
            f"headroom filter records {records}: no measurement of {missing[0]!r} "
            f"({len(missing)} candidates unmeasured): run the filter first"
        )
    chosen = [c for c in chosen if c not in filtered or kept(measured[c.name])]
    names = [c.name for c in chosen]
    by_name = {c.name: c for c in chosen}
    ctx = multiprocessing.get_context("spawn")
    if workers > 1 and any(c.torch for c in chosen):
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            built = list(pool.map(_make_named, names, [quick] * len(names)))
    else:
        built = [_make_named(n, quick) for n in names]
    entries, failed, graphs = [], [], {}
    for name, graph, error in built:
        cand = by_name[name]
        if graph is None:
            failed.append({"name": name, "family": cand.family, "error": error})
            progress(f"failed {name}: {error}")
            continue
        rec = measured.get(name)
        if rec is not None and rec["nodes"] != len(graph["nodes"]):
            raise GraphError(
                f"headroom candidate {name!r}: {len(graph['nodes'])} nodes, its filter record "
                f"says {rec['nodes']} (the generators changed): measure again"
            )
        graphs[name] = graph
        entries.append(
            {
                "name": name,
                "family": cand.family,
                "kind": cand.kind,
                "nodes": len(graph["nodes"]),
                "kept": rec is not None and kept(rec),
            }
        )
    assign(entries)
    out_dir = Path(out_dir)
    _clear_old(out_dir)
    entries.sort(key=lambda e: (e["split"], e["family"], e["nodes"], e["name"]))
    for e in entries:
        rel = Path(e["split"]) / e["family"] / f"{e['name']}.json"
        e["path"] = rel.as_posix()
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(graphs[e["name"]], separators=(",", ":")))
    index = {
        "version": 1,
        "set": "headroom",
        "unfiltered": unfiltered,
        "graphs": entries,
        "num_failed": len(failed),
        "failed": failed,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    index_path = out_dir / "index.json"
    index_path.write_text(json.dumps(index, indent=1) + "\n")
    progress(
        f"headroom corpus: {len(entries)} graphs, {time.perf_counter() - t0:.0f} s -> {index_path}"
    )
    return index_path
