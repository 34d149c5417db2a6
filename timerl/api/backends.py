"""The array backends a program compiles for, by the names ``ctx.compile(backend=...)`` takes."""

from __future__ import annotations

from timerl.runtime.backend import BACKENDS

__all__ = ["backend_names"]


def backend_names() -> tuple[str, ...]:
    """Every backend name ``compile`` accepts, sorted (an optional one may still be missing
    its library: compiling for it then says which extra to install)."""
    return tuple(sorted(BACKENDS))
