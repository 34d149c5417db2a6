"""Index expressions: dims, bounds, affine arithmetic, min/max, slices and conditions."""

from timerl.symbolic.bounds import always_le0, always_lt0
from timerl.symbolic.expr import (
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
    compile_exprs,
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
    "always_le0",
    "always_lt0",
    "as_condition",
    "as_expr",
    "compile_exprs",
    "floordiv",
    "max_",
    "min_",
    "mod",
]
