"""The algorithms, each an ordinary recurrent-tensor program: PPO and REINFORCE with the
pieces the others reuse (``policy_gradient``), ``a2c``, ``dqn``, ``sac``; and what they are
built from: return estimators (``returns``), a replay buffer (``replay``), running
normalisation (``normalize``), config names (``naming``)."""

from timerl.rl.algos.a2c import A2CConfig, a2c
from timerl.rl.algos.dqn import DQNConfig, dqn
from timerl.rl.algos.policy_gradient import (
    FINITE,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    STEP_FRACTION,
    WIDTHS,
    AlgoConfig,
    AlgoProgram,
    Policy,
    PPOConfig,
    ReinforceConfig,
    Rule,
    at_least,
    default_config,
    ppo,
    ppo_loss,
    reinforce,
)
from timerl.rl.algos.sac import SACConfig, sac
from timerl.rl.algos.shared import normalized_advantage

__all__ = [
    "FINITE",
    "FRACTION",
    "NON_NEGATIVE",
    "POSITIVE",
    "STEP_FRACTION",
    "WIDTHS",
    "A2CConfig",
    "AlgoConfig",
    "AlgoProgram",
    "DQNConfig",
    "PPOConfig",
    "Policy",
    "ReinforceConfig",
    "Rule",
    "SACConfig",
    "a2c",
    "at_least",
    "default_config",
    "dqn",
    "normalized_advantage",
    "ppo",
    "ppo_loss",
    "reinforce",
    "sac",
]
