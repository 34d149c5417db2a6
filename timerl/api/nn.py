"""Neural-network modules whose parameters are recurrent over the iteration dim.

A parameter is a placeholder over ``(i,)`` with ``requires_grad=True`` and a base case
``w[0] = init``; an optimiser's ``step()`` writes ``w[i + 1]``. ``module.unroll(u)`` gives a
copy whose parameters run over ``(i, u)`` for several updates per iteration (PPO epochs and
minibatches): ``w_u[i, 0] = w[i]``, and the optimiser carries the last update back to
``w[i + 1]``.

A module may declare a **role** (``MLP(..., role="critic")``): its parameters carry it, so a
program picks parameters by what they are for (``policy.parameters(role="critic")``), and a
compiled program lists them with it (``prog.parameters()``). An applied ``MLP`` declares its
activation, which ``prog.activations()`` reports by network name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from timerl.api.functional import conv2d, max_pool2d
from timerl.api.scope import current
from timerl.api.tensor import RecurrentTensor, cat
from timerl.errors import ProgramError, ShapeError
from timerl.ir.build import apply
from timerl.ir.graph import View
from timerl.ir.prims import orthogonal_array
from timerl.symbolic import Const, Dim, as_expr


def orthogonal(rows: int, cols: int, gain: float, rng: np.random.Generator) -> np.ndarray:
    """An orthogonal init (well-conditioned at depth; the usual choice for RL policies)."""
    return orthogonal_array(rows, cols, gain, rng)


def role_of(tensor: RecurrentTensor) -> str | None:
    """The role declared for a parameter (by :func:`parameter` or its module), or None."""
    return tensor.ctx.declarations.roles.get(tensor.op.id)


def _declare_role(tensor: RecurrentTensor, role: str | None) -> None:
    if role is not None:
        tensor.ctx.declarations.roles[tensor.op.id] = role


class Module:
    """A set of named parameters and a forward function over recurrent tensors."""

    role: str | None = None  # what the module is for ("actor", "critic"); its parameters' role

    def describe(self) -> list[dict[str, Any]]:
        """The forward pass as layer records (plain JSON, parameters by name): what ``timerl
        eval`` runs in numpy and ``timerl export`` rebuilds in torch, with no compiler."""
        raise ProgramError(f"{type(self).__name__} has no layer description (describe())")

    def parameters(self, role: str | None = None) -> list[RecurrentTensor]:
        """The parameters, in declaration order; with ``role``, those declared with it."""
        out: list[RecurrentTensor] = []
        for value in vars(self).values():
            if isinstance(value, RecurrentTensor) and value.requires_grad:
                out.append(value)
            elif isinstance(value, Module):
                out.extend(value.parameters())
            elif isinstance(value, list):
                for v in value:
                    if isinstance(v, Module):
                        out.extend(v.parameters())
        if role is not None:
            out = [p for p in out if role_of(p) == role]
        return out

    def _modules(self) -> list[Module]:
        """This module and every module inside it."""
        out: list[Module] = [self]
        for value in vars(self).values():
            inner = value if isinstance(value, list) else [value]
            for v in inner:
                if isinstance(v, Module):
                    out.extend(v._modules())
        return out

    def _map(self, fn: Callable[[RecurrentTensor], RecurrentTensor]) -> Module:
        new = object.__new__(type(self))
        for key, value in vars(self).items():
            if isinstance(value, RecurrentTensor) and value.requires_grad:
                value = fn(value)
            elif isinstance(value, Module):
                value = value._map(fn)
            elif isinstance(value, list):
                value = [v._map(fn) if isinstance(v, Module) else v for v in value]
            setattr(new, key, value)
        return new

    def at(self, *index: object) -> Module:
        """This module with every parameter read at ``index`` (e.g. ``policy.at(i)``)."""
        return self._map(lambda p: _Bound(p[index]))

    def unroll(self, dim: Dim) -> Module:
        """A copy with parameters over ``(*domain, dim)`` starting from these parameters."""

        def inner(p: RecurrentTensor) -> RecurrentTensor:
            dom = p.op.domain
            if dim in dom:
                raise ProgramError(f"unroll: {p.name} already runs over {dim.name}")
            q = RecurrentTensor.placeholder(
                p.shape, p.dtype, dom + (dim,), requires_grad=True, name=f"{p.name}@{dim.name}"
            )
            q[tuple(dom) + (0,)] = p
            q.outer = p  # type: ignore[attr-defined]
            _declare_role(q, role_of(p))
            return q

        return self._map(inner)

    def copy(self, prefix: str = "target") -> Module:
        """Separate parameters over the same domain that start equal to these.

        The usual target network of off-policy learners: it is never differentiated, and
        :class:`timerl.api.optim.Polyak` moves it toward the original parameters.
        """

        def inner(p: RecurrentTensor) -> RecurrentTensor:
            dom = p.op.domain
            if not dom or p.outer is not None:
                raise ProgramError(
                    f"copy: {p.name} must run over the iteration dim alone, not "
                    f"({', '.join(d.name for d in dom)})"
                )
            # Start from the same initial value, not from a read of p[0]: the copy is
            # updated from p and p from a loss on the copy, so reading p here would tie the
            # two recurrences into one cycle of ops.
            init = p.op.inputs[0].src if p.op.inputs else None
            if init is None or init.domain:
                raise ProgramError(f"copy: {p.name} must start from a constant initial value")
            q = RecurrentTensor.placeholder(
                p.shape, p.dtype, dom, requires_grad=True, name=f"{prefix}.{p.name}"
            )
            q[tuple(0 for _ in dom)] = RecurrentTensor(View.of(init), p.ctx)
            _declare_role(q, role_of(p))
            return q

        new = self._map(inner)
        for module in new._modules():  # the copy's networks are named as its parameters are
            if isinstance(module, MLP):
                module.name = f"{prefix}.{module.name}"
        return new

    def with_weights(self, arrays: Sequence[np.ndarray]) -> Module:
        """A copy whose parameters are leaves over no dim holding ``arrays`` (in
        ``parameters()`` order): weights loaded from elsewhere (a checkpoint, another
        framework's module) instead of drawn when the program runs."""
        from timerl.api.context import from_numpy

        params = self.parameters()
        if len(arrays) != len(params):
            raise ProgramError(f"with_weights: {len(params)} parameters, got {len(arrays)} arrays")
        values = {id(p): np.asarray(a) for p, a in zip(params, arrays, strict=True)}
        for p in params:
            want, got = tuple(int(s) for s in p.shape), values[id(p)].shape
            if want != got:
                raise ProgramError(f"with_weights: {p.name} is {want}, got an array of {got}")

        def load(p: RecurrentTensor) -> RecurrentTensor:
            value = values[id(p)].astype(p.dtype, copy=False)
            return from_numpy(value, requires_grad=True, name=p.name)

        return self._map(load)

    def detached(self) -> Module:
        """This module with every parameter read through ``detach()``: a forward pass that
        passes gradients to its input but never to its own weights (SAC's actor loss)."""
        return self._map(lambda p: p.detach())

    def __call__(self, x: RecurrentTensor) -> RecurrentTensor:
        return self.forward(x)

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        raise NotImplementedError


class _Bound(RecurrentTensor):
    """A parameter read at a fixed index: used in forward passes, not itself trained."""

    __slots__ = ()

    def __init__(self, t: RecurrentTensor) -> None:
        super().__init__(t.view, t.ctx, requires_grad=True)


def parameter(
    value: np.ndarray | RecurrentTensor,
    domain: tuple[Dim, ...],
    name: str,
    role: str | None = None,
) -> RecurrentTensor:
    """A trained parameter over ``domain`` (the iteration dim, or none) starting from
    ``value``: a placeholder with ``requires_grad=True`` and the base case ``w[0] = value``,
    which an optimiser's ``step()`` continues. ``role``: what it is for (see ``role_of``)."""
    from timerl.api.context import from_numpy

    init = value if isinstance(value, RecurrentTensor) else from_numpy(value, name=f"{name}.init")
    p = RecurrentTensor.placeholder(init.shape, init.dtype, domain, requires_grad=True, name=name)
    if domain:
        p[tuple(0 for _ in domain)] = init
    else:
        p[True] = init
    _declare_role(p, role)
    return p


_param = parameter


def _orthogonal_init(rows: int, cols: int, gain: float, seed: int, name: str) -> RecurrentTensor:
    """An orthogonal init drawn when the program runs: the program holds its seed, not the
    array, so the initial weights are freed once the first iteration has read them."""
    view = apply(
        "orthogonal",
        name=name,
        shape=(rows, cols),
        dtype=np.dtype(np.float32),
        gain=float(gain),
        seed=int(seed),
    )
    return RecurrentTensor(view, current())


def _default_domain(domain: Sequence[Dim] | None) -> tuple[Dim, ...]:
    if domain is not None:
        return tuple(domain)
    ctx = current()
    return (ctx.dims[0],) if len(ctx.dims) > 1 else ()


def _check_size(what: str, size: Any, context: str = "") -> None:
    # bool is an int subclass, and numpy integers are not ints: check both explicitly
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 1:
        raise ProgramError(f"{what} must be a positive int, got {size!r}{context}")


class Linear(Module):
    """``y = x @ W + b`` with an orthogonal init (gain ``sqrt(2)`` by default)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        gain: float = math.sqrt(2.0),
        domain: Sequence[Dim] | None = None,
        seed: int | None = None,
        name: str = "linear",
        role: str | None = None,
    ) -> None:
        for what, size in (("in_features", in_features), ("out_features", out_features)):
            _check_size(f"Linear {name!r}: {what}", size)
        ctx = current()
        dom = _default_domain(domain)
        stream = seed if seed is not None else ctx.next_stream()
        init = _orthogonal_init(in_features, out_features, gain, stream, f"{name}.weight.init")
        self.role, self.name = role, name
        self.weight = parameter(init, dom, f"{name}.weight", role)
        self.bias = (
            parameter(np.zeros(out_features, np.float32), dom, f"{name}.bias", role)
            if bias
            else None
        )

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        y = x @ self.weight
        return y + self.bias if self.bias is not None else y

    def describe(self) -> list[dict[str, Any]]:
        return [{"op": "linear", "param": self.name}]


ACTIVATIONS: dict[str, Callable[[RecurrentTensor], RecurrentTensor]] = {
    "tanh": lambda x: x.tanh(),
    "relu": lambda x: x.relu(),
    "sigmoid": lambda x: x.sigmoid(),
}


class MLP(Module):
    """Linear layers with an activation between them; the last layer has its own init gain."""

    def __init__(
        self,
        sizes: Sequence[int],
        activation: str = "tanh",
        out_gain: float = 1.0,
        domain: Sequence[Dim] | None = None,
        seed: int | None = None,
        name: str = "mlp",
        role: str | None = None,
    ) -> None:
        if len(sizes) < 2:
            raise ProgramError(f"MLP needs at least input and output sizes, got {list(sizes)}")
        for k, size in enumerate(sizes):
            _check_size(f"MLP {name!r}: sizes[{k}]", size, f" (sizes={list(sizes)})")
        if activation not in ACTIVATIONS:
            raise ProgramError(
                f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}"
            )
        self.activation = activation
        self.name = name
        self.role = role
        n = len(sizes) - 1
        self.layers = [
            Linear(
                sizes[k],
                sizes[k + 1],
                gain=out_gain if k == n - 1 else math.sqrt(2.0),
                domain=domain,
                seed=None if seed is None else seed * 1000 + k,
                name=f"{name}.{k}",
                role=role,
            )
            for k in range(n)
        ]

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        act = ACTIVATIONS[self.activation]
        if len(self.layers) > 1:  # an activation is applied: declare it
            reads = [p.op.id for p in self.parameters()]
            x.ctx.declarations.note_network(self.name, self.activation, self.role, reads)
        for k, layer in enumerate(self.layers):
            x = layer(x)
            if k < len(self.layers) - 1:
                x = act(x)
        return x

    def describe(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for k, layer in enumerate(self.layers):
            out += layer.describe()
            if k < len(self.layers) - 1:
                out.append({"op": self.activation})
        return out


# --- images: convolutions, pooling, the usual pixel trunks ------------------------------------


def _pair(value: int | Sequence[int], what: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int | np.integer) else tuple(value)
    if len(pair) != 2 or any(
        isinstance(v, bool) or not isinstance(v, int | np.integer) for v in pair
    ):
        raise ProgramError(f"{what} must be an int or a pair of ints, got {value!r}")
    return int(pair[0]), int(pair[1])


def _image_sizes(layer: str, x: RecurrentTensor, channels: int) -> tuple[int, int]:
    """The static spatial size of an image input ``(..., C, H, W)``, checked when the program
    is built: a ShapeError naming ``layer``, what it expected and what it got."""
    shape = tuple(x.shape)
    got = "(" + ", ".join(str(s) for s in shape) + ")"
    if len(shape) < 3:
        raise ShapeError(f"{layer}: expected an image (..., {channels}, H, W), got {got}")
    c, h, w = (as_expr(s) for s in shape[-3:])
    if not all(isinstance(s, Const) for s in (c, h, w)):
        raise ShapeError(f"{layer}: expected static channel and spatial sizes, got {got}")
    if c.value != channels:
        raise ShapeError(
            f"{layer}: expected {channels} input channels (..., {channels}, H, W), got {got}"
        )
    return h.value, w.value


# uint8 frames to [0, 1]: what the Atari and IMPALA trunks compute (on their first conv's
# weight) and what their ``describe`` tells an export
PIXEL_SCALE = 1.0 / 255.0


def _as_float(x: RecurrentTensor) -> RecurrentTensor:
    """A float32 image: pixels stay uint8 in the rollout and are cast here."""
    return x.to("float32") if x.dtype != np.float32 else x


class Conv2d(Module):
    """A 2-d convolution over ``(..., C, H, W)`` images (any leading axes) with a bias, and an
    orthogonal init of the ``(O, C * kh * kw)`` weight matrix (gain ``sqrt(2)``), as CleanRL's
    ``layer_init``. An integer (uint8) image is cast to float32 first."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        gain: float = math.sqrt(2.0),
        domain: Sequence[Dim] | None = None,
        seed: int | None = None,
        name: str = "conv",
    ) -> None:
        label = f"Conv2d {name!r}"
        for what, size in (("in_channels", in_channels), ("out_channels", out_channels)):
            _check_size(f"{label}: {what}", size)
        self.kernel = _pair(kernel_size, f"{label}: kernel_size")
        self.stride = _pair(stride, f"{label}: stride")
        self.padding = _pair(padding, f"{label}: padding")
        if min(self.kernel) < 1 or min(self.stride) < 1:
            raise ProgramError(
                f"{label}: kernel_size and stride must be positive, got {self.kernel} and "
                f"{self.stride}"
            )
        if min(self.padding) < 0:
            raise ProgramError(f"{label}: padding must be non-negative, got {self.padding}")
        self.label, self.in_channels, self.name = label, in_channels, name
        ctx = current()
        dom = _default_domain(domain)
        stream = seed if seed is not None else ctx.next_stream()
        kh, kw = self.kernel
        init = _orthogonal_init(out_channels, in_channels * kh * kw, gain, stream, f"{name}.w0")
        init = init.reshape(out_channels, in_channels, kh, kw)
        self.weight = _param(init, dom, f"{name}.weight")
        self.bias = _param(np.zeros(out_channels, np.float32), dom, f"{name}.bias")

    def output_size(self, size: tuple[int, int]) -> tuple[int, int]:
        """The spatial size of the output for an input of ``size``, or a ShapeError."""
        padded = tuple(size[k] + 2 * self.padding[k] for k in range(2))
        if self.kernel[0] > padded[0] or self.kernel[1] > padded[1]:
            raise ShapeError(
                f"{self.label}: kernel {self.kernel} is larger than its padded input "
                f"{padded} (input {size}, padding {self.padding})"
            )
        return tuple(  # type: ignore[return-value]
            (padded[k] - self.kernel[k]) // self.stride[k] + 1 for k in range(2)
        )

    def forward(self, x: RecurrentTensor, scale: float = 1.0) -> RecurrentTensor:
        """``scale`` multiplies the input. It is applied to the weight: a conv is linear in
        its input, and the weight is far smaller than a batch of images (the Nature CNN's
        first weight holds 8k numbers, a minibatch of 256 Atari frames 7.2M)."""
        self.output_size(_image_sizes(self.label, x, self.in_channels))
        weight = self.weight * scale if scale != 1.0 else self.weight
        y = conv2d(_as_float(x), weight, self.stride, self.padding)
        return y + self.bias.reshape(-1, 1, 1)

    def describe(self) -> list[dict[str, Any]]:
        conv = {"op": "conv2d", "param": self.name, "stride": list(self.stride)}
        return [{"op": "float", "scale": 1.0}, {**conv, "padding": list(self.padding)}]


class MaxPool2d(Module):
    """The largest element of each window (``stride`` defaults to the kernel, as torch's)."""

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        padding: int | Sequence[int] = 0,
        name: str = "pool",
    ) -> None:
        self.label = f"MaxPool2d {name!r}"
        self.kernel = _pair(kernel_size, f"{self.label}: kernel_size")
        self.stride = self.kernel if stride is None else _pair(stride, f"{self.label}: stride")
        self.padding = _pair(padding, f"{self.label}: padding")
        if min(self.kernel) < 1 or min(self.stride) < 1 or min(self.padding) < 0:
            raise ProgramError(
                f"{self.label}: expected a positive kernel and stride and a non-negative "
                f"padding, got {self.kernel}, {self.stride}, {self.padding}"
            )
        if any(self.padding[k] > self.kernel[k] // 2 for k in range(2)):
            raise ProgramError(
                f"{self.label}: padding {self.padding} exceeds half the kernel {self.kernel}"
            )

    def output_size(self, size: tuple[int, int]) -> tuple[int, int]:
        padded = tuple(size[k] + 2 * self.padding[k] for k in range(2))
        if self.kernel[0] > padded[0] or self.kernel[1] > padded[1]:
            raise ShapeError(
                f"{self.label}: kernel {self.kernel} is larger than its padded input {padded}"
            )
        return tuple(  # type: ignore[return-value]
            (padded[k] - self.kernel[k]) // self.stride[k] + 1 for k in range(2)
        )

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        if x.ndim < 3:
            raise ShapeError(f"{self.label}: expected an image (..., C, H, W), got {x.shape}")
        self.output_size(_image_sizes(self.label, x, int(as_expr(x.shape[-3]).value)))
        return max_pool2d(x, self.kernel, self.stride, self.padding)

    def describe(self) -> list[dict[str, Any]]:
        sizes = {"kernel": list(self.kernel), "stride": list(self.stride)}
        return [{"op": "max_pool2d", **sizes, "padding": list(self.padding)}]


class Flatten(Module):
    """The trailing ``ndim`` axes (an image's ``C, H, W``) as one, in torch's order."""

    def __init__(self, ndim: int = 3) -> None:
        _check_size("Flatten: ndim", ndim)
        self.ndim = ndim

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        if x.ndim < self.ndim:
            raise ShapeError(f"Flatten: expected at least {self.ndim} axes, got {x.shape}")
        return x.flatten(x.ndim - self.ndim)

    def describe(self) -> list[dict[str, Any]]:
        return [{"op": "flatten", "ndim": self.ndim}]


class NatureCNN(Module):
    """The DQN/PPO Atari trunk (CleanRL's ``Agent.network``): conv 32 8x8 stride 4, conv 64
    4x4 stride 2, conv 64 3x3, ReLUs, flatten, linear ``out_features``, ReLU. Takes uint8
    frames ``(..., C, H, W)`` and scales them by 1/255 inside."""

    # the smallest frame its convs fit: 36x36 -> 8x8 -> 3x3 -> 1x1
    MIN_SIZE = 36

    def __init__(
        self,
        in_channels: int = 4,
        image_size: int | Sequence[int] = 84,
        out_features: int = 512,
        domain: Sequence[Dim] | None = None,
        seed: int | None = None,
        name: str = "nature",
    ) -> None:
        def sub(k: int) -> int | None:
            return None if seed is None else seed * 1000 + k

        specs = [(in_channels, 32, 8, 4), (32, 64, 4, 2), (64, 64, 3, 1)]
        self.convs = [
            Conv2d(c, o, k, s, domain=domain, seed=sub(n), name=f"{name}.{n}")
            for n, (c, o, k, s) in enumerate(specs)
        ]
        size = _pair(image_size, f"NatureCNN {name!r}: image_size")
        self.image_size = size
        for conv in self.convs:
            size = conv.output_size(size)
        self.flatten = Flatten()
        self.linear = Linear(
            64 * size[0] * size[1], out_features, domain=domain, seed=sub(3), name=f"{name}.3"
        )
        self.label = f"NatureCNN {name!r}"

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        got = _image_sizes(self.label, x, self.convs[0].in_channels)
        if got != self.image_size:
            raise ShapeError(f"{self.label}: expected {self.image_size} images, got {got}")
        x = self.convs[0].forward(x, scale=PIXEL_SCALE).relu()
        for conv in self.convs[1:]:
            x = conv(x).relu()
        return self.linear(self.flatten(x)).relu()

    def describe(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"op": "float", "scale": PIXEL_SCALE}]
        for conv in self.convs:
            out += [*conv.describe(), {"op": "relu"}]
        return [*out, *self.flatten.describe(), *self.linear.describe(), {"op": "relu"}]


class MinAtarCNN(Module):
    """The MinAtar paper's trunk (Young and Tian, 2019): conv 16 3x3 stride 1, ReLU, flatten,
    linear ``out_features``, ReLU, initialised as CleanRL's (orthogonal, gain ``sqrt(2)``).
    Takes small images ``(..., C, H, W)`` of 0/1 planes (MinAtar's 10x10), not scaled."""

    def __init__(
        self,
        in_channels: int = 4,
        image_size: int | Sequence[int] = 10,
        out_features: int = 128,
        domain: Sequence[Dim] | None = None,
        seed: int | None = None,
        name: str = "minatar",
    ) -> None:
        def sub(k: int) -> int | None:
            return None if seed is None else seed * 1000 + k

        self.label = f"MinAtarCNN {name!r}"
        self.image_size = _pair(image_size, f"{self.label}: image_size")
        self.conv = Conv2d(in_channels, 16, 3, 1, domain=domain, seed=sub(0), name=f"{name}.0")
        height, width = self.conv.output_size(self.image_size)
        self.flatten = Flatten()
        self.linear = Linear(
            16 * height * width, out_features, domain=domain, seed=sub(1), name=f"{name}.1"
        )

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        got = _image_sizes(self.label, x, self.conv.in_channels)
        if got != self.image_size:
            raise ShapeError(f"{self.label}: expected {self.image_size} images, got {got}")
        return self.linear(self.flatten(self.conv(x).relu())).relu()

    def describe(self) -> list[dict[str, Any]]:
        conv = [*self.conv.describe(), {"op": "relu"}]
        return [*conv, *self.flatten.describe(), *self.linear.describe(), {"op": "relu"}]


class _Residual(Module):
    """``x + conv1(relu(conv0(relu(x))))``, both 3x3 convs keeping the size."""

    def __init__(self, channels: int, domain: Any, seed: Any, name: str) -> None:
        self.conv0 = Conv2d(
            channels, channels, 3, padding=1, domain=domain, seed=seed(0), name=f"{name}.0"
        )
        self.conv1 = Conv2d(
            channels, channels, 3, padding=1, domain=domain, seed=seed(1), name=f"{name}.1"
        )

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        return x + self.conv1(self.conv0(x.relu()).relu())

    def describe(self) -> list[dict[str, Any]]:
        body = [{"op": "relu"}, *self.conv0.describe(), {"op": "relu"}, *self.conv1.describe()]
        return [{"op": "residual", "layers": body}]


class ImpalaCNN(Module):
    """The IMPALA trunk (CleanRL's procgen agent): per stack of ``channels``, a 3x3 conv, a 3x3
    max-pool of stride 2 (padding 1) and two residual blocks; then flatten, ReLU, linear
    ``out_features``, ReLU. Takes uint8 frames and scales them by 1/255 inside."""

    def __init__(
        self,
        in_channels: int = 3,
        image_size: int | Sequence[int] = 64,
        channels: Sequence[int] = (16, 32, 32),
        out_features: int = 256,
        domain: Sequence[Dim] | None = None,
        seed: int | None = None,
        name: str = "impala",
    ) -> None:
        def seeder(prefix: int) -> Callable[[int], int | None]:
            return lambda k: None if seed is None else seed * 1000 + prefix * 10 + k

        self.label = f"ImpalaCNN {name!r}"
        self.in_channels = in_channels
        self.image_size = size = _pair(image_size, f"{self.label}: image_size")
        self.stacks: list[Module] = []
        c = in_channels
        for n, out in enumerate(channels):
            conv = Conv2d(
                c, out, 3, padding=1, domain=domain, seed=seeder(n * 3)(0), name=f"{name}.{n}.conv"
            )
            pool = MaxPool2d(3, 2, 1, name=f"{name}.{n}.pool")
            size = pool.output_size(conv.output_size(size))
            res = [
                _Residual(out, domain, seeder(n * 3 + k + 1), f"{name}.{n}.res{k}")
                for k in range(2)
            ]
            self.stacks += [conv, pool, *res]
            c = out
        self.flatten = Flatten()
        self.linear = Linear(
            c * size[0] * size[1],
            out_features,
            domain=domain,
            seed=seeder(99)(0),
            name=f"{name}.out",
        )

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        got = _image_sizes(self.label, x, self.in_channels)
        if got != self.image_size:
            raise ShapeError(f"{self.label}: expected {self.image_size} images, got {got}")
        first = self.stacks[0]
        assert isinstance(first, Conv2d)
        x = first.forward(x, scale=PIXEL_SCALE)
        for layer in self.stacks[1:]:
            x = layer(x)
        return self.linear(self.flatten(x).relu()).relu()

    def describe(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"op": "float", "scale": PIXEL_SCALE}]
        for layer in self.stacks:
            out += layer.describe()
        flat = [*self.flatten.describe(), {"op": "relu"}]
        return [*out, *flat, *self.linear.describe(), {"op": "relu"}]


# --- recurrent cells -------------------------------------------------------------------------


class _Cell(Module):
    """Input and hidden weights ``(in, G * H)`` and ``(H, G * H)`` (torch's ``weight_ih.T`` and
    ``weight_hh.T``, gates in torch's order), both biases zero, orthogonal weights (gain 1), as
    CleanRL's LSTM agent."""

    gates = 1

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        domain: Sequence[Dim] | None = None,
        seed: int | None = None,
        name: str = "cell",
    ) -> None:
        for what, size in (("input_size", input_size), ("hidden_size", hidden_size)):
            _check_size(f"{type(self).__name__} {name!r}: {what}", size)
        ctx = current()
        dom = _default_domain(domain)
        width = self.gates * hidden_size
        streams = [ctx.next_stream() if seed is None else seed * 1000 + k for k in range(2)]
        w_ih = _orthogonal_init(input_size, width, 1.0, streams[0], f"{name}.weight_ih.init")
        w_hh = _orthogonal_init(hidden_size, width, 1.0, streams[1], f"{name}.weight_hh.init")
        self.weight_ih = _param(w_ih, dom, f"{name}.weight_ih")
        self.weight_hh = _param(w_hh, dom, f"{name}.weight_hh")
        self.bias_ih = _param(np.zeros(width, np.float32), dom, f"{name}.bias_ih")
        self.bias_hh = _param(np.zeros(width, np.float32), dom, f"{name}.bias_hh")
        self.input_size, self.hidden_size, self.name = input_size, hidden_size, name

    def _gate(self, z: RecurrentTensor, k: int) -> RecurrentTensor:
        h = self.hidden_size
        return z.narrow(-1, k * h, h)

    def describe(self) -> list[dict[str, Any]]:
        """One step whose state (``[h, c]`` for an LSTM, ``h`` for a GRU) the runner carries;
        the layer's output is ``h``."""
        op = type(self).__name__.removesuffix("Cell").lower()
        return [{"op": op, "param": self.name, "hidden": self.hidden_size}]


class LSTMCell(_Cell):
    """torch's ``LSTMCell``: ``cell(x, (h, c)) -> (h', c')``, gates input, forget, cell,
    output. ``cell.packed(x, hc)`` takes and returns the state as one ``(..., 2 H)`` tensor
    (``[h, c]``), for a single recurrent tensor ``hc[t + 1] = cell.packed(x[t], hc[t])``."""

    gates = 4

    def __call__(self, x: Any, state: Any = None) -> Any:  # type: ignore[override]
        h, c = state
        z = x @ self.weight_ih + self.bias_ih + h @ self.weight_hh + self.bias_hh
        i, f, g, o = (self._gate(z, k) for k in range(4))
        c_next = f.sigmoid() * c + i.sigmoid() * g.tanh()
        return o.sigmoid() * c_next.tanh(), c_next

    def packed(self, x: RecurrentTensor, hc: RecurrentTensor) -> RecurrentTensor:
        n = self.hidden_size
        h, c = self(x, (hc.narrow(-1, 0, n), hc.narrow(-1, n, n)))
        return cat([h, c], -1)


class GRUCell(_Cell):
    """torch's ``GRUCell``: ``cell(x, h) -> h'``, gates reset, update, new."""

    gates = 3

    def __call__(self, x: Any, h: Any = None) -> Any:  # type: ignore[override]
        zi = x @ self.weight_ih + self.bias_ih
        zh = h @ self.weight_hh + self.bias_hh
        r = (self._gate(zi, 0) + self._gate(zh, 0)).sigmoid()
        u = (self._gate(zi, 1) + self._gate(zh, 1)).sigmoid()
        n = (self._gate(zi, 2) + r * self._gate(zh, 2)).tanh()
        return (1.0 - u) * n + u * h
