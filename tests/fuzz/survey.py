"""Survey what the fuzzer finds: every distinct failure with its smallest reproducer.

The differential tests stop at the first failing program; this script keeps going, groups the
failures by their error (names and numbers taken out), keeps the shortest reproducer of each,
and counts, for every generator flag, how many programs using it failed::

    python tests/fuzz/survey.py --programs 400 --out FINDINGS.md

Programs come from a seeded RNG (``--seed``): a third with one construct, the rest with up to
three. The shortest program of each kind of failure is then shrunk (``shrink.py``).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # this checkout's timerl

from generator import FLAGS, RandomChooser, generate  # noqa: E402
from harness import HAS_OPTIMIZE_FLAG, Finding, check, signature  # noqa: E402
from programs import Program  # noqa: E402
from shrink import shrink  # noqa: E402

# where jax is installed, programs run on it too (``--no-jax``: not, a quicker survey)
JAX = importlib.util.find_spec("jax") is not None


def failure(program: Program) -> Finding | None:
    """The first disagreement of timerl with the reference, on numpy (optimised and not),
    torch and jax."""
    try:
        check(program, torch_too=True, jax_too=JAX)
    except Finding as f:
        return f
    return None


# elementwise constructs every program of the per-construct table may use besides its own
BASIC = frozenset({"spatial", "spatial_reduce", "where", "maximum", "exp", "lgamma"})
# constructs that only show up together with another one
COMPANIONS = {
    "shift": {"piecewise"},
    "cross_read": {"fwd"},
    "linear": {"fwd_cond", "bwd_cond"},
    "derived_slice": {"prefix", "suffix"},
    "reduce_max": {"prefix", "full"},
    "alias": {"clamp", "mod", "prefix", "derived_slice"},
    "before": {"at_point", "two_step"},
    "chain": {"two_step", "coupled", "frame", "bwd_cond", "overlap"},
    "at_point": {"two_step", "overlap", "prefix"},
    "empty_branch": {"piecewise", "bound_one"},
    "whole_base": {"fwd", "overlap", "full"},
    "constant": {"fwd", "two_step"},
    "bare": {"frame"},
    "scalar_input": {"spread", "spatial_index"},
    "spread": {"scalar_input", "spatial_index"},
    "broadcast": {"spread", "constant", "fwd"},
    "bound_one": {"two_step", "frame", "piecewise"},
}


def per_flag_table(n: int, seed: int) -> list[str]:
    """For each construct: how many of ``n`` programs using only it (and BASIC) fail.

    Each row's programs also use the row's ``COMPANIONS``; rows for dims other than ``t`` use
    the (i, t) context.
    """
    rows = []
    for flag in FLAGS:
        if flag in BASIC:
            continue
        flags = BASIC | {flag} | COMPANIONS.get(flag, set())
        failed = {False: 0, True: 0}
        first = ""
        for grad in (False, True):
            for k in range(n):
                ch = RandomChooser(seed * 1_000_003 + k + (10_000 if grad else 0))
                needs_two = flag in ("carry", "outer_rec", "cross_read")
                program = generate(ch, flags, grad=grad, max_stages=2, two=needs_two or None)
                f = failure(program)
                if f is not None:
                    failed[grad] += 1
                    first = first or signature(f).replace("|", "/")
        rows.append(f"| `{flag}` | {failed[False]}/{n} | {failed[True]}/{n} | {first} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grad-share", type=float, default=0.35)
    parser.add_argument("--shrink-budget", type=int, default=120)
    parser.add_argument("--per-flag", type=int, default=0, help="programs per construct alone")
    parser.add_argument("--out", default="")
    parser.add_argument("--no-jax", action="store_true", help="numpy and torch only (quicker)")
    args = parser.parse_args(argv)
    global JAX
    JAX = JAX and not args.no_jax
    per_flag = per_flag_table(args.per_flag, args.seed) if args.per_flag else []

    found: dict[str, tuple[Finding, int, int]] = {}
    counts: collections.Counter = collections.Counter()
    uses: collections.Counter = collections.Counter()
    fails: collections.Counter = collections.Counter()
    import timerl

    print(f"timerl from {os.path.dirname(timerl.__file__)}", file=sys.stderr)
    start = time.perf_counter()
    n_ok = 0
    for k in range(args.programs):
        seed = args.seed * 1_000_003 + k
        ch = RandomChooser(seed)
        grad = ch.chance(int(args.grad_share * 100))
        program = generate(ch, frozenset(FLAGS), grad=grad, max_stages=1 if k % 3 == 0 else 3)
        uses.update(program.used)
        try:
            check(program, torch_too=True, jax_too=JAX)
            n_ok += 1
        except Finding as f:
            sig = signature(f)
            counts[sig] += 1
            fails.update(program.used)
            size = len(program.source())
            if sig not in found or size < found[sig][1]:
                found[sig] = (f, size, seed)
    seconds = time.perf_counter() - start
    for sig, (f, _size, seed) in list(found.items()):

        def same(q: Program, sig: str = sig) -> bool:
            g = failure(q)
            return g is not None and signature(g) == sig

        small = shrink(f.program, same, budget=args.shrink_budget)
        found[sig] = (failure(small) or f, _size, seed)
    shrink_seconds = time.perf_counter() - start - seconds

    lines = [
        "# Fuzzer findings",
        "",
        f"{args.programs} programs (seed {args.seed}, {args.grad_share:.0%} with gradients,"
        f" `optimize=False` compared: {HAS_OPTIMIZE_FLAG}), {n_ok} passed,"
        f" {args.programs - n_ok} failed, {len(found)} distinct failures; {seconds:.0f} s"
        f" (+{shrink_seconds:.0f} s shrinking the reproducers).",
        f"Command: `python tests/fuzz/survey.py --programs {args.programs} --seed {args.seed}`.",
        "",
        "## Failure rate by construct (programs using it that failed / using it)",
        "",
    ]
    for flag in FLAGS:
        if uses[flag]:
            lines.append(f"- `{flag}`: {fails[flag]}/{uses[flag]}")
    if per_flag:
        lines += [
            "",
            f"## Each construct alone ({args.per_flag} value and {args.per_flag} gradient"
            " programs with only it and the basic elementwise ops enabled)",
            "",
            "| construct | values failed | gradients failed | first failure |",
            "|---|---|---|---|",
            *per_flag,
        ]
    lines.append("")
    lines.append("## Distinct failures, most frequent first (shortest reproducer of each)")
    for n, (sig, count) in enumerate(counts.most_common(), 1):
        f, _, seed = found[sig]
        lines += [
            "",
            f"### {n}. {f.kind} ({count} programs)",
            "",
            f"First seen with generator seed {seed}; shrunk; constructs in the reproducer:"
            f" {', '.join(sorted(f.program.used)) or 'none flagged'}.",
            "",
            "```",
            f.detail,
            "```",
            "",
            "```python",
            f.program.source(),
            "```",
        ]
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
