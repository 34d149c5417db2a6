"""timerl: deep RL programs as recurrent tensors, compiled and scheduled as a whole."""

from timerl.api import distributions, nn, optim
from timerl.api.context import Context, evaluate, from_numpy
from timerl.api.functional import (
    arange,
    cat,
    exp,
    full,
    log,
    max,
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
from timerl.symbolic import Slice
from timerl.version import __version__  # noqa: F401 (public)

__all__ = [
    "BackendError",
    "BoundError",
    "Context",
    "CycleError",
    "MemoryBudgetError",
    "OutOfRangeError",
    "Program",
    "ProgramError",
    "RecurrentTensor",
    "ShapeError",
    "Slice",
    "TimerlError",
    "UndefinedPointError",
    "arange",
    "distributions",
    "nn",
    "optim",
    "rl",
    "cat",
    "evaluate",
    "exp",
    "from_numpy",
    "full",
    "log",
    "max",
    "maximum",
    "min",
    "minimum",
    "ones",
    "rand",
    "randn",
    "sink",
    "stack",
    "tanh",
    "where",
    "zeros",
]


def __getattr__(name: str):
    # ``tl.rl`` imports gymnasium: load it on first use so ``import timerl`` stays quick.
    if name == "rl":
        import importlib

        return importlib.import_module("timerl.rl")
    raise AttributeError(f"module 'timerl' has no attribute {name!r}")
