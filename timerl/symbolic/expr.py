"""Integer index expressions over dims and bounds.

Every expression is kept in one canonical form: an affine combination of *atoms* (symbols, and
the non-linear nodes min/max/floor-div/mod) plus a constant. Canonical forms make structural
equality (``==``) meaningful and simplification a by-product of construction, which is what the
dependence analysis needs: ``(t + 1) - 1`` *is* ``t``.

Comparisons ``<, <=, >, >=`` build :class:`Condition` objects; ``==`` stays structural equality
so expressions can be dict keys. Use ``e.eq(other)`` / ``e.ne(other)`` for (in)equality
conditions.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Union

from timerl.errors import IndexExprError

ExprLike = Union["Expr", int]

_symbol_ids = itertools.count()


class Expr:
    """Base class: arithmetic builds canonical expressions, comparisons build conditions."""

    __slots__ = ()

    # --- construction -------------------------------------------------------------------------
    def __add__(self, other: ExprLike) -> Expr:
        other = _operand(self, "+", other)
        return other if other is NotImplemented else _add(self, other, 1)

    def __radd__(self, other: ExprLike) -> Expr:
        other = _operand(self, "+", other)
        return other if other is NotImplemented else _add(other, self, 1)

    def __sub__(self, other: ExprLike) -> Expr:
        other = _operand(self, "-", other)
        return other if other is NotImplemented else _add(self, other, -1)

    def __rsub__(self, other: ExprLike) -> Expr:
        other = _operand(self, "-", other)
        return other if other is NotImplemented else _add(other, self, -1)

    def __neg__(self) -> Expr:
        return _scale(self, -1)

    def __mul__(self, other: ExprLike) -> Expr:
        other = _operand(self, "*", other)
        if other is NotImplemented:
            return other
        if isinstance(other, Const):
            return _scale(self, other.value)
        if isinstance(self, Const):
            return _scale(other, self.value)
        raise IndexExprError(
            f"index expressions are affine: cannot multiply {self} by {other} "
            "(use a constant factor, floor division or min/max)"
        )

    __rmul__ = __mul__

    def __truediv__(self, other: object) -> Expr:
        if _operand(self, "/", other) is NotImplemented:
            return NotImplemented
        raise IndexExprError(
            f"{self} / {other!r}: index expressions are integers; use {self} // {other!r} for "
            "an index, or make a tensor of the index first (see tl.full) to divide values"
        )

    __rtruediv__ = __truediv__

    def __floordiv__(self, other: int) -> Expr:
        return floordiv(self, other)

    def __mod__(self, other: int) -> Expr:
        return mod(self, other)

    # --- conditions ---------------------------------------------------------------------------
    def __lt__(self, other: ExprLike) -> Condition:
        return Cmp.make(self - as_expr(other), "<")

    def __le__(self, other: ExprLike) -> Condition:
        return Cmp.make(self - as_expr(other), "<=")

    def __gt__(self, other: ExprLike) -> Condition:
        return Cmp.make(as_expr(other) - self, "<")

    def __ge__(self, other: ExprLike) -> Condition:
        return Cmp.make(as_expr(other) - self, "<=")

    def eq(self, other: ExprLike) -> Condition:
        """The condition ``self == other`` (``==`` itself is structural equality)."""
        return Cmp.make(self - as_expr(other), "==")

    def ne(self, other: ExprLike) -> Condition:
        return Cmp.make(self - as_expr(other), "!=")

    # --- queries ------------------------------------------------------------------------------
    def linear(self) -> tuple[dict[Expr, int], int]:
        """This expression as ``({atom: coefficient}, constant)``."""
        return {self: 1}, 0

    def symbols(self) -> frozenset[Symbol]:
        raise NotImplementedError

    def evaluate(self, env: Mapping[Symbol, int]) -> int:
        raise NotImplementedError

    def source(self, names: Mapping[Symbol, str]) -> str:
        """Python source computing this expression from variables named by ``names``."""
        raise NotImplementedError

    def substitute(self, mapping: Mapping[Symbol, Expr]) -> Expr:
        raise NotImplementedError

    @property
    def is_const(self) -> bool:
        return isinstance(self, Const)

    def __bool__(self) -> bool:
        raise TypeError(
            f"the truth value of index expression {self} is unknown until it is evaluated; "
            "use a timerl condition (t < T) where a branch is meant"
        )


def _operand(expr: Expr, op: str, value: object) -> Expr:
    """The other operand of index arithmetic; NotImplemented for a tensor (so ``t + x`` is the
    tensor's addition), a timerl error for a float: an index is an integer."""
    if isinstance(value, Expr):
        return value
    numpy_float = type(value).__module__ == "numpy" and getattr(
        getattr(value, "dtype", None), "kind", None
    ) in ("f", "c")
    if isinstance(value, (float, complex)) or numpy_float:
        raise IndexExprError(
            f"{expr} {op} {value!r}: {expr} is an integer index expression (a point of its "
            "dims), not a value. To compute with a point's index as a value, combine it with a "
            f"tensor (x * {expr}, x + {expr}: the index becomes a value of x's dtype), or make "
            f"it a tensor first: tl.full((), {expr}, dtype='float32') {op} {value!r}"
        )
    if isinstance(value, bool) or not (isinstance(value, int) or hasattr(value, "__index__")):
        return NotImplemented  # type: ignore[return-value]
    return Const(int(value))  # type: ignore[arg-type]


def as_expr(value: ExprLike) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        raise TypeError("a bool is not an index expression")
    if isinstance(value, int) or hasattr(value, "__index__"):
        return Const(int(value))
    raise TypeError(f"expected an integer index expression, got {type(value).__name__}: {value!r}")


@dataclass(frozen=True, eq=True)
class Const(Expr):
    value: int

    def linear(self) -> tuple[dict[Expr, int], int]:
        return {}, self.value

    def symbols(self) -> frozenset[Symbol]:
        return frozenset()

    def evaluate(self, env: Mapping[Symbol, int]) -> int:
        return self.value

    def source(self, names: Mapping[Symbol, str]) -> str:
        return repr(self.value)

    def substitute(self, mapping: Mapping[Symbol, Expr]) -> Expr:
        return self

    def __repr__(self) -> str:
        return str(self.value)

    __str__ = __repr__


class Symbol(Expr):
    """A named integer variable; identity is the symbol (two dims both called ``t`` differ)."""

    __slots__ = ("name", "uid")

    def __init__(self, name: str) -> None:
        self.name = name
        self.uid = next(_symbol_ids)

    # Identity is equality; object's own (C-level) hash keeps dict lookups by symbol fast.
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def symbols(self) -> frozenset[Symbol]:
        return frozenset((self,))

    def evaluate(self, env: Mapping[Symbol, int]) -> int:
        try:
            return env[self]
        except KeyError:
            raise KeyError(f"no value for symbol {self.name}") from None

    def source(self, names: Mapping[Symbol, str]) -> str:
        return names[self]

    def substitute(self, mapping: Mapping[Symbol, Expr]) -> Expr:
        return mapping.get(self, self)

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__


class Bound(Symbol):
    """The extent of a dim (``T`` for ``t``): its value is fixed at compile or run time."""

    __slots__ = ("dim",)

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.dim: Dim | None = None


class Dim(Symbol):
    """A temporal (or iteration) dimension, ranging over ``0 .. bound - 1``."""

    __slots__ = ("bound",)

    def __init__(self, name: str, bound: Bound | None = None) -> None:
        super().__init__(name)
        self.bound = bound if bound is not None else Bound(name.upper())
        self.bound.dim = self


@dataclass(frozen=True, eq=True)
class Affine(Expr):
    """``sum(coef * atom) + const`` with at least two parts (else it is simplified away)."""

    terms: tuple[tuple[Expr, int], ...]
    const: int

    def linear(self) -> tuple[dict[Expr, int], int]:
        return dict(self.terms), self.const

    def symbols(self) -> frozenset[Symbol]:
        return frozenset().union(*(a.symbols() for a, _ in self.terms))

    def evaluate(self, env: Mapping[Symbol, int]) -> int:
        return sum(c * a.evaluate(env) for a, c in self.terms) + self.const

    def source(self, names: Mapping[Symbol, str]) -> str:
        parts = [f"{c}*{a.source(names)}" if c != 1 else a.source(names) for a, c in self.terms]
        if self.const:
            parts.append(repr(self.const))
        return "(" + " + ".join(parts) + ")"

    def substitute(self, mapping: Mapping[Symbol, Expr]) -> Expr:
        out: Expr = Const(self.const)
        for atom, coef in self.terms:
            out = out + atom.substitute(mapping) * coef
        return out

    def __repr__(self) -> str:
        text = ""
        for atom, coef in self.terms:
            sign = "-" if coef < 0 else "+"
            mag = abs(coef)
            body = f"{mag}*{atom}" if mag != 1 else str(atom)
            text += (f"{sign} " if text else ("-" if coef < 0 else "")) + body + " "
        if self.const:
            text += f"{'-' if self.const < 0 else '+'} {abs(self.const)}"
        return text.strip()

    __str__ = __repr__


def _sort_key(atom: Expr) -> tuple:
    if isinstance(atom, Symbol):
        return (0, atom.uid, "")
    return (1, 0, repr(atom))


def _make(terms: Mapping[Expr, int], const: int) -> Expr:
    items = [(a, c) for a, c in terms.items() if c != 0]
    if not items:
        return Const(const)
    if len(items) == 1:  # most index expressions (``t + 1``): nothing to sort
        if items[0][1] == 1 and const == 0:
            return items[0][0]
        return Affine((items[0],), const)
    items.sort(key=lambda x: _sort_key(x[0]))
    return Affine(tuple(items), const)


# Memoised operations (here and on conditions below): expressions and conditions are
# immutable values, symbols hashed by identity, and compiling asks the same questions again
# and again; index arithmetic, for one, adds 21,589 pairs of expressions in compiling PPO, 96
# of them distinct, and scales 9,772. Bounded, so a long-lived process does not grow without
# limit.
_memo = functools.lru_cache(maxsize=1 << 16)


@_memo
def _add(a: Expr, b: Expr, sign: int) -> Expr:
    ta, ca = a.linear()
    tb, cb = b.linear()
    terms = dict(ta)
    for atom, coef in tb.items():
        terms[atom] = terms.get(atom, 0) + sign * coef
    return _make(terms, ca + sign * cb)


@_memo
def _scale(a: Expr, k: int) -> Expr:
    terms, const = a.linear()
    return _make({atom: c * k for atom, c in terms.items()}, const * k)


# --- non-linear atoms -------------------------------------------------------------------------


@dataclass(frozen=True, eq=True)
class MinMax(Expr):
    """``min(args)`` or ``max(args)``; args are canonical and deduplicated."""

    kind: str  # "min" | "max"
    args: tuple[Expr, ...]

    def symbols(self) -> frozenset[Symbol]:
        return frozenset().union(*(a.symbols() for a in self.args))

    def evaluate(self, env: Mapping[Symbol, int]) -> int:
        values = [a.evaluate(env) for a in self.args]
        return min(values) if self.kind == "min" else max(values)

    def source(self, names: Mapping[Symbol, str]) -> str:
        return f"{self.kind}(" + ", ".join(a.source(names) for a in self.args) + ")"

    def substitute(self, mapping: Mapping[Symbol, Expr]) -> Expr:
        return _minmax(self.kind, [a.substitute(mapping) for a in self.args])

    def __repr__(self) -> str:
        return f"{self.kind}(" + ", ".join(map(str, self.args)) + ")"

    __str__ = __repr__


def _minmax(kind: str, args: Iterable[ExprLike]) -> Expr:
    pick = min if kind == "min" else max
    flat: list[Expr] = []
    args = _drop_dominated(list(map(as_expr, args)), pick)
    for arg in args:
        if isinstance(arg, MinMax) and arg.kind == kind:
            flat.extend(arg.args)
        else:
            flat.append(arg)
    # Flattening can bring comparable arguments together again: compare once more.
    kept = _drop_dominated(flat, pick)
    if len(kept) == 1:
        return kept[0]
    if all(isinstance(a, Const) for a in kept):
        return Const(pick(a.value for a in kept))  # type: ignore[attr-defined]
    return MinMax(kind, tuple(sorted(kept, key=repr)))


def _drop_dominated(args: list[Expr], pick) -> list[Expr]:
    """Of arguments that differ by a constant keep the winner: min(m, m + 1) is m."""
    kept: list[Expr] = []
    for arg in args:
        for j, other in enumerate(kept):
            diff = arg - other
            if isinstance(diff, Const):
                if pick(diff.value, 0) == diff.value and diff.value != 0:
                    kept[j] = arg
                break
        else:
            kept.append(arg)
    return kept


def min_(*args: ExprLike) -> Expr:
    """``tl.min``: the smaller of index expressions."""
    return _minmax("min", args)


def max_(*args: ExprLike) -> Expr:
    """``tl.max``: the larger of index expressions."""
    return _minmax("max", args)


@dataclass(frozen=True, eq=True)
class DivMod(Expr):
    """Floor division or modulo by a positive constant."""

    kind: str  # "//" | "%"
    arg: Expr
    divisor: int

    def symbols(self) -> frozenset[Symbol]:
        return self.arg.symbols()

    def evaluate(self, env: Mapping[Symbol, int]) -> int:
        value = self.arg.evaluate(env)
        return value // self.divisor if self.kind == "//" else value % self.divisor

    def source(self, names: Mapping[Symbol, str]) -> str:
        return f"({self.arg.source(names)} {self.kind} {self.divisor})"

    def substitute(self, mapping: Mapping[Symbol, Expr]) -> Expr:
        sub = self.arg.substitute(mapping)
        return floordiv(sub, self.divisor) if self.kind == "//" else mod(sub, self.divisor)

    def __repr__(self) -> str:
        arg = f"({self.arg})" if isinstance(self.arg, Affine) else str(self.arg)
        return f"({arg} {self.kind} {self.divisor})"

    __str__ = __repr__


def _check_divisor(divisor: object) -> int:
    if isinstance(divisor, Expr):
        divisor = divisor.value if isinstance(divisor, Const) else divisor
    if not isinstance(divisor, int) or isinstance(divisor, bool) or divisor <= 0:
        raise IndexExprError(f"index division needs a positive integer constant, got {divisor!r}")
    return divisor


def floordiv(arg: ExprLike, divisor: int) -> Expr:
    arg, divisor = as_expr(arg), _check_divisor(divisor)
    if divisor == 1:
        return arg
    if isinstance(arg, Const):
        return Const(arg.value // divisor)
    terms, const = arg.linear()
    if all(c % divisor == 0 for c in terms.values()):
        # (k*d*x + c) // d == k*x + c // d exactly.
        return _make({a: c // divisor for a, c in terms.items()}, 0) + const // divisor
    return DivMod("//", arg, divisor)


def mod(arg: ExprLike, divisor: int) -> Expr:
    arg, divisor = as_expr(arg), _check_divisor(divisor)
    if divisor == 1:
        return Const(0)
    if isinstance(arg, Const):
        return Const(arg.value % divisor)
    terms, const = arg.linear()
    reduced = {a: c % divisor for a, c in terms.items()}
    if not any(reduced.values()):
        return Const(const % divisor)
    return DivMod("%", _make(reduced, const % divisor), divisor)


# --- conditions -------------------------------------------------------------------------------


class Condition:
    """A boolean predicate over symbols; combine with ``&``, ``|`` and ``~``."""

    __slots__ = ()

    def __and__(self, other: Condition | bool) -> Condition:
        return _both(self, as_condition(other))

    __rand__ = __and__

    def __or__(self, other: Condition | bool) -> Condition:
        return _either(self, as_condition(other))

    __ror__ = __or__

    def __invert__(self) -> Condition:
        return Not.make(self)

    def evaluate(self, env: Mapping[Symbol, int]) -> bool:
        raise NotImplementedError

    def symbols(self) -> frozenset[Symbol]:
        raise NotImplementedError

    def source(self, names: Mapping[Symbol, str]) -> str:
        raise NotImplementedError

    def substitute(self, mapping: Mapping[Symbol, Expr]) -> Condition:
        raise NotImplementedError

    def __bool__(self) -> bool:
        raise TypeError(
            f"condition {self} has no truth value until evaluated at a point; "
            "use it as an index (x[t < 5] = ...) or with tl.where"
        )


@dataclass(frozen=True, eq=True)
class Literal(Condition):
    value: bool

    def evaluate(self, env: Mapping[Symbol, int]) -> bool:
        return self.value

    def symbols(self) -> frozenset[Symbol]:
        return frozenset()

    def source(self, names: Mapping[Symbol, str]) -> str:
        return repr(self.value)

    def substitute(self, mapping: Mapping[Symbol, Expr]) -> Condition:
        return self

    def __repr__(self) -> str:
        return repr(self.value)


TRUE = Literal(True)
FALSE = Literal(False)

_CMP = {
    "==": lambda v: v == 0,
    "!=": lambda v: v != 0,
    "<": lambda v: v < 0,
    "<=": lambda v: v <= 0,
}


@dataclass(frozen=True, eq=True)
class Cmp(Condition):
    """``diff OP 0`` with OP one of ``==, !=, <, <=``."""

    diff: Expr
    op: str

    @staticmethod
    def make(diff: Expr, op: str) -> Condition:
        if isinstance(diff, Const):
            return Literal(_CMP[op](diff.value))
        return Cmp(diff, op)

    def evaluate(self, env: Mapping[Symbol, int]) -> bool:
        return _CMP[self.op](self.diff.evaluate(env))

    def symbols(self) -> frozenset[Symbol]:
        return self.diff.symbols()

    def source(self, names: Mapping[Symbol, str]) -> str:
        return f"({self.diff.source(names)} {self.op} 0)"

    def substitute(self, mapping: Mapping[Symbol, Expr]) -> Condition:
        return Cmp.make(self.diff.substitute(mapping), self.op)

    def __repr__(self) -> str:
        # Show ``a OP b`` with positive terms on each side: ``t >= 1`` rather than ``1 - t <= 0``.
        terms, const = self.diff.linear()
        pos = _make({a: c for a, c in terms.items() if c > 0}, max(const, 0))
        neg = _make({a: -c for a, c in terms.items() if c < 0}, max(-const, 0))
        flip = {"<": ">", "<=": ">=", "==": "==", "!=": "!="}
        if not pos.symbols() and neg.symbols():
            return f"{neg} {flip[self.op]} {pos}"
        return f"{pos} {self.op} {neg}"


@dataclass(frozen=True, eq=True)
class And(Condition):
    parts: tuple[Condition, ...]

    @staticmethod
    def make(parts: Iterable[Condition]) -> Condition:
        flat: list[Condition] = []
        for p in parts:
            if p == FALSE:
                return FALSE
            if p == TRUE:
                continue
            for q in p.parts if isinstance(p, And) else (p,):
                if Not.make(q) in flat:
                    return FALSE
                if q not in flat:
                    flat.append(q)
        if not flat:
            return TRUE
        return flat[0] if len(flat) == 1 else And(tuple(flat))

    def evaluate(self, env: Mapping[Symbol, int]) -> bool:
        return all(p.evaluate(env) for p in self.parts)

    def symbols(self) -> frozenset[Symbol]:
        return frozenset().union(*(p.symbols() for p in self.parts))

    def source(self, names: Mapping[Symbol, str]) -> str:
        return "(" + " and ".join(p.source(names) for p in self.parts) + ")"

    def substitute(self, mapping: Mapping[Symbol, Expr]) -> Condition:
        return And.make(p.substitute(mapping) for p in self.parts)

    def __repr__(self) -> str:
        return " & ".join(f"({p})" for p in self.parts)


@dataclass(frozen=True, eq=True)
class Or(Condition):
    parts: tuple[Condition, ...]

    @staticmethod
    def make(parts: Iterable[Condition]) -> Condition:
        flat: list[Condition] = []
        for p in parts:
            if p == TRUE:
                return TRUE
            if p == FALSE:
                continue
            for q in p.parts if isinstance(p, Or) else (p,):
                if Not.make(q) in flat:
                    return TRUE
                if q not in flat:
                    flat.append(q)
        if not flat:
            return FALSE
        return flat[0] if len(flat) == 1 else Or(tuple(flat))

    def evaluate(self, env: Mapping[Symbol, int]) -> bool:
        return any(p.evaluate(env) for p in self.parts)

    def symbols(self) -> frozenset[Symbol]:
        return frozenset().union(*(p.symbols() for p in self.parts))

    def source(self, names: Mapping[Symbol, str]) -> str:
        return "(" + " or ".join(p.source(names) for p in self.parts) + ")"

    def substitute(self, mapping: Mapping[Symbol, Expr]) -> Condition:
        return Or.make(p.substitute(mapping) for p in self.parts)

    def __repr__(self) -> str:
        return " | ".join(f"({p})" for p in self.parts)


# ``a & b`` and ``a | b`` memoised: guard inference combines the same few conditions over
# and over (compiling CartPole PPO: 4,974 conjunctions of 69 distinct pairs, 1,249
# disjunctions of 19), and each ``make`` compares every part with every other's negation
@_memo
def _both(a: Condition, b: Condition) -> Condition:
    return And.make([a, b])


@_memo
def _either(a: Condition, b: Condition) -> Condition:
    return Or.make([a, b])


@dataclass(frozen=True, eq=True)
class Not(Condition):
    part: Condition

    @staticmethod
    @_memo
    def make(part: Condition) -> Condition:
        # memoised: ``And.make`` and ``Or.make`` negate every part they are given to find a
        # complementary pair, and a comparison's negation is arithmetic on its expression
        if isinstance(part, Literal):
            return Literal(not part.value)
        if isinstance(part, Not):
            return part.part
        if isinstance(part, Cmp):
            if part.op == "==":
                return Cmp(part.diff, "!=")
            if part.op == "!=":
                return Cmp(part.diff, "==")
            if part.op == "<":  # not (d < 0)  <=>  -d <= 0
                return Cmp.make(-part.diff, "<=")
            return Cmp.make(-part.diff, "<")  # not (d <= 0)  <=>  -d < 0
        return Not(part)

    def evaluate(self, env: Mapping[Symbol, int]) -> bool:
        return not self.part.evaluate(env)

    def symbols(self) -> frozenset[Symbol]:
        return self.part.symbols()

    def source(self, names: Mapping[Symbol, str]) -> str:
        return f"(not {self.part.source(names)})"

    def substitute(self, mapping: Mapping[Symbol, Expr]) -> Condition:
        return Not.make(self.part.substitute(mapping))

    def __repr__(self) -> str:
        return f"~({self.part})"


def comparisons(cond: Condition) -> list[Cmp] | None:
    """The comparisons ``cond`` is made of, through ``&``, ``|`` and ``~`` (none for a
    literal); None where it holds a condition of another kind, whose dependence on its
    symbols a caller reading the comparisons would miss."""
    found: list[Cmp] = []

    def collect(c: Condition) -> bool:
        if isinstance(c, Literal):
            return True
        if isinstance(c, Cmp):
            found.append(c)
            return True
        if isinstance(c, (And, Or)):
            return all(collect(p) for p in c.parts)
        if isinstance(c, Not):
            return collect(c.part)
        return False

    return found if collect(cond) else None


def as_condition(value: Condition | bool) -> Condition:
    if isinstance(value, Condition):
        return value
    if isinstance(value, bool):
        return Literal(value)
    raise TypeError(f"expected a condition or bool, got {type(value).__name__}")


# --- slices -----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=True)
class Slice:
    """A half-open range of points ``start:stop`` (step 1) along one dim."""

    start: Expr
    stop: Expr

    @property
    def size(self) -> Expr:
        return self.stop - self.start

    def symbols(self) -> frozenset[Symbol]:
        return self.start.symbols() | self.stop.symbols()

    def substitute(self, mapping: Mapping[Symbol, Expr]) -> Slice:
        return Slice(self.start.substitute(mapping), self.stop.substitute(mapping))

    def __repr__(self) -> str:
        return f"{self.start}:{self.stop}"


Index = Union[Expr, Slice]
