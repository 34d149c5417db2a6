"""Survey what the fuzzer finds: every distinct failure with its smallest reproducer.

The differential tests stop at the first failing program; this script keeps going, groups the
failures by their error (names and numbers taken out), keeps the shortest reproducer of each,
and counts, for every generator flag, how many programs using it failed::

    python tests/fuzz/survey.py --programs 400 --out FINDINGS.md

Programs come from a seeded RNG (``--seed``), smallest first: a third with one construct, the
rest with up to three.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import HAS_OPTIMIZE_FLAG, Finding, check, signature  # noqa: E402
from programs import FLAGS, RandomChooser, generate  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grad-share", type=float, default=0.35)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)

    found: dict[str, tuple[Finding, int, int]] = {}
    counts: collections.Counter = collections.Counter()
    uses: collections.Counter = collections.Counter()
    fails: collections.Counter = collections.Counter()
    start = time.perf_counter()
    n_ok = 0
    for k in range(args.programs):
        seed = args.seed * 1_000_003 + k
        ch = RandomChooser(seed)
        grad = ch.chance(int(args.grad_share * 100))
        program = generate(ch, frozenset(FLAGS), grad=grad, max_stages=1 if k % 3 == 0 else 3)
        uses.update(program.used)
        try:
            check(program, torch_too=ch.chance(30))
            n_ok += 1
        except Finding as f:
            sig = signature(f)
            counts[sig] += 1
            fails.update(program.used)
            size = len(program.source())
            if sig not in found or size < found[sig][1]:
                found[sig] = (f, size, seed)
    seconds = time.perf_counter() - start

    lines = [
        "# Fuzzer findings",
        "",
        f"{args.programs} programs (seed {args.seed}, {args.grad_share:.0%} with gradients,"
        f" `optimize=False` compared: {HAS_OPTIMIZE_FLAG}), {n_ok} passed,"
        f" {args.programs - n_ok} failed, {len(found)} distinct failures; {seconds:.0f} s.",
        f"Command: `python tests/fuzz/survey.py --programs {args.programs} --seed {args.seed}`.",
        "",
        "## Failure rate by construct (programs using it that failed / using it)",
        "",
    ]
    for flag in FLAGS:
        if uses[flag]:
            lines.append(f"- `{flag}`: {fails[flag]}/{uses[flag]}")
    lines.append("")
    lines.append("## Distinct failures, most frequent first (shortest reproducer of each)")
    for n, (sig, count) in enumerate(counts.most_common(), 1):
        f, _, seed = found[sig]
        lines += [
            "",
            f"### {n}. {f.kind} ({count} programs)",
            "",
            f"Generator seed {seed}; constructs used: {', '.join(sorted(f.program.used))}.",
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
