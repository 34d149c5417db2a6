"""The points of a domain as numpy arrays, to evaluate index expressions over all of them at
once (validation, and the checks passes make over whole domains)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from timerl.symbolic import Bound, Dim

# Domains larger than this are enumerated at scaled-down bounds (ir/validate.py)
MAX_POINTS = 8_000_000


def domain_grid(domain: tuple[Dim, ...], bounds: Mapping[Bound, int]) -> dict:
    """An environment for ``vevaluate``: each dim of ``domain`` as a flat array over its
    points (row-major), each bound as its value; halved until at most ``MAX_POINTS``."""
    sizes = [bounds[d.bound] for d in domain]
    total = int(np.prod(sizes)) if sizes else 1
    while total > MAX_POINTS:
        sizes = [max(1, (s + 1) // 2) for s in sizes]
        total = int(np.prod(sizes))
    env: dict = dict(bounds)
    if domain:
        axes = np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij")
        for d, axis in zip(domain, axes, strict=True):
            env[d] = axis.ravel()
        for d, s in zip(domain, sizes, strict=True):
            env[d.bound] = s
    return env
