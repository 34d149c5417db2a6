"""The ``timerl`` command: each subcommand lives with the layer it drives."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from timerl.errors import TimerlError

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


def build_parser() -> argparse.ArgumentParser:
    from timerl.version import __version__

    parser = argparse.ArgumentParser(prog="timerl", description=__doc__)
    parser.add_argument("--version", action="version", version=f"timerl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    from timerl import bench_cli
    from timerl.graphopt import cli as graphopt_cli
    from timerl.rl.train import cli as rl_cli

    rl_cli.register(sub)
    graphopt_cli.register(sub, export_program=_export_program, train_program=_train_program)
    bench_cli.register(sub)
    return parser


def _silence_stdout() -> None:
    """After the reader of our stdout went away (``| head``), later writes and the flush at
    exit must not raise again: point stdout at /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a real file (tests capture it)
        pass


def _export_program(spec: Any) -> Any:
    """Compile a timerl program named by a graphopt corpus spec into graph dicts."""
    from timerl.rl.graph_policy.corpus_export import export_program

    return export_program(spec)


def _train_program(settings: dict[str, Any], **options: Any) -> Any:
    """Train graphopt's policy with the timerl program of ``rl/graph_policy/policy.py``."""
    from timerl.rl.graph_policy.train import train_program

    return train_program(settings, **options)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except TimerlError as err:
        print(f"timerl: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt as err:
        detail = str(err) or "interrupted"
        print(f"timerl: {detail}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
