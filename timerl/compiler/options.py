"""``CompileOptions``: how a program is compiled, as one value passed to the pipeline.

Every choice a pass makes from outside the program is a field here, so the same spec and
options always compile to the same program (nothing is read from the environment).
"""

from __future__ import annotations

from dataclasses import dataclass

from timerl.errors import ProgramError


@dataclass(frozen=True)
class CompileOptions:
    """``optimize=False`` keeps only the passes correctness needs: the reference every
    optimisation is tested against. The pass switches (``reuse``, ``scan``, ``vectorize``)
    turn one optimisation off, to measure it or to compare against the program as written.
    ``blocks`` runs computations over many rows in about that many blocks of rows
    (incrementalisation) without a budget asking for it; ``memory_budget`` (bytes) makes the
    compiler fit the program under it, or refuse it naming the smallest budget that fits.
    ``threads`` is how many threads the math libraries run the program's kernels on; None:
    every usable core for a program with large kernels (a CNN's minibatch), else one."""

    optimize: bool = True
    reuse: bool = True
    scan: bool = True
    vectorize: bool = True
    blocks: int | None = None
    memory_budget: int | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.blocks is not None and (
            isinstance(self.blocks, bool) or not isinstance(self.blocks, int) or self.blocks < 1
        ):
            raise ProgramError(
                f"CompileOptions(blocks={self.blocks!r}): give a whole number of blocks, 1 or more"
            )
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise ProgramError(
                f"CompileOptions(threads={self.threads!r}): give a whole number of threads, "
                "1 or more (or None to choose from the program's kernels)"
            )
        if self.memory_budget is not None and self.memory_budget < 0:
            raise ProgramError(
                f"CompileOptions(memory_budget={self.memory_budget}): a budget is a number of "
                "bytes, 0 or more"
            )
