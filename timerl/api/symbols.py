"""The symbolic names a program's author meets: dims, their bounds, index expressions.

``ctx.dims`` and ``ctx.bounds`` hand them out; this module names their types (for hints and
``isinstance``) and the index arithmetic a library on the API writes with, so that it need not
reach into the compiler's own ``timerl.symbolic``. ``tl.min``/``tl.max`` of expressions are
the symbolic ``min``/``max`` below."""

from __future__ import annotations

from timerl.symbolic import Bound, Condition, Dim, Expr, Slice, max_, min_

__all__ = ["Bound", "Condition", "Dim", "Expr", "Slice", "max_", "min_"]
