"""``define``: a primitive's entry in the registry and in every transformation's table, in one
call beside its definition (docs/architecture.md, "Adding a primitive")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from timerl.ir.prims.batching import TABLE as BATCHING
from timerl.ir.prims.batching import Batching
from timerl.ir.prims.core import Infer, Prim, Traits, register
from timerl.ir.prims.cost import TABLE as COST
from timerl.ir.prims.cost import CostRule
from timerl.ir.prims.rows import TABLE as ROWS
from timerl.ir.prims.rows import Rows
from timerl.ir.prims.simplify import TABLE as SIMPLIFY
from timerl.ir.prims.simplify import Rule
from timerl.ir.prims.table import Declined

NO_TRAITS = Traits()  # no trait declared


def define(
    name: str,
    infer: Infer,
    impl: Callable[..., Any],
    vjp: Callable[..., list[Any]] | None = None,
    *,
    traits: Traits = NO_TRAITS,
    cost: CostRule,
    batching: Batching | Declined,
    rows: Rows | Declined,
    simplify: tuple[Rule, ...],
    point_attrs: tuple[str, ...] = (),
    array_attrs: tuple[str, ...] = (),
    differentiable: bool = True,
    extra: dict[str, Any] | None = None,
    view_when: Callable[[Mapping[str, Any]], bool] | None = None,
) -> Prim:
    """Register primitive ``name``: its inference, numpy reference semantics (``impl``),
    backward rule and traits, and its entry in each transformation's table: ``cost`` (the
    cost model), ``batching`` (vectorisation), ``rows`` (row semantics), ``simplify`` (its own
    identities; ``()`` for none). Each entry is a rule or ``Declined(why)``. ``view_when``:
    for a primitive that is a view of its input for some attributes only, which."""
    prim = register(
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
            view_when=view_when,
        )
    )
    COST.define(name, cost)
    BATCHING.define(name, batching)
    ROWS.define(name, rows)
    SIMPLIFY.define(name, simplify)
    return prim
