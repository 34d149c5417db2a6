"""How a run uses the C heap its arrays come from, decided from the memory plan.

An iteration allocates and frees the same arrays as the one before it. Whether the heap keeps
the freed pages for the next iteration, reuses them only for a loop's repeated arrays, reserves
them at setup, or gives them back right before the plan's peak depends on what holds the peak
(``PlannedPeak.peak_small_bytes``: the share of it in arrays small enough to come from the
heap) and on whether a memory budget asked for the plan. ``runtime/heap.py`` carries these
decisions out (glibc's ``mallopt``, trimming, reserving).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from timerl.memory.replay import PlannedPeak, repeated_array_bytes
from timerl.schedule.program import Schedule
from timerl.symbolic import Bound

# Arrays up to this size come from the heap and are reused when freed; larger ones are mapped
# and unmapped. 32 MiB is the most glibc accepts, and the most its own adaptive threshold
# reaches; fixed from the start, the first iteration reuses its freed arrays too instead of
# mapping fresh pages for each one until the adaptive threshold has risen.
MMAP_THRESHOLD = 32 << 20
# A heap that keeps no freed pages keeps up to this many of a loop's repeated arrays free at
# its top, so each step's arrays take the pages of the step before.
REUSED_ARRAYS = 4
# the most of a planned peak a run lets the heap keep for a loop's repeated arrays: 1 / this
REUSE_SHARE = 16


@dataclass(frozen=True)
class HeapPolicy:
    """What a run asks of the heap (``runtime/heap.py`` and the executor carry it out)."""

    keep_freed_pages: bool = True
    reuse_up_to: int = 0  # bytes of a loop's repeated arrays the heap keeps reusing
    reserve: int = 0  # bytes of heap pages faulted in at setup
    huge_page_advice: bool = True
    spare_blocks: frozenset[int] = frozenset()  # blocks whose rows a run keeps between uses
    trim_before: frozenset[int] = frozenset()  # ops right before which the heap is trimmed


def heap_policy(
    planned: Callable[[], PlannedPeak],
    sched: Schedule,
    static: Mapping[Bound, int],
    budget: int | None,
    heap_arrays: bool,
    compiled: bool,
) -> HeapPolicy:
    """The heap's use for a run of the plan ``planned()`` makes (asked only where the arrays
    come from the heap; ``compiled``: the optimised code, which reserves pages and keeps spare
    blocks; the reference, ``compiled=False``, does neither)."""
    if not heap_arrays:
        return HeapPolicy(keep_freed_pages=budget is None)
    plan = planned()
    keep = _keeps_freed_pages(plan, budget)
    return HeapPolicy(
        keep_freed_pages=keep,
        reuse_up_to=_reuse_up_to(plan, sched, static, budget, keep),
        reserve=plan.peak_small_bytes if compiled and keep else 0,
        huge_page_advice=not (compiled and _maps_arrays_apart(plan)),
        spare_blocks=plan.spare_blocks if compiled and budget is None else frozenset(),
        trim_before=_trim_before(plan, keep),
    )


def _keeps_freed_pages(plan: PlannedPeak, budget: int | None) -> bool:
    # The heap keeps freed arrays' pages for the next iteration's, but not under a budget,
    # and not where arrays mapped apart hold most of the peak (a rollout of images). There the
    # heap serves a small share of the peak and its faults a small share of an iteration,
    # while the holes its freed arrays leave stay resident: memory-e8 reached its resident
    # high at the update's Adam step with 13 MiB free in the heap, 7 MiB over the plan's peak
    # (3 MiB with glibc's thresholds, at the same iteration time).
    if budget is not None:
        return False
    return 2 * plan.peak_small_bytes >= (plan.peak_bytes or 0)


def _reuse_up_to(
    plan: PlannedPeak,
    sched: Schedule,
    static: Mapping[Bound, int],
    budget: int | None,
    keep_freed_pages: bool,
) -> int:
    # A heap that keeps no freed pages still reuses them for the arrays a loop allocates at
    # every point (an env's step: its observations and the env's own temporaries of that
    # size), without a budget. Under one they are mapped apart too, which costs faults, not
    # memory: reused, their pages stay resident beside the meter (memory-e8 under its budget:
    # 1.64-1.69 s an iteration instead of 2.28-2.85, but run data 18.2 MiB, not 17.2-17.3,
    # for a 16 MiB meter; memory-e32 37.8, not 34.0, for 32.6).
    if budget is not None or keep_freed_pages:
        return 0
    size = repeated_array_bytes(sched, static)
    # the heap keeps up to ``REUSED_ARRAYS`` of them: not where that is more than a sixteenth
    # of the peak (a loop of large arrays, as a budget would have it: faulted)
    if REUSED_ARRAYS * size * REUSE_SHARE > (plan.peak_bytes or 0):
        return 0
    return size


def _trim_before(plan: PlannedPeak, keep_freed_pages: bool) -> frozenset[int]:
    # a heap that keeps no freed pages still leaves its holes resident until trimmed: given
    # back right before the statement where the plan peaks
    if keep_freed_pages or plan.peak_op is None:
        return frozenset()
    return frozenset({plan.peak_op})


def _maps_arrays_apart(plan: PlannedPeak) -> bool:
    # arrays above glibc's mmap threshold are mapped afresh at each allocation: numpy's
    # huge-page advice would make their first touch wait for the kernel to compact memory
    # (runtime/heap.numpy_huge_pages)
    return (plan.peak_bytes or 0) > plan.peak_small_bytes
