"""``define``: a primitive's entry in the registry, in one call beside its definition."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from timerl.ir.prims.core import Infer, Prim, Traits, per_output, register

NO_TRAITS = Traits()  # no trait declared


def define(
    name: str,
    infer: Infer,
    impl: Callable[..., Any],
    vjp: Callable[..., list[Any]] | None = None,
    *,
    traits: Traits = NO_TRAITS,
    cost: Callable[[int, list[int], dict[str, Any]], float] = per_output,
    point_attrs: tuple[str, ...] = (),
    array_attrs: tuple[str, ...] = (),
    differentiable: bool = True,
    extra: dict[str, Any] | None = None,
) -> Prim:
    """Register primitive ``name``: its inference, numpy reference semantics (``impl``),
    backward rule and traits."""
    return register(
        Prim(
            name,
            infer,
            impl,
            vjp,
            elementwise=traits.elementwise,
            point_attrs=point_attrs,
            array_attrs=array_attrs,
            keyed=traits.random,
            differentiable=differentiable,
            extra=dict(extra or {}),
            traits=traits,
            cost=cost,
        )
    )
