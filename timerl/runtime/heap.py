"""What a run asks of the C heap (glibc's malloc) that numpy and torch's CPU arrays live on.

An iteration of a program allocates and frees the same arrays as the iteration before it. Left
to its defaults, glibc hands many of those pages back to the system as they are freed (arrays
above its mmap threshold are unmapped; a free top of the heap above its trim threshold is cut)
and the next iteration faults them in again: on synthetic-e64 about 2,000 page faults an
iteration, 3 ms of its 44 (7%). :func:`keep_freed_pages` makes the heap keep them, and the
executor decides when to give pages back (:class:`HeapTrim`): after the first iteration, after
long iterations, when the resting memory grew, and when a run ends.

Everything here is a no-op off glibc.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Any

# A program whose data peaks at this many bytes gives the heap's free pages back after an
# iteration of its outer loop: the arrays an iteration frees can leave the heap fragmented,
# and the next iteration would peak that much higher than its arrays (a 375 MiB rollout: 42
# then 57 MiB at rest). Trimming costs the faults of touching those pages again, a few ms:
# nothing against an iteration of ``TRIM_SECONDS`` or more, but 5% of synthetic-e64's
# 0.15 s (12 iterations, 3 alternated runs: 146-152 ms an iteration trimmed every time,
# 138-142 not, the same peak resident memory). After a shorter iteration the heap is
# trimmed only where its resting memory grew by ``TRIM_GROWTH`` over its level: the second
# iteration's, then the size it had at the last trim, so that a heap whose resting size
# wanders (torch's does, by tens of MiB on synthetic-e256) is trimmed at each new high only.
# A heap that merely holds one iteration's freed arrays hands them to the next.
TRIM_PEAK = 16 << 20
TRIM_SECONDS = 0.5
TRIM_GROWTH = 4 << 20

# glibc's mallopt parameters (malloc.h) and the values a run sets
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Arrays up to this size come from the heap and are reused when freed; larger ones are mapped
# and unmapped. 32 MiB is the most glibc accepts, and the most its own adaptive threshold
# reaches; fixed from the start, the first iteration reuses its freed arrays too instead of
# mapping fresh pages for each one until the adaptive threshold has risen.
MMAP_THRESHOLD = 32 << 20
# The heap keeps freed pages at its top up to this much; :class:`HeapTrim` gives them back.
TRIM_THRESHOLD = 1 << 30
# glibc's own settings: where a user set any of them, the heap is left as they configured it
_USER_SETTINGS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)

# glibc's initial thresholds, which a run under a memory budget fixes (see keep_freed_pages)
_GLIBC_DEFAULT = 128 << 10

_LIBC: list[Any] = []  # the C library, looked up once ([None] where it is not glibc)
# whether the heap is set to keep freed pages now (None: as glibc set it, never changed)
_KEEPING: list[bool | None] = [None]


def _glibc() -> Any:
    if not _LIBC:
        lib = None
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(None)
                lib.malloc_trim.argtypes, lib.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
                lib.mallopt.argtypes, lib.mallopt.restype = (
                    [ctypes.c_int, ctypes.c_int],
                    ctypes.c_int,
                )
            except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
                lib = None
        _LIBC.append(lib)
    return _LIBC[0]


def keep_freed_pages(keep: bool = True) -> bool:
    """Make the heap keep freed arrays' pages for the next allocations, or stop keeping them.

    A run under a memory budget does not keep them: its resident memory counts more than the
    faults, and pages kept in a fragmented heap cost it about 6 MiB on memory-e8 (a budget of
    33 MiB). It fixes glibc's initial thresholds, which glibc itself would raise: the first
    freed mapping of a few MiB (memory-e8 draws its initial weights through 6 MiB
    temporaries) moves every later array up to that size onto the heap, where freed pages
    stay resident. Fixed, each array above 128 KiB is mapped and unmapped, and the run's
    resident memory follows the meter (memory-e32 under its budget: 3% over it, not 13%;
    its streamed chunks are read into the same buffers again, see ``RowFile._read_all``).
    Process-wide, as every malloc setting is; the heap is left alone where the user set
    glibc's ``MALLOC_*_`` variables or a ``glibc.malloc`` tunable. True when it keeps them.
    """
    lib = _glibc()
    user = any(os.environ.get(v) for v in _USER_SETTINGS) or "glibc.malloc." in os.environ.get(
        "GLIBC_TUNABLES", ""
    )
    if lib is None or user or keep is _KEEPING[0]:
        return bool(_KEEPING[0])
    mmap, trim = (MMAP_THRESHOLD, TRIM_THRESHOLD) if keep else (_GLIBC_DEFAULT, _GLIBC_DEFAULT)
    if lib.mallopt(_M_MMAP_THRESHOLD, mmap) and lib.mallopt(_M_TRIM_THRESHOLD, trim):
        _KEEPING[0] = keep
    return bool(_KEEPING[0])


def release_free_heap() -> None:
    """Hand the heap's free pages back to the system.

    Compiling and Python's compile of the generated run function (3,500 lines for PPO) peak
    at about 20 MiB of small objects that are freed before the run; glibc keeps those pages,
    so they would sit in the process's resident memory beside the program's data, which the
    meter and ``planned_peak`` cannot see. After a run, the pages its arrays were kept in.
    """
    lib = _glibc()
    if lib is not None:
        lib.malloc_trim(0)


def resident_bytes() -> int | None:
    """The process's resident memory now (Linux's ``/proc/self/statm``), None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class HeapTrim:
    """When to call :func:`release_free_heap` after an iteration (see ``TRIM_PEAK``)."""

    def __init__(self) -> None:
        self.iterations = 0
        self.rest: int | None = None  # resident bytes after the 2nd iteration or the last trim
        self.started = time.perf_counter()  # when the current iteration began

    def after_iteration(self, peak: int) -> None:
        now = time.perf_counter()
        seconds, self.started = now - self.started, now
        if peak < TRIM_PEAK:
            return
        self.iterations += 1
        if self.iterations == 1 or seconds >= TRIM_SECONDS:
            release_free_heap()
            return
        rss = resident_bytes()
        if rss is None:  # growth cannot be told: trim (a no-op off glibc)
            release_free_heap()
        elif self.rest is None:
            self.rest = rss
        elif rss > self.rest + TRIM_GROWTH:
            release_free_heap()
            self.rest = rss  # a new high: the next trim waits until the heap grows past it
