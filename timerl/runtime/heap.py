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

import contextlib
import ctypes
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import CodeType
from typing import Any

# the policy's thresholds (memory/heap_policy.py): the heap keeps arrays up to MMAP_THRESHOLD,
# and up to REUSED_ARRAYS of a loop's repeated arrays where it keeps no other freed pages
from timerl.memory.heap_policy import MMAP_THRESHOLD, REUSED_ARRAYS

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
# The heap keeps freed pages at its top up to this much; :class:`HeapTrim` gives them back.
TRIM_THRESHOLD = 1 << 30
# glibc's own settings: where a user set any of them, the heap is left as they configured it
_USER_SETTINGS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)

# glibc's initial thresholds, which a run that keeps no freed pages fixes (see keep_freed_pages)
_GLIBC_DEFAULT = 128 << 10

_LIBC: list[Any] = []  # the C library, looked up once ([None] where it is not glibc)
# whether the heap is set to keep freed pages now (None: as glibc set it, never changed)
_KEEPING: list[bool | None] = [None]
_MMAP = [0]  # the mmap threshold set with it
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


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
                lib.malloc.argtypes, lib.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
                lib.free.argtypes, lib.free.restype = [ctypes.c_void_p], None
                lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                lib.madvise.restype = ctypes.c_int
            except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
                lib = None
        _LIBC.append(lib)
    return _LIBC[0]


def keep_freed_pages(keep: bool = True, reuse_up_to: int = 0) -> bool:
    """Make the heap keep freed arrays' pages for the next allocations, or stop keeping them.

    A run under a memory budget does not keep them: its resident memory counts more than the
    faults, and pages kept in a fragmented heap cost it about 6 MiB on memory-e8 (a budget of
    33 MiB). Nor does a run whose peak is mostly arrays mapped apart (a rollout of images),
    whose faults are mostly theirs (``memory/heap_policy.py``). It fixes glibc's initial
    thresholds, which glibc itself would raise: the first freed mapping of a few MiB
    (memory-e8 draws its initial weights through 6 MiB temporaries) moves every later array
    up to that size onto the heap, where freed pages stay resident. Fixed, each array above
    128 KiB is mapped and unmapped, and the run's resident memory follows the meter
    (memory-e32 under its budget: 3% over it, not 13%; its streamed chunks are read into the
    same buffers again, see ``RowFile._read_all``).
    Not keeping them, arrays up to ``reuse_up_to`` bytes still come from the heap and reuse
    its pages: those a loop allocates at every one of its points, an environment's step its
    observations among them (``budget.repeated_array_bytes``). Mapped apart, each such array
    was faulted in at every step: memory-e8's 375 KiB observations and the env's own
    temporaries of that size, 247,000 faults an iteration against 9,000-14,000, 1.0-1.25 s of
    system time. The heap then holds up to ``REUSED_ARRAYS`` of them free at its top.
    Process-wide, as every malloc setting is; the heap is left alone where the user set
    glibc's ``MALLOC_*_`` variables or a ``glibc.malloc`` tunable. True when it keeps them.
    """
    lib = _glibc()
    user = any(os.environ.get(v) for v in _USER_SETTINGS) or "glibc.malloc." in os.environ.get(
        "GLIBC_TUNABLES", ""
    )
    if keep:
        mmap, trim = MMAP_THRESHOLD, TRIM_THRESHOLD
    else:
        # a chunk's header beside the array, rounded up to whole pages
        fits = -(-(reuse_up_to + 64) // _PAGE) * _PAGE if reuse_up_to > 0 else 0
        mmap = min(max(_GLIBC_DEFAULT, fits), MMAP_THRESHOLD)
        # and a free top of the heap that holds a step's arrays stays: trimmed at every free,
        # the next step faulted it in again (memory-e32: 200,000 faults every other iteration)
        trim = REUSED_ARRAYS * mmap if fits else _GLIBC_DEFAULT
    if lib is None or user or (keep is _KEEPING[0] and mmap == _MMAP[0]):
        return bool(_KEEPING[0])
    if lib.mallopt(_M_MMAP_THRESHOLD, mmap) and lib.mallopt(_M_TRIM_THRESHOLD, trim):
        _KEEPING[0], _MMAP[0] = keep, mmap
    return bool(_KEEPING[0])


def compile_apart(source: str, filename: str) -> CodeType:
    """``compile(source, filename, "exec")`` on a thread of its own.

    Python's compiler takes the memory of a long generated module (3,500 lines for PPO) from
    the C heap in blocks it frees when done, about 11 MiB for memory-e8's, and the run
    function it returns is allocated after them and keeps the heap's top in place: left as
    free holes below it. A trim gives their pages back, but glibc serves a later request
    from a free chunk that fits before it maps new memory, whatever the size, so the run's
    arrays (1.95 MiB activations, 3 MiB gradients) fill those holes again and, freed, stay
    resident until the next trim, counted by no meter (memory-e8 under its budget: 19-21
    MiB of run data for a 16 MiB meter). glibc gives a thread an arena of its own, so
    compiled there the blocks and their holes stay out of the heap the run allocates from
    (19.3-21.1 → 17.2-17.3 MiB). Where no thread can be started, compiled here."""
    try:
        pool = ThreadPoolExecutor(1, thread_name_prefix="timerl-compile")
        compiling = pool.submit(compile, source, filename, "exec")
    except RuntimeError:  # no thread to be had (interpreter shutting down, a thread limit)
        return compile(source, filename, "exec")
    with pool:
        return compiling.result()


def release_free_heap() -> None:
    """Hand the heap's free pages back to the system.

    Compiling and Python's compile of the generated run function (3,500 lines for PPO) peak
    at about 20 MiB of small objects that are freed before the run; glibc keeps those pages,
    so they would sit in the process's resident memory beside the program's data, which the
    meter and ``planned_peak`` cannot see; given back after compiling where the run's pages
    are not reserved (where the heap keeps no freed pages). After a run, the pages its arrays
    were kept in.
    """
    lib = _glibc()
    if lib is not None:
        # The huge pages asked for a reserve go back with it, and the advice too: a range
        # advised so stays advised, and a run that trims after every iteration would then
        # make the kernel compact memory for a huge page at each fault there (memory-e8:
        # 1.48 s an iteration against 1.06).
        for start, n in _ADVISED:
            lib.madvise(start, n, _MADV_NOHUGEPAGE)
        _ADVISED.clear()
        lib.malloc_trim(0)


# A trim before a peak statement waits until this many of its own durations have passed since
# the last one (see :func:`trim_before_peak`)
TRIM_SPACING = 50
_LAST_TRIM = [0.0, 0.0]  # when the last trim before a peak ended, and what it took


def trim_before_peak() -> None:
    """:func:`release_free_heap`, called by a run whose heap keeps no freed pages right before
    the statement where its plan peaks: the holes freed small arrays leave in the heap stay
    resident until trimmed, and no meter counts them (memory-e32: 2.5 MiB at its peak).

    A trim walks the whole heap, about 2 ms in a process holding the compiler's objects:
    nothing against an update statement run once an iteration, but a peak inside a loop of a
    thousand steps would pay it at every step. Spaced by ``TRIM_SPACING`` of its own
    durations, it costs at most 2% of the run."""
    began = time.perf_counter()
    last, took = _LAST_TRIM
    if began - last < TRIM_SPACING * took:
        return
    release_free_heap()
    ended = time.perf_counter()
    _LAST_TRIM[:] = [ended, ended - began]


# pieces :func:`reserve` allocates: under the mmap threshold, so that the heap serves them
RESERVE_PIECE = MMAP_THRESHOLD // 2
_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14  # Linux's madvise advice: back this range with transparent huge pages
_MADV_NOHUGEPAGE = 15
_ADVISED: list[tuple[int, int]] = []  # the ranges a reserve asked huge pages for


def reserve(nbytes: int) -> int:
    """Fault in ``nbytes`` of heap pages now and free them, kept for the run's arrays.

    The first iteration of a run otherwise touches every page of its working set for the
    first time, and on a virtual machine a first touch costs several times a reused page
    (synthetic-e256: about 4,500 faults, 10-20% of an iteration). Called at setup with the
    planned peak of the arrays the heap serves (``PlannedPeak.peak_small_bytes``), it moves
    those faults out of the first iteration; resident memory at the run's peak is the same,
    since the run fills these pages. Only while the heap keeps freed pages
    (:func:`keep_freed_pages`): otherwise the pages would go straight back. The bytes it
    reserved (0 off glibc).
    """
    lib = _glibc()
    if lib is None or not _KEEPING[0] or nbytes <= 0:
        return 0
    pieces = []
    left = nbytes
    try:
        while left > 0:
            n = min(left, RESERVE_PIECE)
            ptr = lib.malloc(n)
            if not ptr:
                break
            _advise_huge_pages(lib, ptr, n)
            ctypes.memset(ptr, 0, n)
            pieces.append(ptr)
            left -= n
    finally:
        for ptr in reversed(pieces):
            lib.free(ptr)
    return nbytes - left


def numpy_huge_pages(enabled: bool) -> bool | None:
    """Whether numpy asks the kernel for transparent huge pages on its arrays of 4 MiB or
    more; sets it and returns the setting before (None where numpy offers no switch).

    An array above glibc's mmap threshold is a fresh mapping each time it is allocated, and
    with that advice its first touch waits for the kernel to assemble 2 MiB pages, compacting
    memory synchronously where the system's ``defrag`` setting is ``madvise`` (the default).
    On a machine whose memory is fragmented that is slow and unbounded: memory-e8's first
    iteration spent 4.2 s in the kernel for its 375 MiB rollout (5.5 s against a steady
    1.05 s); without the advice it faults 4 KiB pages, 0.2 s. The executor turns it off for
    runs whose planned peak holds such arrays; the heap's reserve asks for huge pages itself.
    """
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray  # type: ignore[no-redef]
    switch = getattr(multiarray, "_set_madvise_hugepage", None)
    return None if switch is None else bool(switch(enabled))


@contextlib.contextmanager
def numpy_huge_pages_off(off: bool = True) -> Iterator[None]:
    """numpy's huge-page advice off inside (where ``off``), as it was after."""
    before = numpy_huge_pages(False) if off else None
    try:
        yield
    finally:
        if before is not None:
            numpy_huge_pages(before)


def _advise_huge_pages(lib: Any, ptr: int, n: int) -> None:
    # numpy asks for transparent huge pages for its arrays of 4 MiB or more, and gets them
    # where it is the first to touch their pages; pages the reserve touched first would be
    # small ones (measured: a product and a tanh over 64,000 x 64 rows 7% slower). Asked
    # here for the whole reserve, torch's arrays get them too. Where the kernel offers no
    # huge pages, madvise fails and nothing changes.
    start = -(-ptr // _HUGE_PAGE) * _HUGE_PAGE
    end = (ptr + n) // _HUGE_PAGE * _HUGE_PAGE
    if end > start and lib.madvise(start, end - start, _MADV_HUGEPAGE) == 0:
        _ADVISED.append((start, end - start))


def _statm() -> tuple[int, int] | None:
    """Resident and file-backed resident pages now (Linux's ``/proc/self/statm``)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        return int(fields[1]), int(fields[2])
    except (OSError, ValueError, IndexError):
        return None


def resident_bytes() -> int | None:
    """The process's resident memory now, None off Linux."""
    pages = _statm()
    return None if pages is None else pages[0] * _PAGE


def anonymous_bytes() -> int | None:
    """Resident memory not backed by files (the heap, arrays), None off Linux.

    Code pages of a library touched for the first time are resident too, but they are no
    pages the heap holds.
    """
    pages = _statm()
    return None if pages is None else (pages[0] - pages[1]) * _PAGE


class HeapTrim:
    """When to call :func:`release_free_heap` after an iteration (see ``TRIM_PEAK``)."""

    def __init__(self) -> None:
        self.iterations = 0
        # The heap's resting level (anonymous resident bytes): after the first iteration where
        # setup reserved the run's pages (:func:`reserve`), else after the second, the first
        # being trimmed to drop what setup left; then the size at the last trim.
        self.rest: int | None = None
        self.reserved = False
        self.started = time.perf_counter()  # when the current iteration began

    def start(self, reserved: bool) -> None:
        """A run begins; ``reserved``: its working set's pages are already in the heap."""
        self.started = time.perf_counter()
        self.reserved = reserved

    def after_iteration(self, peak: int) -> None:
        now = time.perf_counter()
        seconds, self.started = now - self.started, now
        if peak < TRIM_PEAK:
            return
        self.iterations += 1
        if seconds >= TRIM_SECONDS or (self.iterations == 1 and not self.reserved):
            release_free_heap()
            return
        rss = anonymous_bytes()
        if rss is None:  # growth cannot be told: trim (a no-op off glibc)
            release_free_heap()
        elif self.rest is None:
            self.rest = rss
        elif rss > self.rest + TRIM_GROWTH:
            release_free_heap()
            self.rest = rss  # a new high: the next trim waits until the heap grows past it
