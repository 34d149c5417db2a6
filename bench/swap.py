"""A block swapped to the next tier under a memory budget: time per run and memory held.

One block ``x`` (``T`` rows) is written, sits idle while a second block ``y`` is written, then
is read whole; under a budget of 1.5 blocks the compiler swaps ``x`` out and back. Prints,
for the program without and with the budget (runs alternated), the seconds per run, the
meter's peak and the memory the process really held: the device allocator's peak on CUDA,
the resident set's growth on the host (measured in a fresh process per configuration, since
the high-water mark of a process only rises).

    python -m bench.swap                      # numpy, 256 MiB blocks, on the host
    python -m bench.swap --backend torch --device cuda --width 1048576
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any


def idle_block(width: int = 1024) -> tuple[Any, Any]:
    """``x`` is written, idle while ``y``'s loop runs, then read whole: a block to swap.
    ``(context, output)``; the memory tests use it too."""
    import timerl as tl

    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((width,), domain=(t,))
        x[0] = tl.full((width,), 1.0)
        x[t + 1] = x[t] * 0.5 + 1.0
        y = tl.RecurrentTensor.placeholder((width,), domain=(t,))
        y[0] = x[T - 1] * 2.0
        y[t + 1] = y[t] * 0.9
        out = x[0:T] @ y[0:T].sum(0)
    return ctx, out


def _program(width: int, rows: int, budget_blocks: float | None, backend: str, device: str):
    ctx, out = idle_block(width)
    block = rows * width * 4
    budget = None if budget_blocks is None else int(budget_blocks * block)
    prog = ctx.compile(
        bounds={"T": rows}, outputs=[out], backend=backend, device=device, memory_budget=budget
    )
    return prog, out


def _measure(args: argparse.Namespace, budget_blocks: float | None) -> dict:
    """One configuration in this process: seconds per run, meter peak, memory held."""
    from timerl.runtime.heap import resident_bytes

    prog, out = _program(args.width, args.rows, budget_blocks, args.backend, args.device)
    sync = (lambda: None) if args.device == "cpu" else _cuda_sync
    base = resident_bytes()
    seconds = []
    for _ in range(args.runs):
        sync()
        start = time.perf_counter()
        prog.run()
        sync()
        seconds.append(time.perf_counter() - start)
    stats = prog.stats()
    held = stats.get("device_peak_bytes")
    if held is None:  # the host: the resident set's growth over the runs
        held = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {
        "seconds": statistics.median(seconds),
        "metered_peak": stats["peak_bytes"],
        "held_peak": held,
        "moved": stats.get("swapped_bytes", 0),
        "tier": stats.get("swap_tier"),
        "tier_peak": stats.get("swap_tier_peak_bytes", 0),
        "checksum": float(prog.value(out).sum()),
    }


def _cuda_sync() -> None:
    import torch

    torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="numpy", choices=["numpy", "torch"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--width", type=int, default=1 << 18, help="float32 elements per row")
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--runs", type=int, default=5, help="runs per process (median)")
    p.add_argument("--rounds", type=int, default=3, help="processes per configuration")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a worker: free or budget
    args = p.parse_args(argv)
    if args.one is not None:
        print(json.dumps(_measure(args, None if args.one == "free" else 1.5)))
        return 0
    block = args.rows * args.width * 4
    print(f"block {block / 2**20:.0f} MiB ({args.rows} rows of {args.width} float32), "
          f"{args.backend} on {args.device}, budget 1.5 blocks; {args.runs} runs per process, "
          f"{args.rounds} alternated processes per configuration")  # fmt: skip
    results: dict[str, list[dict]] = {"free": [], "budget": []}
    for _ in range(args.rounds):
        for name in results:
            cmd = [sys.executable, "-m", "bench.swap", *(argv or sys.argv[1:]), "--one", name]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for name, rows in results.items():
        mib = [f"{r['held_peak'] / 2**20:.0f}" for r in rows]
        ms = [f"{r['seconds'] * 1e3:.1f}" for r in rows]
        r = rows[0]
        print(f"{name:>6}: {'/'.join(ms)} ms a run; metered peak {r['metered_peak'] / 2**20:.0f} "
              f"MiB, held {'/'.join(mib)} MiB; moved {r['moved'] / 2**20:.0f} MiB to the "
              f"{r['tier'] or '-'} tier (at most {r['tier_peak'] / 2**20:.0f} MiB there)")  # fmt: skip
    same = {r["checksum"] for rows in results.values() for r in rows}
    print("same values with and without the budget:", len(same) == 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
