"""bench/swap.py: one block swapped under a budget of 1.5 blocks, measured both ways."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `bench` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench import swap  # noqa: E402


def test_the_budget_moves_one_block_out_and_back_and_keeps_the_values():
    args = argparse.Namespace(backend="numpy", device="cpu", width=1024, rows=64, runs=2)
    block = 64 * 1024 * 4
    free, tight = swap._measure(args, None), swap._measure(args, 1.5)
    assert free["moved"] == 0 and free["tier_peak"] == 0
    assert tight["moved"] == 2 * block and tight["tier"] == "disk"
    assert tight["tier_peak"] == block
    assert free["metered_peak"] > 2 * block > tight["metered_peak"]
    assert tight["checksum"] == free["checksum"]
