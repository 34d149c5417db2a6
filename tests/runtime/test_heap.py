"""The C heap's settings and trims around a run (runtime/heap.py)."""

from __future__ import annotations

import resource
import subprocess
import sys

import numpy as np
import pytest

from timerl.runtime import heap


def _in_fresh_process(script: str, *args: str) -> str:
    """What ``script`` prints, run by a Python process of its own (a heap no test has used)."""
    out = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, check=True
    )
    return out.stdout


class _FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        return 1

    def malloc(self, size: int) -> int:
        return 0  # out of memory: a reserve stops, reserving nothing

    def free(self, ptr: int) -> None:
        pass

    def madvise(self, ptr: int, size: int, advice: int) -> int:
        self.calls.append((ptr, advice))
        return 0


@pytest.fixture
def fake_libc(monkeypatch):
    libc = _FakeLibc()
    monkeypatch.setattr(heap, "_LIBC", [libc])
    monkeypatch.setattr(heap, "_KEEPING", [None])
    monkeypatch.setattr(heap, "_MMAP", [0])
    monkeypatch.setattr(heap, "_ADVISED", [])
    for name in heap._USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    return libc


def test_freed_pages_are_kept_until_a_run_under_a_budget(fake_libc):
    assert heap.keep_freed_pages()
    assert heap.keep_freed_pages()  # already kept: nothing to set
    assert fake_libc.calls == [(-3, heap.MMAP_THRESHOLD), (-1, heap.TRIM_THRESHOLD)]
    assert not heap.keep_freed_pages(False)  # glibc's first thresholds again
    assert fake_libc.calls[2:] == [(-3, 128 << 10), (-1, 128 << 10)]


def test_a_run_under_a_budget_fixes_glibcs_first_thresholds(fake_libc):
    # glibc would raise them after the first large free: arrays up to that size would then
    # stay on the heap, resident when freed
    assert not heap.keep_freed_pages(False)
    assert not heap.keep_freed_pages(False)  # already fixed: nothing to set
    assert fake_libc.calls == [(-3, 128 << 10), (-1, 128 << 10)]


def test_arrays_a_loop_allocates_at_every_point_still_reuse_the_heaps_pages(fake_libc):
    # 375 KiB observations: mapped apart at every step, each was faulted in again
    step = 8 * 3 * 64 * 64 * 4
    assert not heap.keep_freed_pages(False, reuse_up_to=step)
    mmap = fake_libc.calls[0][1]
    assert fake_libc.calls[0][0] == -3 and step < mmap <= step + 8192 and mmap % 4096 == 0
    # and the heap's free top holds a few of them: trimmed at every free, each step faulted
    # its pages in again
    assert fake_libc.calls[1] == (-1, heap.REUSED_ARRAYS * mmap)
    assert not heap.keep_freed_pages(False, reuse_up_to=step)  # as set: nothing to set
    assert len(fake_libc.calls) == 2
    assert not heap.keep_freed_pages(False)  # and back to glibc's first thresholds
    assert fake_libc.calls[2:] == [(-3, 128 << 10), (-1, 128 << 10)]
    heap.keep_freed_pages(False, reuse_up_to=1 << 40)  # never above what glibc accepts
    assert fake_libc.calls[4] == (-3, heap.MMAP_THRESHOLD)


@pytest.mark.parametrize(
    "name, value",
    [("MALLOC_TRIM_THRESHOLD_", "131072"), ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1")],
)
def test_the_users_own_heap_settings_are_left_alone(fake_libc, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert not heap.keep_freed_pages()
    assert fake_libc.calls == []


def test_a_freed_array_is_reused_without_faulting_its_pages_again():
    if heap._glibc() is None:
        pytest.skip("glibc's heap only")
    heap.keep_freed_pages()  # what every run does first
    n = (8 << 20) // 4  # 8 MiB: above glibc's default mmap threshold, below the kept one

    def faults_of_one_array() -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a = np.ones(n, dtype=np.float32)
        del a
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    faults_of_one_array()  # the heap grows to hold it once
    assert faults_of_one_array() < 64  # 2,048 pages an array when they are handed back


_RESERVED_FAULTS = """
import ctypes, resource
from timerl.runtime import heap

lib = heap._glibc()
heap.keep_freed_pages()
n = 12 << 20

def faults_of_one_allocation():
    # malloc and memset, not numpy: numpy would ask for huge pages and fault fewer
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    ptr = lib.malloc(n)
    ctypes.memset(ptr, 1, n)
    lib.free(ptr)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

heap.release_free_heap()
fresh = faults_of_one_allocation()  # about 3,000 faults: one a page
heap.release_free_heap()
assert heap.reserve(2 * n) == 2 * n
print(fresh, faults_of_one_allocation())
"""


@pytest.mark.skipif(heap._glibc() is None, reason="glibc's heap only")
def test_pages_reserved_at_setup_are_not_faulted_again():
    # in a fresh process: an earlier test's arrays leave holes in this one's heap, trimmed
    # but still free chunks, and ranges numpy advised for huge pages, either of which can
    # take the allocation in place of the reserved pages
    fresh, again = map(int, _in_fresh_process(_RESERVED_FAULTS).split())
    assert again * 4 < fresh


def test_nothing_is_reserved_where_the_heap_does_not_keep_freed_pages(fake_libc):
    # freed, the pages would go straight back: reserving them would only cost the faults
    heap.keep_freed_pages(False)
    assert heap.reserve(8 << 20) == 0


def test_a_trim_takes_back_the_huge_pages_asked_for_a_reserve(fake_libc, monkeypatch):
    # left advised, a range refaulted after every trim makes the kernel compact memory for
    # each huge page (memory-e8, trimmed after every iteration: 40% slower iterations)
    monkeypatch.setattr(heap, "_ADVISED", [(2 << 20, 4 << 20)])
    heap.release_free_heap()
    assert fake_libc.calls == [(2 << 20, heap._MADV_NOHUGEPAGE)]
    assert heap._ADVISED == []


def _short_iterations(monkeypatch, resident_mib: list[int]) -> tuple[heap.HeapTrim, list[int]]:
    """A HeapTrim over short iterations after which the process holds ``resident_mib``."""
    trims: list[int] = []
    resident = iter(resident_mib)
    monkeypatch.setattr(heap, "anonymous_bytes", lambda: next(resident) << 20)
    monkeypatch.setattr(heap, "release_free_heap", lambda: trims.append(1))
    monkeypatch.setattr(heap, "TRIM_GROWTH", 4 << 20)
    monkeypatch.setattr(heap, "TRIM_SECONDS", 1e9)
    return heap.HeapTrim(), trims


def test_the_heap_is_trimmed_only_when_resting_memory_grows(monkeypatch):
    trim, trims = _short_iterations(monkeypatch, [100, 101, 105, 102])
    trim.after_iteration(heap.TRIM_PEAK - 1)  # a small program: never looks
    for _ in range(5):
        trim.after_iteration(heap.TRIM_PEAK)
    # the first iteration trims; the second sets the resting level; only the fourth grew
    assert trims == [1, 1]


def test_a_run_whose_pages_were_reserved_keeps_them_after_its_first_iteration(monkeypatch):
    # the first iteration's arrays are the reserve: trimming them would cost the second
    # iteration every fault the reserve saved the first
    trim, trims = _short_iterations(monkeypatch, [130, 131, 136])
    trim.start(reserved=True)
    for _ in range(3):
        trim.after_iteration(heap.TRIM_PEAK)
    assert trims == [1]  # 130 is the level; only 136 grew past it


@pytest.mark.parametrize("resident", [None, 100 << 20])
def test_after_long_iterations_or_unknown_memory_every_iteration_trims(monkeypatch, resident):
    trims: list[int] = []
    monkeypatch.setattr(heap, "anonymous_bytes", lambda: resident)
    monkeypatch.setattr(heap, "release_free_heap", lambda: trims.append(1))
    monkeypatch.setattr(heap, "TRIM_SECONDS", 1e9 if resident is None else 0.0)
    trim = heap.HeapTrim()
    for _ in range(3):
        trim.after_iteration(heap.TRIM_PEAK)
    assert trims == [1, 1, 1]


def test_a_run_under_a_memory_budget_does_not_keep_freed_pages(fake_libc):
    from core_helpers import counting

    ctx, _, big_t, x = counting(4)
    free = ctx.compile(bounds={big_t: 8}, outputs=[x])
    budgeted = ctx.compile(bounds={big_t: 8}, outputs=[x], memory_budget=1 << 20)
    free.run()
    assert heap._KEEPING == [True]
    budgeted.run()
    assert heap._KEEPING == [False]
    np.testing.assert_array_equal(budgeted.value(x), free.value(x))


def test_a_trim_raises_the_level_the_next_one_waits_for(monkeypatch):
    # a heap whose resting size wanders (torch's does) is trimmed at each new high only:
    # a trim costs the next iteration the faults of every page it gave back
    trim, trims = _short_iterations(monkeypatch, [100, 106, 108, 111])
    done = []
    for _ in range(5):
        trim.after_iteration(heap.TRIM_PEAK)
        done.append(len(trims))
    # the first iteration trims; 100 is the level; 106 trims and becomes it; 108 does not
    assert done == [1, 1, 2, 2, 3]


@pytest.mark.parametrize("compiled", [True, False])
def test_under_a_budget_the_heap_is_trimmed_right_before_the_plans_peak(monkeypatch, compiled):
    # freed small arrays leave pages resident in the heap's holes, which no meter counts: given
    # back where the plan peaks, the run's resident memory follows the meter there
    from core_helpers import counting

    ctx, _, big_t, x = counting(4)
    free = ctx.compile(bounds={big_t: 8}, outputs=[x])
    budgeted = ctx.compile(bounds={big_t: 8}, outputs=[x], memory_budget=1 << 20)
    plan = budgeted.planned_peak()
    peak = [op for op in budgeted.compiled.spec.ops if op.id == plan.peak_op]
    assert len(peak) == 1 and peak[0].label == plan.peak_at
    trims: list[int] = []
    monkeypatch.setattr(heap, "release_free_heap", lambda: trims.append(1))
    monkeypatch.setattr(heap, "_LAST_TRIM", [0.0, 0.0])
    budgeted.executor(compiled=compiled).run()
    assert 1 <= len(trims) <= 8  # before the peak's statement: at most once a point of t
    del trims[:]
    free.executor(compiled=compiled).run()
    assert not trims  # without a budget the heap keeps its free pages for the next arrays
    np.testing.assert_array_equal(budgeted.value(x), free.value(x))


def test_trims_before_a_peak_in_a_long_loop_are_spaced(monkeypatch):
    # a trim walks the whole heap (about 2 ms): a peak statement run at every step of a long
    # loop would otherwise pay it a thousand times an iteration
    clock = iter([0.0, 0.002, 0.003, 0.05, 0.2, 0.202])
    monkeypatch.setattr(heap.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(heap, "_LAST_TRIM", [0.0, 0.0])
    trims: list[int] = []
    monkeypatch.setattr(heap, "release_free_heap", lambda: trims.append(1))
    heap.trim_before_peak()  # trims from 0 to 2 ms
    heap.trim_before_peak()  # 1 ms after it: within 50 of its 2 ms, skipped
    heap.trim_before_peak()  # 48 ms after: skipped
    heap.trim_before_peak()  # 198 ms after: trims
    assert trims == [1, 1]


_MAIN_ARENA_GROWTH = """
import ctypes, os, re, sys, tempfile
from timerl.runtime import heap

def main_arena():
    libc = ctypes.CDLL(None)
    libc.fdopen.restype = ctypes.c_void_p
    libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    fd, path = tempfile.mkstemp()
    fp = libc.fdopen(fd, b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    xml = open(path).read()
    os.unlink(path)
    heap0 = xml.split('<heap nr="1">')[0]
    return int(re.findall(r'<system type="current" size="(\\d+)"/>', heap0)[0])

src = "def run(x):\\n" + "".join(f"    v{i} = x + {i}  # add#{i}\\n" for i in range(6000))
before = main_arena()
code = heap.compile_apart(src, "<run>") if sys.argv[1] == "apart" else compile(src, "<run>", "exec")
grown = main_arena() - before
ns = {}
exec(code, ns)
assert ns["run"](1) is None
print(grown)
"""


@pytest.mark.skipif(heap._glibc() is None, reason="glibc's arenas only")
def test_a_run_function_compiled_apart_leaves_the_runs_heap_as_it_was():
    # a fresh process each, so that no earlier test's free space absorbs the compiler's
    def grown(how: str) -> int:
        return int(_in_fresh_process(_MAIN_ARENA_GROWTH, how).split()[-1])

    # compiled here, the compiler's freed blocks stay in the heap as holes the run's arrays
    # fill; compiled apart, they are another arena's
    assert grown("here") > 4 << 20
    assert grown("apart") < 1 << 20


def test_code_is_compiled_here_where_no_thread_can_be_started(monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    def refuse(self, *args, **kwargs):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(ThreadPoolExecutor, "submit", refuse)
    ns: dict = {}
    exec(heap.compile_apart("def f(x):\n    return x + 1\n", "<f>"), ns)
    assert ns["f"](1) == 2
