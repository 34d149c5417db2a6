"""Index expressions: dims, bounds, affine arithmetic, min/max, slices and conditions."""

from timerl.symbolic.bounds import always_eq, always_le0, always_lt0, pieces, simplify
from timerl.symbolic.evaluate import compile_exprs, vevaluate
from timerl.symbolic.expr import (  # noqa: I001
    FALSE,
    TRUE,
    Bound,
    Condition,
    Const,
    Dim,
    Expr,
    Index,
    Slice,
    Symbol,
    as_condition,
    as_expr,
    floordiv,
    max_,
    min_,
    mod,
)

__all__ = [
    "FALSE",
    "TRUE",
    "Bound",
    "Condition",
    "Const",
    "Dim",
    "Expr",
    "Index",
    "Slice",
    "Symbol",
    "always_eq",
    "always_le0",
    "always_lt0",
    "as_condition",
    "as_expr",
    "compile_exprs",
    "vevaluate",
    "floordiv",
    "max_",
    "min_",
    "mod",
    "pieces",
    "simplify",
]
