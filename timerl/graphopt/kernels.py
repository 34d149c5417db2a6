"""The decoders' inner loops, compiled by numba when it is installed (the ``graphopt`` extra).

Decoding keys to an order is the search's inner loop: a 5,000-evaluation search of a
1,000-node graph decodes 5,000 times, and as Python loops (``decoders.py``) that took most of
its time. These are the same loops over flat CSR arrays; ``tests/graphopt/test_kernels.py``
checks that both give the same orders. numba is imported, and the kernels compiled (once,
then cached beside this module) or loaded, only for a search of at least
:data:`WORTH_FROM` node-decodes: loading costs about a second per process, more than the
compiler's own small searches take.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

#: node-decodes (nodes x evaluations) from which a search loads the kernels
WORTH_FROM = 1_000_000

_loaded: dict[str, Callable[..., Any]] = {}


def available() -> bool:
    """numba is installed (without it the pure-Python decoders run)."""
    import importlib.util

    return importlib.util.find_spec("numba") is not None


def worth_it(nodes: int, decodes: int) -> bool:
    """Whether a search of ``decodes`` decodes of a ``nodes``-node graph should load the
    kernels (and can)."""
    return nodes * decodes >= WORTH_FROM and available()


def get(name: str) -> Callable[..., Any] | None:
    """The compiled ``list_schedule`` or ``post_order`` (loaded on first use), or None
    without numba."""
    if not _loaded and available():
        _load()
    return _loaded.get(name)


def _load() -> None:
    import numba

    def jit(fn: Callable[..., Any], **options: Any) -> Any:
        return numba.njit(cache=True, nogil=True, **options)(fn)

    # the kernels read these through the module's globals: compiled first, then inlined
    globals()["_before"] = jit(_before_py, inline="always")
    globals()["_sift_down"] = jit(_sift_down_py, inline="always")
    _loaded["list_schedule"] = jit(_list_schedule)
    _loaded["post_order"] = jit(_post_order)


def _before_py(priority: np.ndarray, a: int, b: int) -> bool:
    """``a`` runs before ``b`` when both are ready: higher priority, ties lower index."""
    return priority[a] > priority[b] or (priority[a] == priority[b] and a < b)


def _sift_down_py(heap: np.ndarray, size: int, i: int, priority: np.ndarray) -> None:
    while True:
        c = 2 * i + 1
        if c >= size:
            return
        if c + 1 < size and _before(priority, heap[c + 1], heap[c]):
            c += 1
        if not _before(priority, heap[c], heap[i]):
            return
        heap[i], heap[c] = heap[c], heap[i]
        i = c


def _list_schedule(
    succ_ptr: np.ndarray, succ_idx: np.ndarray, pred_ptr: np.ndarray, priority: np.ndarray
) -> np.ndarray:
    """List scheduling with a binary heap of the ready nodes (no sort of the keys: the heap
    compares them)."""
    n = len(pred_ptr) - 1
    indeg = pred_ptr[1:] - pred_ptr[:-1]
    heap = np.empty(n, np.int64)
    size = 0
    for v in range(n):
        if indeg[v] == 0:
            heap[size] = v
            size += 1
    for i in range(size // 2 - 1, -1, -1):
        _sift_down(heap, size, i, priority)
    order = np.empty(n, np.int64)
    count = 0
    while size > 0:
        v = heap[0]
        size -= 1
        heap[0] = heap[size]
        _sift_down(heap, size, 0, priority)
        order[count] = v
        count += 1
        for e in range(succ_ptr[v], succ_ptr[v + 1]):
            w = succ_idx[e]
            indeg[w] -= 1
            if indeg[w] == 0:
                i = size
                heap[size] = w
                size += 1
                while i > 0:  # sift up
                    p = (i - 1) // 2
                    if not _before(priority, heap[i], heap[p]):
                        break
                    heap[i], heap[p] = heap[p], heap[i]
                    i = p
    return order[:count]


def _post_order(
    starts: np.ndarray, pred_idx: np.ndarray, key: np.ndarray, sinks: np.ndarray
) -> np.ndarray:
    """Iterative post-order DFS from the sinks over predecessors, both taken highest key
    first (ties: lower index first, as a stable sort)."""
    n = len(starts) - 1
    preds = pred_idx.copy()
    for v in range(n):  # insertion sort per node: in-degrees are small
        for i in range(starts[v] + 1, starts[v + 1]):
            u = preds[i]
            j = i - 1
            while j >= starts[v] and key[preds[j]] < key[u]:
                preds[j + 1] = preds[j]
                j -= 1
            preds[j + 1] = u
    roots = sinks[np.argsort(-key[sinks], kind="mergesort")]
    done = np.zeros(n, np.bool_)
    nxt = starts[:-1].copy()
    stack = np.empty(n, np.int64)
    order = np.empty(n, np.int64)
    count = 0
    for s in roots:
        stack[0] = s
        top = 1
        while top > 0:
            v = stack[top - 1]
            i, end = nxt[v], starts[v + 1]
            while i < end and done[preds[i]]:
                i += 1
            if i < end:
                nxt[v] = i + 1
                stack[top] = preds[i]
                top += 1
            else:
                top -= 1
                if not done[v]:
                    done[v] = True
                    order[count] = v
                    count += 1
    return order[:count]


_before, _sift_down = _before_py, _sift_down_py  # what the kernels call, until compiled
