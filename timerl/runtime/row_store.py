"""A fused loop's every-iteration values held stacked, split into points only when read so."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class _Released:
    """What ``RowStore.pop`` returns for a row never split out: its byte count, for the meter."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class RowStore(dict):
    """A point store that also holds, per outer point, rows along the last dim as one stacked
    array (a fused loop's every-iteration values), split out only when a row is read alone.

    Splitting a stacked array costs one dispatch per row on the jax backend, and the usual
    readers want it whole again (a slice ``x[i, 0:T]``, or the next fused loop's per-iteration
    input): ``stacked`` hands it over as it is, unless a row was written since. Rows the loop
    did not keep (guarded off, freed) are in the array too; a valid program never reads them.
    Point reads, writes and frees behave as on a dict; ``values()`` (read only to count bytes
    when freeing) does not split rows.
    """

    __slots__ = ("lazy",)

    def __init__(self, points: dict | None = None) -> None:
        super().__init__(points or {})
        # outer -> [rows, the ks not split out yet, bytes of a row, whether a row was rewritten]
        self.lazy: dict[tuple, list] = {}

    @classmethod
    def adopt(cls, stores: dict, op_id: int) -> RowStore:
        """The store of ``op_id``, made a ``RowStore`` in place (once) keeping its points."""
        store = stores[op_id]
        if not isinstance(store, RowStore):
            store = stores[op_id] = RowStore(store)
        return store

    def put_rows(
        self, outer: tuple, rows: Any, ks: list[int], row_bytes: int | None = None
    ) -> None:
        """Points ``outer + (k,)`` for ``k`` in ``ks`` are ``rows[k]``; ``row_bytes``, the
        bytes of one row where the caller knows them (a jax array's ``nbytes`` is slow)."""
        if outer in self.lazy:
            self._split_all(outer)
            del self.lazy[outer]
        wanted = set(ks)
        held = dict.__len__(self)
        if held >= len(ks):
            for k in ks:
                dict.pop(self, (*outer, k), None)
        elif held:  # a few points held (a loop's last row, stored alone): scan those
            for p in [p for p in dict.keys(self) if p[-1] in wanted and p[:-1] == outer]:
                dict.pop(self, p)
        if row_bytes is None:
            row_bytes = int(getattr(rows, "nbytes", 0)) // max(int(rows.shape[0]), 1)
        self.lazy[outer] = [rows, wanted, row_bytes, False]

    def stacked(self, outer: tuple, n: int) -> Any:
        """The rows of ``outer`` as one array of ``n``, or None where it is not held so."""
        entry = self.lazy.get(outer)
        if entry is None or entry[3] or int(entry[0].shape[0]) != n:
            return None
        return entry[0]

    def _entry(self, key: object) -> list | None:
        if not self.lazy or not isinstance(key, tuple) or not key:
            return None
        entry = self.lazy.get(key[:-1])
        return entry if entry is not None and key[-1] in entry[1] else None

    def _split(self, key: tuple) -> bool:
        entry = self._entry(key)
        if entry is None:
            return False
        entry[1].discard(key[-1])
        dict.__setitem__(self, key, entry[0][key[-1]])
        return True

    def _split_all(self, outer: tuple | None = None) -> None:
        for o in [outer] if outer is not None else list(self.lazy):
            entry = self.lazy.get(o)
            if entry is not None:
                for k in sorted(entry[1]):
                    self._split((*o, k))

    def __getitem__(self, key: tuple) -> Any:
        try:
            return dict.__getitem__(self, key)
        except KeyError:
            if self._split(key):
                return dict.__getitem__(self, key)
            raise

    def get(self, key: tuple, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or self._entry(key) is not None

    def __setitem__(self, key: tuple, value: Any) -> None:
        entry = self.lazy.get(key[:-1]) if self.lazy else None
        if entry is not None:
            entry[1].discard(key[-1])
            entry[3] = True  # the stacked array no longer holds this point's value
        dict.__setitem__(self, key, value)

    def pop(self, key: tuple, *default: Any) -> Any:
        entry = self._entry(key)
        if entry is None:
            return dict.pop(self, key, *default)
        entry[1].discard(key[-1])
        if not entry[1]:
            del self.lazy[key[:-1]]  # no row left to split out: drop the array
        return _Released(entry[2])

    def pop_prefix(self, prefix: tuple, nbytes: Callable[[Any], int]) -> int:
        """Drop every point under ``prefix`` at once (whole stacked arrays, not row by row);
        the bytes released, as ``nbytes`` counts each point."""
        n = len(prefix)
        released = 0
        for outer in [o for o in self.lazy if o[:n] == prefix]:
            entry = self.lazy.pop(outer)
            released += nbytes(_Released(entry[2])) * len(entry[1])
        for point in [p for p in dict.keys(self) if p[:n] == prefix]:
            released += nbytes(dict.pop(self, point))
        return released

    def keys(self) -> Any:
        lazy = [(*o, k) for o, entry in self.lazy.items() for k in entry[1]]
        return list(dict.keys(self)) + lazy

    def __iter__(self) -> Iterator[tuple]:
        return iter(self.keys())

    def values(self) -> Any:
        released = [_Released(e[2]) for e in self.lazy.values() for _ in e[1]]
        return list(dict.values(self)) + released

    def items(self) -> Any:
        self._split_all()
        return dict.items(self)

    def __len__(self) -> int:
        return dict.__len__(self) + sum(len(e[1]) for e in self.lazy.values())

    def __bool__(self) -> bool:
        return len(self) > 0

    def clear(self) -> None:
        self.lazy.clear()
        dict.clear(self)
