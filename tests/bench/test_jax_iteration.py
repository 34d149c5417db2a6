"""bench/jax_iteration.py: an iteration's time split around its jitted calls."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `bench` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))


def test_the_split_adds_up_and_names_the_host_functions(capsys):
    pytest.importorskip("jax")
    from bench import jax_iteration

    assert jax_iteration.main(["--config", "cartpole-l1", "--iterations", "2", "--top", "5"]) == 0
    out = capsys.readouterr().out
    wall, inside, outside = map(
        float,
        re.search(
            r"([\d.]+) ms an iteration, ([\d.]+) inside jitted calls, ([\d.]+) outside", out
        ).groups(),
    )
    assert inside > 0 and outside > 0 and abs(wall - inside - outside) < 0.02
    listed = out.split("own time (cProfile, ms an iteration):\n")[1].splitlines()
    assert len(listed) == 5 and all(re.match(r"\s+[\d.]+  .+:\d+ ", line) for line in listed)
