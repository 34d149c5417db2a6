"""The graph policy: a small message-passing network giving BRKGA its per-node proposals.

The network is defined once, here: :func:`param_shapes` (the parameters' names and shapes)
and :func:`network` (the computation, written against :class:`GraphOps`, the four graph
operations it needs). Each engine runs that one function with its own ``GraphOps``: numpy
here (``NumpyGraphOps``: the compiler and ``timerl graphopt optimize`` need no torch), torch
in ``train.py`` and timerl tensors over padded batches in ``timerl.rl.graph_policy``; tests
check the three agree value for value. Likewise :func:`beta_from_outputs` maps outputs to
Beta parameters for all three.

Network, hidden width H, R rounds (``x``: node features, ``P``/``S``: mean over a node's
predecessors / successors):

    h = relu(x W_in + b_in)
    repeat R times:  h = h + relu(h W_self + (P h) W_pred + (S h) W_succ + b)
    out = [h, mean_nodes(h)] W_out + b_out          # (n, OUTPUTS)

Each node's outputs are the policy's *mean action*: for each key group (priority, device,
swap) a logit of the Beta mean and a log concentration, and a logit of the crossover bias
(columns 0-6); the decoder logit (column 7, averaged over the graph: the Beta mean of the
gene that picks list scheduling or the post-order decoder) and a move logit (column 8: how
often the local search moves the node, ``move_weights``). ``proposal`` maps an action (the
mean, or a sample around it while training) to BRKGA's Beta(a, b) per gene and bias per
gene. An action of zeros is Beta(1, 1) (uniform) and bias 0.7, plain BRKGA's defaults, and
uniform move weights.

Weights live in one ``.npz`` file (read with ``allow_pickle=False``); its ``meta`` entry is
JSON (as bytes) naming the format, the feature version and the shapes, and optionally the
``uniform_share`` of BRKGA's draws the weights leave uniform. A file that is missing,
truncated, of another format or of another feature version, or whose ``uniform_share`` is
outside [0, 1], raises ``CheckpointError`` naming the file and what differs.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from timerl.errors import CheckpointError
from timerl.graphopt.brkga import check_uniform_share
from timerl.graphopt.decoders import OBJECTIVES
from timerl.graphopt.features import FEATURE_VERSION, NUM_FEATURES, GraphFeatures

FORMAT = "timerl-graphopt-policy"
#: per node: (mean logit, log concentration) for priority, device and swap keys; bias logit;
#: decoder logit (its graph mean is used); local-search move logit
OUTPUTS = 9
DECODER_COLUMN = 7
MOVE_COLUMN = 8
MOVE_LOGIT_RANGE = (-4.0, 4.0)
GROUPS = ("priority", "device", "swap")
SHIPPED = Path(__file__).parent / "data" / "policy.npz"
#: weights trained on the runtime objective (2 devices + host under a memory limit), used for
#: that objective: the peak-memory file above never learned placement, swaps or running time
SHIPPED_RUNTIME = Path(__file__).parent / "data" / "policy-runtime.npz"
#: concentration kappa = BASE_KAPPA * exp(z): a = m kappa, b = (1 - m) kappa; kappa 2 = uniform
BASE_KAPPA = 2.0
LOG_KAPPA_RANGE = (-1.0, 5.0)
BIAS_RANGE = (0.5, 0.9)  # a logit of 0 is 0.7, plain BRKGA's default


def param_shapes(hidden: int, rounds: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of every parameter (the torch module uses the same names)."""
    shapes: dict[str, tuple[int, ...]] = {
        "in.w": (NUM_FEATURES, hidden),
        "in.b": (hidden,),
    }
    for r in range(rounds):
        shapes[f"r{r}.self"] = (hidden, hidden)
        shapes[f"r{r}.pred"] = (hidden, hidden)
        shapes[f"r{r}.succ"] = (hidden, hidden)
        shapes[f"r{r}.b"] = (hidden,)
    shapes["out.w"] = (2 * hidden, OUTPUTS)
    shapes["out.b"] = (OUTPUTS,)
    shapes["log_std"] = (OUTPUTS,)
    return shapes


class GraphOps(Protocol):
    """The graph operations :func:`network` needs, over node rows ``h`` (n, width) or a
    padded batch of them; arithmetic and ``@`` come from the tensor type itself."""

    def relu(self, h: Any) -> Any: ...

    def pred_mean(self, h: Any) -> Any:
        """Per node, the mean of ``h`` over its predecessors (0 without any)."""

    def succ_mean(self, h: Any) -> Any:
        """Per node, the mean of ``h`` over its successors (0 without any)."""

    def with_graph_mean(self, h: Any) -> Any:
        """``[h, mean of h over the graph's (real) nodes, for every node]`` (n, 2 width)."""

    def keep(self, h: Any) -> Any:
        """``h`` with padded nodes zeroed (unpadded engines: ``h`` itself)."""


def network(params: Mapping[str, Any], x: Any, rounds: int, ops: GraphOps) -> Any:
    """The policy network, the one definition every engine runs (module docstring)."""
    h = ops.keep(ops.relu(x @ params["in.w"] + params["in.b"]))
    for r in range(rounds):
        m = h @ params[f"r{r}.self"] + ops.pred_mean(h) @ params[f"r{r}.pred"]
        m = m + ops.succ_mean(h) @ params[f"r{r}.succ"] + params[f"r{r}.b"]
        h = h + ops.keep(ops.relu(m))
    return ops.with_graph_mean(h) @ params["out.w"] + params["out.b"]


def beta_from_outputs(
    logit: Any, log_kappa: Any, sigmoid: Any, exp: Any, clip: Any
) -> tuple[Any, Any]:
    """A key group's Beta(a, b) from its mean logit and log concentration, in any engine
    (its ``sigmoid``, ``exp`` and ``clip(x, lo, hi)``): mean ``sigmoid(logit)``,
    concentration ``BASE_KAPPA * exp(log_kappa)`` (clipped to ``LOG_KAPPA_RANGE``), each
    parameter at least 1e-3."""
    m = sigmoid(logit)
    kappa = exp(clip(log_kappa, *LOG_KAPPA_RANGE)) * BASE_KAPPA
    return clip(m * kappa, 1e-3, None), clip((1.0 - m) * kappa, 1e-3, None)


class NumpyGraphOps:
    """:class:`GraphOps` in numpy for one graph: means over neighbours as CSR sums
    (``add.reduceat``)."""

    def __init__(self, feats: GraphFeatures) -> None:
        n = feats.x.shape[0]
        self.pred_mean = _neighbour_mean(feats.dst, feats.src, n)
        self.succ_mean = _neighbour_mean(feats.src, feats.dst, n)

    @staticmethod
    def relu(h: np.ndarray) -> np.ndarray:
        return np.maximum(h, 0.0)

    @staticmethod
    def with_graph_mean(h: np.ndarray) -> np.ndarray:
        return np.concatenate([h, np.broadcast_to(h.mean(axis=0), h.shape)], axis=1)

    @staticmethod
    def keep(h: np.ndarray) -> np.ndarray:
        return h


def _neighbour_mean(to: np.ndarray, frm: np.ndarray, n: int) -> Any:
    """``mean(h)``: per node ``t``, the mean of ``h[f]`` over the edges ``f -> t`` given as
    arrays ``frm``, ``to``."""
    order = np.argsort(to, kind="stable")
    to_s, frm_s = to[order], frm[order]
    counts = np.bincount(to_s, minlength=n)
    has = np.nonzero(counts)[0]
    starts = np.searchsorted(to_s, has)
    inv = (1.0 / np.maximum(counts[has], 1)).astype(np.float32)[:, None]

    def mean(h: np.ndarray) -> np.ndarray:
        out = np.zeros_like(h)
        if frm_s.size:
            out[has] = np.add.reduceat(h[frm_s], starts, axis=0) * inv
        return out

    return mean


def trained_objectives(
    rewarded: bool, runtime_share: float, *, imitated: bool = False
) -> tuple[str, ...]:
    """What a training run teaches: imitation fits peak-memory orders only; reward updates see
    runtime problems when ``runtime_share`` is positive and peak-memory ones unless it is 1
    (then no peak-memory problem is ever drawn). Both trainers record this."""
    if not rewarded:
        return ("peak-memory",)
    learned = []
    if imitated or runtime_share < 1:
        learned.append("peak-memory")
    if runtime_share > 0:
        learned.append("runtime")
    return tuple(o for o in OBJECTIVES if o in learned)


@dataclass
class PolicyWeights:
    """Parameters of the network plus its description (``meta``, JSON-serialisable)."""

    params: dict[str, np.ndarray]
    hidden: int
    rounds: int
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def random(cls, hidden: int = 32, rounds: int = 3, seed: int = 0) -> PolicyWeights:
        """An untrained network (the ablation's 'same network, untrained')."""
        rng = np.random.default_rng(seed)
        params = {}
        for name, shape in param_shapes(hidden, rounds).items():
            if name == "log_std":
                params[name] = np.full(shape, np.log(0.5), dtype=np.float32)
            elif len(shape) == 1:
                params[name] = np.zeros(shape, dtype=np.float32)
            else:
                scale = 0.1 if name == "out.w" else 1.0 / np.sqrt(shape[0])
                params[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
        return cls(params, hidden, rounds, {"trained": False})

    @property
    def objectives(self) -> tuple[str, ...]:
        """The objectives these weights learned from: a file's ``objectives`` entry, else what
        its training implies (imitation fits peak-memory orders only; the reward phase also
        sees runtime problems when ``runtime_share`` is positive). An untrained network is
        applied to every objective: it is the ablation's control."""
        if "objectives" in self.meta:
            return tuple(self.meta["objectives"])
        if not self.meta.get("trained"):
            return OBJECTIVES
        config = self.meta.get("config") or {}
        rewarded = int(self.meta.get("iterations", 1)) > 0
        return trained_objectives(rewarded, float(config.get("runtime_share", 0.3)))

    @property
    def uniform_share(self) -> float:
        """The share of BRKGA's draws left uniform when these weights steer (``meta``'s
        ``uniform_share``, 0 when absent): chosen on validation graphs with the weights, so the
        file carries it."""
        return float(self.meta.get("uniform_share", 0.0))

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path, extra: dict[str, np.ndarray] | None = None) -> None:
        """Write ``.npz`` (no pickled objects); ``extra`` arrays ride along (checkpoints)."""
        meta = {
            "format": FORMAT,
            "feature_version": FEATURE_VERSION,
            "num_features": NUM_FEATURES,
            "outputs": OUTPUTS,
            "hidden": self.hidden,
            "rounds": self.rounds,
            **self.meta,
        }
        arrays: dict[str, np.ndarray] = {f"p/{k}": v for k, v in self.params.items()}
        for k, v in (extra or {}).items():
            arrays[f"x/{k}"] = v
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        tmp.replace(path)

    @classmethod
    def load(
        cls, path: str | Path, *, with_extra: bool = False
    ) -> PolicyWeights | tuple[PolicyWeights, dict[str, np.ndarray]]:
        """Read and check a weights file; see the module docstring for what is refused."""
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"policy weights {path}: file not found")
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise CheckpointError(
                f"policy weights {path}: not a readable .npz archive (truncated or corrupt?): {err}"
            ) from err
        if "meta" not in arrays:
            raise CheckpointError(f"policy weights {path}: no 'meta' entry (not a policy file)")
        try:
            meta = json.loads(arrays.pop("meta").tobytes().decode())
        except (ValueError, UnicodeDecodeError) as err:
            raise CheckpointError(f"policy weights {path}: unreadable 'meta' entry: {err}") from err
        if meta.get("format") != FORMAT:
            raise CheckpointError(
                f"policy weights {path}: format {meta.get('format')!r}, expected {FORMAT!r}"
            )
        if meta.get("feature_version") != FEATURE_VERSION:
            raise CheckpointError(
                f"policy weights {path}: trained on feature version "
                f"{meta.get('feature_version')!r} ({meta.get('num_features')} features); this "
                f"timerl computes version {FEATURE_VERSION} ({NUM_FEATURES} features): retrain "
                "with `timerl graphopt train`"
            )
        if meta.get("outputs") != OUTPUTS:
            raise CheckpointError(
                f"policy weights {path}: {meta.get('outputs')} outputs per node, expected {OUTPUTS}"
            )
        hidden, rounds = int(meta["hidden"]), int(meta["rounds"])
        params: dict[str, np.ndarray] = {}
        for name, shape in param_shapes(hidden, rounds).items():
            arr = arrays.get(f"p/{name}")
            if arr is None:
                raise CheckpointError(f"policy weights {path}: parameter {name!r} is missing")
            if arr.shape != shape:
                raise CheckpointError(
                    f"policy weights {path}: parameter {name!r} has shape {arr.shape}, "
                    f"expected {shape}"
                )
            params[name] = arr.astype(np.float32)
        if "uniform_share" in meta:
            try:
                check_uniform_share(meta["uniform_share"])
            except ValueError as err:
                raise CheckpointError(f"policy weights {path}: 'meta' entry: {err}") from None
        known = {"format", "feature_version", "num_features", "outputs", "hidden", "rounds"}
        weights = cls(params, hidden, rounds, {k: v for k, v in meta.items() if k not in known})
        if with_extra:
            extra = {k[2:]: v for k, v in arrays.items() if k.startswith("x/")}
            return weights, extra
        return weights

    # ------------------------------------------------------------------ inference
    def forward(self, feats: GraphFeatures) -> np.ndarray:
        """The mean action, (n, OUTPUTS)."""
        if feats.x.shape[0] == 0:
            return np.zeros((0, OUTPUTS), dtype=np.float32)
        return network(self.params, feats.x, self.rounds, NumpyGraphOps(feats))


def proposal(
    action: np.ndarray, groups: int, decoder_gene: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BRKGA's (alpha, beta, bias), each per gene, from an (n, OUTPUTS) action.

    ``groups`` key groups are used (1: priorities only; 2 or 3 with device and swap keys, in
    the decoder's layout: all priorities, then all device keys, then all swap keys). When a
    problem has swap keys but no device keys the swap group still comes from columns 4-5.
    ``decoder_gene``: one more gene, last, whose Beta mean is the sigmoid of the decoder
    column's mean over the nodes (concentration 2, bias 0.7).
    """
    cols = key_columns(groups)
    a_parts, b_parts, r_parts = [], [], []
    lo, hi = BIAS_RANGE
    bias = lo + (hi - lo) * _sigmoid(action[:, 6].astype(np.float64))
    for c in cols:
        a, b = beta_from_outputs(
            action[:, c].astype(np.float64),
            action[:, c + 1].astype(np.float64),
            _sigmoid,
            np.exp,
            np.clip,
        )
        a_parts.append(a)
        b_parts.append(b)
        r_parts.append(bias)
    if decoder_gene:
        logit = float(action[:, DECODER_COLUMN].mean()) if len(action) else 0.0
        m = float(_sigmoid(np.array(logit)))
        a_parts.append(np.array([BASE_KAPPA * m]))
        b_parts.append(np.array([BASE_KAPPA * (1.0 - m)]))
        r_parts.append(np.array([0.7]))
    return np.concatenate(a_parts), np.concatenate(b_parts), np.concatenate(r_parts)


def move_weights(action: np.ndarray) -> np.ndarray:
    """Per node, how often the local search picks it among the candidate moves:
    ``exp`` of the move column, clipped to ``MOVE_LOGIT_RANGE`` (zeros: uniform)."""
    return np.exp(np.clip(action[:, MOVE_COLUMN].astype(np.float64), *MOVE_LOGIT_RANGE))


def key_groups(place: bool, swaps: bool) -> int:
    """The ``groups`` argument of :func:`proposal` for a problem's key layout."""
    if place:
        return 3 if swaps else 2
    return -2 if swaps else 1


def key_columns(groups: int) -> list[int]:
    """The output column of each key group's mean logit, in the decoder's order (0: the
    priorities, 2: the device keys, 4: the swap keys); its log concentration is the next."""
    return [0] if groups == 1 else ([0, 4] if groups == -2 else [0, 2, 4][:groups])


def used_columns(groups: int) -> list[int]:
    """Output columns an action of this layout actually uses (for the policy gradient)."""
    cols = {1: [0, 1], 2: [0, 1, 2, 3], 3: [0, 1, 2, 3, 4, 5], -2: [0, 1, 4, 5]}[groups]
    return [*cols, 6, DECODER_COLUMN, MOVE_COLUMN]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))
