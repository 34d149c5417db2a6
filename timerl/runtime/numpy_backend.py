"""The numpy backend: runs each primitive's reference ``impl``.

It is the reference every other configuration is tested against, so it has no lowerings of
its own: the semantics in ``timerl.ir.prims`` are what it runs (a specialisation only skips
the reference's tests where their outcome is known from the op's static shapes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from timerl.errors import BackendError
from timerl.ir import prims, rowwise
from timerl.ir.graph import Op
from timerl.runtime.backend import (
    SUBSCRIPT_LOWERINGS,
    Backend,
    math_threads,
    plain_reads,
    static_shape,
)

# ufuncs that write into ``out=``: the reference semantics of these primitives, computed in
# the buffer of an input that dies at the op (same shape and dtype, see memory/donation.py)
DONATING: dict[str, Callable[..., Any]] = {
    "neg": np.negative,
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "sin": np.sin,
    "cos": np.cos,
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "pow": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
}


def _plain_matmul(a: Any, b: Any) -> Any:
    if type(a) is np.ndarray:
        return np.matmul(a, b)
    return rowwise.rows_matmul(a, b)  # rows kept out of memory (a streamed block)


def _matmul_for(op: Op) -> Callable[..., Any] | None:
    """``np.matmul`` itself where the reference's product would call it unchanged (two 2-D
    operands, not by blocks): the same values without its tests at each call (0.5 us of a
    rollout step's 2 us product of 16 rows)."""
    shapes = [static_shape(e.src.shape) for e in op.inputs]
    if None in shapes or not plain_reads(op) or not rowwise.is_plain_product(*shapes):
        return None
    return _plain_matmul


class NumpyBackend(Backend):
    name = "numpy"
    donating_lowerings = DONATING
    inline_lowerings = SUBSCRIPT_LOWERINGS  # the reference semantics of these views
    specialisations = {"matmul": _matmul_for}
    heap_arrays = True  # numpy allocates with malloc
    swaps_points = True  # point stores write each point to its own file (runtime/stores.py)
    streams_rows = True  # its kernels read row sources (ir/rowwise.py)

    def __init__(self, device: str = "cpu", threads: int | None = 1) -> None:
        if device != "cpu":
            raise BackendError(f"the numpy backend runs on the cpu only, not {device!r}")
        super().__init__(device, threads)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        if self.threads is None:
            yield
            return
        with math_threads(self.threads):
            yield

    def has_lowering(self, prim: str) -> bool:
        return prim in prims.REGISTRY

    def lowering(self, prim: str) -> Callable[..., Any]:
        return prims.get(prim).impl  # the reference semantics are numpy's lowering

    # numpy's own function, not a method around it: a host call converts an env step's
    # action and its three results at every step
    asarray = staticmethod(np.asarray)
    to_numpy = staticmethod(np.asarray)

    def stack(self, values: list[Any]) -> np.ndarray:
        return np.stack(values)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        # np.zeros of memory the heap reuses is a memset (0.6 ms for a 16 MiB block)
        return np.empty(shape, dtype=dtype)

    def copy(self, value: Any) -> np.ndarray:
        return np.array(value, copy=True)

    def broadcast(self, value: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        value = np.asarray(value)
        if value.shape != shape:
            value = np.broadcast_to(value, shape)
        return value.astype(dtype, copy=False)
