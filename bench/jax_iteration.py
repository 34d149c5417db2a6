"""Where an iteration of timerl's PPO on the jax backend goes: inside its jitted calls, or in
the host's work around them; and, with ``--kernels``, the device's kernels by name.

The program is compiled and run once (tracing and XLA's compile), then run again with every
jitted call timed until its results are ready: ``inside`` is that time, ``outside`` the rest
of the iteration (the host's Python: stores, frees, the env's episode tally, metrics). The
run's Python functions are listed by their own time (cProfile; the calls' dispatch, counted
inside, among them). ``--kernels``
also traces a further run with ``jax.profiler`` and sums a GPU's stream events by kernel.

    python -m bench.jax_iteration --config synthetic-e256 --device cuda --kernels
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import glob
import pstats
import sys
import tempfile
import time
from dataclasses import replace
from typing import Any


def _compiled(label: str, device: str, iterations: int) -> Any:
    from bench import rl
    from bench.timerl_runner import timerl_config
    from timerl.rl.train import build

    case = {c.label: c for c in rl.all_cases(iterations=iterations)}[label]
    cfg = replace(case.config, device=device).resolved()
    prog = build("ppo", timerl_config(cfg, "ppo", "jax"))
    bounds = {"I": iterations, **prog.bounds}
    outputs = list(prog.metrics.values())
    return prog.ctx.compile(bounds=bounds, outputs=outputs, backend="jax", device=device)


def _time_calls(backend: Any) -> list[float]:
    """Wrap the backend's cached jitted functions so each call waits for its results and adds
    its seconds to the returned list's one entry."""
    import jax

    spent = [0.0]
    for table in (backend._bodies, backend._loops, backend._regions):
        for key, fn in list(table.items()):

            def timed(*args: Any, _fn: Any = fn) -> Any:
                start = time.perf_counter()
                out = jax.block_until_ready(_fn(*args))
                spent[0] += time.perf_counter() - start
                return out

            table[key] = timed
    return spent


def _kernels(prog: Any, device: str, iterations: int, top: int) -> None:
    import jax
    from jax.profiler import ProfileData

    if device == "cpu":
        print("--kernels: a GPU's kernels only (on the CPU XLA's thunks nest, so sums mislead)")
        return
    folder = tempfile.mkdtemp(prefix="timerl-trace-")
    with jax.profiler.trace(folder):
        prog.run()
        jax.effects_barrier()
    path = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[0]
    total: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for plane in ProfileData.from_file(path).planes:
        if "/device:GPU" not in plane.name:
            continue
        for line in plane.lines:
            if "Stream" not in line.name:  # kernels and copies, not XLA's op or module spans
                continue
            for event in line.events:
                total[event.name] += event.duration_ns
                count[event.name] += 1
    n = iterations
    print(f"device events: {sum(total.values()) / 1e6 / n:.2f} ms and "
          f"{sum(count.values()) / n:,.0f} events an iteration")  # fmt: skip
    for name, ns in total.most_common(top):
        print(f"  {ns / 1e6 / n:8.3f} ms {count[name] / n:8.0f}x  {name[:100]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="synthetic-e256", help="a bench rl case label")
    p.add_argument("--device", default="cpu")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--kernels", action="store_true", help="also the device's kernels by name")
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args(argv)
    from bench.common import pin_threads

    pin_threads(args.threads)
    prog = _compiled(args.config, args.device, args.iterations)
    prog.run()  # traces and compiles; later runs reuse the jitted functions
    spent = _time_calls(prog.backend)
    executor = prog.executor()
    executor.prepare(False)  # generate the run's code first: it is not an iteration's work
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    executor.run()
    profile.disable()
    wall = (time.perf_counter() - start) / args.iterations
    inside = spent[0] / args.iterations
    print(f"{args.config} on jax/{args.device}, {args.iterations} iterations: "
          f"{wall * 1e3:.2f} ms an iteration, {inside * 1e3:.2f} inside jitted calls, "
          f"{(wall - inside) * 1e3:.2f} outside")  # fmt: skip
    print("the run's Python by function, own time (cProfile, ms an iteration):")
    stats = pstats.Stats(profile)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])  # type: ignore[attr-defined]
    shown = 0
    for (file, line, name), (_, _, own, *_rest) in rows:
        if "block_until_ready" in name or file.endswith("bench/jax_iteration.py"):
            continue
        print(f"  {own * 1e3 / args.iterations:7.3f}  {file.split('/')[-1]}:{line} {name}")
        shown += 1
        if shown == args.top:
            break
    if args.kernels:
        _kernels(prog, args.device, args.iterations, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
