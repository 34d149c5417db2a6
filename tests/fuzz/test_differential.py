"""Differential fuzzing: random valid recurrence programs, timerl against a plain evaluator.

Each example is a program from ``generator.generate`` with every construct enabled. timerl must
build and compile it (any ``TimerlError`` on these valid programs is a failure, as is a raw
Python exception) and give, value for value, what ``programs.Reference`` computes point by
point; gradient examples also compare every input's ``.grad`` with torch autograd through the
same reference. A failure prints the shrunk program as runnable timerl source.

``TIMERL_FUZZ_EXAMPLES`` sets the total number of programs (default 400, split over the tests
below by ``TESTS``); each runs on numpy (optimised, and with ``optimize=False``), on torch and,
where jax is installed, on jax. ``TIMERL_FUZZ_DEVICE`` (default cpu) is the device of the
torch and jax runs. ``TIMERL_FUZZ_SEED`` (any string) draws another set of programs than the
fixed one the suite checks (``make fuzz SEED=7``). ``TIMERL_FUZZ_KEEP_GOING=1`` runs every
program and fails at the end with each distinct failure (unshrunk) instead of stopping at the
first.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, note, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from generator import FLAGS, DrawChooser, generate  # noqa: E402
from harness import HAS_OPTIMIZE_FLAG, Finding, check, signature  # noqa: E402
from programs import Program  # noqa: E402

TOTAL = int(os.environ.get("TIMERL_FUZZ_EXAMPLES", "400"))
# run every program and fail once at the end, listing each distinct failure (no shrinking)
KEEP_GOING = os.environ.get("TIMERL_FUZZ_KEEP_GOING", "") == "1"
# another set of programs than the suite's fixed one (each value its own, reproducibly)
SEED = os.environ.get("TIMERL_FUZZ_SEED", "")
# the jax backend is an optional extra: where it is installed, every program runs on it too
HAS_JAX = importlib.util.find_spec("jax") is not None

# share of the programs each test runs, and what they are: (share, gradients, (i, t) dims,
# most stages per program); values are cheaper than gradients
TESTS = {
    "values_t": (0.32, False, False, 3),
    "values_it": (0.26, False, True, 3),
    "values_small": (0.16, False, None, 1),
    "grads_t": (0.14, True, False, 2),
    "grads_it": (0.12, True, True, 2),
}
assert abs(sum(share for share, *_ in TESTS.values()) - 1.0) < 1e-9
# each test runs in this many parts of its own seed, so two workers share the work evenly
PARTS = 2


def examples(name: str) -> int:
    return max(1, -(-round(TOTAL * TESTS[name][0]) // PARTS))


@st.composite
def programs(draw, grad: bool, two: bool | None, max_stages: int) -> tuple[Program, bool, bool]:
    """A program with every construct enabled, and whether to run it on numpy by blocks of
    rows too (incrementalisation, a quarter of the programs) and on numpy through
    ``ctx.compile`` with the context's effects as roots (a quarter)."""
    ch = DrawChooser(draw)
    program = generate(ch, frozenset(FLAGS), grad=grad, max_stages=max_stages, two=two)
    return program, ch.chance(25), ch.chance(25)


def fuzz(name: str, part: int) -> None:
    """Check ``examples(name)`` programs, each on numpy with every optimisation on, numpy with
    none (``optimize=False``), torch and jax; the first failure is shrunk and printed."""
    _, grad, two, max_stages = TESTS[name]
    findings: list[Finding] = []
    count = examples(name)

    @seed(zlib.crc32((name + (f"/{part}" if part else "") + SEED).encode()))
    @settings(
        max_examples=count,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.generate] if KEEP_GOING else [Phase.generate, Phase.shrink],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(programs(grad, two, max_stages))
    def each(case: tuple[Program, bool, bool]) -> None:
        program, blocked, compiled = case
        note(program.source())
        try:
            check(
                program,
                torch_too=True,
                unoptimised=True,
                jax_too=HAS_JAX,
                blocked=blocked,
                compiled=compiled,
            )
        except Finding as f:
            if not KEEP_GOING:
                raise
            findings.append(f)

    each()
    if findings:
        groups: dict[str, list[Finding]] = {}
        for f in findings:
            groups.setdefault(signature(f), []).append(f)
        text = [f"{len(findings)} of {count} programs failed, {len(groups)} ways:"]
        for sig, fs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            text.append(f"\n[{len(fs)}x] {sig}\n{min(fs, key=lambda f: len(str(f)))}")
        pytest.fail("\n".join(text), pytrace=False)


@pytest.mark.parametrize("part", range(PARTS))
def test_values_t(part):
    fuzz("values_t", part)


@pytest.mark.parametrize("part", range(PARTS))
def test_values_it(part):
    fuzz("values_it", part)


@pytest.mark.parametrize("part", range(PARTS))
def test_values_small(part):
    """One construct at a time, so a rejected construct is found in its smallest form."""
    fuzz("values_small", part)


@pytest.mark.parametrize("part", range(PARTS))
def test_gradients_t(part):
    fuzz("grads_t", part)


@pytest.mark.parametrize("part", range(PARTS))
def test_gradients_it(part):
    fuzz("grads_it", part)


def test_the_reference_is_independent_of_timerl():
    """The reference evaluator and the generator must not use timerl: a bug shared by both
    would hide itself."""
    import ast
    import importlib
    import inspect

    for name in ("arrays", "exprs", "programs", "generator"):
        tree = ast.parse(inspect.getsource(importlib.import_module(name)))
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "numpy" in imported, name  # the walk sees the imports
        assert not any(m and m.split(".")[0] == "timerl" for m in imported), name


# constructs timerl has supported for long: enough to check the printed reproducers
PLAIN = frozenset({"spatial", "clamp", "prefix", "suffix", "full", "const_index", "fwd"})


@pytest.mark.parametrize("seed", range(4))
def test_printed_reproducer_is_the_checked_program(seed):
    """Running the printed source gives the reference's values (arrays print exactly)."""
    import numpy as np
    from generator import RandomChooser

    program = generate(RandomChooser(seed), PLAIN, max_stages=2, two=False)
    source = program.source().replace("print(tl.evaluate(", "result = (tl.evaluate(")
    scope: dict = {}
    exec(compile(source, "<reproducer>", "exec"), scope)
    want = program.reference_values()
    assert len(scope["result"]) == len(program.outputs)
    for t, got in zip(program.outputs, scope["result"], strict=True):
        np.testing.assert_allclose(got, want[t.name], rtol=1e-7, atol=1e-9)


def _small_program(grad: bool = False) -> Program:
    from generator import RandomChooser

    return generate(RandomChooser(3), PLAIN, grad=grad, max_stages=1, two=False)


def test_a_wrong_value_fails_the_check(monkeypatch):
    """The comparison is live: a reference that disagrees by 1e-5 is reported with the program."""
    program = _small_program()
    check(program)  # agrees as generated
    right = program.reference_values()
    name = program.outputs[0].name
    wrong = {k: v + (1e-5 if k == name else 0.0) for k, v in right.items()}
    monkeypatch.setattr(program, "reference_values", lambda: wrong)
    with pytest.raises(Finding, match=f"value mismatch: {name} on numpy") as info:
        check(program)
    assert "tl.evaluate(" in str(info.value)  # the reproducer is printed


def test_a_wrong_gradient_fails_the_check(monkeypatch):
    program = _small_program(grad=True)
    check(program)
    right = program.reference_grads()
    wrong = {k: v * 1.001 + 1e-6 for k, v in right.items()}
    monkeypatch.setattr(program, "reference_grads", lambda: wrong)
    with pytest.raises(Finding, match="gradient mismatch"):
        check(program)


def test_a_sink_that_misses_a_point_or_a_value_fails_the_check(monkeypatch):
    """Sinks are checked where the program is compiled with its effects: every point once,
    each with the reference's value."""
    import dataclasses

    from programs import Builder

    plain = _small_program()
    program = dataclasses.replace(plain, sinks=(plain.outputs[0].name,))
    check(program, compiled=True)  # agrees as generated
    record = Builder.recorder

    def skipping_the_first(self, name):
        inner, calls = record(self, name), []

        def rec(value, point):
            calls.append(point)
            if len(calls) > 1:
                inner(value, point)

        return rec

    monkeypatch.setattr(Builder, "recorder", skipping_the_first)
    with pytest.raises(Finding, match="sink mismatch: sink.* got points"):
        check(program, compiled=True)

    def off_by_a_little(self, name):
        inner = record(self, name)
        return lambda value, point: inner(np.asarray(value) + 1e-5, point)

    monkeypatch.setattr(Builder, "recorder", off_by_a_little)
    with pytest.raises(Finding, match="sink mismatch: sink.* at"):
        check(program, compiled=True)


def test_a_rejected_valid_program_fails_the_check(monkeypatch):
    """Any timerl error on a generated program is a failure, never a skip."""
    import timerl as tl

    program = _small_program()

    def reject(*args, **kwargs):
        raise tl.CycleError("no loop order")

    monkeypatch.setattr(tl, "evaluate", reject)
    with pytest.raises(Finding, match="rejected by evaluate"):
        check(program)


def test_gradient_of_a_slice_along_a_fixed_row():
    """Found by the fuzzer: the gradient of ``u[1, t:T]`` must not reach row 0.

    x[t] = sum_{k >= t} u[1, k], loss = sum_t x[t]^2, so d loss / d u[1, k] = 2 * sum_{t <= k} x[t]
    and row 0 gets nothing, with or without the optimising passes.
    """
    import numpy as np

    import timerl as tl

    u = np.array([[0.19, 0.38], [0.83, -0.35]])
    x = np.array([u[1, t:].sum() for t in range(2)])
    want = np.zeros_like(u)
    want[1] = [2 * x[: k + 1].sum() for k in range(2)]
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (_, big_t) = ctx.dims, ctx.bounds
    with ctx:
        u0 = tl.from_numpy(u, domain=(i, t), dtype="float64", requires_grad=True)
        y = u0[1, t:big_t].sum(0)
        (y * y).sum().backward()
    modes = [{}, {"optimize": False}] if HAS_OPTIMIZE_FLAG else [{}]
    for kwargs in modes:
        np.testing.assert_allclose(
            tl.evaluate(u0.grad, **kwargs), want, rtol=1e-12, err_msg=str(kwargs)
        )


@pytest.mark.parametrize("error", ["CycleError", "OutOfRangeError", "ProgramError"])
def test_no_rejection_is_tolerated(monkeypatch, error):
    """The scheduler's errors too: every generated program is valid, so any refusal fails."""
    import timerl as tl

    program = _small_program()

    def reject(*args, **kwargs):
        raise getattr(tl, error)("refused")

    monkeypatch.setattr(tl, "evaluate", reject)
    with pytest.raises(Finding, match=f"rejected by evaluate .*{error}: refused"):
        check(program)
