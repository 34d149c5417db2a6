"""``prog.explain()``: a readable summary by default, every statement on request."""

from __future__ import annotations

from timerl.cli import main
from timerl.rl.algos import ppo


def test_ppo_summary_is_short_and_full_lists_everything(capsys):
    algo = ppo()
    prog = algo.ctx.compile(bounds={"I": 2, **algo.bounds})
    summary = prog.explain()
    full = prog.explain(full=True)
    assert len(summary.splitlines()) <= 300
    assert len(full.splitlines()) > len(summary.splitlines())
    for name in ("for t in", "for u in", "CartPole-v1.step", "gae", "duplicate ops merged"):
        assert name in summary
    assert "free " in full and "= matmul(" in full
    assert main(["show", "ppo"]) == 0
    shown = capsys.readouterr().out
    assert len(shown.splitlines()) <= 300
    assert main(["show", "ppo", "--full"]) == 0
    assert len(capsys.readouterr().out.splitlines()) > len(shown.splitlines())
