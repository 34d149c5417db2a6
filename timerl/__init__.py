"""timerl: deep RL programs as recurrent tensors, compiled and scheduled as a whole.

The public names load on first use (PEP 562): ``import timerl.graphopt`` (which stands alone)
or ``timerl --help`` must not pay for the compiler, numpy's and gymnasium's imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from timerl.errors import (
    BackendError,
    BoundError,
    CycleError,
    MemoryBudgetError,
    OutOfRangeError,
    ProgramError,
    ShapeError,
    TimerlError,
    UndefinedPointError,
)
from timerl.version import __version__  # noqa: F401 (public)

if TYPE_CHECKING:  # what the lazy names are, for readers and type checkers
    from timerl.api import distributions, nn, optim
    from timerl.api.context import Context, evaluate, from_numpy
    from timerl.api.functional import (
        arange,
        cat,
        conv2d,
        exp,
        full,
        log,
        max,
        max_pool2d,
        maximum,
        min,
        minimum,
        ones,
        rand,
        randn,
        sink,
        stack,
        tanh,
        where,
        zeros,
    )
    from timerl.api.program import Program
    from timerl.api.tensor import RecurrentTensor
    from timerl.compiler.options import CompileOptions
    from timerl.symbolic import Slice

_FUNCTIONAL = (
    "arange cat conv2d exp full log max max_pool2d maximum min minimum ones rand randn sink stack tanh"
    " where zeros"
)
# public name -> (module, attribute; None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    **{name: ("timerl.api.functional", name) for name in _FUNCTIONAL.split()},
    "distributions": ("timerl.api.distributions", None),
    "nn": ("timerl.api.nn", None),
    "optim": ("timerl.api.optim", None),
    "rl": ("timerl.rl", None),
    "Context": ("timerl.api.context", "Context"),
    "CompileOptions": ("timerl.compiler.options", "CompileOptions"),
    "evaluate": ("timerl.api.context", "evaluate"),
    "from_numpy": ("timerl.api.context", "from_numpy"),
    "Program": ("timerl.api.program", "Program"),
    "RecurrentTensor": ("timerl.api.tensor", "RecurrentTensor"),
    "Slice": ("timerl.symbolic", "Slice"),
}

__all__ = [
    "BackendError",
    "BoundError",
    "CycleError",
    "MemoryBudgetError",
    "OutOfRangeError",
    "ProgramError",
    "ShapeError",
    "TimerlError",
    "UndefinedPointError",
    "CompileOptions",
    "Context",
    "Program",
    "RecurrentTensor",
    "Slice",
    "arange",
    "cat",
    "conv2d",
    "distributions",
    "evaluate",
    "exp",
    "from_numpy",
    "full",
    "log",
    "max",
    "max_pool2d",
    "maximum",
    "min",
    "minimum",
    "nn",
    "ones",
    "optim",
    "rand",
    "randn",
    "rl",
    "sink",
    "stack",
    "tanh",
    "where",
    "zeros",
]


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'timerl' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
