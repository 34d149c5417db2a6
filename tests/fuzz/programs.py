"""Random valid recurrence programs, each with a timerl builder and an independent evaluator.

A program is a small tree of plain Python objects: inputs (numpy arrays over some of the
context's dims), derived tensors (``y = expr``) and piecewise placeholders (a list of branches,
each an index or condition write and an expression). The same tree is

- built into a timerl program (``Program.build``),
- printed as runnable timerl source (``Program.source``), the reproducer of a failure, and
- evaluated point by point by ``Reference``, a memoised lazy interpreter written here against
  numpy or torch (torch only for autograd gradients), which knows nothing of timerl: each point
  of a placeholder takes the first branch that matches it, and reads are plain array indexing.

The expressions are in ``exprs.py`` (their array operations in ``arrays.py``), the generator
that draws valid programs in ``generator.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from arrays import NumpyOps, TorchOps
from exprs import DIM_BOUND, Expr, Read, Spec, nodes

# the value of an input's rows past the point where ``until`` ends t: far outside the (-1, 1)
# of the rows a program reads, so a read past the end shows in the values
PAST = 7.0

# --------------------------------------------------------------------------- tensors


@dataclass(frozen=True)
class Write:
    """Where a branch writes: per dim ``cur`` (d), ``shift`` (d + k, k of either sign),
    ``const`` (k) or ``last`` (D - 1 - k).

    ``x[t + k] = v`` writes point ``p`` with ``v`` read at ``t = p - k``; it applies where
    both ``p`` and ``p - k`` exist. A constant point outside ``0 .. D - 1`` (``x[2]`` with
    ``T = 2``, ``x[T - 2]`` with ``T = 1``) is a branch that applies to no point.
    """

    specs: tuple[Spec, ...]

    def match(self, point: tuple, dims: tuple, n: dict) -> dict | None:
        env = {}
        for d, s, p in zip(dims, self.specs, point, strict=True):
            if s.kind == "cur":
                env[d] = p
            elif s.kind == "shift":
                if not 0 <= p - s.k < n[d]:
                    return None
                env[d] = p - s.k
            elif s.kind == "const":
                if p != s.k:
                    return None
                env[d] = p
            elif s.kind == "last":
                if p != n[d] - 1 - s.k:
                    return None
                env[d] = p
            else:
                raise AssertionError(s.kind)
        return env

    def key(self, b: Builder, dims: tuple) -> Any:
        key = tuple(
            s.build(b.sym[d], b.big[d], b.tl) for d, s in zip(dims, self.specs, strict=True)
        )
        return key if len(key) > 1 else key[0]

    def source(self, dims: tuple) -> str:
        return ", ".join(s.source(d) for d, s in zip(dims, self.specs, strict=True))


@dataclass(frozen=True)
class Cond:
    """A condition write: ``d.eq(0)``, ``d.eq(D - 1)``, ``d < k``, ``(i + t).eq(k)``, ``True``."""

    kind: str
    d: str = "t"
    k: int = 0

    def holds(self, env: dict, n: dict) -> bool:
        if self.kind == "true":
            return True
        if self.kind == "eq0":
            return env[self.d] == 0
        if self.kind == "eqlast":
            return env[self.d] == n[self.d] - 1
        if self.kind == "lt":
            return env[self.d] < self.k
        if self.kind == "sum_eq":
            return env["i"] + env["t"] == self.k
        raise AssertionError(self.kind)

    def match(self, point: tuple, dims: tuple, n: dict) -> dict | None:
        env = dict(zip(dims, point, strict=True))
        return env if self.holds(env, n) else None

    def key(self, b: Builder, dims: tuple) -> Any:
        if self.kind == "true":
            return True
        d, big = b.sym.get(self.d), b.big.get(self.d)
        if self.kind == "eq0":
            return d.eq(0)
        if self.kind == "eqlast":
            return d.eq(big - 1)
        if self.kind == "lt":
            return d < self.k
        return (b.sym["i"] + b.sym["t"]).eq(self.k)

    def source(self, dims: tuple) -> str:
        big = DIM_BOUND.get(self.d)
        return {
            "true": "True",
            "eq0": f"{self.d}.eq(0)",
            "eqlast": f"{self.d}.eq({big} - 1)",
            "lt": f"{self.d} < {self.k}",
            "sum_eq": f"(i + t).eq({self.k})",
        }[self.kind]


@dataclass
class TensorDef:
    """An input (``array``), a derived tensor (``expr``) or a placeholder (``branches``)."""

    name: str
    domain: tuple[str, ...]
    shape: tuple[int, ...]
    array: np.ndarray | None = None
    expr: Expr | None = None
    branches: list[tuple[Write | Cond, Expr]] = field(default_factory=list)
    construct: str = "input"
    group: str = ""  # placeholders defined together (coupled recurrences) share a group
    linear: bool = False  # a fwd_cond/bwd_cond recurrence with a linear step (flag "linear")

    @property
    def kind(self) -> str:
        if self.array is not None:
            return "input"
        return "derived" if self.expr is not None else "placeholder"


def _forward(t: TensorDef) -> bool:
    """Whether ``t`` is a forward recurrence of more than one step or tensor (two-step,
    coupled, or written at ``t + k``)."""
    if t.construct in ("two_step", "coupled"):
        return True
    shifts = [s for w, _ in t.branches if isinstance(w, Write) for s in w.specs]
    return t.construct == "frame" and any(s.kind == "shift" and s.k > 0 for s in shifts)


# --------------------------------------------------------------------------- program


class Builder:
    """State while building the timerl program: symbols, bounds, tensors by name."""

    def __init__(self, tl: Any, ctx: Any) -> None:
        self.tl = tl
        self.ctx = ctx
        self.sym = {s.name: s for s in ctx.dims}
        self.big = {d: b for d, b in zip(self.sym, ctx.bounds, strict=True)}
        self.tensors: dict[str, Any] = {}
        # what each sink received: tensor name -> [(point as a tuple over its dims, value)]
        self.sunk: dict[str, list[tuple[tuple[int, ...], np.ndarray]]] = {}

    def recorder(self, name: str) -> Callable[[Any, dict[str, int]], None]:
        got = self.sunk.setdefault(name, [])

        def record(value: Any, point: dict[str, int]) -> None:
            got.append((tuple(point.values()), np.array(value, dtype=np.float64)))

        return record

    def host(self, v: Any) -> Any:
        """``v`` through a host function marked as an effect (an env step's kind of call)."""
        out = self.tl.api.functional.apply(
            "udf",
            v.view,
            fn=host_function,
            shape=tuple(v.shape),
            dtype=np.dtype("float64"),
            effect=True,
            name="host",
        )
        self.ctx.add_root(out.op)
        return self.tl.RecurrentTensor(out, self.ctx)


def host_function(a: Any) -> np.ndarray:
    return np.tanh(np.asarray(a, dtype=np.float64)) * 0.5


class Reference:
    """The independent evaluator: each point computed on demand, memoised, first branch wins.

    With per-episode lengths (``Program.lengths``) ``T`` is the length of the episode being
    computed: a tensor over i sets it from its point, and one without i (a schedule over t
    alone) computes its points for the episode that reads them.
    """

    def __init__(self, program: Program, xp: Any, leaves: dict[str, Any]) -> None:
        self.program = program
        self.xp = xp
        self.leaves = leaves
        self.memo: dict[tuple, Any] = {}
        self.lengths = program.lengths
        self.sizes = [dict(program.n)]  # the sizes of the dims for the episode being computed

    @property
    def n(self) -> dict[str, int]:
        return self.sizes[-1]

    def value(self, t: TensorDef, point: tuple) -> Any:
        if self.lengths is None:
            return self._value(t, point, (t.name, point))
        if "i" not in t.domain:  # computed for the episode that reads it
            return self._value(t, point, (t.name, point, self.n["t"]))
        episode = point[t.domain.index("i")]
        if not 0 <= episode < self.program.n["i"]:
            raise IndexError(f"generator bug: {t.name} read at {point}, outside its domain")
        self.sizes.append({**self.program.n, "t": self.lengths[episode]})
        try:
            return self._value(t, point, (t.name, point))
        finally:
            self.sizes.pop()

    def _value(self, t: TensorDef, point: tuple, key: tuple) -> Any:
        if not all(0 <= p < self.n[d] for d, p in zip(t.domain, point, strict=True)):
            raise IndexError(f"generator bug: {t.name} read at {point}, outside its domain")
        if key in self.memo:
            return self.memo[key]
        if t.kind == "input":
            v = self.leaves[t.name][point]
        elif t.kind == "derived":
            v = t.expr.ev(self, dict(zip(t.domain, point, strict=True)))
        else:
            for where, expr in t.branches:
                env = where.match(point, t.domain, self.n)
                if env is not None:
                    v = expr.ev(self, env)
                    break
            else:
                raise AssertionError(f"generator bug: {t.name}{point} undefined")
        if self.xp.name != "torch":
            v = np.broadcast_to(np.asarray(v, dtype=np.float64), t.shape)
        else:
            torch = self.xp.torch
            v = torch.as_tensor(v, dtype=torch.float64).expand(t.shape)
        self.memo[key] = v
        return v

    def whole(self, t: TensorDef) -> Any:
        """All points of ``t``, domain axes leading (as ``tl.evaluate`` returns them); with
        per-episode lengths, a tensor over (i, t) is a list of each episode's points."""
        if self.lengths is not None and "t" in t.domain:
            assert t.domain == ("i", "t"), f"generator bug: {t.name} over t without i"
            return [
                self.xp.stack([self.value(t, (k, q)) for q in range(n)], t.shape)
                for k, n in enumerate(self.lengths)
            ]
        points = list(itertools.product(*(range(self.n[d]) for d in t.domain)))
        items = [self.value(t, p) for p in points]
        full = self.xp.stack(items, t.shape)
        return full.reshape(tuple(self.n[d] for d in t.domain) + t.shape)


@dataclass
class Program:
    dims: tuple[str, ...]
    n: dict[str, int]
    tensors: list[TensorDef]
    grad: bool = False
    sinks: tuple[str, ...] = ()  # tensors whose every point a sink receives
    # t ends by ``ctx.until`` at its last point ``n["t"] - 1``, with a cap this many points
    # further: inputs over t get that many more rows (``PAST``, never read), and a ``stop``
    # input is 1 at the end (None: t is static)
    until: int | None = None
    # the stop also reads a value without t taken from a point of an input over t (``(stop -
    # 0.5) * (w[0] + 1) > 0``, w in (0.5, 1.5)): what the stop needs from before its loop
    # that reads a loop's point runs inside the stopping loop, at that point
    until_reads_a_point: bool = False
    # with ``until`` on (i, t): each i ends t after its own number of points (``n["t"]`` to
    # ``n["t"] + until``), the stop condition over (i, t); inputs over t get rows of their own
    # up to the longest episode (``ragged_rows``), then ``PAST`` (None: one length for all)
    lengths: tuple[int, ...] | None = None

    def __repr__(self) -> str:
        return f"<program using {', '.join(sorted(self.used)) or 'no flagged construct'}>"

    @property
    def inputs(self) -> list[TensorDef]:
        return [t for t in self.tensors if t.kind == "input"]

    @property
    def outputs(self) -> list[TensorDef]:
        return [t for t in self.tensors if t.kind != "input"]

    @property
    def loss_of(self) -> TensorDef:
        return self.outputs[-1]

    @property
    def used(self) -> frozenset[str]:
        """The generator flags whose constructs appear in this program."""
        out = {t.construct for t in self.outputs} - {"derived"}
        if len(self.dims) == 2:
            out.add("two_dims")
        if any(t.shape for t in self.tensors):
            out.add("spatial")
        if any(t.linear for t in self.tensors):
            out.add("linear")
        if self.sinks:
            out.add("sink")
        if self.until is not None:
            out.add("until")
        if self.lengths is not None:
            out.add("ragged")
        for t in self.tensors:
            exprs = ([t.expr] if t.expr is not None else []) + [e for _, e in t.branches]
            for e in exprs:
                out |= e.flags()
            for where, e in t.branches:
                out |= self._branch_flags(t, where, e)
        if min(self.n.values()) == 1:
            out.add("bound_one")
        return frozenset(out)

    def _branch_flags(self, t: TensorDef, where: Write | Cond, e: Expr) -> set[str]:
        """What a branch shows: a point past the bound, reads of a pinned dim, a whole-range
        reduction in a base case, a scalar written to a spatial tensor, a backward step
        reading a forward recurrence."""
        out = {"broadcast"} if e.shape != t.shape else set()
        reads = [node for node in nodes(e) if isinstance(node, Read)]
        back = t.construct in ("bwd_cond", "overlap") or (
            isinstance(where, Write) and any(s.kind == "shift" and s.k < 0 for s in where.specs)
        )
        if back and any(_forward(r.src) for r in reads if r.src is not t):
            out.add("chain")
        if not isinstance(where, Write):
            return out
        pinned = {}
        for d, s in zip(t.domain, where.specs, strict=True):
            if s.kind == "shift" and s.k < 0:
                out.add("frame")
            if s.kind in ("const", "last"):
                pinned[d] = s
                point = s.k if s.kind == "const" else self.n[d] - 1 - s.k
                if not 0 <= point < self.n[d]:
                    out.add("empty_branch")
        for r in reads:
            for d, s in zip(r.src.domain, r.specs, strict=True):
                if d in pinned and not s.constant:
                    out.add("at_point")
                if d in pinned and s.kind == "full":
                    out.add("whole_base")
        return out

    # -- timerl
    def build(self, tl: Any) -> tuple[Any, Builder, Any]:
        """The timerl program: (context, builder with tensors by name, loss or None)."""
        ctx = tl.Context(dims=self.dims)
        b = Builder(tl, ctx)
        loss = None
        with ctx:
            for t in self.tensors:
                if t.name in b.tensors:
                    continue
                if t.kind == "input":
                    b.tensors[t.name] = tl.from_numpy(
                        self.padded(t),
                        domain=tuple(b.sym[d] for d in t.domain),
                        requires_grad=self.grad,
                        dtype="float64",
                        name=t.name,
                    )
                elif t.kind == "derived":
                    b.tensors[t.name] = t.expr.build(b)
                else:
                    group = self.group_of(t)
                    for g in group:
                        b.tensors[g.name] = tl.RecurrentTensor.placeholder(
                            g.shape,
                            dtype="float64",
                            domain=tuple(b.sym[d] for d in g.domain),
                            name=g.name,
                        )
                    for g in group:
                        for where, expr in g.branches:
                            b.tensors[g.name][where.key(b, g.domain)] = expr.build(b)
            for name in self.sinks:
                ctx.sink(b.tensors[name], b.recorder(name))
            if self.until is not None:
                over = tuple(b.sym[d] for d in self.stop_domain)
                stop = tl.from_numpy(self.stop_marker(), domain=over, name="stop")
                if self.until_reads_a_point:
                    w = tl.from_numpy(self.stop_weights(), domain=(b.sym["t"],), name="w")
                    ctx.until(b.sym["t"], (stop - 0.5) * (w[0] + 1.0) > 0.0)
                else:
                    ctx.until(b.sym["t"], stop > 0.5)
            if self.grad:
                z = b.tensors[self.loss_of.name]
                loss = (z * z).sum()
                loss.backward()
        return ctx, b, loss

    def group_of(self, t: TensorDef) -> list[TensorDef]:
        """``t`` and the placeholders defined together with it."""
        return [t] + [g for g in self.tensors if g.group and g.group == t.name]

    def bounds(self, b: Builder) -> dict:
        return {b.big[d]: self.cap if d == "t" else self.n[d] for d in self.dims}

    @property
    def cap(self) -> int:
        return self.n["t"] + (self.until or 0)

    @property
    def stop_domain(self) -> tuple[str, ...]:
        return ("i", "t") if self.lengths is not None else ("t",)

    def rows(self, t: TensorDef) -> np.ndarray:
        """An input's values: its array, and with per-episode lengths rows of its own up to the
        longest episode (drawn from the array's values, so the same program draws them
        alike)."""
        if self.lengths is None or "t" not in t.domain:
            return t.array
        axis = t.domain.index("t")
        extra = max(self.lengths) - self.n["t"]
        rng = np.random.RandomState(int(abs(t.array.sum()) * 1e6) % 2**31)
        shape = list(t.array.shape)
        shape[axis] = extra
        return np.concatenate([t.array, rng.uniform(-1.0, 1.0, shape)], axis=axis)

    def padded(self, t: TensorDef) -> np.ndarray:
        """An input's array, with the rows past the stop where t ends by ``until`` (past each
        episode's own end where episodes have lengths of their own)."""
        rows = self.rows(t)
        if self.until is None or "t" not in t.domain:
            return rows
        axis = t.domain.index("t")
        shape = list(rows.shape)
        shape[axis] = self.cap - rows.shape[axis]
        out = np.concatenate([rows, np.full(shape, PAST)], axis=axis)
        if self.lengths is not None and "i" in t.domain:
            at_i = t.domain.index("i")
            for k, n in enumerate(self.lengths):
                index: list = [slice(None)] * out.ndim
                index[at_i], index[axis] = k, slice(n, None)
                out[tuple(index)] = PAST
        return out

    def stop_marker(self) -> np.ndarray:
        """1 at t's last point (``n["t"] - 1``, or each episode's own), 0 before it and after it
        (up to the cap)."""
        if self.lengths is None:
            out = np.zeros(self.cap)
            out[self.n["t"] - 1] = 1.0
            return out
        out = np.zeros((len(self.lengths), self.cap))
        out[range(len(self.lengths)), np.array(self.lengths) - 1] = 1.0
        return out

    def stop_weights(self) -> np.ndarray:
        """``w`` of ``until_reads_a_point``: positive, so the stop holds where the marker does."""
        return np.linspace(0.5, 1.5, self.cap)

    # -- reference
    def reference_values(self) -> dict[str, np.ndarray]:
        leaves = {t.name: self.rows(t) for t in self.inputs}
        ref = Reference(self, NumpyOps, leaves)
        return {t.name: ref.whole(t) for t in self.outputs}

    def reference_grads(self) -> dict[str, np.ndarray]:
        """d/d input of sum over the loss tensor's points of (z * z).sum(), by torch autograd."""
        import torch

        leaves = {
            t.name: torch.tensor(self.rows(t), dtype=torch.float64, requires_grad=True)
            for t in self.inputs
        }
        ref = Reference(self, TorchOps(), leaves)
        z = ref.whole(self.loss_of)
        parts = z if isinstance(z, list) else [z]  # one part per episode (``lengths``)
        total = sum((part * part).sum() for part in parts)
        names = list(leaves)
        if not total.requires_grad:  # the loss reads no input (constant indices into nothing)
            grads = [None] * len(names)
        else:
            grads = torch.autograd.grad(total, [leaves[k] for k in names], allow_unused=True)
        out = {
            k: (np.zeros_like(leaves[k].detach().numpy()) if g is None else g.numpy())
            for k, g in zip(names, grads, strict=True)
        }
        if self.lengths is not None:  # an input over (i, t): each episode's rows
            for t in self.inputs:
                if t.domain == ("i", "t"):
                    out[t.name] = [out[t.name][k, :n] for k, n in enumerate(self.lengths)]
        return out

    # -- reproducer
    def source(self) -> str:
        """The program as runnable timerl source."""
        lines = [
            "import numpy as np",
            "import timerl as tl",
            "",
            f"ctx = tl.Context(dims={self.dims!r})",
            f"({', '.join(self.dims)},), ({', '.join(DIM_BOUND[d] for d in self.dims)},)"
            " = ctx.dims, ctx.bounds",
        ]
        if "host" in self.used:
            lines += [
                "",
                "",
                "def host(x):",
                "    y = tl.api.functional.apply(",
                '        "udf", x.view, fn=lambda a: np.tanh(np.asarray(a, dtype=np.float64)) * 0.5,',
                '        shape=tuple(x.shape), dtype=np.dtype("float64"), effect=True, name="host",',
                "    )",
                "    ctx.add_root(y.op)",
                "    return tl.RecurrentTensor(y, ctx)",
                "",
                "",
            ]
        if "noise" in self.used:
            lines += [
                "",
                "",
                "def noise(shape, like, stream):",
                "    z = tl.randn(shape, like=like)",
                '    z.op.attrs["stream"] = stream',
                "    return z",
                "",
                "",
            ]
        lines.append("with ctx:")
        rg = ", requires_grad=True" if self.grad else ""
        done: set[str] = set()
        for t in self.tensors:
            if t.name in done:
                continue
            if t.kind == "input":
                arr = np.array2string(self.padded(t), separator=", ", precision=17, threshold=10**6)
                arr = " ".join(arr.split())
                dom = ", ".join(t.domain) + ("," if len(t.domain) == 1 else "")
                lines.append(
                    f"    {t.name} = tl.from_numpy(np.array({arr}), domain=({dom}),"
                    f' dtype="float64"{rg})'
                )
            elif t.kind == "derived":
                lines.append(f"    {t.name} = {t.expr.source()}")
            else:
                group = self.group_of(t)
                for g in group:
                    dom = ", ".join(g.domain) + ("," if len(g.domain) == 1 else "")
                    lines.append(
                        f"    {g.name} = tl.RecurrentTensor.placeholder({g.shape!r},"
                        f' dtype="float64", domain=({dom}))'
                    )
                    done.add(g.name)
                for g in group:
                    for where, expr in g.branches:
                        lines.append(f"    {g.name}[{where.source(g.domain)}] = {expr.source()}")
        for name in self.sinks:
            lines.append(
                f'    ctx.sink({name}, lambda value, point: print("{name}", point, value))'
            )
        if self.until is not None:
            stop = " ".join(np.array2string(self.stop_marker(), separator=", ").split())
            over = ", ".join(self.stop_domain) + ("," if len(self.stop_domain) == 1 else "")
            lines.append(f"    stop = tl.from_numpy(np.array({stop}), domain=({over}))")
            if self.until_reads_a_point:
                w = " ".join(np.array2string(self.stop_weights(), separator=", ").split())
                lines.append(f"    w = tl.from_numpy(np.array({w}), domain=(t,))")
                lines.append("    ctx.until(t, (stop - 0.5) * (w[0] + 1.0) > 0.0)")
            else:
                lines.append("    ctx.until(t, stop > 0.5)")
        outs = [t.name for t in self.outputs]
        if self.grad:
            z = self.loss_of.name
            lines.append(f"    loss = ({z} * {z}).sum()")
            lines.append("    loss.backward()")
            outs += [f"{t.name}.grad" for t in self.inputs]
        extent = {d: self.cap if d == "t" else self.n[d] for d in self.dims}
        bounds = ", ".join(f"{DIM_BOUND[d]}: {extent[d]}" for d in self.dims)
        lines.append(f"print(tl.evaluate([{', '.join(outs)}], bounds={{{bounds}}}))")
        return "\n".join(lines)
