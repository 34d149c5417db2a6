"""The error classes every layer raises, so users can catch ``tl.TimerlError`` alone."""

from __future__ import annotations


class TimerlError(Exception):
    """Base of every error timerl raises on purpose."""


class ProgramError(TimerlError):
    """A recurrent-tensor program is malformed (found while building or validating the PDG)."""


class IndexExprError(ProgramError, TypeError):
    """An index expression outside the affine forms timerl analyses (e.g. ``t * t``)."""


class ShapeError(ProgramError):
    """Operands' shapes or dtypes do not fit the op."""


class UndefinedPointError(ProgramError):
    """A tensor is read at a point where no branch of its definition applies."""


class OutOfRangeError(ProgramError):
    """An index reads outside a tensor's domain."""


class CycleError(ProgramError):
    """A dependence cycle that no loop direction can execute (e.g. no base case)."""


class BoundError(ProgramError):
    """A bound symbol was left without a value, or was given a bad one."""


class BackendError(TimerlError):
    """A backend is unknown, not installed, or cannot run on the requested device."""


class EnvError(TimerlError):
    """An environment id is unknown or its spaces are not supported."""


class CheckpointError(TimerlError):
    """A checkpoint is missing, corrupt, or belongs to another configuration."""


class NumericalError(TimerlError):
    """A NaN or infinity appeared in a value that must stay finite."""


class GraphError(TimerlError):
    """A graphopt graph file or graph is invalid."""


class MemoryBudgetError(TimerlError):
    """A program's planned peak memory exceeds ``ctx.compile(memory_budget=...)``: raised at
    compile time, naming the smallest budget that fits (``smallest``, bytes, where known) and
    the tensor that needs it."""

    def __init__(self, message: str, smallest: int | None = None) -> None:
        super().__init__(message)
        self.smallest = smallest
