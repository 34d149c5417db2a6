"""Inputs whose last row the program never reads: the off-by-one of a recurrence.

``h[t + 1] = cell(h[t], x[t])`` over a 20-row ``x`` defines ``h`` at 20 points with 19
steps, and the step writing ``h[19]`` reads ``x[18]``: ``x[19]`` is never read, and nothing
fails. The check is kept narrow so that it speaks only when that is likely a mistake: an
input given with ``tl.from_numpy`` over a dim (whose rows the user chose to give), read at
its next-to-last point along that dim but never at its last. A program that reads fewer
rows on purpose (``x[0:T - 1]``, a shift that starts later) reads neither end and says
nothing.
"""

from __future__ import annotations

import os
import warnings
from itertools import product

import numpy as np

from timerl.compiler.spec import ProgramSpec
from timerl.ir.reads import needed_points
from timerl.symbolic import TRUE, vevaluate

MAX_POINTS = 1 << 16  # of the other dims, where the last row's points are evaluated


class UnreadRowWarning(UserWarning):
    """An input given with ``from_numpy`` has a last row the program never reads."""


def unread_last_rows(spec: ProgramSpec) -> list[str]:
    """One line per ``from_numpy`` input and dim whose last row is never read while the row
    before it is (see the module docstring); empty when there is none."""
    inputs = [op for op in spec.ops if op.attrs.get("sealed") and op.domain]
    if not inputs:
        return []
    needed = needed_points(list(spec.ops), spec.roots)
    lines = []
    for op in inputs:
        guard = needed[op.id]
        if guard == TRUE:
            continue
        for dim in op.domain:
            size = spec.static.get(dim.bound)
            if size is None or size < 2:
                continue
            last = _read_anywhere(guard, op.domain, dim, size - 1, spec.static)
            before = _read_anywhere(guard, op.domain, dim, size - 2, spec.static)
            if last is False and before is True:
                what = f"input {op.name}" if op.name else "an input"
                site = f" (from_numpy at {op.site})" if op.site else " (from_numpy)"
                lines.append(
                    f"{what}{site}: its last row along {dim.name} ({dim.name} = {size - 1}, "
                    f"of the {size} given) is never read; a recurrence "
                    f"h[{dim.name} + 1] = f(h[{dim.name}], x[{dim.name}]) over {size} rows "
                    f"makes {size - 1} steps: to read every row, define h[0] from x[0] and "
                    f"h[{dim.name} + 1] from x[{dim.name} + 1]"
                )
    return lines


def _read_anywhere(guard, domain, dim, point: int, static) -> bool | None:
    """Whether ``guard`` holds at ``dim = point`` for some value of the other dims (None
    where that cannot be told: another dim without a static bound, or too many points)."""
    others = [d for d in domain if d is not dim]
    sizes = [static.get(d.bound) for d in others]
    if any(s is None for s in sizes) or int(np.prod(sizes, dtype=np.int64)) > MAX_POINTS:
        return None
    points = np.array(list(product(*(range(s) for s in sizes))), dtype=np.int64)
    env = {**static, dim: np.full(len(points), point)}
    for k, d in enumerate(others):
        env[d] = points[:, k]
    try:
        return bool(np.any(vevaluate(guard, env)))
    except Exception:  # a condition this cannot evaluate here: say nothing
        return None


def warn_unread_last_rows(spec: ProgramSpec) -> list[str]:
    """Warn (``UnreadRowWarning``, from the user's line) for each line of
    :func:`unread_last_rows`; return them for ``prog.explain()``."""
    lines = unread_last_rows(spec)
    for line in lines:
        warnings.warn(line, UnreadRowWarning, stacklevel=_user_level())
    return lines


def _user_level() -> int:
    """The ``stacklevel`` of the first frame outside timerl (and the decorators it runs
    through) for a warning raised by this function's caller: the user's compile or evaluate."""
    import contextlib
    import sys

    skip = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), contextlib.__file__)
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(skip):
        frame, level = frame.f_back, level + 1
    return level
