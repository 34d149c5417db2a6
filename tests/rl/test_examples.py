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


def test_custom_env_example_trains_evaluates_exports_and_resumes(tmp_path, monkeypatch):
    """examples/custom_env.py on examples/random_walk.py, run from another folder: the
    env's module is found on the path (python puts the script's folder there)."""
    pytest.importorskip("torch")  # for the export
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.chdir(tmp_path)
    mod = _load("custom_env")
    figures = mod.main(tmp_path / "walk", steps=4096)
    # a random walk wanders (0.7 or so); the best policy walks right, 3 steps: 0.98
    assert figures["first_return"] < 0.85
    assert figures["trained_return"] > 0.95 and figures["eval_return"] == pytest.approx(0.98)
    assert figures["resumed_iterations"] == 24  # 16 iterations of 256 steps, then 8 more
    assert (tmp_path / "walk" / "policy.pt2").exists()
