"""A model of your own for ``timerl graphopt import`` (see docs/graphopt.md, "Your own model").

    timerl graphopt import my_model:mlp --training --out mlp-train.json
    timerl graphopt optimize mlp-train.json

``mlp`` returns the module and its example inputs; a factory returning only the module
takes ``--input-shape 64,784`` instead.
"""

from __future__ import annotations

import torch


def mlp() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """A 784-512-512-10 classifier and a batch of 64 inputs."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    return model, (torch.randn(64, 784),)
