"""The primitive op registry: one entry per primitive holds what the primitive *means*.

``core`` defines an entry (``Prim``: inference, the numpy reference semantics, the backward
rule, typed ``Traits``); each family module defines its primitives with ``define``. How a
backend computes a primitive is that backend's business: its lowerings live in its own module
(``runtime/torch_lowering.py``, ``runtime/jax_lowering.py``), so this package imports no array
library but numpy. Composite ops (softmax, losses, distributions) are built from these in
``api/``. docs/architecture.md ("Adding a primitive") says what to write where.
"""

from timerl.ir.prims import (  # noqa: F401 - each family registers its primitives
    control,
    conv,
    elementwise,
    indexing,
    linalg,
    movement,
    reductions,
    sources,
)
from timerl.ir.prims.core import REGISTRY, Infer, Prim, Shape, Traits, get, register
from timerl.ir.prims.sources import CHOLESKY_QR_ASPECT, orthogonal_array

__all__ = [
    "CHOLESKY_QR_ASPECT",
    "REGISTRY",
    "Infer",
    "Prim",
    "Shape",
    "Traits",
    "get",
    "orthogonal_array",
    "register",
]
