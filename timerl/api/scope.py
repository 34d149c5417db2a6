"""The active context: a thread-local stack, and the interface tensors ask of a context.

Tensors need "the context I belong to" (to define points, find gradient leaves, number random
streams) but nothing of compilation; the context needs tensors. ``Scope`` is the part of a
context that tensors see, so ``tensor`` imports this module and ``context`` imports both,
with no cycle.
"""

from __future__ import annotations

import threading
from typing import Any

from timerl.api.roles import Declarations
from timerl.errors import ProgramError
from timerl.symbolic import Bound, Dim

_local = threading.local()


def _stack() -> list[Scope]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def current() -> Scope:
    """The innermost ``with tl.Context(...)`` block's context."""
    stack = _stack()
    if not stack:
        raise ProgramError("no active timerl context: build tensors inside `with tl.Context(...):`")
    return stack[-1]


class Scope:
    """What a tensor may ask of its context (``timerl.api.context.Context`` implements it)."""

    dims: tuple[Dim, ...]
    bounds: tuple[Bound, ...]
    declarations: Declarations  # parameters' roles, applied networks (``tl.nn``)
    _differentiated: set[int]
    _gradients: set[int]

    def __enter__(self) -> Any:
        _stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _stack().remove(self)

    def _define(self, target: Any, key: Any, value: Any) -> None:
        raise NotImplementedError

    def _register_placeholder(self, t: Any) -> None:
        raise NotImplementedError

    def _grad_leaves(self) -> list[Any]:
        raise NotImplementedError

    def next_stream(self) -> int:
        raise NotImplementedError

    def sink(self, tensor: Any, fn: Any) -> None:
        raise NotImplementedError
