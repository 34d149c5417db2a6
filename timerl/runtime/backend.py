"""The interface every array backend implements, and the lookup of a backend by name.

A backend lowers primitives (``lowering``) and supplies the few array utilities the executor
needs (stacking points, broadcasting a merge's branch, counting bytes). Each backend lives in
its own module with its lowerings; this module imports none of them, so asking for the numpy
backend never imports torch.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from timerl.errors import BackendError
from timerl.ir import prims
from timerl.ir.graph import Edge, Op
from timerl.memory.plan import Capabilities
from timerl.symbolic import Const, Slice


def static_shape(shape: Iterable[Any]) -> tuple[int, ...] | None:
    """An op's shape as ints, or None where it depends on a point or a bound."""
    if not all(isinstance(s, Const) for s in shape):
        return None
    return tuple(int(s.value) for s in shape)


def plain_reads(op: Op) -> bool:
    """Whether each input of ``op`` is one point of its source (no slice adds axes): the
    kernel's operands then have their sources' shapes."""
    return not any(isinstance(i, Slice) for e in op.inputs for i in e.index)


# Views whose lowering is one subscript on numpy and on torch alike (``x[item]``,
# ``x[index]``): the source a backend with these lowerings may write inline.
SUBSCRIPT_LOWERINGS: Mapping[str, Callable[..., str]] = {
    "tuple_get": lambda x, item, **_: f"{x}[{item}]",
    "select_at": lambda x, index, **_: f"{x}[{index}]",
}


def _delivered(edge: Edge, reader: Op) -> np.dtype:
    """The dtype ``reader`` receives through ``edge``: the source's, or where a host function
    declares its results' dtypes (an env step casts its parts itself), the part's it reads."""
    declared = edge.src.attrs.get("result_dtypes")
    item = reader.attrs.get("item")
    if declared is not None and isinstance(item, int) and 0 <= item < len(declared):
        return np.dtype(declared[item])
    return edge.src.dtype


class Backend:
    """``threads`` caps the math library's threads while a program runs (None: leaves them
    as they are); a compiled program sets it from its kernels (``program_threads``)."""

    name = "abstract"
    # What the fusion pass may plan for this backend (``compiler/fusion.py``): whether
    # ``fuse`` compiles a run of pure statements into one function (jax: jax.jit),
    # ``fuse_loop`` a whole loop, ``fuse_body`` one iteration with its inner loops; and per
    # primitive, the per-point attributes its lowering takes traced.
    fuses = False
    fuses_loops = False
    fuses_bodies = False
    traced_attrs: Mapping[str, Any] = {}
    # a small region in a loop stepping the host may run as numpy kernels (jax on the CPU)
    numpy_regions = False
    # The backend's lowering table (its own module's), primitive name -> function.
    lowerings: Mapping[str, Callable[..., Any]] = {}
    # Lowerings that write the result into a given array, ``fn(*inputs, out=array)``: what
    # lets an op reuse the buffer of an input that dies at it (``memory/donation.py``).
    donating_lowerings: Mapping[str, Callable[..., Any]] = {}
    # Lowerings chosen per op, primitive name -> ``f(op)``: a function for the op's static
    # shapes and dtypes, or None for the general lowering (which tests them at each call).
    specialisations: Mapping[str, Callable[[Op], Callable[..., Any] | None]] = {}
    # Whether the library promotes mixed dtypes by numpy's rules, which the IR declares; if
    # not (torch, jax: int64 + float32 -> float32), results are cast to the declared dtype.
    promotes_like_numpy = True
    # The backend's array class: ``nbytes`` reads its own attribute first.
    array_type: type = np.ndarray
    # Lowerings the generated code writes as an expression: primitive name -> a function of
    # the inputs' and the attributes' sources giving the expression's. For a view that is one
    # subscript (a part of a host call's result, a point of a precomputed array) a kernel
    # call's frame and keywords cost more than its work, at every rollout step.
    inline_lowerings: Mapping[str, Callable[..., str]] = {}
    # A block's rows as separate views, made once before a loop over them, or None where
    # indexing the block at each step costs no more (numpy: 60 ns a row either way).
    row_views: Callable[[Any], Sequence[Any]] | None = None

    # Point values written to disk between uses (optimiser state, idle gradients), and
    # kernels that read a block's rows from a file by chunks: memory planning's moves that
    # this backend's stores and kernels carry out (numpy's).
    swaps_points = False
    streams_rows = False
    # Arrays written in place (block rows, donated results); jax's are immutable.
    mutable_arrays = True

    def __init__(self, device: str = "cpu", threads: int | None = 1) -> None:
        self.device = device
        self.threads = threads

    def use_threads(self, threads: int | None) -> None:
        """Run the math libraries on ``threads`` threads from the next run on."""
        self.threads = threads

    @property
    def capabilities(self) -> Capabilities:
        """What the compiler may plan for this backend (``memory/plan.py``)."""
        return Capabilities(
            swaps_points=self.swaps_points,
            streams_rows=self.streams_rows,
            mutable_arrays=self.mutable_arrays,
            donating=frozenset(self.donating_lowerings),
            heap_arrays=self.heap_arrays,
            fuses_regions=self.fuses,
            fuses_loops=self.fuses_loops,
            fuses_bodies=self.fuses_bodies,
            traced_attrs=dict(self.traced_attrs),
            numpy_regions=self.numpy_regions,
        )

    @property
    def heap_arrays(self) -> bool:
        """Whether the arrays a run allocates come from the process's C heap (``malloc``),
        whose pages ``runtime/heap.py`` can reserve and keep: numpy's, torch's on the CPU.
        Not jax's (XLA allocates for itself) or a GPU's."""
        return False

    def has_lowering(self, prim: str) -> bool:
        return prim in self.lowerings

    def lowering(self, prim: str) -> Callable[..., Any]:
        """This backend's function for ``prim``: inputs positionally, attributes by keyword."""
        try:
            return self.lowerings[prim]
        except KeyError:
            raise BackendError(f"primitive {prim!r} has no {self.name} lowering") from None

    def donating_lowering(self, prim: str) -> Callable[..., Any] | None:
        """``prim``'s lowering that writes into ``out=``, or None where it has none."""
        return self.donating_lowerings.get(prim)

    def donations(self, table: Mapping[int, int], ops: Iterable[Op]) -> dict[int, int]:
        """The entries of a donation table (op id -> input position) this backend lowers."""
        prim_of = {op.id: op.prim for op in ops}
        return {
            i: k
            for i, k in table.items()
            if i in prim_of and self.donating_lowering(prim_of[i]) is not None
        }

    def kernel(self, op: Op) -> Callable[..., Any]:
        """The function that computes ``op``'s value at one point: the backend's lowering,
        or its form for ``op``'s static shapes where it has one. Only ops with an operand
        of another dtype than their own pay for the dtype check."""
        self.check([op])
        special = self.specialisations.get(op.prim)
        fn = (special(op) if special is not None else None) or self.lowering(op.prim)
        if not self._casts(op):
            return fn
        cast = self.caster(op.dtype)

        def cast_result(*args: Any, **kwargs: Any) -> Any:
            return cast(fn(*args, **kwargs))

        return cast_result

    def _casts(self, op: Op) -> bool:
        """Whether ``op``'s results are cast to its declared dtype here (``kernel``)."""
        traits = prims.get(op.prim).traits
        return not (
            self.promotes_like_numpy
            or traits.host
            or traits.multi_output
            or all(_delivered(e, op) == op.dtype for e in op.inputs)
        )

    def inline_rule(self, op: Op) -> Callable[..., str] | None:
        """The source rule (``inline_lowerings``) of ``op``, where this backend writes it
        inline: it has one, no specialisation and nothing to cast."""
        rule = self.inline_lowerings.get(op.prim)
        if rule is None or op.prim in self.specialisations or self._casts(op):
            return None
        return rule

    def cast(self, value: Any, dtype: np.dtype) -> Any:
        """``value`` as ``dtype`` (itself when it has it already)."""
        raise NotImplementedError

    def caster(self, dtype: np.dtype) -> Callable[[Any], Any]:
        """``cast`` to one dtype, for a kernel that casts at every call."""
        return functools.partial(self.cast, dtype=dtype)

    def check(self, ops: Iterable[Op]) -> None:
        """Fail before running when an op has no lowering here, naming the op and its line.

        Piecewise and host ops are run by the executor itself, so they need none.
        """
        for op in ops:
            traits = prims.get(op.prim).traits
            if traits.piecewise or traits.host or self.has_lowering(op.prim):
                continue
            raise BackendError(
                f"primitive {op.prim!r} has no {self.name} lowering; it is used by {op.where()}"
            )

    def asarray(self, value: Any) -> Any:
        raise NotImplementedError

    def to_numpy(self, value: Any) -> np.ndarray:
        raise NotImplementedError

    def stack(self, values: list[Any]) -> Any:
        raise NotImplementedError

    def nbytes(self, value: Any) -> int:
        """Bytes of a value: an array, or a tuple or list of them (an env step's outputs,
        summed in a loop, not a generator: the meter counts them at every step)."""
        leaf = self.array_type
        if type(value) is leaf:  # nearly every call: before the checks below
            return value.nbytes
        if isinstance(value, (tuple, list)):
            total = 0
            for v in value:
                total += v.nbytes if type(v) is leaf else self.nbytes(v)
            return total
        return int(getattr(value, "nbytes", 0))

    def broadcast(self, value: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        raise NotImplementedError

    def copy(self, value: Any) -> Any:
        """A value with a buffer of its own (a constant a donation will write into)."""
        raise NotImplementedError

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        raise NotImplementedError

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """An array whose values are never read before they are written (a block store's)."""
        return self.zeros(shape, dtype)

    def truth(self, value: Any) -> bool:
        return bool(self.to_numpy(value).all())

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        yield

    def device_peak_bytes(self) -> int | None:
        """The accelerator allocator's own peak since ``reset_device_peak``; None on the host."""
        return None

    def reset_device_peak(self) -> None:
        """Start ``device_peak_bytes`` afresh (each run does)."""

    # Where a block swapped out under a memory budget goes: "disk" (files, read back
    # explicitly) where the arrays already live in host memory; "host" for an accelerator,
    # whose next tier is the host's memory (``to_host``/``from_host``).
    swap_tier = "disk"

    def to_host(self, value: Any) -> Any:
        """A host-memory copy of ``value`` to hold while it is swapped out (``swap_tier``
        "host"); the copy may still be in flight when this returns."""
        raise BackendError(f"the {self.name} backend on {self.device!r} swaps to disk")

    def from_host(self, value: Any) -> Any:
        """``to_host``'s copy back on the device, ordered before any later kernel."""
        raise BackendError(f"the {self.name} backend on {self.device!r} swaps to disk")

    def fuse(self, key: Hashable, fn: Callable[..., tuple]) -> Callable[..., tuple]:
        """``fn(static, *arrays)`` (pure: a tuple of arrays out) compiled as one unit, cached
        by ``key`` for this backend's life, ``static`` a hashable its trace may depend on;
        only backends with ``fuses`` implement it."""
        raise BackendError(f"the {self.name} backend does not compile regions")

    def region_stats(self) -> dict[str, Any] | None:
        """Counts and seconds of region compilation, for ``prog.stats()``; None if none."""
        return None


# RL-sized kernels are small, and a multi-threaded BLAS on a busy 2-core machine spends more
# time waking threads than multiplying (measured: 935 us vs 8 us per 8x4x64 matmul); pixel
# policies' kernels are large (a Nature-CNN minibatch's convolutions: 0.5-2 * 10^9 operations
# each), and on one thread they leave the other cores idle (eager PyTorch's Pong PPO ran 1.4x
# faster on two threads than on one). So a program runs on every core it may use where its
# largest kernel is at least this many operations, else on one thread. A rollout step's
# kernels (an 8-frame Nature CNN's first convolution: 5 * 10^7) stay below it.
PARALLEL_MIN_OPS = 1e8


def usable_cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1


def program_threads(largest_kernel: float) -> int:
    """The math threads a program runs on, by its largest kernel's operations
    (``compiler.fusion_regions.largest_kernel``), where none were asked for."""
    return usable_cores() if largest_kernel >= PARALLEL_MIN_OPS else 1


_CONTROLLER: list[Any] = []  # [(threadpoolctl controller, modules loaded when it was made)]


def math_threads(limits: int, user_api: str | None = None) -> contextlib.AbstractContextManager:
    """Cap the math libraries' threads (BLAS, OpenMP) while a program runs.

    ``threadpoolctl.threadpool_limits`` finds the libraries afresh on every call by walking
    every loaded shared object: 0.1-0.8 ms a run, paid in its first iteration (an eighth of
    the first iteration's excess over the steady one on CartPole). The libraries found are
    kept for as long as no module was imported since, which is when a new one could load.
    """
    from threadpoolctl import ThreadpoolController

    if not _CONTROLLER or _CONTROLLER[0][1] != len(sys.modules):
        _CONTROLLER[:] = [(ThreadpoolController(), len(sys.modules))]
    return _CONTROLLER[0][0].limit(limits=limits, user_api=user_api)


# name -> (module, class, the package it needs and the extra that installs it)
BACKENDS: dict[str, tuple[str, str, str | None, str | None]] = {
    "numpy": ("timerl.runtime.numpy_backend", "NumpyBackend", None, None),
    "torch": ("timerl.runtime.torch_backend", "TorchBackend", "torch", "torch"),
    "jax": ("timerl.runtime.jax_backend", "JaxBackend", "jax", "jax"),
}


def backend_class(name: str) -> type[Backend]:
    """The class of backend ``name``, imported only now (so numpy never imports torch)."""
    try:
        module, cls, needs, extra = BACKENDS[name]
    except KeyError:
        raise BackendError(f"unknown backend {name!r}; choose one of {sorted(BACKENDS)}") from None
    if needs is not None and importlib.util.find_spec(needs) is None:
        raise BackendError(
            f"backend {name!r} needs the {needs!r} package: pip install 'timerl[{extra}]'"
        )
    return getattr(importlib.import_module(module), cls)


def make_backend(name: str, device: str = "cpu", threads: int | None = 1) -> Backend:
    return backend_class(name)(device, threads)
