"""Model families of the headroom corpus, written in torch here (nothing is downloaded).

The families are those where ordering has room: many parallel branches whose intermediates
either pile up or not depending on the order (randomly wired networks, NAS cells, mixtures of
experts, multi-branch blocks), long skips that keep activations alive (U-Nets, dense blocks),
and joint forward, backward and optimizer graphs of transformers (see ``torch_export``'s
``optimizer`` option). Every builder returns ``build(training) -> (module, example inputs)``
with seeded random weights, like ``models.py``'s.

- ``randwire``: RandWire's stages, each a random graph (Watts-Strogatz, Barabasi-Albert or
  Erdos-Renyi: ``structured.wiring``) oriented from lower to higher node index; a node sums its
  inputs, then ReLU, depthwise-separable conv, BN; a stage's sinks are averaged.
- ``nas``: NASNet-style networks of a randomly drawn cell: each of ``blocks`` blocks applies two
  ops (separable convs, pools, identity) to two earlier states of the cell and sums them; the
  cell's unused block outputs are concatenated. Normal cells, with a reduction cell (stride 2)
  between stages.
- ``dense``: DenseNet blocks, every layer reading the concatenation of all earlier outputs.
- ``multibranch``: ResNeXt-like blocks with ``branches`` explicit parallel paths summed.
- ``unet``: deeper and wider U-Nets than ``models.unet``, with two convs per level.
- ``moe``: mixture-of-experts decoders from ``transformers`` configs (Mixtral, Qwen2-MoE,
  OLMoE), random weights.
"""

from __future__ import annotations

from collections.abc import Callable

import networkx as nx
import torch
from torch import nn

from timerl.graphopt.corpus.structured import wiring

Builder = Callable[[bool], tuple[nn.Module, tuple]]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _sep_conv(c: int, k: int, stride: int = 1) -> nn.Sequential:
    """ReLU, depthwise k x k, pointwise 1 x 1, BN: RandWire's and NASNet's unit."""
    return nn.Sequential(
        nn.ReLU(),
        nn.Conv2d(c, c, k, stride=stride, padding=k // 2, groups=c, bias=False),
        nn.Conv2d(c, c, 1, bias=False),
        nn.BatchNorm2d(c),
    )


def _conv_bn_relu(cin: int, cout: int, k: int = 3, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
    )


class _Head(nn.Module):
    """Stem, body, global pool and a linear classifier."""

    def __init__(self, stem: nn.Module, body: nn.Module, width: int, classes: int = 100) -> None:
        super().__init__()
        self.stem, self.body = stem, body
        self.fc = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(self.stem(x)).mean(dim=(2, 3)))


# ------------------------------------------------------------------------------ RandWire
class _WiredStage(nn.Module):
    """One RandWire stage: a DAG over ``wiring``'s nodes (edges low to high index)."""

    def __init__(self, g: nx.Graph, cin: int, c: int) -> None:
        super().__init__()
        n = g.number_of_nodes()
        self.preds = [sorted(u for u in g.neighbors(v) if u < v) for v in range(n)]
        used = {u for p in self.preds for u in p}
        self.sinks = [v for v in range(n) if v not in used]
        self.entry = nn.Sequential(
            nn.ReLU(), nn.Conv2d(cin, c, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c)
        )
        self.units = nn.ModuleList(_sep_conv(c, 3) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.entry(x)
        outs: list[torch.Tensor] = []
        for v, preds in enumerate(self.preds):
            s = x if not preds else outs[preds[0]]
            for u in preds[1:]:
                s = s + outs[u]
            outs.append(self.units[v](s))
        y = outs[self.sinks[0]]
        for v in self.sinks[1:]:
            y = y + outs[v]
        return y / len(self.sinks)


def randwire(
    kind: str,
    nodes: int,
    *,
    stages: int = 3,
    width: int = 16,
    seed: int = 0,
    image: int = 64,
    batch: int = 8,
) -> Builder:
    """A randomly wired CNN: ``stages`` stages of ``nodes`` nodes, each wired by ``kind``."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        torch.manual_seed(seed)
        body, cin = [], width
        for s in range(stages):
            c = width * 2**s
            body.append(_WiredStage(wiring(kind, nodes, seed * 100 + s), cin, c))
            cin = c
        stem = _conv_bn_relu(3, width)
        model = _Head(stem, nn.Sequential(*body), cin)
        return model, (torch.randn(batch, 3, image, image, generator=_gen(seed)),)

    return build


# ------------------------------------------------------------------------------ NAS cells
NAS_OPS = ("sep3", "sep5", "avg3", "max3", "identity")


def nas_cell(blocks: int, seed: int) -> list[tuple[int, str, int, str]]:
    """A random cell: per block, (input, op, input, op); inputs index the cell's states
    (0: the cell before last, 1: the last cell, 2 + b: block b)."""
    rng = torch.Generator().manual_seed(seed)
    cell = []
    for b in range(blocks):
        picks = torch.randint(0, 2 + b, (2,), generator=rng).tolist()
        ops = torch.randint(0, len(NAS_OPS), (2,), generator=rng).tolist()
        cell.append((picks[0], NAS_OPS[ops[0]], picks[1], NAS_OPS[ops[1]]))
    return cell


def _nas_op(name: str, c: int, stride: int) -> nn.Module:
    if name == "sep3":
        return nn.Sequential(_sep_conv(c, 3, stride), _sep_conv(c, 3))
    if name == "sep5":
        return nn.Sequential(_sep_conv(c, 5, stride), _sep_conv(c, 5))
    if name == "avg3":
        return nn.AvgPool2d(3, stride, 1)
    if name == "max3":
        return nn.MaxPool2d(3, stride, 1)
    if stride == 1:
        return nn.Identity()
    return nn.Sequential(
        nn.ReLU(), nn.Conv2d(c, c, 1, stride=stride, bias=False), nn.BatchNorm2d(c)
    )


class _Cell(nn.Module):
    """A NASNet-style cell; ``reduce`` halves the resolution (ops on the cell inputs stride 2)."""

    def __init__(
        self, spec: list, c_pp: int, c_p: int, c: int, reduce: bool, prev_reduced: bool
    ) -> None:
        super().__init__()
        self.spec = spec
        # the cell before last is at twice the resolution when the last cell reduced
        self.pre0 = _conv_bn_relu(c_pp, c, 1, 2 if prev_reduced else 1)
        self.pre1 = _conv_bn_relu(c_p, c, 1)
        self.ops = nn.ModuleList()
        for a, op_a, b, op_b in spec:
            for idx, op in ((a, op_a), (b, op_b)):
                self.ops.append(_nas_op(op, c, 2 if reduce and idx < 2 else 1))
        used = {i for a, _, b, _ in spec for i in (a, b)}
        self.concat = [2 + k for k in range(len(spec)) if 2 + k not in used]
        self.out_channels = c * len(self.concat)

    def forward(self, s0: torch.Tensor, s1: torch.Tensor) -> torch.Tensor:
        states = [self.pre0(s0), self.pre1(s1)]
        for k, (a, _, b, _) in enumerate(self.spec):
            states.append(self.ops[2 * k](states[a]) + self.ops[2 * k + 1](states[b]))
        return torch.cat([states[i] for i in self.concat], dim=1)


class _NasNet(nn.Module):
    def __init__(self, normal: list, reduction: list, cells: int, stages: int, c: int) -> None:
        super().__init__()
        self.stem = _conv_bn_relu(3, c)
        self.cells = nn.ModuleList()
        c_pp = c_p = c
        prev_reduced = False
        for s in range(stages):
            if s > 0:
                c *= 2
                cell = _Cell(reduction, c_pp, c_p, c, True, prev_reduced)
                self.cells.append(cell)
                c_pp, c_p, prev_reduced = c_p, cell.out_channels, True
            for _ in range(cells):
                cell = _Cell(normal, c_pp, c_p, c, False, prev_reduced)
                self.cells.append(cell)
                c_pp, c_p, prev_reduced = c_p, cell.out_channels, False
        self.fc = nn.Linear(c_p, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s0 = s1 = self.stem(x)
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1)
        return self.fc(s1.mean(dim=(2, 3)))


def nas(
    cells: int,
    *,
    blocks: int = 5,
    stages: int = 3,
    width: int = 16,
    seed: int = 0,
    image: int = 32,
    batch: int = 8,
) -> Builder:
    """A NASNet-style network of a random normal and reduction cell (seeded)."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        torch.manual_seed(seed)
        normal, reduction = nas_cell(blocks, 2 * seed), nas_cell(blocks, 2 * seed + 1)
        model = _NasNet(normal, reduction, cells, stages, width)
        return model, (torch.randn(batch, 3, image, image, generator=_gen(seed)),)

    return build


# ------------------------------------------------------------------------------ skip-heavy
class _DenseBlock(nn.Module):
    def __init__(self, layers: int, cin: int, growth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(
                nn.BatchNorm2d(cin + i * growth),
                nn.ReLU(),
                nn.Conv2d(cin + i * growth, 4 * growth, 1, bias=False),
                nn.BatchNorm2d(4 * growth),
                nn.ReLU(),
                nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False),
            )
            for i in range(layers)
        )
        self.out_channels = cin + layers * growth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = [x]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, dim=1)))
        return torch.cat(feats, dim=1)


def dense(
    blocks: tuple[int, ...], growth: int = 12, *, image: int = 32, batch: int = 8, seed: int = 0
) -> Builder:
    """A DenseNet-BC: dense blocks of the given layer counts, transitions halving channels."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        torch.manual_seed(seed)
        c = 2 * growth
        body: list[nn.Module] = []
        for i, layers in enumerate(blocks):
            block = _DenseBlock(layers, c, growth)
            body.append(block)
            c = block.out_channels
            if i < len(blocks) - 1:
                body += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1), nn.AvgPool2d(2)]
                c //= 2
        model = _Head(_conv_bn_relu(3, 2 * growth), nn.Sequential(*body), c)
        return model, (torch.randn(batch, 3, image, image, generator=_gen(seed)),)

    return build


class _BranchBlock(nn.Module):
    """``branches`` parallel bottleneck paths of unequal widths, summed, plus the skip."""

    def __init__(self, c: int, branches: int, seed: int) -> None:
        super().__init__()
        rng = torch.Generator().manual_seed(seed)
        widths = (2 ** torch.randint(1, 5, (branches,), generator=rng)).tolist()
        self.paths = nn.ModuleList(
            nn.Sequential(
                _conv_bn_relu(c, w, 1),
                _conv_bn_relu(w, w, 3),
                nn.Conv2d(w, c, 1, bias=False),
                nn.BatchNorm2d(c),
            )
            for w in widths
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for path in self.paths:
            y = y + path(x)
        return torch.relu(y)


def multibranch(
    blocks: int, branches: int, width: int = 32, *, image: int = 32, batch: int = 8, seed: int = 0
) -> Builder:
    """A ResNeXt-like net whose blocks hold ``branches`` explicit paths, a stride-2 transition
    after every third block."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        torch.manual_seed(seed)
        body: list[nn.Module] = []
        c = width
        for b in range(blocks):
            body.append(_BranchBlock(c, branches, seed * 100 + b))
            if b % 3 == 2 and b < blocks - 1:
                body.append(_conv_bn_relu(c, 2 * c, 3, 2))
                c *= 2
        model = _Head(_conv_bn_relu(3, width), nn.Sequential(*body), c)
        return model, (torch.randn(batch, 3, image, image, generator=_gen(seed)),)

    return build


class _UNet(nn.Module):
    def __init__(self, depth: int, width: int, convs: int) -> None:
        super().__init__()
        self.down, self.up, self.upconv = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        cin, chans = 3, []
        for d in range(depth):
            c = width * 2**d
            layers = [_conv_bn_relu(cin, c)] + [_conv_bn_relu(c, c) for _ in range(convs - 1)]
            self.down.append(nn.Sequential(*layers))
            chans.append(c)
            cin = c
        self.mid = nn.Sequential(_conv_bn_relu(cin, 2 * cin), _conv_bn_relu(2 * cin, 2 * cin))
        cin *= 2
        for c in reversed(chans):
            self.upconv.append(nn.ConvTranspose2d(cin, c, 2, stride=2))
            layers = [_conv_bn_relu(2 * c, c)] + [_conv_bn_relu(c, c) for _ in range(convs - 1)]
            self.up.append(nn.Sequential(*layers))
            cin = c
        self.out = nn.Conv2d(cin, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = nn.functional.max_pool2d(x, 2)
        x = self.mid(x)
        for upconv, block, skip in zip(self.upconv, self.up, reversed(skips), strict=True):
            x = block(torch.cat([upconv(x), skip], dim=1))
        return self.out(x)


def unet(
    depth: int, width: int = 16, convs: int = 2, *, image: int = 64, batch: int = 4, seed: int = 0
) -> Builder:
    """A U-Net of ``depth`` levels with ``convs`` conv-BN-ReLU per level and side."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        torch.manual_seed(seed)
        model = _UNet(depth, width, convs)
        return model, (torch.randn(batch, 3, image, image, generator=_gen(seed)),)

    return build


# ------------------------------------------------------------------------------ MoE
def moe(
    arch: str,
    layers: int,
    hidden: int,
    experts: int,
    top_k: int = 2,
    *,
    seq: int = 64,
    batch: int = 4,
    vocab: int = 4096,
) -> Builder:
    """A mixture-of-experts decoder from a ``transformers`` config (random weights):
    ``arch`` is ``mixtral``, ``qwen2moe`` or ``olmoe``."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        import transformers

        from timerl.graphopt.corpus.models import _common, _hf, _ids

        torch.manual_seed(0)
        common = dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=2 * hidden,
            max_position_embeddings=seq,
            num_experts_per_tok=top_k,
            **_common(vocab),
        )
        if arch == "mixtral":
            cfg = transformers.MixtralConfig(num_local_experts=experts, **common)
            model = transformers.MixtralForCausalLM(cfg)
        elif arch == "qwen2moe":
            cfg = transformers.Qwen2MoeConfig(
                num_experts=experts,
                moe_intermediate_size=hidden,
                shared_expert_intermediate_size=2 * hidden,
                **common,
            )
            model = transformers.Qwen2MoeForCausalLM(cfg)
        elif arch == "olmoe":
            cfg = transformers.OlmoeConfig(num_experts=experts, **common)
            model = transformers.OlmoeForCausalLM(cfg)
        else:
            raise ValueError(f"unknown MoE architecture {arch!r}")
        ids = _ids(batch, seq, vocab, layers)
        if training:
            return _hf(model, ("input_ids", "labels"), (ids, ids), use_cache=False)
        return _hf(model, ("input_ids",), (ids,), use_cache=False)

    return build
