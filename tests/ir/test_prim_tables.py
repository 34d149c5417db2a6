"""Every primitive has an entry in every transformation's table and a lowering on every backend,
or declines one with a reason: the checklist "Adding a primitive" of docs/architecture.md."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from timerl.ir import prims
from timerl.ir.prims.batching import Batching
from timerl.ir.prims.core import declared
from timerl.ir.prims.rows import Rows
from timerl.ir.prims.table import TABLES, Declined, RuleTable

# what each table's entries are (a rule of that kind, or Declined)
KINDS: dict[str, Callable[[object], bool]] = {
    "batching": lambda e: isinstance(e, Batching),
    "rows": lambda e: isinstance(e, Rows),
    "cost": callable,
    "simplify": lambda e: isinstance(e, tuple) and all(callable(r) for r in e),
}
BACKENDS = ["numpy", "torch", "jax"]


def test_the_tables_are_those_the_checklist_names():
    assert set(TABLES) == set(KINDS)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_primitive_has_an_entry_in_every_table(name):
    table = TABLES[name]
    missing = table.missing(prims.REGISTRY)
    assert not missing, (
        f"no {name} entry for {missing}: give define(...) {table.holds} or Declined(why)"
    )
    for prim in prims.REGISTRY:
        entry = table.entry(prim)
        assert isinstance(entry, Declined) or KINDS[name](entry), (name, prim, entry)


def test_a_declined_entry_says_why():
    with pytest.raises(ValueError, match="says why"):
        Declined(" ")
    declined = [
        (name, prim)
        for name, table in TABLES.items()
        for prim in prims.REGISTRY
        if isinstance(table.entry(prim), Declined)
    ]
    assert declined  # the tables do decline some (user code is never batched)
    assert all(len(TABLES[n].entry(p).why) > 10 for n, p in declined)


def test_a_primitive_registered_without_its_entries_is_reported_missing():
    """The check above can fail: a primitive registered by hand, not with ``define``."""
    prims.register(prims.Prim("no_entries", declared, lambda **_: np.zeros(())))
    try:
        for name, table in TABLES.items():
            assert table.missing(prims.REGISTRY) == ["no_entries"], name
            assert table.rule("no_entries") is None
    finally:
        del prims.REGISTRY["no_entries"]


def test_a_table_takes_one_entry_per_primitive():
    table: RuleTable[int] = RuleTable("a test table", "an int")
    try:
        table.define("add", 1)
        with pytest.raises(ValueError, match="already has"):
            table.define("add", 2)
        with pytest.raises(ValueError, match="rule or Declined"):
            table.define("sub", None)  # type: ignore[arg-type]
        table.define("mul", Declined("it multiplies"))
        assert table.rule("add") == 1 and table.rule("mul") is None
        assert table.rule("not a primitive") is None
    finally:
        del TABLES["a test table"]


def _lowerings(backend: str) -> tuple[set[str], dict[str, str]]:
    """The primitives the backend lowers, and those it declines with the reason."""
    if backend == "numpy":  # the reference semantics are numpy's lowering
        return {n for n, p in prims.REGISTRY.items() if callable(p.impl)}, {}
    module = pytest.importorskip(f"timerl.runtime.{backend}_lowering")
    return set(module.LOWERINGS), dict(module.NOT_LOWERED)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_primitive_is_lowered_on_every_backend_or_declined(backend):
    lowered, declined = _lowerings(backend)
    missing = sorted(set(prims.REGISTRY) - lowered - set(declined))
    assert not missing, f"no {backend} lowering for {missing}: add one, or NOT_LOWERED[name] = why"
    assert not lowered & set(declined), "a primitive is lowered and declined at once"
    assert set(declined) <= set(prims.REGISTRY)
    assert all(why.strip() for why in declined.values())
    # what a backend declines, the executor runs itself: host calls
    assert all(prims.get(n).traits.host for n in declined)


def test_numpy_specialisations_and_donations_name_registered_primitives():
    from timerl.runtime import numpy_backend
    from timerl.runtime.backend import SUBSCRIPT_LOWERINGS

    tables = [numpy_backend.DONATING, numpy_backend.NumpyBackend.specialisations]
    for table in [*tables, SUBSCRIPT_LOWERINGS]:
        assert set(table) <= set(prims.REGISTRY)
