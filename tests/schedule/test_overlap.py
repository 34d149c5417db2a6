"""Overlap: a host call that can be started early (an env stepped by remote workers) is started
before the statements that do not need it, and waited for after them; values are unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import rollout_beside_recurrence

from timerl.rl.envs.synthetic import SyntheticVectorEnv
from timerl.schedule.program import Compute, Loop, Start


class _StartableSynthetic(SyntheticVectorEnv):
    """Synthetic-v0 with the ``step_async`` of an env stepped elsewhere; records the calls."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []
        self._sent: np.ndarray | None = None

    def step_async(self, actions) -> None:
        assert self._sent is None, "started twice"
        self.calls.append("start")
        self._sent = np.array(actions)

    def step(self, actions):
        if self._sent is not None:
            np.testing.assert_array_equal(self._sent, actions)
            self._sent = None
        self.calls.append("wait")
        return super().step(actions)


def _body(prog) -> list:
    (loop,) = [s for s in prog.schedule.body if isinstance(s, Loop)]
    return loop.body


@pytest.mark.parametrize("compiled", [True, False], ids=["generated", "interpreted"])
def test_independent_statements_run_between_start_and_wait(compiled):
    vec = _StartableSynthetic(num_envs=3, seed=0, obs_shape=(4,), action_dim=1)
    ctx, reward, acc = rollout_beside_recurrence(vec)
    prog = ctx.compile(bounds={"T": 6}, outputs=[reward, acc])
    body = _body(prog)
    kinds = [(type(s).__name__, s.op.name) for s in body if isinstance(s, (Compute, Start))]
    start = kinds.index(("Start", "Synthetic-v0.step"))
    wait = kinds.index(("Compute", "Synthetic-v0.step"))
    between = [name for kind, name in kinds[start + 1 : wait]]
    assert "acc" in between  # the recurrence that never reads the env runs meanwhile
    assert all(kind == "Compute" for kind, _ in kinds[start + 1 : wait])
    assert not any(n and n.startswith("Synthetic-v0.") for n in between)
    assert any("overlap: " in line and "in flight" in line for line in prog.report.notes)
    prog.run(compiled=compiled)
    assert vec.calls == ["start", "wait"] * 6

    plain = _StartableSynthetic(num_envs=3, seed=0, obs_shape=(4,), action_dim=1)
    ctx, reward2, acc2 = rollout_beside_recurrence(plain)
    ref = ctx.compile(bounds={"T": 6}, outputs=[reward2, acc2], optimize=False)
    ref.run()
    assert plain.calls == ["wait"] * 6  # the reference never starts early
    np.testing.assert_array_equal(prog.value(reward), ref.value(reward2))
    np.testing.assert_array_equal(prog.value(acc), ref.value(acc2))


def test_an_env_that_cannot_start_early_keeps_its_place():
    vec = SyntheticVectorEnv(num_envs=3, seed=0, obs_shape=(4,), action_dim=1)
    ctx, reward, acc = rollout_beside_recurrence(vec)
    prog = ctx.compile(bounds={"T": 6}, outputs=[reward, acc])
    assert not any(isinstance(s, Start) for s in _body(prog))
    assert not any("overlap" in line for line in prog.report.notes)


def test_nothing_moves_when_every_later_statement_needs_the_call(monkeypatch):
    """PPO's rollout: each step's statements read the previous step's observation."""
    from timerl.rl.algos import PPOConfig, ppo

    # every Synthetic-v0 batch startable, as a Ray env is
    monkeypatch.setattr(SyntheticVectorEnv, "step_async", lambda self, a: None, raising=False)
    cfg = PPOConfig(env_id="Synthetic-v0", num_envs=2, num_steps=4, hidden=(4,))
    cfg.env_kwargs = {"episode_length": 5, "obs_shape": [3]}
    algo = ppo(cfg)
    prog = algo.ctx.compile(bounds={"I": 1, **algo.bounds})
    assert any("overlap: nothing to run while Synthetic-v0.step" in n for n in prog.report.notes)
    assert not any(isinstance(s, Start) for s in prog.schedule.statements())
