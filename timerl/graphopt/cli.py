"""``timerl graphopt {optimize,import,eval,train,corpus}``: argument parsing and printing only."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from timerl.errors import GraphError, TimerlError


class DefaultsHelpFormatter(
    argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter
):
    """Shows every flag's default (a flag whose default depends on the run says so in its own
    help); keeps descriptions' line breaks. Every ``timerl`` command's help uses it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default:" in text or action.default is None:
            return text
        return super()._get_help_string(action)


def evaluations(text: str) -> int:
    """An evaluation budget: a search with none (or fewer) has nothing to spend."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 evaluation, got {value}")
    return value


def register(sub: Any, *, export_program: Any = None, train_program: Any = None) -> None:
    """Add the ``graphopt`` command and its subcommands to the top-level parser.

    ``export_program`` (a ``ProgramSpec -> graph dicts`` function) lets ``corpus`` build the
    ``timerl`` family, and ``train_program`` lets ``train --engine program`` train the policy
    with a timerl program; graphopt itself reads no PDG and imports no compiler."""
    p = sub.add_parser("graphopt", help="order and place computation graphs (REGAL)")
    gsub = p.add_subparsers(dest="graphopt_command", required=True)

    o = gsub.add_parser(
        "optimize",
        help="search an order/placement for one graph file",
        formatter_class=DefaultsHelpFormatter,
    )
    o.add_argument("graph", type=Path, help="graph JSON file")
    o.add_argument(
        "--objective",
        choices=("peak-memory", "runtime"),
        default="peak-memory",
        help="what to minimise (runtime: under --memory-limit per accelerator)",
    )
    o.add_argument(
        "--method",
        choices=("program", "portfolio", "local", "brkga", "learned", "untrained", "exact"),
        default="learned",
        help="learned: BRKGA steered by the policy, seeded with the portfolio",
    )
    o.add_argument(
        "--weights",
        type=Path,
        default=None,
        help="policy weights (default: the shipped ones for the objective)",
    )
    o.add_argument(
        "--budget", type=evaluations, default=5000, help="number of schedule evaluations"
    )
    o.add_argument("--devices", type=int, default=1, help="number of accelerators")
    o.add_argument("--memory-limit", type=int, default=None, help="bytes per accelerator")
    o.add_argument("--host", action="store_true", help="allow swapping tensors to host memory")
    o.add_argument("--time-limit", type=float, default=30.0, help="seconds, for --method exact")
    o.add_argument("--seed", type=int, default=0, help="the search's random seed")
    o.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="processes that score the search's schedules (same result; 2 on a 2-core machine)",
    )
    o.add_argument(
        "--out", type=Path, default=None, help="write the result JSON to this file (default: none)"
    )
    o.add_argument(
        "--json",
        action="store_true",
        help="print the result JSON instead of the summary (for scripts)",
    )
    o.set_defaults(func=cmd_optimize)

    m = gsub.add_parser(
        "import",
        help="write the graph of your own PyTorch model (needs torch)",
        formatter_class=DefaultsHelpFormatter,
        description="MODULE:FACTORY names a function (or class) in a module importable from "
        "the current folder; it returns a torch.nn.Module, or (module, example_inputs). "
        "Without example inputs from the factory, --input-shape gives them.",
    )
    m.add_argument("model", help="module:factory, e.g. mymodels:make_mlp")
    m.add_argument(
        "--input-shape",
        action="append",
        default=None,
        type=_shape,
        metavar="D1,D2,...",
        help="shape of one example input (repeat it for each input of forward, in order); "
        "default: the inputs the factory returns",
    )
    m.add_argument(
        "--dtype", default="float32", help="dtype of the --input-shape inputs (int64: token ids)"
    )
    m.add_argument(
        "--training",
        action="store_true",
        help="the training step: forward, backward and --optimizer's update (default: "
        "inference, one forward pass)",
    )
    m.add_argument(
        "--optimizer",
        choices=("adam", "sgd", "none"),
        default="adam",
        help="with --training: the update per parameter (none: forward and backward only)",
    )
    m.add_argument("--name", default=None, help="the graph's name (default: the factory's)")
    m.add_argument("--out", type=Path, default=Path("graph.json"), help="graph JSON file")
    m.set_defaults(func=cmd_import)

    e = gsub.add_parser(
        "eval", help="compare methods on a corpus split", formatter_class=DefaultsHelpFormatter
    )
    e.add_argument("--split", default="test", help="corpus split to evaluate")
    e.add_argument("--corpus", type=Path, default=Path("corpus"), help="corpus folder")
    e.add_argument(
        "--budget", type=evaluations, default=5000, help="schedule evaluations per method"
    )
    e.add_argument(
        "--methods", nargs="+", default=None, help="default: all but 'untrained' (an ablation)"
    )
    e.add_argument(
        "--weights",
        type=Path,
        default=None,
        help="policy weights (default: the shipped ones for the objective)",
    )
    e.add_argument("--limit", type=int, default=None, help="first N graphs of the split")
    e.add_argument("--exact-nodes", type=int, default=60, help="run exact up to this size")
    e.add_argument("--exact-time", type=float, default=10.0, help="exact time limit, seconds")
    e.add_argument(
        "--objective",
        choices=("peak-memory", "runtime"),
        default="peak-memory",
        help="what to minimise (runtime: under --memory-fraction per accelerator)",
    )
    e.add_argument("--devices", type=int, default=1, help="number of accelerators")
    e.add_argument("--host", action="store_true", help="allow swapping tensors to host memory")
    e.add_argument(
        "--memory-fraction",
        type=float,
        default=None,
        help="per-device memory limit as a fraction of the graph's program-order peak",
    )
    e.add_argument("--seed", type=int, default=0, help="every search's random seed")
    e.add_argument(
        "--unseeded",
        action="store_true",
        help="start BRKGA and the learned search from no portfolio schedule (REGAL's setting)",
    )
    e.add_argument("--out", type=Path, default=None, help="write per-graph results JSON")
    e.add_argument("--markdown", type=Path, default=None, help="write the table as markdown")
    e.add_argument("--no-progress", action="store_true")
    _workers_flags(e, "graphs evaluated at a time")
    e.set_defaults(func=cmd_eval)

    t = gsub.add_parser(
        "train",
        help="train the policy on a corpus split (needs torch)",
        formatter_class=DefaultsHelpFormatter,
    )
    t.add_argument("--corpus", type=Path, default=Path("corpus"), help="corpus folder")
    t.add_argument("--split", default="train", help="corpus split to train on")
    t.add_argument("--out", type=Path, default=Path("policy.npz"), help="final weights file")
    t.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="default: OUT.ckpt.npz (--engine program: a run folder, default OUT.run)",
    )
    t.add_argument("--checkpoint-every", type=int, default=10, help="updates between saves")
    t.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="also write each checkpoint's weights as OUT-<updates>.npz (to choose one later)",
    )
    t.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    t.add_argument("--iterations", type=int, default=300, help="policy updates")
    t.add_argument("--minutes", type=float, default=None, help="stop after this wall time")
    t.add_argument("--budget", type=evaluations, default=400, help="BRKGA evaluations per sample")
    t.add_argument("--batch", type=int, default=4, help="fresh samples per update")
    t.add_argument("--max-nodes", type=int, default=600, help="largest training graph")
    t.add_argument(
        "--runtime-share", type=float, default=0.3, help="share of runtime problems drawn"
    )
    t.add_argument(
        "--runtime-max-nodes",
        type=int,
        default=250,
        help="largest graph also posed for the runtime objective",
    )
    t.add_argument("--hidden", type=int, default=32, help="the network's width")
    t.add_argument("--rounds", type=int, default=3, help="message-passing rounds")
    t.add_argument("--lr", type=float, default=3e-3, help="Adam's learning rate")
    t.add_argument("--seed", type=int, default=0, help="initial weights and sampling")
    t.add_argument(
        "--reward",
        choices=("search", "decode"),
        default="search",
        help="search: steered vs uniform BRKGA; decode: the proposals' sampled keys decoded",
    )
    t.add_argument("--samples", type=int, default=16, help="decode reward: keys per problem")
    t.add_argument("--entropy", type=float, default=1e-3, help="entropy bonus")
    t.add_argument(
        "--warm-start",
        choices=("none", "imitate"),
        default="none",
        help="imitate: first fit the mean priorities to each graph's best known order",
    )
    t.add_argument("--imitate-updates", type=int, default=300, help="imitation updates")
    t.add_argument(
        "--imitate-budget", type=evaluations, default=2000, help="BRKGA decodes per target order"
    )
    t.add_argument(
        "--imitate-concentration", type=float, default=4.0, help="Beta a + b to imitate with"
    )
    t.add_argument(
        "--imitate-scale",
        type=float,
        default=1.0,
        help="priority logits x this after the imitation: same mean order, wider proposals",
    )
    t.add_argument(
        "--imitate-moves",
        type=float,
        default=0.0,
        help="weight of fitting the move logits to the nodes each target moved (0: off)",
    )
    t.add_argument(
        "--imitate-decoder",
        type=float,
        default=0.0,
        help="weight of fitting the decoder logit to each target's better decoder (0: off)",
    )
    t.add_argument(
        "--decoder-gene",
        action="store_true",
        help="decode reward: also draw the gene choosing list or post-order decoding",
    )
    t.add_argument("--targets", type=Path, default=None, help="default: OUT.targets.npz")
    t.add_argument(
        "--engine",
        choices=("torch", "program"),
        default="torch",
        help="torch: the training loop in Python and torch; program: a timerl program "
        "(checkpoints and metrics in OUT.run/)",
    )
    _workers_flags(t, "searches of an update run at a time")
    t.set_defaults(func=cmd_train, train_program=train_program)

    c = gsub.add_parser(
        "corpus", help="build the graph corpus", formatter_class=DefaultsHelpFormatter
    )
    c.add_argument("--out", type=Path, default=Path("corpus"), help="folder to write it to")
    c.add_argument("--quick", action="store_true", help="a small corpus, for smoke tests")
    c.add_argument(
        "--headroom",
        action="store_true",
        help="the headroom corpus: families held out whole, held-out graphs kept by the "
        "shipped filter measurements (docs/graphopt.md)",
    )
    c.add_argument(
        "--unfiltered",
        action="store_true",
        help="--headroom: every candidate, kept by the filter or not (marked in the index)",
    )
    c.add_argument(
        "--measured-only",
        action="store_true",
        help="--headroom: only the candidates the filter records hold (no training graphs)",
    )
    c.add_argument(
        "--records",
        type=Path,
        default=None,
        help="--headroom: the filter's records (default: the shipped ones)",
    )
    c.add_argument(
        "--families", default=None, help="--headroom: only these families (comma separated)"
    )
    c.add_argument("--workers", type=int, default=2, help="--headroom: processes building graphs")
    c.set_defaults(func=cmd_corpus, export_program=export_program)


def _workers_flags(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help=f"{what} (1: in this process; more: local processes, or Ray tasks with "
        "--ray-address); the results are the same",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="run as Ray tasks on the cluster at this address (pip install 'timerl[ray]'; "
        "default: $RAY_ADDRESS, else local processes)",
    )


def _problem(args: argparse.Namespace, graph: Any) -> Any:
    from timerl.graphopt.decoders import Problem
    from timerl.graphopt.perfmodel import Cluster

    if args.devices < 1:
        raise GraphError("--devices must be at least 1")
    cluster = None
    if args.devices > 1 or args.memory_limit is not None or args.host:
        cluster = Cluster.make(args.devices, memory_limit=args.memory_limit, host=args.host)
    return Problem(graph, args.objective, cluster)


def _require_ortools() -> None:
    """The exact method is a CP-SAT model: fail before loading anything when it is missing."""
    try:
        from ortools.sat.python import cp_model  # noqa: F401
    except ImportError:
        raise TimerlError(
            "--method exact needs OR-Tools, which is not installed: "
            "pip install 'timerl[graphopt]' (or pip install ortools)"
        ) from None


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes such as 8,64, got {text!r}") from None
    if not dims or any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(f"expected positive sizes such as 8,64, got {text!r}")
    return dims


def mib(nbytes: float) -> str:
    """Bytes in MiB, four significant digits (``11.55 MiB``, ``0.1358 MiB``)."""
    value = nbytes / 2**20
    return f"{value:.0f} MiB" if value >= 1000 else f"{value:.4g} MiB"


def _seconds(value: float) -> str:
    if value >= 1:
        return f"{value:.4g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.4g} ms"
    return f"{value * 1e6:.4g} us"


def _resident(meta: dict[str, Any]) -> str:
    """What a graph's peak leaves out, in words."""
    parts = []
    if meta.get("param_bytes"):
        parts.append(f"parameters ({mib(meta['param_bytes'])})")
    if meta.get("optimizer_state_bytes"):
        parts.append(f"optimizer state ({mib(meta['optimizer_state_bytes'])})")
    if not parts:
        return "the peak is the largest sum of node outputs resident at once (the bytes the file gives)"
    return (
        "the peak counts the nodes' outputs (inputs, activations, gradients, temporaries); the "
        f"{' and '.join(parts)}, resident under every order, are not included"
    )


def optimize_summary(graph: Any, args: argparse.Namespace, result: dict[str, Any]) -> str:
    """The result of ``optimize`` for people: values with their units, and what they count."""
    value, prog = result["objective"], result["program_order_value"]
    lower = 100 * (prog - value) / prog if prog > 0 else 0.0
    if args.objective == "peak-memory":
        head = f"peak memory {mib(value)} ({value:,.0f} bytes), program order {mib(prog)}"
        note = _resident(graph.meta)
    else:
        head = f"runtime {_seconds(value)}, program order {_seconds(prog)}"
        note = "runtime on the reference device, from the nodes' costs"
    lines = [
        f"{graph.name}: {head}: {lower:.1f}% lower, by {result['detail']} in "
        f"{result['seconds']:.2f} s",
        f"  {note}",
    ]
    if args.out is not None:
        lines.append(f"  result (order, placement, swaps): {args.out}")
    return "\n".join(lines)


def cmd_import(args: argparse.Namespace) -> int:
    from timerl.graphopt.perfmodel import PeakMemory
    from timerl.graphopt.torch_import import example_tensors, from_torch, load_model

    model, inputs = load_model(args.model)
    if args.input_shape:
        inputs = example_tensors(args.input_shape, args.dtype)
    if inputs is None:
        raise GraphError(
            f"{args.model} returns a module without example inputs: give their shapes with "
            "--input-shape (once per input), or return (module, example_inputs)"
        )
    name = args.name or args.model.partition(":")[2]
    optimizer = None if args.optimizer == "none" else args.optimizer
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export's notes on the tracing it does
        graph = from_torch(model, inputs, training=args.training, optimizer=optimizer, name=name)
    graph.save(args.out)
    peak = PeakMemory(graph).peak(graph.program_order)
    kind = "inference"
    if args.training:
        kind = "training: forward, backward" + (f", {optimizer} update" if optimizer else "")
    print(
        f"{args.out}: {graph.name} ({kind}), {graph.n} nodes, {graph.num_edges()} edges; "
        f"program-order peak {mib(peak)}\n  {_resident(graph.meta)}"
    )
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:
    from timerl.graphopt.evaluate import optimize
    from timerl.graphopt.graph import Graph

    if args.method == "exact":
        _require_ortools()
    graph = Graph.load(args.graph)
    problem = _problem(args, graph)
    result = optimize(
        graph,
        problem,
        args.method,
        budget=args.budget,
        seed=args.seed,
        time_limit=args.time_limit,
        weights=args.weights,
        jobs=args.jobs,
    )
    result["unit"] = "bytes" if args.objective == "peak-memory" else "seconds"
    for key in ("param_bytes", "optimizer_state_bytes"):
        if key in graph.meta:  # resident under every order: not in the peak
            result[key] = graph.meta[key]
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.write_text(text)
    print(text if args.json else optimize_summary(graph, args, result))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from timerl.graphopt.evaluate import (
        COLUMNS,
        FAMILY_COLUMNS,
        METHODS,
        evaluate_corpus,
        fmt,
        headroom_by_family,
        load_index,
        summarise,
        to_markdown,
    )

    methods = args.methods or list(METHODS)
    total = len(load_index(args.corpus, args.split))
    if args.limit is not None:
        total = min(total, args.limit)
    if total == 0:
        raise GraphError(f"{args.corpus}: no graphs in split {args.split!r}")
    console = Console() if sys.stdout.isatty() else Console(width=200)
    t0 = time.perf_counter()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=args.no_progress,
    ) as progress:
        task = progress.add_task(f"eval {args.split}", total=total)
        records = evaluate_corpus(
            args.corpus,
            args.split,
            methods=methods,
            budget=args.budget,
            seed=args.seed,
            limit=args.limit,
            exact_nodes=args.exact_nodes,
            exact_time=args.exact_time,
            on_graph=lambda name: progress.update(task, advance=1, description=name),
            make_problem=_problem_factory(args),
            weights=args.weights,
            workers=args.workers,
            ray_address=args.ray_address,
            seeded=not args.unseeded,
        )
    rows = summarise(records, methods)
    table = Table(
        title=f"graphopt eval: split {args.split}, {_setting(args)}, budget {args.budget}, "
        f"{len(records)} graphs, {time.perf_counter() - t0:.0f}s"
    )
    for _, title in COLUMNS:
        table.add_column(title)
    for r in rows:
        table.add_row(*(fmt(r[k]) for k, _ in COLUMNS))
    console.print(table)
    fam_rows = headroom_by_family(records)
    fam = Table(title="headroom of ordering by family (best known order vs program order)")
    for _, title in FAMILY_COLUMNS:
        fam.add_column(title)
    for r in fam_rows:
        fam.add_row(*(fmt(r[k]) for k, _ in FAMILY_COLUMNS))
    console.print(fam)
    if args.out is not None:
        args.out.write_text(json.dumps([vars(r) for r in records], indent=1))
    if args.markdown is not None:
        md = to_markdown(rows) + "\n\n" + to_markdown(fam_rows, FAMILY_COLUMNS) + "\n"
        args.markdown.write_text(md)
    return 0


def _problem_factory(args: argparse.Namespace) -> Any:
    """Per-graph Problem for eval; a memory fraction turns into a per-graph byte limit."""
    from timerl.graphopt.decoders import Problem
    from timerl.graphopt.perfmodel import Cluster, PeakMemory

    if args.devices < 1:
        raise GraphError("--devices must be at least 1")

    def make(graph: Any) -> Any:
        limit = None
        if args.memory_fraction is not None:
            prog = PeakMemory(graph).peak(graph.program_order)
            limit = max(1, int(args.memory_fraction * prog))
        if args.devices == 1 and limit is None and not args.host:
            return Problem(graph, args.objective)
        cluster = Cluster.make(args.devices, memory_limit=limit, host=args.host)
        return Problem(graph, args.objective, cluster)

    return make


def _setting(args: argparse.Namespace) -> str:
    text = f"{args.objective}, {args.devices} device(s)"
    if args.host:
        text += " + host"
    if args.memory_fraction is not None:
        text += f", limit {args.memory_fraction:g} x program peak"
    if args.unseeded:
        text += ", searches unseeded"
    return text


def cmd_train(args: argparse.Namespace) -> int:
    from timerl.graphopt.train import TrainConfig, rich_progress, train

    if args.engine == "program":
        return _train_by_program(args)
    config = TrainConfig(
        corpus=str(args.corpus),
        split=args.split,
        max_nodes=args.max_nodes,
        runtime_share=args.runtime_share,
        runtime_max_nodes=args.runtime_max_nodes,
        budget=args.budget,
        batch=args.batch,
        hidden=args.hidden,
        rounds=args.rounds,
        lr=args.lr,
        seed=args.seed,
        reward=args.reward,
        samples=args.samples,
        entropy=args.entropy,
        warm_start=args.warm_start,
        imitate_updates=args.imitate_updates,
        imitate_budget=args.imitate_budget,
        imitate_concentration=args.imitate_concentration,
        imitate_scale=args.imitate_scale,
        imitate_moves=args.imitate_moves,
        imitate_decoder=args.imitate_decoder,
        decoder_gene=args.decoder_gene,
    )
    bar, show = rich_progress()
    if bar is not None:
        bar.start()
    try:
        train(
            config,
            iterations=args.iterations,
            out=args.out,
            checkpoint=args.checkpoint,
            checkpoint_every=args.checkpoint_every,
            resume=args.resume,
            minutes=args.minutes,
            progress=show,
            workers=args.workers,
            ray_address=args.ray_address,
            targets=args.targets,
            keep=args.keep_checkpoints,
        )
    finally:
        if bar is not None:
            bar.stop()
    return 0


def _train_by_program(args: argparse.Namespace) -> int:
    if args.train_program is None:
        raise GraphError("--engine program needs timerl's compiler (run it as `timerl graphopt`)")
    settings = {
        "corpus": str(args.corpus),
        "split": args.split,
        "max_nodes": args.max_nodes,
        "runtime_share": args.runtime_share,
        "budget": args.budget,
        "num_envs": args.batch,
        "hidden": [args.hidden] * args.rounds,
        "lr": args.lr,
        "seed": args.seed,
        "entropy": args.entropy,
        "search_workers": args.workers,
    }
    if args.warm_start == "imitate":
        settings["imitate_budget"] = args.imitate_budget
        settings["imitate_concentration"] = args.imitate_concentration
    if args.reward == "decode":
        settings["samples"] = args.samples
    given = {
        "ray_address": args.ray_address,
        "imitate_moves": args.imitate_moves,
        "imitate_decoder": args.imitate_decoder,
        "decoder_gene": args.decoder_gene,
    }
    out = args.train_program(
        settings,
        iterations=args.iterations,
        out=args.out,
        run_dir=args.checkpoint,
        resume=args.resume,
        checkpoint_every=args.checkpoint_every,
        progress=sys.stderr.isatty(),
        warm_start=args.warm_start,
        imitate_updates=args.imitate_updates,
        imitate_scale=args.imitate_scale,
        targets=args.targets,
        minutes=args.minutes,
        given=given,
        reward=args.reward,
    )
    print(f"wrote {out}")
    return 0


def cmd_corpus(args: argparse.Namespace) -> int:
    from timerl.graphopt.corpus import build_corpus

    if args.headroom:
        from timerl.graphopt.corpus.headroom import HEADROOM_SPLIT, build_headroom_corpus

        families = None
        if args.families:
            families = [f.strip() for f in args.families.split(",") if f.strip()]
            unknown = sorted(set(families) - set(HEADROOM_SPLIT))
            if unknown:
                raise GraphError(
                    f"--families: unknown famil{'y' if len(unknown) == 1 else 'ies'} "
                    f"{', '.join(unknown)}; choose from {', '.join(sorted(HEADROOM_SPLIT))}"
                )
        if args.workers < 1:
            raise GraphError(f"--workers must be at least 1, got {args.workers}")
        records = {"records": args.records} if args.records is not None else {}
        index = build_headroom_corpus(
            args.out,
            **records,
            unfiltered=args.unfiltered,
            measured_only=args.measured_only,
            families=families,
            workers=args.workers,
            quick=args.quick,
        )
        print(f"corpus index: {index}")
        return 0
    if args.unfiltered or args.families or args.measured_only or args.records:
        raise GraphError(
            "--unfiltered, --measured-only, --records and --families apply to --headroom only"
        )
    index = build_corpus(
        args.out, quick=args.quick, progress=True, export_program=args.export_program
    )
    print(f"corpus index: {index}")
    return 0
