"""graphopt's GNN policy trained as a timerl program (``timerl train graph-policy``): the
graph problems it acts on (``problems``), the policy program (``policy``), the runs behind
``timerl graphopt train --engine timerl`` (``train``), and timerl's own programs as graphs of
graphopt's corpus (``corpus_export``)."""

from timerl.rl.graph_policy.policy import (
    GraphNet,
    beta_params,
    decode_loss,
    export_weights,
    graph_policy,
    policy_loss,
    running_baseline,
)
from timerl.rl.graph_policy.problems import GraphPolicyConfig, GraphProblems

__all__ = [
    "GraphNet",
    "GraphPolicyConfig",
    "GraphProblems",
    "beta_params",
    "decode_loss",
    "export_weights",
    "graph_policy",
    "policy_loss",
    "running_baseline",
]
