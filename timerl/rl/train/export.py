"""``timerl export``: the trained acting network as a file that runs without timerl.

- ``torch``: a ``torch.export`` program (``torch.export.load(path).module()``) mapping a batch
  of observations ``(batch, *obs_shape)``, of any float dtype (float32, float64), to
  deterministic actions ``(batch, *action_shape)``; needs only torch to run. torch.export
  fixes the number of dimensions of an input, so one observation is given as a batch of one
  (``policy(obs[None])[0]``); the dtype it converts itself.
- ``onnx``: the same module as an ONNX graph, input ``obs`` and output ``action``; writing it
  needs the ``onnx`` extra (torch's exporter uses ``onnx`` and ``onnxscript``).

The network is the one ``timerl eval`` acts with (see :mod:`timerl.rl.train.evaluation`), input
normalisation included: the exported module takes raw observations.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from timerl.errors import BackendError, CheckpointError
from timerl.rl.algos.naming import arg_ref
from timerl.rl.train.evaluation import (
    PolicySpec,
    _make_env,
    checkpoint_policy,
    load_run_checkpoint,
)

FORMATS = {"torch": ".pt2", "onnx": ".onnx"}


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise BackendError(
            "timerl export needs torch, which is not installed: pip install 'timerl[torch]'"
        ) from None
    return torch


def torch_module(spec: PolicySpec) -> Any:
    """A ``torch.nn.Module``: observations (batch, *obs_shape) -> deterministic actions."""
    torch = _torch()
    nn = torch.nn
    acts = {"tanh": nn.Tanh, "relu": nn.ReLU, "sigmoid": nn.Sigmoid}
    layers: list[Any] = []
    n = len(spec.weights)
    for k, (w, b) in enumerate(zip(spec.weights, spec.biases, strict=True)):
        lin = nn.Linear(w.shape[0], w.shape[1], bias=b is not None)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T)))
            if b is not None:
                lin.bias.copy_(torch.from_numpy(np.asarray(b)))
        layers.append(lin)
        if k < n - 1:
            layers.append(acts[spec.activation]())
    low = torch.as_tensor(spec.low if spec.low is not None else np.zeros(1), dtype=torch.float32)
    high = torch.as_tensor(spec.high if spec.high is not None else np.zeros(1), dtype=torch.float32)
    norm = spec.normalizer
    # with no normalisation: mean 0, scale 1 and clip inf (an identity the module skips)
    mean = torch.as_tensor(norm.mean if norm else np.zeros(1), dtype=torch.float32)
    var = norm.var if norm else np.ones(1)
    scale = torch.sqrt(torch.as_tensor(var, dtype=torch.float32) + (norm.eps if norm else 0.0))
    clip = float(norm.clip) if norm else None
    policy = _policy_class()
    return policy(
        nn.Sequential(*layers),
        spec.kind,
        spec.obs_dim,
        low,
        high,
        spec.low is not None,
        mean,
        scale,
        clip,
    )


def _policy_class() -> Any:
    """Defined on first use: torch is an optional dependency."""
    torch = _torch()

    class Policy(torch.nn.Module):
        """Deterministic actions of a timerl-trained policy (argmax, mean, or squashed mean)."""

        def __init__(
            self,
            net: Any,
            kind: str,
            obs_dim: int,
            low: Any,
            high: Any,
            bounded: bool,
            obs_mean: Any,
            obs_scale: Any,
            obs_clip: float | None,
        ) -> None:
            super().__init__()
            self.net = net
            self.kind = kind
            self.obs_dim = obs_dim
            self.bounded = bounded
            self.register_buffer("low", low)
            self.register_buffer("high", high)
            self.register_buffer("obs_mean", obs_mean)
            self.register_buffer("obs_scale", obs_scale)
            self.obs_clip = obs_clip

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            # a cast that torch.export does not turn into a check of the input's dtype (as
            # ``obs.float()`` would): float64 observations (numpy's default) are accepted
            x = torch.ops.aten._to_copy.default(obs, dtype=torch.float32)
            if self.obs_clip is not None:
                x = ((x - self.obs_mean) / self.obs_scale).clamp(-self.obs_clip, self.obs_clip)
            out = self.net(x.reshape(obs.shape[0], self.obs_dim))
            if self.kind == "categorical" or self.kind == "greedy":
                return out.argmax(-1)
            if self.kind == "gaussian":
                return out
            y = torch.tanh(out[:, : out.shape[1] // 2])
            if self.bounded:
                y = self.low + (y + 1.0) * 0.5 * (self.high - self.low)
            return y

    return Policy


def export_run(
    run_dir: str | Path,
    fmt: str = "torch",
    out: str | Path | None = None,
    checkpoint: str = "latest",
    env: Any = None,
    notice: Callable[[str], None] | None = None,
) -> Path:
    """Write the run's acting network as ``fmt``; returns the file written.

    ``env``: the environment to size the network's input and output by, instead of the one
    the run records (an id, ``"module:EnvId"``, a class or a factory). ``notice``: told when
    a damaged latest checkpoint is passed over for an older one."""
    if fmt not in FORMATS:
        raise CheckpointError(
            f"unknown export format {fmt!r} ({arg_ref('fmt', '--format')}); "
            f"choose one of {sorted(FORMATS)}"
        )
    ckpt = load_run_checkpoint(run_dir, checkpoint, notice=notice)
    env = _make_env(ckpt.header, 0, env)
    spec = checkpoint_policy(ckpt, env)
    example = env.reset()
    env.close()
    path = Path(out) if out is not None else Path(run_dir) / f"policy{FORMATS[fmt]}"
    path.parent.mkdir(parents=True, exist_ok=True)
    module = torch_module(spec).eval()
    torch = _torch()
    # a batch of two: tracing with one would specialise the batch size to 1
    x = torch.from_numpy(np.repeat(np.asarray(example, dtype=np.float32), 2, axis=0))
    if fmt == "torch":
        batch = torch.export.Dim("batch", min=1)
        program = torch.export.export(module, (x,), dynamic_shapes={"obs": {0: batch}})
        torch.export.save(program, str(path))
        return path
    _export_onnx(module, x, path)
    return path


def _export_onnx(module: Any, x: Any, path: Path) -> None:
    torch = _torch()
    missing = [m for m in ("onnx", "onnxscript") if not _has(m)]
    if missing:
        raise BackendError(
            f"--format onnx needs {' and '.join(missing)}, not installed: "
            "pip install 'timerl[onnx]' (or use --format torch)"
        )
    import logging
    import warnings

    batch = torch.export.Dim("batch", min=1)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _onnx_export(torch, module, x, path, batch)


def _onnx_export(torch: Any, module: Any, x: Any, path: Path, batch: Any) -> None:
    torch.onnx.export(
        module,
        (x,),
        str(path),
        input_names=["obs"],
        output_names=["action"],
        dynamic_shapes={"obs": {0: batch}},
        dynamo=True,
        external_data=False,
        verbose=False,
    )


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
