"""Every algorithm ``timerl train`` knows: name -> (program builder, config class).

It sits with the driver, not in ``algos``: it also names graphopt's policy
(``timerl.rl.graph_policy``), which is built from ``algos``' pieces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from timerl.rl.algos.a2c import A2CConfig, a2c
from timerl.rl.algos.dqn import DQNConfig, dqn
from timerl.rl.algos.policy_gradient import AlgoConfig, PPOConfig, ReinforceConfig, ppo, reinforce
from timerl.rl.algos.sac import SACConfig, sac
from timerl.rl.graph_policy.policy import graph_policy
from timerl.rl.graph_policy.problems import GraphPolicyConfig

ALGOS: dict[str, tuple[Callable[..., Any], type[AlgoConfig]]] = {
    "ppo": (ppo, PPOConfig),
    "reinforce": (reinforce, ReinforceConfig),
    "a2c": (a2c, A2CConfig),
    "dqn": (dqn, DQNConfig),
    "sac": (sac, SACConfig),
    "graph-policy": (graph_policy, GraphPolicyConfig),
}
