"""A rule table: one transformation's rules, keyed by primitive.

JAX's model: a primitive carries its own meaning (``core.Prim``), and each transformation
keeps a table of its rules keyed by primitive, filled beside each primitive's definition
(``define``). A primitive a transformation cannot handle is not left out: its entry says so,
with the reason (``Declined``), so that ``tests/ir/test_prim_tables.py`` can tell a
forgotten entry from a deliberate one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

R = TypeVar("R")


@dataclass(frozen=True)
class Declined:
    """A table's explicit answer that a primitive has no rule there, and why."""

    why: str

    def __post_init__(self) -> None:
        if not self.why.strip():
            raise ValueError("a declined entry says why")


class RuleTable(Generic[R]):
    """The rules of one transformation (``name``), each primitive's rule or its ``Declined``."""

    def __init__(self, name: str, holds: str) -> None:
        self.name = name
        self.holds = holds  # what a rule is, in words (the completeness test names it)
        self._entries: dict[str, R | Declined] = {}
        TABLES[name] = self

    def define(self, prim: str, entry: R | Declined) -> None:
        if prim in self._entries:
            raise ValueError(f"primitive {prim!r} already has a {self.name} entry")
        if entry is None:
            raise ValueError(f"the {self.name} entry of {prim!r} is a rule or Declined(why)")
        self._entries[prim] = entry

    def entry(self, prim: str) -> R | Declined | None:
        """The primitive's entry: its rule, its ``Declined``, or None where it has none."""
        return self._entries.get(prim)

    def rule(self, prim: str) -> R | None:
        """The primitive's rule; None where it is declined (or, outside the registry, absent)."""
        entry = self._entries.get(prim)
        return None if isinstance(entry, Declined) else entry

    def missing(self, prims: Iterable[str]) -> list[str]:
        """The primitives of ``prims`` with no entry, neither a rule nor a ``Declined``."""
        return [p for p in prims if p not in self._entries]

    def __repr__(self) -> str:
        return f"RuleTable({self.name!r}, {len(self._entries)} entries)"


# every transformation's table, by name (the completeness test walks them all)
TABLES: dict[str, RuleTable] = {}
