"""The env-interleaving probe: every kind it compares runs and times the env's step alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `bench` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench import env_interleave  # noqa: E402


@pytest.mark.parametrize("kind", ["none", "numpy", "torch"])
def test_steps_are_timed_with_each_kind_between(kind, monkeypatch):
    pytest.importorskip("torch")
    calls = []
    original = env_interleave._between

    def counting(k):
        fn = original(k)
        return lambda: (calls.append(k), fn())

    monkeypatch.setattr(env_interleave, "_between", counting)
    us = env_interleave.step_us("CartPole-v1", 2, kind, steps=5)
    assert calls == [kind] * 5
    assert 0.0 < us < 1e6


def test_the_report_names_each_kind(capsys):
    pytest.importorskip("torch")
    assert env_interleave.main(["--num-envs", "2", "--steps", "3", "--rounds", "3"]) == 0
    out = capsys.readouterr().out
    for kind in ("none", "numpy", "torch"):
        assert f"between steps: {kind}" in out
