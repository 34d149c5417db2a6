"""``timerl bench``: the side-by-side benchmarks, which live in the repository's ``bench/``.

``bench`` is a top-level directory of the source checkout, not part of the installed package,
so the command looks for it in the current directory and next to this package's source, and
says where it looked when it finds neither.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType


def _import_bench(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name not in ("bench", name):
            raise
    candidates = [Path.cwd(), Path(__file__).resolve().parents[1]]
    for root in candidates:
        if (root / "bench" / "__init__.py").exists():
            sys.path.insert(0, str(root))
            sys.modules.pop("bench", None)
            return importlib.import_module(name)
    looked = ", ".join(str(c / "bench") for c in candidates)
    raise SystemExit(
        f"timerl bench: the benchmark sources (bench/) were not found (looked in {looked}); "
        "run it from the root of a timerl source checkout"
    )


def _run_rl(args: argparse.Namespace) -> int:
    rl = _import_bench("bench.rl")
    return int(rl.main(list(args.args)))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="side-by-side benchmarks against eager baselines")
    kinds = p.add_subparsers(dest="bench_command", required=True)
    rl = kinds.add_parser(
        "rl",
        add_help=False,
        prefix_chars="+",
        help="timerl PPO/REINFORCE vs eager torch, jitted JAX (and SB3) on the same configs",
        description="Runs timerl (numpy and torch backends) and the baselines on the same "
        "configurations, alternating systems over several repetitions, and prints env steps/s, "
        "s/iteration, setup time, peak memory and the timerl/baseline ratios.",
    )
    # Every flag goes to bench.rl's own parser (``timerl bench rl --help`` prints it); '+' as
    # the prefix keeps this parser from claiming the '--' options it does not know.
    rl.add_argument("args", nargs="*", help="bench.rl options, e.g. --quick --out DIR")
    rl.set_defaults(func=_run_rl)
