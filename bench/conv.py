"""NatureCNN forward and backward on a batch of Atari frames: timerl against eager PyTorch.

The pixel policy's trunk (CleanRL's Atari agent: three convolutions, a 512-unit linear layer)
on a ``(batch, 4, 84, 84)`` uint8 batch, scaled by 1/255 inside, the loss ``mean(y ** 2)`` and
its gradient with respect to every weight. timerl compiles the program once per backend
(numpy: im2col and one BLAS product per convolution; torch: ``conv2d`` and its gradients) and
runs it; eager torch runs the same module with the same weights. The three are alternated,
``--repeats`` times, and the medians and their ratios to eager torch printed.

Run: ``python -m bench.conv [--batch 128] [--repeats 5] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np


def _timerl(
    backend: str, frames: np.ndarray, threads: int
) -> tuple[Callable[[], None], list[np.ndarray]]:
    """A compiled forward+backward of NatureCNN, and its initial weights (torch's layout)."""
    import timerl as tl

    ctx = tl.Context(dims=("t",))
    with ctx:
        # the weights as leaves (as eager torch holds them), not drawn at every run
        weights = tl.evaluate(tl.nn.NatureCNN(4, 84, seed=0).parameters(), backend="numpy")
        net = tl.nn.NatureCNN(4, 84, seed=0).with_weights(weights)
        y = net(tl.from_numpy(frames))
        loss = (y * y).mean()
        loss.backward()
        params = net.parameters()
        prog = ctx.compile(
            outputs=[loss] + [p.grad for p in params],
            backend=backend,
            options=tl.CompileOptions(threads=threads),  # eager torch's count
        )
    # one executor for every repeat: code generated once, as a training loop's iterations
    # share it (``Program.run`` makes a fresh executor per call)
    return prog.executor().run, weights


def _eager(frames: np.ndarray, weights: list[np.ndarray]) -> Callable[[], None]:
    import torch
    import torch.nn.functional as F  # noqa: N812

    ws = [torch.tensor(np.asarray(w), requires_grad=True) for w in weights]
    obs = torch.as_tensor(frames)
    specs = [(4, 0), (2, 0), (1, 0)]

    def step() -> None:
        x = obs.float() / 255.0
        for k, (stride, pad) in enumerate(specs):
            x = F.conv2d(x, ws[2 * k], ws[2 * k + 1], stride=stride, padding=pad).relu()
        y = (x.flatten(1) @ ws[6] + ws[7]).relu()
        loss = (y * y).mean()
        torch.autograd.grad(loss, ws)

    return step


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    frames = np.random.default_rng(0).integers(0, 256, (args.batch, 4, 84, 84), dtype=np.uint8)
    run_np, weights = _timerl("numpy", frames, args.threads)
    run_torch, _ = _timerl("torch", frames, args.threads)
    runners = {"timerl numpy": run_np, "timerl torch": run_torch, "eager torch": None}
    runners["eager torch"] = _eager(frames, weights)
    for run in runners.values():  # warm up (first-call allocations, lazy imports)
        run()
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.repeats):
        for name, run in runners.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["eager torch"])
    print(
        f"NatureCNN forward+backward, batch {args.batch}x4x84x84 uint8, {args.repeats} "
        f"alternated repeats, torch threads {args.threads}, {platform.machine()}"
    )
    for name, ts in times.items():
        med = statistics.median(ts)
        spread = ", ".join(f"{t * 1e3:.0f}" for t in ts)
        print(f"  {name:13s} median {med * 1e3:7.1f} ms  x{med / base:5.2f} of eager  [{spread}]")


if __name__ == "__main__":
    main()
