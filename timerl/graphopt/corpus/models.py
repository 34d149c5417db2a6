"""Model builders for the graph corpus: HuggingFace architectures from configs and CNNs in code.

Every builder returns ``(module, example_inputs)`` with random weights; nothing is downloaded.
HuggingFace models use eager attention (the SDPA path breaks ``run_decompositions`` on torch
2.13 for GPT-2) and untied embeddings (tied weights appear twice to ``aot_export_module``, which
then finds a parameter without gradient). For training graphs, the language models are given
labels so that the exported loss is the model's own cross-entropy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch
from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    """One corpus entry built from a model: ``build(training)`` returns module and inputs."""

    name: str
    family: str
    build: Callable[[bool], tuple[nn.Module, tuple]]
    training: bool = False


class _KwargCall(nn.Module):
    """Call a HuggingFace model with positional tensors mapped to keyword arguments.

    ``torch.export`` takes positional example inputs; HuggingFace forwards take ``labels`` and
    ``decoder_input_ids`` by keyword, far from the front of their signatures.
    """

    def __init__(self, model: nn.Module, names: tuple[str, ...], **fixed: Any) -> None:
        super().__init__()
        self.model = model
        self.names = names
        self.fixed = fixed

    def forward(self, *args: torch.Tensor) -> Any:
        out = self.model(**dict(zip(self.names, args, strict=True)), **self.fixed, return_dict=True)
        return out["loss"] if "loss" in out else out["logits"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ids(batch: int, seq: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=_gen(seed))


def _hf(
    model: nn.Module, names: tuple[str, ...], inputs: tuple, **fixed: Any
) -> tuple[nn.Module, tuple]:
    return _KwargCall(model, names, **fixed), inputs


def _common(vocab: int) -> dict:
    return {
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "attn_implementation": "eager",
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
    }


def gpt2(
    layers: int, hidden: int, heads: int, *, seq: int = 128, batch: int = 4, vocab: int = 8192
) -> Callable[[bool], tuple[nn.Module, tuple]]:
    """GPT-2 decoder with an LM head."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            n_layer=layers, n_embd=hidden, n_head=heads, n_positions=seq, **_common(vocab)
        )
        ids = _ids(batch, seq, vocab, layers)
        model = GPT2LMHeadModel(cfg)
        if training:
            return _hf(model, ("input_ids", "labels"), (ids, ids), use_cache=False)
        return _hf(model, ("input_ids",), (ids,), use_cache=False)

    return build


def llama(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    *,
    seq: int = 128,
    batch: int = 4,
    vocab: int = 8192,
) -> Callable[[bool], tuple[nn.Module, tuple]]:
    """Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU MLP, grouped-query attention."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            intermediate_size=hidden * 8 // 3,
            max_position_embeddings=seq,
            **_common(vocab),
        )
        ids = _ids(batch, seq, vocab, layers)
        model = LlamaForCausalLM(cfg)
        if training:
            return _hf(model, ("input_ids", "labels"), (ids, ids), use_cache=False)
        return _hf(model, ("input_ids",), (ids,), use_cache=False)

    return build


def bert(
    layers: int, hidden: int, heads: int, *, seq: int = 128, batch: int = 4, vocab: int = 8192
) -> Callable[[bool], tuple[nn.Module, tuple]]:
    """BERT encoder with a masked-LM head."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        from transformers import BertConfig, BertForMaskedLM

        cfg = BertConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=hidden * 4,
            max_position_embeddings=seq,
            **_common(vocab),
        )
        ids = _ids(batch, seq, vocab, layers)
        model = BertForMaskedLM(cfg)
        if training:
            return _hf(model, ("input_ids", "labels"), (ids, ids))
        return _hf(model, ("input_ids",), (ids,))

    return build


def t5(
    layers: int, hidden: int, heads: int, *, seq: int = 64, batch: int = 4, vocab: int = 8192
) -> Callable[[bool], tuple[nn.Module, tuple]]:
    """T5 encoder-decoder (relative position bias, cross-attention)."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        from transformers import T5Config, T5ForConditionalGeneration

        cfg = T5Config(
            num_layers=layers,
            num_decoder_layers=layers,
            d_model=hidden,
            d_kv=hidden // heads,
            num_heads=heads,
            d_ff=hidden * 4,
            decoder_start_token_id=0,
            use_cache=False,
            **_common(vocab),
        )
        src = _ids(batch, seq, vocab, layers)
        tgt = _ids(batch, seq // 2, vocab, layers + 1)
        model = T5ForConditionalGeneration(cfg)
        if training:
            return _hf(
                model,
                ("input_ids", "decoder_input_ids", "labels"),
                (src, tgt, tgt),
                use_cache=False,
            )
        return _hf(model, ("input_ids", "decoder_input_ids"), (src, tgt), use_cache=False)

    return build


def vit(
    layers: int, hidden: int, heads: int, *, image: int = 64, patch: int = 8, batch: int = 4
) -> Callable[[bool], tuple[nn.Module, tuple]]:
    """Vision transformer classifier."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        from transformers import ViTConfig, ViTForImageClassification

        cfg = ViTConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=hidden * 4,
            image_size=image,
            patch_size=patch,
            num_labels=100,
            attn_implementation="eager",
        )
        pixels = torch.randn(batch, 3, image, image, generator=_gen(layers))
        model = ViTForImageClassification(cfg)
        if training:
            labels = torch.randint(0, 100, (batch,), generator=_gen(layers + 1))
            return _hf(model, ("pixel_values", "labels"), (pixels, labels))
        return _hf(model, ("pixel_values",), (pixels,))

    return build


# --------------------------------------------------------------------------- CNNs in code


def _conv_bn(cin: int, cout: int, k: int = 3, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
    )


class _Classifier(nn.Module):
    """Stem, body and a global-pool classifier head shared by the CNN families."""

    def __init__(self, stem: nn.Module, body: nn.Module, width: int, classes: int = 100) -> None:
        super().__init__()
        self.stem, self.body = stem, body
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.body(self.stem(x))
        return self.head(x.mean(dim=(2, 3)))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.a = _conv_bn(cin, cout, 3, stride)
        self.b = nn.Sequential(
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout)
        )
        self.skip = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride), nn.BatchNorm2d(cout))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b(self.a(x)) + self.skip(x))


def resnet(
    blocks: tuple[int, ...], width: int = 32, *, image: int = 64, batch: int = 8
) -> Callable[[bool], tuple[nn.Module, tuple]]:
    """ResNet with basic blocks; ``blocks`` gives the block count per stage."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        cin = width
        for stage, count in enumerate(blocks):
            cout = width * 2**stage
            for i in range(count):
                layers.append(_BasicBlock(cin, cout, 2 if i == 0 and stage > 0 else 1))
                cin = cout
        model = _Classifier(_conv_bn(3, width), nn.Sequential(*layers), cin)
        return model, (torch.randn(batch, 3, image, image, generator=_gen(1)),)

    return build


class _InceptionBlock(nn.Module):
    """Four parallel branches (1x1; 1x1-3x3; 1x1-3x3-3x3; pool-1x1) concatenated."""

    def __init__(self, cin: int, b: int) -> None:
        super().__init__()
        self.b1 = _conv_bn(cin, b, 1)
        self.b3 = nn.Sequential(_conv_bn(cin, b, 1), _conv_bn(b, b, 3))
        self.b5 = nn.Sequential(_conv_bn(cin, b // 2, 1), _conv_bn(b // 2, b, 3), _conv_bn(b, b, 3))
        self.bp = nn.Sequential(nn.MaxPool2d(3, 1, 1), _conv_bn(cin, b, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.bp(x)], dim=1)


def inception(
    modules: int, branch: int = 16, *, image: int = 64, batch: int = 8
) -> Callable[[bool], tuple[nn.Module, tuple]]:
    """Inception-style network: ``modules`` blocks, downsampling every third."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        cin = 2 * branch
        for i in range(modules):
            layers.append(_InceptionBlock(cin, branch))
            cin = 4 * branch
            if i % 3 == 2:
                layers.append(nn.MaxPool2d(2))
        model = _Classifier(_conv_bn(3, 2 * branch), nn.Sequential(*layers), cin)
        return model, (torch.randn(batch, 3, image, image, generator=_gen(2)),)

    return build


class _UNet(nn.Module):
    """Encoder-decoder with skip connections; the skips keep large activations alive."""

    def __init__(self, depth: int, width: int) -> None:
        super().__init__()
        self.down = nn.ModuleList()
        self.up = nn.ModuleList()
        self.upconv = nn.ModuleList()
        cin = 3
        chans = []
        for d in range(depth):
            c = width * 2**d
            self.down.append(nn.Sequential(_conv_bn(cin, c), _conv_bn(c, c)))
            chans.append(c)
            cin = c
        self.mid = _conv_bn(cin, cin * 2)
        cin *= 2
        for c in reversed(chans):
            self.upconv.append(nn.ConvTranspose2d(cin, c, 2, stride=2))
            self.up.append(nn.Sequential(_conv_bn(2 * c, c), _conv_bn(c, c)))
            cin = c
        self.out = nn.Conv2d(cin, 2, 1)

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
    depth: int, width: int = 16, *, image: int = 64, batch: int = 4
) -> Callable[[bool], tuple[nn.Module, tuple]]:
    """U-Net segmenter; ``image`` must be divisible by ``2**depth``."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        torch.manual_seed(0)
        return _UNet(depth, width), (torch.randn(batch, 3, image, image, generator=_gen(3)),)

    return build


class _MLP(nn.Module):
    def __init__(self, layers: int, width: int, din: int, residual: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(din, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(width),
                nn.Linear(width, width * 2),
                nn.GELU(),
                nn.Linear(width * 2, width),
            )
            for _ in range(layers)
        )
        self.residual = residual
        self.out = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = x + b(x) if self.residual else b(x)
        return self.out(x)


def mlp(
    layers: int, width: int = 256, *, residual: bool = True, batch: int = 64
) -> Callable[[bool], tuple[nn.Module, tuple]]:
    """Deep MLP of pre-norm blocks, with or without residual connections."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        torch.manual_seed(0)
        model = _MLP(layers, width, 64, residual)
        return model, (torch.randn(batch, 64, generator=_gen(4)),)

    return build


class _RandWireStage(nn.Module):
    """A randomly wired stage: each DAG node sums its inputs, then ReLU-conv-BN.

    The wiring is a Watts-Strogatz graph with edges oriented from lower to higher index, as in
    randomly wired networks; nodes without predecessors read the stage input and the stage output
    is the mean of the nodes without successors.
    """

    def __init__(self, wiring: nx.Graph, cin: int, c: int) -> None:
        super().__init__()
        self.n = wiring.number_of_nodes()
        self.preds = [sorted(u for u in wiring.neighbors(v) if u < v) for v in range(self.n)]
        has_succ = {u for v in range(self.n) for u in self.preds[v]}
        self.sinks = [v for v in range(self.n) if v not in has_succ]
        self.entry = _conv_bn(cin, c, 3, 2)
        self.ops = nn.ModuleList(
            nn.Sequential(
                nn.ReLU(),
                nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False),
                nn.Conv2d(c, c, 1, bias=False),
                nn.BatchNorm2d(c),
            )
            for _ in range(self.n)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.entry(x)
        outs: list[torch.Tensor] = []
        for v in range(self.n):
            ins = [outs[u] for u in self.preds[v]] or [x]
            s = ins[0]
            for t in ins[1:]:
                s = s + t
            outs.append(self.ops[v](s))
        y = outs[self.sinks[0]]
        for v in self.sinks[1:]:
            y = y + outs[v]
        return y / len(self.sinks)


def randwire(
    nodes: int,
    k: int = 4,
    p: float = 0.75,
    *,
    stages: int = 2,
    width: int = 16,
    seed: int = 0,
    image: int = 32,
    batch: int = 8,
) -> Callable[[bool], tuple[nn.Module, tuple]]:
    """Randomly wired CNN: ``stages`` Watts-Strogatz stages of ``nodes`` nodes each."""

    def build(training: bool) -> tuple[nn.Module, tuple]:
        torch.manual_seed(seed)
        body: list[nn.Module] = []
        cin = width
        for s in range(stages):
            wiring = nx.connected_watts_strogatz_graph(nodes, k, p, seed=seed * 100 + s)
            c = width * 2**s
            body.append(_RandWireStage(wiring, cin, c))
            cin = c
        model = _Classifier(_conv_bn(3, width), nn.Sequential(*body), cin)
        return model, (torch.randn(batch, 3, image, image, generator=_gen(5)),)

    return build


def _spec(name: str, family: str, build: Callable) -> list[ModelSpec]:
    """An inference and a training entry for one model configuration."""
    return [
        ModelSpec(name, family, build, False),
        ModelSpec(f"{name}-train", family, build, True),
    ]


def model_specs(quick: bool = False) -> list[ModelSpec]:
    """The fixed list of model configurations of the corpus (inference and training each).

    Inference graphs have about 20 to 850 nodes (the small ones let an exact solver give the
    optimum), training graphs 250 to 2,200; the largest training graphs of the held-out test
    families (T5, ViT, Inception) are bigger than every training-split graph, for test-large.
    """
    if quick:
        return [
            *_spec("mlp-l4", "mlp", mlp(4, 64)),
            *_spec("resnet-s2", "resnet", resnet((1, 1), 16, image=32)),
            *_spec("vit-l1", "vit", vit(1, 64, 4, image=32)),
        ]
    specs: list[ModelSpec] = []
    for layers, hidden, heads in [(1, 128, 4), (2, 256, 4), (4, 384, 6), (6, 768, 12)]:
        specs += _spec(f"gpt2-l{layers}-h{hidden}", "gpt2", gpt2(layers, hidden, heads))
    for layers, hidden, heads, kv in [(1, 128, 4, 2), (2, 256, 8, 4), (4, 512, 8, 2)]:
        specs += _spec(f"llama-l{layers}-h{hidden}", "llama", llama(layers, hidden, heads, kv))
    for layers, hidden, heads in [(2, 128, 4), (4, 256, 4)]:
        specs += _spec(f"bert-l{layers}-h{hidden}", "bert", bert(layers, hidden, heads))
    for layers, hidden, heads in [(1, 128, 4), (2, 256, 4), (4, 512, 8)]:
        specs += _spec(f"t5-l{layers}-h{hidden}", "t5", t5(layers, hidden, heads))
    for layers, hidden, heads in [(2, 128, 4), (4, 256, 4), (12, 384, 6)]:
        specs += _spec(f"vit-l{layers}-h{hidden}", "vit", vit(layers, hidden, heads))
    for blocks in [(1, 1), (2, 2, 2), (2, 2, 2, 2), (3, 4, 6, 3)]:
        tag = "".join(map(str, blocks))
        specs += _spec(f"resnet-b{tag}", "resnet", resnet(blocks))
    for modules in [2, 5, 12]:
        specs += _spec(f"inception-m{modules}", "inception", inception(modules))
    for depth in [2, 3, 4]:
        specs += _spec(f"unet-d{depth}", "unet", unet(depth))
    for layers, residual in [(8, False), (8, True), (24, True)]:
        tag = "res" if residual else "plain"
        specs += _spec(f"mlp-{tag}-l{layers}", "mlp", mlp(layers, residual=residual))
    for n, seed in [(8, 0), (12, 3), (16, 1), (24, 2)]:
        specs += _spec(f"randwire-n{n}-s{seed}", "randwire", randwire(n, seed=seed))
    return specs
