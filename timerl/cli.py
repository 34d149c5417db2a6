"""The ``timerl`` command: each subcommand lives with the layer it drives."""

from __future__ import annotations

import argparse
import sys

from timerl.errors import TimerlError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="timerl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from timerl import bench_cli
    from timerl.graphopt import cli as graphopt_cli
    from timerl.rl import cli as rl_cli

    rl_cli.register(sub)
    graphopt_cli.register(sub, export_program=_export_program)
    bench_cli.register(sub)
    return parser


def _export_program(spec):  # noqa: ANN001, ANN202 - a graphopt ProgramSpec -> graph dicts
    from timerl.schedule.to_graph import export_program

    return export_program(spec)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TimerlError as err:
        print(f"timerl: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
