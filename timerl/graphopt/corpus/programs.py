"""The ``timerl`` family of the corpus: which of timerl's own RL programs are exported.

Only the list lives here. Turning a program's loop bodies into graphs reads timerl's PDG and
schedule, which graphopt never imports: ``timerl.rl.graph_policy.corpus_export.export_program`` does it,
and ``build_corpus`` receives that function as its ``export_program`` argument (the
``timerl graphopt corpus`` command passes it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FAMILY = "timerl"  # the corpus family of these graphs; their kind is "program"
KIND = "program"


@dataclass(frozen=True)
class ProgramSpec:
    """One RL algorithm program of the ``timerl`` family: ``algo`` and its config overrides.

    ``largest_only`` keeps just the program's largest graph (the quick corpus wants one).
    """

    name: str
    algo: str
    config: dict[str, Any] = field(default_factory=dict)
    largest_only: bool = False


def timerl_specs(quick: bool = False) -> list[ProgramSpec]:
    """The fixed list of programs exported into the corpus (each gives several graphs)."""
    if quick:
        small = {"env_id": "CartPole-v1", "num_envs": 2, "num_steps": 8}
        return [ProgramSpec("reinforce-cartpole-n2", "reinforce", small, largest_only=True)]
    return [
        ProgramSpec("ppo-cartpole", "ppo", {"env_id": "CartPole-v1"}),
        ProgramSpec("ppo-pendulum", "ppo", {"env_id": "Pendulum-v1"}),
        ProgramSpec("reinforce-cartpole", "reinforce", {"env_id": "CartPole-v1"}),
        ProgramSpec(
            "ppo-synthetic-3x16x16-n16-h128",
            "ppo",
            {
                "env_id": "Synthetic-v0",
                "env_kwargs": {"obs_shape": (3, 16, 16)},
                "num_envs": 16,
                "hidden": (128, 128),
            },
        ),
    ]
