"""``timerl COMMAND --help`` shows every flag's default (train, eval, export, plot, show), and
``timerl train ALGO --help`` that algorithm's flags only."""

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


def _algo_parser(algo: str) -> argparse.ArgumentParser:
    train = _subparser("train")
    sub = next(a for a in train._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[algo]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_with_a_default_shows_it(command):
    missing = flags_hiding_defaults(_subparser(command))
    assert not missing, f"timerl {command} --help hides the default of {missing}"


@pytest.mark.parametrize("algo", ["ppo", "a2c", "reinforce", "dqn", "sac", "graph-policy"])
def test_every_algorithm_flag_shows_its_default(algo):
    missing = flags_hiding_defaults(_algo_parser(algo))
    assert not missing, f"timerl train {algo} --help hides the default of {missing}"


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {opt for a in parser._actions for opt in a.option_strings}


def test_each_algorithm_lists_its_own_flags_only():
    """ppo's help has --clip and --epochs but no DQN or SAC setting, and the reverse."""
    from timerl.rl.train.registry import ALGOS

    for algo, (_, cls) in ALGOS.items():
        flags = _flags(_algo_parser(algo))
        own = {f.name for f in dataclasses.fields(cls)}
        for other, (_, other_cls) in ALGOS.items():
            for f in dataclasses.fields(other_cls):
                flag = "--" + f.name.replace("_", "-")
                if f.name not in own and flag in _flags(_algo_parser(other)):
                    assert flag not in flags, (algo, flag, other)
    ppo = _flags(_algo_parser("ppo"))
    assert {"--clip", "--epochs", "--minibatches", "--gae-lambda"} <= ppo
    assert not {"--buffer-size", "--tau", "--corpus", "--baseline"} & ppo
    dqn = _flags(_algo_parser("dqn"))
    assert "--clip" not in dqn and "--epochs" not in dqn


def test_train_help_lists_the_algorithms(capsys):
    from timerl.rl.train.registry import ALGOS

    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    text = capsys.readouterr().out
    assert all(algo in text for algo in ALGOS)
    assert "--clip" not in text and "--lr" not in text


def test_a_flag_of_another_algorithm_is_refused(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "dqn", "--clip", "0.1"])
    assert "--clip" in capsys.readouterr().err


def test_export_help_names_the_default_format(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["export", "--help"])
    assert "(default: torch)" in capsys.readouterr().out


def test_hidden_help_names_each_algorithms_own_default():
    """dqn and sac default to 128,128, not the 64,64 of the on-policy algorithms."""
    from timerl.rl.train.registry import ALGOS

    texts = {}
    for algo, (_, cls) in ALGOS.items():
        p = _algo_parser(algo)
        action = next(a for a in p._actions if "--hidden" in a.option_strings)
        texts[algo] = text = " ".join(action.help.split())
        (field,) = [f for f in dataclasses.fields(cls) if f.name == "hidden"]
        assert f"(default: {','.join(str(n) for n in field.default)})" in text, (algo, text)
    assert "128,128" in texts["dqn"] and "128,128" in texts["sac"]
