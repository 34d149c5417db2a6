"""``timerl export``: the trained acting network as a file that runs without timerl.

- ``torch``: a ``torch.export`` program (``torch.export.load(path).module()``) mapping a batch
  of observations ``(batch, *obs_shape)``, of any dtype (float32, float64, uint8 frames), to
  deterministic actions ``(batch, *action_shape)``; needs only torch to run. torch.export
  fixes the number of dimensions of an input, so one observation is given as a batch of one
  (``policy(obs[None])[0]``); the dtype it converts itself. A recurrent policy (LSTM) maps
  ``(obs, state)`` to ``(action, next_state)``: ``state`` is ``(batch, width)``, zeros at an
  episode's start (the width is printed on export).
- ``onnx``: the same module as an ONNX graph, input ``obs`` (and ``state``) and output
  ``action`` (and ``next_state``); writing it needs the ``onnx`` extra (torch's exporter uses
  ``onnx`` and ``onnxscript``).

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
from timerl.rl.train.acting import state_widths
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
    """A ``torch.nn.Module``: observations (batch, *obs_shape) -> deterministic actions; for a
    recurrent network ``(obs, state) -> (action, next_state)``."""
    torch = _torch()
    classes = _classes()
    low = torch.as_tensor(spec.low if spec.low is not None else np.zeros(1), dtype=torch.float32)
    high = torch.as_tensor(spec.high if spec.high is not None else np.zeros(1), dtype=torch.float32)
    norm = spec.normalizer
    # with no normalisation: mean 0, scale 1 and clip inf (an identity the module skips)
    mean = torch.as_tensor(norm.mean if norm else np.zeros(1), dtype=torch.float32)
    var = norm.var if norm else np.ones(1)
    scale = torch.sqrt(torch.as_tensor(var, dtype=torch.float32) + (norm.eps if norm else 0.0))
    clip = float(norm.clip) if norm else None
    net = classes["Net"](spec.layers, spec.params)
    policy = classes["RecurrentPolicy" if spec.state_widths else "Policy"]
    module = policy(net, spec.kind, low, high, spec.low is not None, mean, scale, clip)
    return module.requires_grad_(False)  # an inference module: its outputs need no graph


def _torch_layer(record: dict[str, Any], params: dict[str, np.ndarray]) -> Any:
    """The torch module of one record of :mod:`timerl.rl.train.acting` (None: a function)."""
    torch = _torch()
    nn = torch.nn
    op, p = record["op"], record.get("param")

    def put(target: Any, name: str, value: np.ndarray) -> None:
        with torch.no_grad():
            getattr(target, name).copy_(torch.from_numpy(np.ascontiguousarray(value)))

    if op == "linear":
        w = params[f"{p}.weight"]
        bias = params.get(f"{p}.bias")
        layer = nn.Linear(w.shape[0], w.shape[1], bias=bias is not None)
        put(layer, "weight", w.T)
        if bias is not None:
            put(layer, "bias", bias)
        return layer
    if op == "conv2d":
        w = params[f"{p}.weight"]
        layer = nn.Conv2d(w.shape[1], w.shape[0], w.shape[2:], record["stride"], record["padding"])
        put(layer, "weight", w)
        put(layer, "bias", params[f"{p}.bias"])
        return layer
    if op == "max_pool2d":
        return nn.MaxPool2d(record["kernel"], record["stride"], record["padding"])
    if op in ("lstm", "gru"):
        w_ih = params[f"{p}.weight_ih"]
        cell = (nn.LSTMCell if op == "lstm" else nn.GRUCell)(w_ih.shape[0], int(record["hidden"]))
        put(cell, "weight_ih", w_ih.T)
        put(cell, "weight_hh", params[f"{p}.weight_hh"].T)
        put(cell, "bias_ih", params[f"{p}.bias_ih"])
        put(cell, "bias_hh", params[f"{p}.bias_hh"])
        return cell
    if op == "residual":
        return _classes()["Net"](record["layers"], params)
    return None


_CLASSES: dict[str, Any] = {}


def _classes() -> dict[str, Any]:
    """The module classes, defined on first use: torch is an optional dependency."""
    if _CLASSES:
        return _CLASSES
    torch = _torch()
    functions = {"tanh": torch.tanh, "relu": torch.relu, "sigmoid": torch.sigmoid}

    class Net(torch.nn.Module):
        """The acting network's records in order; each cell's state is passed through."""

        def __init__(self, layers: list[dict[str, Any]], params: dict[str, np.ndarray]) -> None:
            super().__init__()
            self.records = layers
            self.layers = torch.nn.ModuleList(
                [m if (m := _torch_layer(r, params)) is not None else Identity() for r in layers]
            )

        def forward(self, x: Any, state: list[Any]) -> tuple[Any, list[Any]]:
            out: list[Any] = []
            for record, layer in zip(self.records, self.layers, strict=True):
                op = record["op"]
                if op in functions:
                    x = functions[op](x)
                elif op == "float":
                    x = x * float(record.get("scale", 1.0))
                elif op == "flatten":
                    x = torch.flatten(x, x.ndim - int(record["ndim"]))
                elif op == "permute":
                    x = x.permute(0, *(1 + int(a) for a in record["axes"]))
                elif op == "residual":
                    y, inner = layer(x, state[len(out) :])
                    x = x + y
                    out += inner
                elif op == "lstm":
                    n = int(record["hidden"])
                    hc = state[len(out)]
                    h, c = layer(x, (hc[:, :n], hc[:, n:]))
                    x = h
                    out.append(torch.cat([h, c], -1))
                elif op == "gru":
                    x = layer(x, state[len(out)])
                    out.append(x)
                else:
                    x = layer(x)
            return x, out

    class Identity(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return x

    class Policy(torch.nn.Module):
        """Deterministic actions of a timerl-trained policy (argmax, mean, or squashed mean)."""

        def __init__(
            self,
            net: Any,
            kind: str,
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
            self.bounded = bounded
            self.register_buffer("low", low)
            self.register_buffer("high", high)
            self.register_buffer("obs_mean", obs_mean)
            self.register_buffer("obs_scale", obs_scale)
            self.obs_clip = obs_clip
            self.widths = state_widths(net.records)

        def run(self, obs: Any, state: list[Any]) -> tuple[Any, list[Any]]:
            # a cast that torch.export does not turn into a check of the input's dtype (as
            # ``obs.float()`` would): float64 observations (numpy's default) and uint8
            # frames are accepted
            x = torch.ops.aten._to_copy.default(obs, dtype=torch.float32)
            if self.obs_clip is not None:
                x = ((x - self.obs_mean) / self.obs_scale).clamp(-self.obs_clip, self.obs_clip)
            out, state = self.net(x, state)
            if self.kind == "categorical" or self.kind == "greedy":
                return out.argmax(-1), state
            if self.kind == "gaussian":
                return out, state
            y = torch.tanh(out[:, : out.shape[1] // 2])
            if self.bounded:
                y = self.low + (y + 1.0) * 0.5 * (self.high - self.low)
            return y, state

        def forward(self, obs: Any) -> Any:
            return self.run(obs, [])[0]

    class RecurrentPolicy(Policy):
        """``(obs, state) -> (action, next_state)``: the cells' states side by side in one
        ``(batch, width)`` tensor, zeros at an episode's start (zero an env's row when its
        episode ends, as training does)."""

        def forward(self, obs: Any, state: Any) -> Any:  # type: ignore[override]
            parts = list(torch.split(state, self.widths, dim=-1))
            action, nxt = self.run(obs, parts)
            return action, torch.cat(nxt, -1)

    _CLASSES.update(Net=Net, Policy=Policy, RecurrentPolicy=RecurrentPolicy)
    return _CLASSES


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
    width = sum(spec.state_widths)
    args = (x, torch.zeros(2, width)) if width else (x,)
    if width and notice is not None:
        notice(
            f"a recurrent policy: module(obs, state) -> (action, next_state), state of shape "
            f"(batch, {width}), zeros at an episode's start"
        )
    if fmt == "torch":
        batch = torch.export.Dim("batch", min=1)
        dynamic = {name: {0: batch} for name in ("obs", "state")[: len(args)]}
        program = torch.export.export(module, args, dynamic_shapes=dynamic)
        torch.export.save(program, str(path))
        return path
    _export_onnx(module, args, path)
    return path


def _export_onnx(module: Any, args: tuple[Any, ...], path: Path) -> None:
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
        _onnx_export(torch, module, args, path, batch)


def _onnx_export(torch: Any, module: Any, args: tuple[Any, ...], path: Path, batch: Any) -> None:
    inputs = ["obs", "state"][: len(args)]
    torch.onnx.export(
        module,
        args,
        str(path),
        input_names=inputs,
        output_names=["action", "next_state"][: len(args)],
        dynamic_shapes={name: {0: batch} for name in inputs},
        dynamo=True,
        external_data=False,
        verbose=False,
    )


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
