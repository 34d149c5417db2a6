"""Run one generated program through timerl and compare every value with the reference."""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import traceback
from dataclasses import dataclass

import numpy as np
from exprs import use_noise
from programs import Program

import timerl as tl
import timerl.api.functional  # noqa: F401 (the builder's host functions reach it as tl.api)
from timerl.ir import counter_rng

# `optimize=False` (the unoptimised numpy reference) where this timerl offers it
HAS_OPTIMIZE_FLAG = "optimize" in inspect.signature(tl.evaluate).parameters

RTOL = 1e-7
ATOL = 1e-9

# incrementalisation (every row region, however small, run by blocks) where timerl has it
try:
    from timerl.compiler import incrementalize
except ImportError:
    incrementalize = None
HAS_BLOCKS = incrementalize is not None

# the device of the torch and jax configurations ("cuda" on a machine with a GPU)
DEVICE = os.environ.get("TIMERL_FUZZ_DEVICE", "cpu")


def _noise(stream: int, point: tuple, shape: tuple) -> np.ndarray:
    """The numbers ``tl.randn`` draws at ``point`` for ``stream`` with seed 0 (in float32)."""
    return counter_rng.normal(np, (0, stream, *point), shape, np.float32).astype(np.float64)


use_noise(_noise)


class Finding(AssertionError):
    """A valid program timerl rejected, crashed on, or computed differently from the reference."""

    def __init__(self, kind: str, detail: str, program: Program) -> None:
        self.kind = kind
        self.detail = detail
        self.program = program
        super().__init__(
            f"{kind}: {detail}\nconstructs used: {', '.join(sorted(program.used))}\n"
            f"--- reproducer ---\n{program.source()}\n------------------"
        )


@dataclass(frozen=True)
class Config:
    """One way of running the program: a backend, with or without the optimising passes."""

    backend: str = "numpy"
    optimize: bool = True
    device: str = "cpu"
    blocks: int | None = None  # computations over rows run in this many blocks
    # ``ctx.compile(outputs=...)`` and ``Program.value`` instead of ``tl.evaluate``: the
    # context's effects are roots, run whether or not an output reads them
    compiled: bool = False

    def __str__(self) -> str:
        on = "" if self.device == "cpu" else f" on {self.device}"
        by = "" if self.blocks is None else f", in {self.blocks} blocks of rows"
        how = ", compiled with its effects" if self.compiled else ""
        return f"{self.backend}{on}{'' if self.optimize else ', optimize=False'}{by}{how}"


def configs(
    torch_too: bool,
    unoptimised: bool = True,
    jax_too: bool = False,
    blocked: bool = False,
    compiled: bool = False,
) -> list[Config]:
    out = [Config("numpy")]
    if compiled:
        out.append(Config("numpy", compiled=True))
    if blocked and HAS_BLOCKS:
        out.append(Config("numpy", blocks=2))
    if HAS_OPTIMIZE_FLAG and unoptimised:
        out.append(Config("numpy", optimize=False))
    if torch_too:
        out.append(Config("torch", device=DEVICE))
    if jax_too:
        out.append(Config("jax", device=DEVICE))
    return out


def _in_generator(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and "/tests/fuzz/" in frames[-1].filename


def _short(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = (
        f" (at {frames[-1].filename.split('/timerl/')[-1]}:{frames[-1].lineno})" if frames else ""
    )
    return f"{type(exc).__name__}: {exc}{where}"


def _compare(kind: str, name: str, got: object, want: object, program: Program, cfg: Config):
    if isinstance(want, list):  # one array per episode (``Program.lengths``)
        parts = list(got) if isinstance(got, (list, tuple, np.ndarray)) else []
        if len(parts) != len(want):
            raise Finding(
                kind, f"{name} on {cfg}: {len(parts)} episodes, want {len(want)}", program
            )
        for k, (g, w) in enumerate(zip(parts, want, strict=True)):
            _compare(kind, f"{name}[{k}]", g, w, program, cfg)
        return
    got_arr = np.asarray(got, dtype=np.float64) if not isinstance(got, list) else None
    if got_arr is None or got_arr.shape != want.shape:
        shape = got_arr.shape if got_arr is not None else "a ragged list"
        raise Finding(kind, f"{name} on {cfg}: shape {shape}, want {want.shape}", program)
    if not np.allclose(got_arr, want, rtol=RTOL, atol=ATOL, equal_nan=False):
        bad = np.argwhere(~np.isclose(got_arr, want, rtol=RTOL, atol=ATOL))
        at = tuple(int(v) for v in bad[0])
        raise Finding(
            kind,
            f"{name} on {cfg} at {at}: timerl {got_arr[at]!r}, reference {want[at]!r}"
            f" ({len(bad)} of {want.size} differ)",
            program,
        )


def run_config(program: Program, cfg: Config, sunk: dict | None = None) -> list:
    """Build the program afresh and evaluate its outputs (and input gradients) on ``cfg``;
    what its sinks received goes into ``sunk`` (they run where the program is compiled with
    its effects, ``cfg.compiled``)."""
    try:
        _ctx, b, _loss = program.build(tl)
    except tl.TimerlError as exc:
        raise Finding("rejected while building", _short(exc), program) from exc
    except Exception as exc:
        if _in_generator(exc):
            raise  # a bug of the generator, not of timerl
        raise Finding("raw exception while building", _short(exc), program) from exc
    if sunk is not None:
        sunk.update(b.sunk)
    wanted = [b.tensors[t.name] for t in program.outputs]
    if program.grad:
        wanted += [b.tensors[t.name].grad for t in program.inputs]
    kwargs: dict = {} if cfg.optimize else {"optimize": False}
    if cfg.blocks is not None:
        kwargs["options"] = tl.CompileOptions(blocks=cfg.blocks)
    try:
        with _blocks(cfg.blocks):
            if cfg.compiled:
                prog = _ctx.compile(
                    bounds=program.bounds(b), backend=cfg.backend, outputs=wanted, **kwargs
                )
                prog.run()
                return [prog.value(w) for w in wanted]
            return tl.evaluate(
                wanted, bounds=program.bounds(b), backend=cfg.backend, device=cfg.device, **kwargs
            )
    except tl.TimerlError as exc:
        raise Finding(f"rejected by evaluate ({cfg})", _short(exc), program) from exc
    except Exception as exc:
        raise Finding(f"raw exception in evaluate ({cfg})", _short(exc), program) from exc


@contextlib.contextmanager
def _blocks(count: int | None):
    """With ``count`` blocks asked for, even the smallest computation over rows runs by
    blocks (None: as usual)."""
    if count is None:
        yield
        return
    old = incrementalize.MIN_OP_BYTES
    incrementalize.MIN_OP_BYTES = 0
    try:
        yield
    finally:
        incrementalize.MIN_OP_BYTES = old


def check(
    program: Program,
    torch_too: bool = False,
    unoptimised: bool = True,
    jax_too: bool = False,
    blocked: bool = False,
    compiled: bool = False,
) -> None:
    """Raise ``Finding`` unless every configuration matches the reference value for value.

    Always the numpy backend with every optimisation on; ``unoptimised`` adds the
    ``optimize=False`` reference where timerl has it, ``torch_too`` the torch backend,
    ``jax_too`` the jax backend (with its jitted regions) and ``blocked`` numpy with every
    computation over rows run in two blocks (incrementalisation), ``compiled`` numpy through
    ``ctx.compile`` with the context's effects as roots instead of ``tl.evaluate``.
    """
    want = program.reference_values()
    grads = program.reference_grads() if program.grad else {}
    for cfg in configs(torch_too, unoptimised, jax_too, blocked, compiled):
        sunk: dict = {}
        got = run_config(program, cfg, sunk)
        if cfg.compiled:
            _compare_sinks(program, sunk, want, cfg)
        outs = program.outputs
        for t, g in zip(outs, got[: len(outs)], strict=True):
            _compare("value mismatch", t.name, g, want[t.name], program, cfg)
        for t, g in zip(program.inputs if program.grad else [], got[len(outs) :], strict=True):
            _compare("gradient mismatch", f"{t.name}.grad", g, grads[t.name], program, cfg)


def _compare_sinks(program: Program, sunk: dict, want: dict, cfg: Config) -> None:
    """Each sink got every point of its tensor once, with the reference's value there."""
    for name in program.sinks:
        got = sunk.get(name, [])
        points = [p for p, _ in got]
        expected = want[name]
        t = next(t for t in program.tensors if t.name == name)
        if isinstance(expected, list):  # one array per episode
            every = [(k, q) for k, rows in enumerate(expected) for q in range(len(rows))]
            expected = {p: expected[p[0]][p[1]] for p in every}
        else:
            every = sorted(np.ndindex(*expected.shape[: len(t.domain)]))
        if sorted(points) != every:
            raise Finding(
                "sink mismatch",
                f"sink({name}) on {cfg} got points {sorted(points)}, want each of {every} once",
                program,
            )
        for p, value in got:
            _compare("sink mismatch", f"sink({name}) at {p}", value, expected[p], program, cfg)


# how a timerl error message is reduced to the kind of failure it reports
_SIGNATURE_RULES = [
    (r"the read of .*? by [^:]*?(\(defined at [^)]*\))?(:| gathers)", r"a read\2"),
    (r"index \(?[^()]*?(\([^()]*\))?[^()]*?\)? must move", "index <expr> must move"),
    (r"cannot slice through index .*", "cannot slice through index <expr>"),
    (r"\(defined at [^)]*\)", ""),
    (r"\(at [^)]*\)", ""),
    (
        r"(reads both earlier and later points: |with and without dim \w+: )(grad|vjp)?.*",
        r"\1\2...",
    ),
    (r"\b(u|y|p|x|a|b|lag)\d+\b", "<tensor>"),
    (r"[a-z_]+#\d+", "<op>"),
    (r"-?\d+(\.\d+)?(e-?\d+)?", "N"),
]


def signature(f: Finding) -> str:
    """The kind of failure: the error with names, numbers and places taken out."""
    if f.kind.endswith("mismatch"):  # which configuration: a wrong value on torch alone
        on = re.search(r" on (.+?)(?: at \(| got points|: |$)", f.detail)
        return f"{f.kind} on {on.group(1)}" if on else f.kind
    text = f.detail
    for pattern, repl in _SIGNATURE_RULES:
        text = re.sub(pattern, repl, text)
    return f"{f.kind} | {' '.join(text.split())}"[:200]
