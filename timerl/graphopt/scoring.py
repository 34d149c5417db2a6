"""Scoring a generation's chromosomes in this process or split over worker processes.

One search's cost is almost all decoding and simulating schedules (about 1 ms each for a
1,000-node graph), and a BRKGA generation's offspring are independent of each other: scored
over ``jobs`` processes, a search uses every core. The results are the same as scoring in
order here, so ``jobs`` never changes a search's outcome. Processes are started by ``spawn``
(not ``fork``) so that threads of a parent that imported torch or jax are never copied;
each worker receives the problem once, at start.

(``parallel.TaskPool`` spreads whole searches over Ray tasks; this is the finer grain inside
one search, and needs nothing beyond the standard library.)
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from timerl.errors import GraphError
from timerl.graphopt.decoders import Problem, Solution

_PROBLEM: Problem | None = None  # the worker process's copy


def _start(problem: Problem) -> None:
    global _PROBLEM
    _PROBLEM = problem


def _score_rows(rows: np.ndarray) -> list[tuple[float, Solution]]:
    assert _PROBLEM is not None
    return [_PROBLEM.fitness(r) for r in rows]


class Scorer:
    """``scorer(rows)`` -> ``[(value, solution)]`` per row of keys, in row order."""

    # below this many rows a batch is scored here: the round trip costs more than it saves
    MIN_SPLIT = 8

    def __init__(self, problem: Problem, jobs: int = 1) -> None:
        if int(jobs) < 1:
            raise GraphError(f"--jobs must be at least 1, got {jobs}")
        self.problem = problem
        self.jobs = int(jobs)
        self._pool: ProcessPoolExecutor | None = None
        if self.jobs > 1:
            self._pool = ProcessPoolExecutor(
                self.jobs,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start,
                initargs=(problem,),
            )

    def __call__(self, rows: np.ndarray) -> list[tuple[float, Solution]]:
        if self._pool is None or len(rows) < self.MIN_SPLIT:
            return [self.problem.fitness(r) for r in rows]
        chunks = np.array_split(rows, self.jobs)
        out: list[tuple[float, Solution]] = []
        for part in self._pool.map(_score_rows, chunks):
            out.extend(part)
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
