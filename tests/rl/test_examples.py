"""The examples a researcher copies must run and learn."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("name", "iterations"), [("reinforce", 41), ("ppo", 31)])
def test_example_trains_cartpole(name, iterations, capsys):
    mod = _load(name)
    mod.ITERATIONS = iterations
    ctx, bounds, outputs = mod.build()
    prog = ctx.compile(bounds=bounds)
    prog.run()
    returns = [
        float(m) for m in re.findall(r"mean episode return\s+([\d.]+)", capsys.readouterr().out)
    ]
    assert len(returns) >= 3
    assert returns[0] < 40  # a random policy
    assert max(returns[-2:]) > 2 * returns[0] + 50, returns
