"""What a program's author declared about its tensors, for the compiled program to list.

``tl.nn`` declares a parameter's role (``"actor"``, ``"critic"``: what it is for, which a name
only hints at) and, when a network is applied, its activation between layers. The context
keeps these declarations by op id; a compiled :class:`~timerl.api.program.Program` answers
``parameters()`` and ``activations()`` from them for the ops it holds, so a library on the API
(checkpoints, evaluation, export) never recognises tensors by the shape of the graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ParameterInfo:
    """A trained parameter of a compiled program."""

    name: str
    role: str | None
    domain: tuple[str, ...]  # the names of the dims it runs over (the iteration dim, ...)
    shape: tuple[Any, ...]
    dtype: Any


@dataclass
class Network:
    """A network the program applies: its activation between layers, its role, and the ops
    of the parameters it was applied with (what tells whether a compiled program still
    applies it)."""

    name: str
    activation: str
    role: str | None
    reads: set[int] = field(default_factory=set)


@dataclass
class Declarations:
    """A context's declarations: each parameter op's role, and the networks applied; once
    frozen for a compiled program, also the ops of its trained parameters."""

    roles: dict[int, str] = field(default_factory=dict)
    networks: dict[str, Network] = field(default_factory=dict)
    parameters: tuple[int, ...] = ()

    def note_network(self, name: str, activation: str, role: str | None, reads: list[int]) -> None:
        net = self.networks.setdefault(name, Network(name, activation, role))
        net.reads.update(reads)

    def frozen(self, parameters: tuple[int, ...]) -> Declarations:
        """A copy that later declarations in the context leave as it is, with the ops of the
        context's trained parameters (its placeholders made with ``requires_grad=True``)."""
        networks = {
            k: Network(n.name, n.activation, n.role, set(n.reads)) for k, n in self.networks.items()
        }
        return Declarations(dict(self.roles), networks, parameters)
