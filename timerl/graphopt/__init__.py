"""graphopt: ordering and placing the ops of computation graphs to save memory or time.

Modules, in dependency order: ``graph`` (IR and JSON file), ``perfmodel`` (peak memory and the
multi-device simulator), ``decoders`` (random keys -> schedules, the Problem), ``brkga``,
``baselines``, ``exact`` (CP-SAT), ``features``, ``policy`` (the graph network, numpy
inference and its weights file), ``learned`` (BRKGA steered by it), ``train`` (policy
gradients, needs torch), ``evaluate`` and ``cli``; ``corpus`` builds graph sets;
``torch_import`` turns a PyTorch model into a graph (:func:`from_torch`). graphopt
imports nothing of timerl but itself and ``timerl.errors``.
Nothing is imported here so that ``timerl --help`` stays fast.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """``timerl.graphopt.from_torch``, imported on first use (torch is an optional extra)."""
    if name == "from_torch":
        from timerl.graphopt.torch_import import from_torch

        return from_torch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
