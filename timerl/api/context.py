"""Context: the dims of a program, its piecewise definitions, sinks and dynamic bounds."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from timerl.api.program import Program
from timerl.api.roles import Declarations
from timerl.api.scope import Scope, current
from timerl.api.tensor import RecurrentTensor, branch_condition, lift
from timerl.compiler.fusion_regions import largest_kernel
from timerl.compiler.options import CompileOptions
from timerl.compiler.pipeline import compile as compile_program
from timerl.compiler.spec import freeze
from timerl.errors import BoundError, CycleError, ProgramError, ShapeError
from timerl.ir import prims
from timerl.ir.autodiff import depends_differentiably
from timerl.ir.build import apply, ordered, user_site
from timerl.ir.graph import Edge, Op, View
from timerl.ir.retime import retime
from timerl.ir.shapes import broadcast
from timerl.memory.replay import parse_bytes
from timerl.runtime.backend import make_backend, program_threads
from timerl.symbolic import Bound, Dim, Expr, Slice


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """CPython's cyclic collector paused while compiling.

    Compiling builds tens of thousands of objects that live as long as the program (ops,
    edges, index expressions, the generated code), and the collector re-traverses the
    survivors every few hundred allocations: in a PPO compile, 17 collections of the middle
    generation and one full one, about 50 ms, a tenth of compiling. The garbage cycles
    compiling leaves are collected by the collector's next run after it (explicit
    ``gc.collect()`` calls still run while it is paused)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Context(Scope):
    """The dims of a program (outer first) and everything defined over them."""

    def __init__(self, dims: Sequence[str] = ("t",)) -> None:
        if isinstance(dims, str):
            dims = (dims,)
        if len(set(dims)) != len(dims) or not dims:
            raise ProgramError(f"a context needs distinct dim names, got {dims!r}")
        self.dims: tuple[Dim, ...] = tuple(Dim(n) for n in dims)
        self.bounds: tuple[Bound, ...] = tuple(d.bound for d in self.dims)
        self._placeholders: list[RecurrentTensor] = []
        self._roots: list[Op] = []
        self._until: dict[Dim, Op] = {}
        self._known_bounds: dict[Bound, tuple[int, str]] = {}
        self._streams = itertools.count()
        self._differentiated: set[int] = set()  # ops some backward() took gradients w.r.t.
        self._gradients: set[int] = set()  # the gradient ops backward() made
        self.declarations = Declarations()

    def next_stream(self) -> int:
        """A number identifying a random op by creation order, stable across rebuilds."""
        return next(self._streams)

    def __enter__(self) -> Context:
        return super().__enter__()

    def __repr__(self) -> str:
        return f"Context(dims=({', '.join(d.name for d in self.dims)}))"

    # --- definitions --------------------------------------------------------------------------
    def _register_placeholder(self, t: RecurrentTensor) -> None:
        self._placeholders.append(t)

    def _grad_leaves(self) -> list[RecurrentTensor]:
        return [t for t in self._placeholders if t.requires_grad]

    def _define(self, target: RecurrentTensor, key: Any, value: Any) -> None:
        op = target.op
        if (
            not prims.get(op.prim).traits.piecewise
            or not target.view.is_identity
            or op.attrs.get("sealed")
        ):
            raise ProgramError(
                f"cannot assign into {target.name}: only tensors made with "
                "RecurrentTensor.placeholder(...) are defined by assignment"
            )
        key = key if isinstance(key, tuple) else (key,)
        site = user_site()
        where = f"assignment to {op.label}" + (f" at {site}" if site else "")
        cond, subst = branch_condition(key, op.domain, where)
        value = lift(value, like=target)
        if value.dtype != op.dtype:
            if not np.can_cast(value.dtype, op.dtype, casting="same_kind") and value.dtype != bool:
                raise ShapeError(f"{where}: value of dtype {value.dtype} does not fit {op.dtype}")
            value = value.to(op.dtype)
        view = value.view
        if view.op.attrs.get("adopt_domain") and not view.op.domain and not view.op.inputs:
            # A side effect with no inputs (env.reset()) runs once per point of the dims the
            # assignment moves along: obs[i, 0] = env.reset() resets at every i.
            dims = tuple(d for d in op.domain if d in subst[d].symbols())
            view.op.domain = dims
            view = View(view.op, dims)
            value = RecurrentTensor(view, self)
        index = tuple(i.substitute(subst) for i in view.index)
        branch = retime(View(view.op, index), op)
        extra = branch.dims - set(op.domain)
        if extra:
            raise ProgramError(
                f"{where}: the value depends on dims "
                f"{sorted(d.name for d in extra)} outside its domain {[d.name for d in op.domain]}"
            )
        try:
            shape = branch.shape
            if broadcast(shape, op.shape) != op.shape:
                raise ShapeError("")
        except ShapeError:
            raise ShapeError(
                f"{where}: value of shape {tuple(view.shape)} does not match "
                f"its declared shape {tuple(op.shape)}"
            ) from None
        if op.id in self._differentiated and depends_differentiably(
            branch.op, op, frozenset(self._gradients)
        ):
            raise CycleError(
                f"{where}: {op.label} already has a gradient (backward() was called), and this "
                f"definition reads {op.label} without .detach(): its gradient would depend on "
                f"itself. Read the previous value detached (e.g. {op.label}.detach() - lr * "
                f"{op.label}.grad), as tl.optim does"
            )
        op.inputs.append(Edge(branch.op, branch.index, cond))

    def until(self, dim: Dim, done: RecurrentTensor) -> None:
        """End ``dim`` at the first point where the scalar bool ``done`` holds (included)."""
        if dim not in self.dims:
            raise ProgramError(f"until: {dim} is not a dim of this context")
        if dim in self._until:
            raise ProgramError(f"until: dim {dim.name} already has a stop condition")
        if dim not in done.domain:
            raise ProgramError(f"until: the stop condition {done.name} must vary over {dim.name}")
        if done.dtype != np.dtype(bool) or done.ndim != 0:
            raise ShapeError(
                f"until: the stop condition {done.name} must be a scalar bool, got shape "
                f"{done.shape} and dtype {done.dtype} (reduce it, e.g. done.all())"
            )
        op = materialize(done)
        self._until[dim] = op
        self._roots.append(op)

    def sink(
        self, tensor: RecurrentTensor, fn: Callable[[np.ndarray, dict[str, int]], Any]
    ) -> None:
        """Call ``fn(value, point)`` with the value at every point, in schedule order."""
        if not callable(fn):
            raise ProgramError(
                f"sink({tensor.name}): fn must be callable as fn(value, point), "
                f"got {type(fn).__name__}"
            )
        dims = tensor.domain

        def call(value: np.ndarray, point: tuple[int, ...]) -> None:
            fn(value, {d.name: p for d, p in zip(dims, point, strict=True)})

        out = apply(
            "udf",
            tensor.view,
            fn=call,
            shape=(),
            dtype=np.dtype(bool),
            effect=True,
            pass_point=True,
        )
        out.op.name = f"sink({tensor.name})"
        self._roots.append(out.op)

    def add_root(self, op: Op) -> None:
        """Keep a side-effecting op in the program even if no output reads it."""
        self._roots.append(op)

    def _note_bound(self, bound: Bound, value: int, why: str) -> None:
        seen = self._known_bounds.get(bound)
        if seen is not None and seen[0] != value:
            raise BoundError(f"{bound.name} is {seen[0]} ({seen[1]}) but {value} ({why})")
        self._known_bounds[bound] = (value, why)

    # --- compiling ----------------------------------------------------------------------------
    def resolve_bounds(self, bounds: Mapping[Bound | str, int] | None) -> tuple[dict, dict]:
        """Split user bounds into static values and dynamic caps; check names and values."""
        by_name = {b.name: b for b in self.bounds}
        static: dict[Bound, int] = {}
        for key, value in (bounds or {}).items():
            bound = by_name.get(key) if isinstance(key, str) else key
            if bound not in self.bounds:
                raise BoundError(f"unknown bound {key!r}; this context has {sorted(by_name)}")
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise BoundError(f"bound {bound.name} must be a positive int, got {value!r}")
            static[bound] = int(value)
        for bound, (value, why) in self._known_bounds.items():
            if bound in static and static[bound] != value:
                raise BoundError(f"{bound.name}={static[bound]} given, but it is {value} ({why})")
            static.setdefault(bound, value)
        dynamic = {d.bound: static.pop(d.bound, None) for d in self._until}
        return static, dynamic

    def compile(
        self,
        bounds: Mapping[Bound | str, int] | None = None,
        backend: str = "numpy",
        device: str = "cpu",
        seed: int = 0,
        outputs: Sequence[RecurrentTensor] = (),
        memory_budget: int | str | None = None,
        optimize: bool = True,
        options: CompileOptions | None = None,
    ) -> Any:
        """Compile the program (its sinks, side effects and ``outputs``) for these bounds.

        ``optimize=False`` keeps only the passes correctness needs and runs each statement of
        the schedule on its own: the reference that optimised programs are tested against. ``memory_budget`` (bytes,
        or a string such as ``"256MiB"``): a program whose planned peak memory exceeds it is
        refused here with ``MemoryBudgetError``, naming the smallest budget that fits.
        ``options`` (``tl.CompileOptions``) switches single passes off or runs computations
        over many rows in blocks; its ``optimize`` and ``memory_budget`` are this call's."""
        return self._compile(
            bounds, backend, device, seed, outputs, memory_budget, optimize, options
        )

    @collector_paused()
    def _compile(
        self,
        bounds: Mapping[Bound | str, int] | None,
        backend: str,
        device: str,
        seed: int,
        outputs: Sequence[RecurrentTensor],
        memory_budget: int | str | None,
        optimize: bool,
        options: CompileOptions | None = None,
        effects: bool = True,
    ) -> Program:
        start = time.perf_counter()
        budget = None if memory_budget is None else parse_bytes(memory_budget)
        options = dataclasses.replace(
            options or CompileOptions(), optimize=optimize, memory_budget=budget
        )
        static, dynamic = self.resolve_bounds(bounds)
        _check_tensors("compile: outputs", outputs, self)
        asked = [materialize(t) for t in outputs]
        roots = list(self._roots) if effects else list(self._until.values())
        spec = freeze(roots, asked, self.dims, self._until, static, dynamic)
        be = make_backend(backend, device)
        compiled = compile_program(spec, options, be.capabilities)
        threads = options.threads
        if threads is None:
            threads = program_threads(largest_kernel(compiled.spec.ops, spec.static))
        be.use_threads(threads)
        parameters = tuple(t.op.id for t in self._grad_leaves())
        return Program(
            compiled,
            be,
            seed=seed,
            output_ids={id(t.view): op.id for t, op in zip(outputs, asked, strict=True)},
            started=start,
            declared=self.declarations.frozen(parameters),
        )


def _check_tensors(what: str, tensors: Sequence[Any], ctx: Any = None) -> Any:
    """Each of ``tensors`` a RecurrentTensor of ``ctx`` (without one, of the first tensor's):
    a value of another kind, or a tensor of another context (whose dims and bounds are not
    this one's), named by its position before anything reads it. Returns the context."""
    for k, t in enumerate(tensors):
        if not isinstance(t, RecurrentTensor):
            raise ProgramError(
                f"{what}[{k}] is a {type(t).__name__}, not a RecurrentTensor; wrap arrays "
                "with tl.from_numpy inside the context"
            )
        if ctx is None:
            ctx = t.ctx
        elif t.ctx is not ctx:
            raise ProgramError(
                f"{what}[{k}] ({t.op.where()}) belongs to another tl.Context than the one "
                "compiling it; a program's tensors all come from one context"
            )
    return ctx


def materialize(t: RecurrentTensor) -> Op:
    """The op holding exactly ``t``'s values (a copy op for a non-identity view)."""
    if t.view.is_identity:
        return t.op
    return apply("identity", t.view).op


def from_numpy(
    array: Any,
    domain: Sequence[Dim] = (),
    requires_grad: bool = False,
    dtype: Any = None,
    name: str | None = None,
) -> RecurrentTensor:
    """A tensor from an array whose leading axes index ``domain`` (and fix those bounds)."""
    ctx = current()
    arr = np.asarray(array)
    if dtype is not None:
        arr = arr.astype(dtype)
    elif arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    domain = tuple(domain)
    if ordered(set(domain)) != domain:
        raise ProgramError(f"from_numpy: domain {domain} must list distinct dims in context order")
    if arr.ndim < len(domain):
        raise ShapeError(f"from_numpy: array of shape {arr.shape} cannot index domain {domain}")
    for k, d in enumerate(domain):
        ctx._note_bound(
            d.bound, arr.shape[k], f"from_numpy array{(' ' + name) if name else ''} axis {k}"
        )
    whole = RecurrentTensor(apply("const", value=arr), ctx)
    value = whole
    for d in domain:
        value = RecurrentTensor(apply("select_at", value.view, index=d), ctx)
    out = RecurrentTensor.placeholder(
        arr.shape[len(domain) :], arr.dtype, domain, requires_grad, name
    )
    out[True] = value
    out.op.attrs["sealed"] = True
    return out


def index_of(view: View, dim: Dim) -> Expr | Slice:
    return view.index[view.op.domain.index(dim)]


def evaluate(
    tensors: Sequence[RecurrentTensor] | RecurrentTensor,
    bounds: Mapping[Bound | str, int] | None = None,
    backend: str = "numpy",
    device: str = "cpu",
    seed: int = 0,
    optimize: bool = True,
    options: CompileOptions | None = None,
) -> list[Any] | Any:
    """Compile and run just what ``tensors`` need; return their values as numpy.

    ``optimize=False`` runs the unoptimised reference (only the passes correctness needs,
    each statement run on its own); ``options`` as for ``Context.compile``."""
    single = isinstance(tensors, RecurrentTensor)
    items = [tensors] if single else list(tensors)
    if not items:
        raise ProgramError("evaluate: no tensors given")
    ctx = _check_tensors("evaluate: tensors", items)
    if not isinstance(ctx, Context):
        raise ProgramError("evaluate: tensors must belong to a tl.Context")
    prog = ctx._compile(
        bounds, backend, device, seed, items, None, optimize, options, effects=False
    )
    prog.run()
    values = [prog.value(t) for t in items]
    return values[0] if single else values
