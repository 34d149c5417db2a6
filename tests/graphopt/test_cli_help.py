"""``timerl graphopt COMMAND --help`` shows every flag's default."""

from __future__ import annotations

import argparse

import pytest
from core_helpers import flags_hiding_defaults

from timerl.cli import build_parser


def _subparser(name: str) -> argparse.ArgumentParser:
    def sub(p: argparse.ArgumentParser, key: str) -> argparse.ArgumentParser:
        action = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        return action.choices[key]

    return sub(sub(build_parser(), "graphopt"), name)


@pytest.mark.parametrize("command", ["optimize", "eval", "train", "corpus"])
def test_every_flag_with_a_default_shows_it(command):
    missing = flags_hiding_defaults(_subparser(command))
    assert not missing, f"timerl graphopt {command} --help hides the default of {missing}"


def test_optimize_help_names_the_default_method(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["graphopt", "optimize", "--help"])
    assert "(default: learned)" in " ".join(capsys.readouterr().out.split())
