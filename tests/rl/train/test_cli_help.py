"""``timerl COMMAND --help`` shows every flag's default (train, eval, export, plot, show)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from core_helpers import flags_hiding_defaults

from timerl.cli import build_parser

COMMANDS = ["train", "eval", "export", "plot", "show"]


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_with_a_default_shows_it(command):
    missing = flags_hiding_defaults(_subparser(command))
    assert not missing, f"timerl {command} --help hides the default of {missing}"


def test_export_help_names_the_default_format(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["export", "--help"])
    assert "(default: torch)" in capsys.readouterr().out


def test_hidden_help_names_each_algorithms_own_default():
    """dqn and sac default to 128,128, not the 64,64 of the on-policy algorithms."""
    from timerl.rl.train.registry import ALGOS

    p = _subparser("train")
    action = next(a for a in p._actions if "--hidden" in a.option_strings)
    text = " ".join(action.help.split())
    for algo, (_, cls) in ALGOS.items():
        (field,) = [f for f in dataclasses.fields(cls) if f.name == "hidden"]
        assert f"{algo} {','.join(str(n) for n in field.default)}" in text, (algo, text)
    assert "dqn 128,128" in text and "sac 128,128" in text
