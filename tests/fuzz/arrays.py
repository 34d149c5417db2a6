"""The reference's array operations: numpy for values, torch for autograd gradients."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class NumpyOps:
    """The reference's array operations in numpy (values)."""

    name = "numpy"

    @staticmethod
    def stack(items: list, shape: tuple) -> Any:
        if not items:
            return np.zeros((0, *shape))
        return np.stack(items)

    tanh = staticmethod(np.tanh)
    exp = staticmethod(np.exp)

    @staticmethod
    def lgamma(x: Any) -> Any:
        """The C library's, elementwise (numpy has none)."""
        return np.asarray(np.frompyfunc(math.lgamma, 1, 1)(x), dtype=np.float64)

    sin = staticmethod(np.sin)
    matmul = staticmethod(np.matmul)
    maximum = staticmethod(np.maximum)
    where = staticmethod(np.where)

    @staticmethod
    def sigmoid(x: Any) -> Any:
        return 1.0 / (1.0 + np.exp(-x))

    @staticmethod
    def reduce(x: Any, op: str, axis: int) -> Any:
        if op == "logsumexp":
            top = np.max(x, axis=axis, keepdims=True)
            return np.log(np.sum(np.exp(x - top), axis=axis)) + np.squeeze(top, axis)
        return {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[op](x, axis=axis)

    @staticmethod
    def softmax(x: Any) -> Any:
        z = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return z / np.sum(z, axis=-1, keepdims=True)

    clip = staticmethod(np.clip)

    @staticmethod
    def conv_row(x: Any, w: np.ndarray) -> Any:
        """``x`` ``(S,)`` correlated with each output channel's kernel row ``w[o, 0, 0]``
        (zero-padded by one each side), the channels summed: written out, not by timerl's."""
        padded = np.concatenate([[0.0], x, [0.0]])
        return sum(
            w[o, 0, 0, k] * padded[k : k + len(x)] for o in range(w.shape[0]) for k in range(3)
        )

    @staticmethod
    def pick(kind: str, x: Any, index: np.ndarray) -> Any:
        """``x`` along its last axis: at ``index`` (gather and take agree on a vector), or
        summed up to each position (cumsum)."""
        return np.cumsum(x, axis=-1) if kind == "cumsum" else x[..., index]


class TorchOps:
    """The same operations in torch, so autograd gives the reference gradients."""

    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def stack(self, items: list, shape: tuple) -> Any:
        if not items:
            return self.torch.zeros((0, *shape), dtype=self.torch.float64)
        return self.torch.stack(items)

    def tanh(self, x: Any) -> Any:
        return self.torch.tanh(x)

    def exp(self, x: Any) -> Any:
        return self.torch.exp(x)

    def lgamma(self, x: Any) -> Any:
        return self.torch.lgamma(x)

    def sin(self, x: Any) -> Any:
        return self.torch.sin(x)

    def sigmoid(self, x: Any) -> Any:
        return self.torch.sigmoid(x)

    def matmul(self, a: Any, m: np.ndarray) -> Any:
        t = self.torch
        return t.matmul(t.as_tensor(a, dtype=t.float64), t.as_tensor(m, dtype=t.float64))

    def maximum(self, a: Any, b: Any) -> Any:
        t = self.torch
        a, b = t.as_tensor(a, dtype=t.float64), t.as_tensor(b, dtype=t.float64)
        return t.maximum(a, b)

    def where(self, c: Any, a: Any, b: Any) -> Any:
        t = self.torch
        a, b = t.as_tensor(a, dtype=t.float64), t.as_tensor(b, dtype=t.float64)
        return t.where(c, a, b)

    def softmax(self, x: Any) -> Any:
        return self.torch.softmax(x, -1)

    def clip(self, x: Any, lo: float, hi: float) -> Any:
        return self.torch.clamp(self.torch.as_tensor(x, dtype=self.torch.float64), lo, hi)

    def conv_row(self, x: Any, w: np.ndarray) -> Any:
        t = self.torch
        image = t.as_tensor(x, dtype=t.float64).reshape(1, 1, 1, -1)
        y = t.nn.functional.conv2d(image, t.as_tensor(w, dtype=t.float64), padding=(0, 1))
        return y.sum((0, 1, 2))

    def pick(self, kind: str, x: Any, index: np.ndarray) -> Any:
        t = self.torch
        x = t.as_tensor(x, dtype=t.float64)
        return t.cumsum(x, -1) if kind == "cumsum" else x[..., t.as_tensor(index)]

    def reduce(self, x: Any, op: str, axis: int) -> Any:
        t = self.torch
        if op == "logsumexp":
            return t.logsumexp(x, axis)
        if op == "sum":
            return x.sum(axis)
        if op == "mean":
            return x.mean(axis)
        if op == "max":
            return t.amax(x, axis)
        return t.amin(x, axis)
