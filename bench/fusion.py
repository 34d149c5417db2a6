"""Does fusing elementwise chains pay at RL sizes? The measurement behind the choice.

timerl's generated code calls one kernel per op, so a chain of elementwise ops allocates a
temporary per op. Fusion can save the allocations (numpy with ``out=`` into one buffer) or the
passes over memory and the per-op dispatch (a compiled kernel: ``torch.compile``). This times,
side by side and alternated, the chains PPO runs most, at the sizes PPO runs them:

- ``adam``: an Adam step on a 64x64 weight (m, v, bias corrections, update: 11 ops);
- ``gae``: the elementwise terms of GAE over a 16-env x 128-step batch (6 ops);
- ``clip``: PPO's clipped objective over 2,048 points (ratio, clip, min, mean: 7 ops);
- ``wide``: tanh(x * a + b) * c over a 4,000 x 64 batch (the vectorised critic's size);
- ``tanh_bw``: the tanh backward ``g * (1 - y * y)`` over 64,000 x 64 (the update at 256 envs),
  also over blocks of rows that stay in cache (``numpy blocked``: each op with ``out=`` into a
  block-sized buffer, the last into the result's rows).

Run: ``python -m bench.fusion [--repeats 5] [--torch-compile]`` (``torch.compile`` needs a
C++ compiler and takes seconds per chain to compile; its compile time is reported apart).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable

import numpy as np


def _adam(xp_ops: dict) -> Callable:
    def chain(p, g, m, v):
        m2 = m * 0.9 + g * 0.1
        v2 = v * 0.999 + g * g * 0.001
        mh = m2 / 0.1
        vh = v2 / 0.001
        return p - 0.0003 * mh / (xp_ops["sqrt"](vh) + 1e-8)

    return chain


def _gae(xp_ops: dict) -> Callable:
    def chain(r, v, nv, d):
        return r + 0.99 * nv * (1.0 - d) - v

    return chain


def _clip(xp_ops: dict) -> Callable:
    def chain(logp, old, adv):
        ratio = xp_ops["exp"](logp - old)
        return -xp_ops["minimum"](ratio * adv, xp_ops["clip"](ratio, 0.8, 1.2) * adv)

    return chain


def _wide(xp_ops: dict) -> Callable:
    def chain(x, a, b, c):
        return xp_ops["tanh"](x * a + b) * c

    return chain


def _adam_out(p, g, m, v, buf, buf2):
    """The Adam chain with every temporary written into two preallocated buffers."""
    np.multiply(m, 0.9, out=buf)
    np.multiply(g, 0.1, out=buf2)
    buf += buf2  # m2
    np.multiply(g, g, out=buf2)
    buf2 *= 0.001
    np.multiply(v, 0.999, out=v)
    v += buf2  # v2 (in place: v is dead after this op, as donation would allow)
    np.divide(v, 0.001, out=buf2)
    np.sqrt(buf2, out=buf2)
    buf2 += 1e-8
    buf /= 0.1
    buf *= 0.0003
    buf /= buf2
    return np.subtract(p, buf, out=buf)


def _tanh_bw(xp_ops: dict) -> Callable:
    def chain(y, g):
        return g * (1.0 - y * y)

    return chain


def _tanh_bw_out(y, g, out, buf):
    """Per op into preallocated buffers: what the generated code runs with donation."""
    np.multiply(y, y, out=buf)
    np.subtract(1.0, buf, out=buf)
    return np.multiply(g, buf, out=out)


BLOCK_ELEMENTS = 1 << 15  # 128 KiB of float32 a block: each op's block stays in the core's L2


def _tanh_bw_blocked(y, g, out, buf):
    """The chain over blocks of rows, each op's block written into a buffer in cache."""
    rows = max(1, BLOCK_ELEMENTS // y.shape[1])
    for start in range(0, y.shape[0], rows):
        stop = min(start + rows, y.shape[0])
        _tanh_bw_out(y[start:stop], g[start:stop], out[start:stop], buf[: stop - start])
    return out


CHAINS = {"adam": _adam, "gae": _gae, "clip": _clip, "wide": _wide, "tanh_bw": _tanh_bw}


def _inputs(name: str, rng: np.random.Generator) -> list[np.ndarray]:
    def f(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    if name == "adam":
        return [f(64, 64), f(64, 64), f(64, 64), np.abs(f(64, 64))]
    if name == "gae":
        return [f(128, 16), f(128, 16), f(128, 16), (f(128, 16) > 1).astype(np.float32)]
    if name == "clip":
        return [f(2048), f(2048), f(2048)]
    if name == "tanh_bw":
        return [np.tanh(f(64000, 64)), f(64000, 64)]
    return [f(4000, 64), f(64), f(64), f(64)]


def _time(fn: Callable, args: list, number: int) -> float:
    fn(*args)
    t0 = time.perf_counter()
    for _ in range(number):
        fn(*args)
    return (time.perf_counter() - t0) / number


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--torch-compile", action="store_true")
    args = ap.parse_args(argv)
    np_ops = {"sqrt": np.sqrt, "exp": np.exp, "minimum": np.minimum, "clip": np.clip}
    np_ops["tanh"] = np.tanh
    rng = np.random.default_rng(0)
    systems: dict[str, dict[str, Callable]] = {
        "numpy per op": {},
        "numpy out=": {},
        "numpy blocked": {},
    }
    inputs = {name: _inputs(name, rng) for name in CHAINS}
    for name, make in CHAINS.items():
        systems["numpy per op"][name] = make(np_ops)
    bufs = (np.empty((64, 64), np.float32), np.empty((64, 64), np.float32))
    systems["numpy out="]["adam"] = lambda p, g, m, v: _adam_out(p, g, m, v.copy(), *bufs)
    wide_out = np.empty((64000, 64), np.float32)
    wide_buf = np.empty((64000, 64), np.float32)
    systems["numpy out="]["tanh_bw"] = lambda y, g: _tanh_bw_out(y, g, wide_out, wide_buf)
    systems["numpy blocked"]["tanh_bw"] = lambda y, g: _tanh_bw_blocked(y, g, wide_out, wide_buf)
    compile_s: dict[str, float] = {}
    torch_inputs: dict[str, list] = {}
    try:
        import torch

        torch.set_num_threads(1)
        t_ops = {
            "sqrt": torch.sqrt,
            "exp": torch.exp,
            "minimum": torch.minimum,
            "clip": torch.clamp,
            "tanh": torch.tanh,
        }
        torch_inputs = {n: [torch.from_numpy(x) for x in xs] for n, xs in inputs.items()}
        systems["torch per op"] = {n: make(t_ops) for n, make in CHAINS.items()}
        if args.torch_compile:
            systems["torch.compile"] = {}
            for n, make in CHAINS.items():
                fn = torch.compile(make(t_ops), dynamic=False)
                t0 = time.perf_counter()
                fn(*torch_inputs[n])
                compile_s[n] = time.perf_counter() - t0
                systems["torch.compile"][n] = fn
    except ImportError:
        pass
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):  # alternated: every system once per repetition
        for sys_name, chains in systems.items():
            for name, fn in chains.items():
                xs = torch_inputs[name] if sys_name.startswith("torch") else inputs[name]
                times.setdefault((sys_name, name), []).append(
                    _time(fn, xs, 30 if name == "tanh_bw" else 300)
                )
    print(
        f"config: python {platform.python_version()}, numpy {np.__version__}, "
        f"{os.cpu_count()} CPUs, 1 thread, median of {args.repeats} alternated repetitions"
    )
    base = "numpy per op"
    print(f"{'chain':8s}" + "".join(f"{s:>22s}" for s in systems))
    for name in CHAINS:
        cells = []
        ref = float(np.median(times[(base, name)]))
        for sys_name in systems:
            if (sys_name, name) not in times:
                cells.append(f"{'-':>22s}")
                continue
            t = float(np.median(times[(sys_name, name)]))
            cells.append(f"{t * 1e6:10.1f} us ({ref / t:4.2f}x)")
        print(f"{name:8s}" + "".join(f"{c:>22s}" for c in cells))
    for name, s in compile_s.items():
        print(f"torch.compile of {name}: {s:.1f} s to compile")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
