"""The acting network as data, run in numpy: what ``timerl eval`` acts with.

A trained program records its acting network in each checkpoint's header (``acting``) as a
list of layer records that ``tl.nn`` modules write (``Module.describe()``), parameters by
name: ``linear``, ``conv2d``, ``max_pool2d``, ``residual`` (nested records added to their
input), ``flatten``, ``permute`` (the axes after the batch axis, e.g. channels-last images to
``(C, H, W)``), ``float`` (a cast to float32 and a scale: uint8 frames stay uint8 up to
here), the activations, and the recurrent cells ``lstm`` and ``gru``, whose state the caller
carries from step to step. A checkpoint without the record (older runs, SAC, DQN, ...) has
its MLP rebuilt from the names ``<net>.<k>.weight`` (:func:`mlp_layers`).

``timerl export`` rebuilds the same records in torch (:mod:`timerl.rl.train.export`); the
tests compare both with the program's own forward pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from timerl.errors import CheckpointError

Layer = dict[str, Any]

ACTIVATIONS = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, np.float32(0.0)),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
}
CELLS = {"lstm": 2, "gru": 1}  # state width in units of the hidden size


def mlp_layers(
    params: dict[str, np.ndarray], net: str, activation: str, obs_ndim: int
) -> list[Layer]:
    """An MLP's records from its parameter names: flattened float input, linear layers
    ``<net>.0``, ``<net>.1``, ... with ``activation`` between them."""
    layers: list[Layer] = [{"op": "flatten", "ndim": obs_ndim}, {"op": "float", "scale": 1.0}]
    ks = _layer_numbers(params, net)
    for k in ks:
        layers.append({"op": "linear", "param": f"{net}.{k}"})
        if k < len(ks) - 1:
            layers.append({"op": activation})
    return layers


def _layer_numbers(params: dict[str, np.ndarray], net: str) -> list[int]:
    prefix, suffix = f"{net}.", ".weight"
    ks = sorted(
        int(name[len(prefix) : -len(suffix)])
        for name in params
        if name.startswith(prefix)
        and name.endswith(suffix)
        and name[len(prefix) : -len(suffix)].isdigit()
    )
    if ks != list(range(len(ks))):
        raise CheckpointError(f"{net}: layers {ks} are not numbered 0..{len(ks) - 1}")
    return ks


def walk(layers: list[Layer]) -> Iterator[Layer]:
    """Every record, nested ones (a residual block's) included, in order."""
    for layer in layers:
        yield layer
        yield from walk(layer.get("layers", []))


def state_widths(layers: list[Layer]) -> list[int]:
    """The width of each recurrent cell's carried state, in order."""
    return [CELLS[r["op"]] * int(r["hidden"]) for r in walk(layers) if r["op"] in CELLS]


def check_layers(layers: list[Layer], params: dict[str, np.ndarray]) -> None:
    """Every record known and every parameter it names present: a clear error, not a
    KeyError in the middle of an episode."""
    for layer in walk(layers):
        op = layer.get("op")
        if op not in RUNNERS and op not in ACTIVATIONS:
            raise CheckpointError(f"the checkpoint's acting network has an unknown layer {op!r}")
        for name in _param_names(layer):
            if name not in params:
                raise CheckpointError(
                    f"the acting network's {op} layer needs the parameter {name!r}, which the "
                    "checkpoint does not hold"
                )


def _param_names(layer: Layer) -> list[str]:
    p = layer.get("param")
    if p is None:
        return []
    if layer["op"] in CELLS:
        return [f"{p}.{w}" for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    return [f"{p}.weight"]


def forward(
    layers: list[Layer], params: dict[str, np.ndarray], x: np.ndarray, state: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The network's output for a batch ``x`` and the cells' next states (``state``: one
    ``(batch, width)`` array per cell, as :func:`state_widths`)."""
    cells = iter(state)
    nxt: list[np.ndarray] = []
    y = _run(layers, params, x, cells, nxt)
    return y, nxt


def _run(
    layers: list[Layer],
    params: dict[str, np.ndarray],
    x: np.ndarray,
    cells: Iterator[np.ndarray],
    nxt: list[np.ndarray],
) -> np.ndarray:
    for layer in layers:
        op = layer["op"]
        if op in ACTIVATIONS:
            x = ACTIVATIONS[op](x)
        elif op == "residual":
            x = x + _run(layer["layers"], params, x, cells, nxt)
        elif op in CELLS:
            x, s = RUNNERS[op](layer, params, x, next(cells))
            nxt.append(s)
        else:
            x = RUNNERS[op](layer, params, x)
    return x


def _linear(layer: Layer, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    y = x @ params[layer["param"] + ".weight"]
    bias = params.get(layer["param"] + ".bias")
    return y + bias if bias is not None else y


def _windows(x: np.ndarray, kernel: Any, stride: Any) -> np.ndarray:
    """``(N, C, OH, OW, kh, kw)``: each output position's input window, as strided views."""
    win = np.lib.stride_tricks.sliding_window_view(x, tuple(kernel), axis=(2, 3))
    return win[:, :, :: stride[0], :: stride[1]]


def _conv2d(layer: Layer, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    w = params[layer["param"] + ".weight"]
    ph, pw = layer["padding"]
    if ph or pw:
        x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    win = _windows(x, w.shape[2:], layer["stride"])
    y = np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)
    return y + params[layer["param"] + ".bias"][:, None, None]


def _max_pool2d(layer: Layer, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    ph, pw = layer["padding"]
    if ph or pw:
        x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf)
    return _windows(x, layer["kernel"], layer["stride"]).max(axis=(-2, -1))


def _flatten(layer: Layer, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    keep = x.ndim - int(layer["ndim"])
    return x.reshape(*x.shape[:keep], -1)


def _permute(layer: Layer, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    return x.transpose(0, *(1 + int(a) for a in layer["axes"]))


def _float(layer: Layer, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    scale = float(layer.get("scale", 1.0))
    return x * np.float32(scale) if scale != 1.0 else x


def _gates(layer: Layer, params: dict[str, np.ndarray], x: np.ndarray, h: np.ndarray) -> Any:
    p = layer["param"]
    zi = x @ params[f"{p}.weight_ih"] + params[f"{p}.bias_ih"]
    zh = h @ params[f"{p}.weight_hh"] + params[f"{p}.bias_hh"]
    return zi, zh


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _lstm(
    layer: Layer, params: dict[str, np.ndarray], x: np.ndarray, hc: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """torch's LSTMCell (gates input, forget, cell, output); state ``[h, c]``."""
    n = int(layer["hidden"])
    h, c = hc[:, :n], hc[:, n:]
    zi, zh = _gates(layer, params, x, h)
    i, f, g, o = np.split(zi + zh, 4, axis=-1)
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    h = _sigmoid(o) * np.tanh(c)
    return h, np.concatenate([h, c], -1)


def _gru(
    layer: Layer, params: dict[str, np.ndarray], x: np.ndarray, h: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """torch's GRUCell (gates reset, update, new)."""
    zi, zh = _gates(layer, params, x, h)
    (ri, ui, ni), (rh, uh, nh) = np.split(zi, 3, axis=-1), np.split(zh, 3, axis=-1)
    r, u = _sigmoid(ri + rh), _sigmoid(ui + uh)
    h = (1.0 - u) * np.tanh(ni + r * nh) + u * h
    return h, h


RUNNERS: dict[str, Any] = {
    "linear": _linear,
    "conv2d": _conv2d,
    "max_pool2d": _max_pool2d,
    "flatten": _flatten,
    "permute": _permute,
    "float": _float,
    "lstm": _lstm,
    "gru": _gru,
    "residual": None,  # handled by _run: it nests records
}
