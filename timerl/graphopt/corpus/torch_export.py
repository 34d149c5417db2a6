"""Turn a PyTorch module into a graphopt graph dict (the JSON exchange format).

Inference graphs come from ``torch.export.export(..., strict=False).run_decompositions()``, i.e.
the functional core-ATen graph a compiler would see. Training graphs are the *joint* forward and
backward graph: the module is wrapped so that it returns a scalar loss, exported with
``torch.export`` in train mode (which copes with data-dependent Python in HuggingFace models by
tracing non-strictly), and the resulting graph module is traced again by
``torch._functorch.aot_autograd.aot_export_module(..., trace_joint=True, output_loss_index=0)``
with the core-ATen decompositions. On torch 2.13 this is the route that works for every model
family of the corpus; ``aot_export_module`` on the raw HuggingFace module fails on data-dependent
mask code, and ``torch.export.experimental._export_forward_backward`` shares its limits.

Modelling choices:

* Parameters, buffers and constants are folded away, with their views (e.g. the ``permute`` of
  a weight feeding an ``addmm``); their total is the dict's ``param_bytes``. On one device a
  weight is resident for the whole program under every order, so it is a constant that no
  decision can change; as a schedulable node it would invent savings (loading a weight late,
  freeing it after its last use). User inputs stay as ``"input"`` nodes with zero cost.
* ``operator.getitem`` on multi-output ops is folded: the producer's bytes are the sum of its
  tensor outputs and consumers of an element depend on the producer directly. This is exactly as
  conservative as an alias (an element keeps the whole result alive) with fewer nodes.
* Views (ops whose ATen schema says the result aliases the first argument, plus
  ``_unsafe_view``) are marked ``alias_of`` their input node, which is always a direct
  predecessor; chains of views are allowed.
* Cost in seconds on a reference device of 1 TFLOP/s and 1 TB/s: FLOPs from
  ``torch.utils.flop_counter``'s registered formulas (matmul, convolution, attention and their
  backwards) evaluated on the fake tensors in ``node.meta["val"]``, plus a per-op launch constant;
  ops without a formula are memory bound and cost (bytes read + bytes written) / 1e12.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from timerl.errors import GraphError

FLOPS_PER_S = 1e12
BYTES_PER_S = 1e12
OP_OVERHEAD_S = 1e-6
VIEW_OVERHEAD_S = 1e-7

# Ops that reinterpret their input's buffer although their schema does not say so.
_EXTRA_VIEW_OPS = {"aten::_unsafe_view", "aten::_reshape_alias", "aten::lift_fresh"}


def _tensor_bytes(val: Any) -> int:
    """Bytes of a (fake) tensor, or the sum over a tuple/list of them; 0 for non-tensors."""
    if isinstance(val, torch.Tensor):
        return int(val.numel()) * int(val.element_size())
    if isinstance(val, (tuple, list)):
        return sum(_tensor_bytes(v) for v in val)
    return 0


def _is_view(target: Any) -> bool:
    """True when the op's output is a view of its first argument (per the ATen schema)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    if schema.name in _EXTRA_VIEW_OPS:
        return True
    if not schema.returns or not schema.arguments:
        return False
    ret = schema.returns[0].alias_info
    arg = schema.arguments[0].alias_info
    if ret is None or arg is None or ret.is_write:
        return False
    return bool(set(ret.before_set) & set(arg.before_set))


def _op_name(target: Any) -> str:
    """``addmm`` for ``aten.addmm.default``; non-default overloads keep their suffix."""
    packet = getattr(target, "overloadpacket", None)
    if packet is None:
        return str(getattr(target, "__name__", target))
    base = packet.__name__
    overload = getattr(target, "_overloadname", "default")
    return base if overload == "default" else f"{base}.{overload}"


def _flops(node: torch.fx.Node) -> int:
    """FLOPs of one ATen call from the registered formula, 0 when the op has none."""
    from torch.utils.flop_counter import flop_registry

    packet = getattr(node.target, "overloadpacket", None)
    formula = flop_registry.get(packet) if packet is not None else None
    if formula is None:
        return 0

    def val(a: Any) -> Any:
        return a.meta.get("val") if isinstance(a, torch.fx.Node) else a

    args = torch.fx.node.map_aggregate(node.args, val)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, val)
    try:
        return int(formula(*args, out_val=node.meta.get("val"), **kwargs))
    except Exception:  # a formula that does not accept this overload's arguments
        return 0


def graph_from_fx(
    graph: torch.fx.Graph,
    *,
    name: str,
    param_names: set[str],
) -> dict:
    """Convert an FX graph with fake-tensor metadata into a graph dict.

    ``param_names`` lists the placeholders that hold parameters, buffers or constants: they and
    their views are folded away and summed into the dict's ``param_bytes``. The other tensor
    placeholders become ``"input"`` nodes.
    """
    nodes: list[dict] = []
    index: dict[str, dict] = {}
    edges: list[list[str]] = []
    # Maps an FX node name to the graph node that stands for it (getitem is folded).
    rep: dict[str, str] = {}
    folded: set[str] = set()  # parameters and views of them
    param_bytes = 0

    def resolve(n: torch.fx.Node) -> str | None:
        return rep.get(n.name)

    for n in graph.nodes:
        if n.op == "placeholder":
            val = n.meta.get("val")
            if not isinstance(val, torch.Tensor):
                continue
            if n.name in param_names:
                folded.add(n.name)
                param_bytes += _tensor_bytes(val)
                continue
            entry = {"id": n.name, "op": "input", "bytes": _tensor_bytes(val), "cost": 0.0}
        elif n.op == "call_function":
            first = n.args[0] if n.args else None
            if n.target is operator.getitem:
                if isinstance(first, torch.fx.Node) and resolve(first) is not None:
                    rep[n.name] = resolve(first)
                continue
            val = n.meta.get("val")
            if val is None and not n.users:
                continue  # runtime assertions and other ops that produce nothing
            is_view = _is_view(n.target) and isinstance(first, torch.fx.Node)
            if is_view and first.name in folded:
                folded.add(n.name)  # a view of a weight is resident weight memory
                continue
            out_bytes = _tensor_bytes(val)
            preds: list[str] = []
            for a in n.all_input_nodes:
                r = resolve(a)
                if r is not None and r not in preds:
                    preds.append(r)
            entry = {"id": n.name, "op": _op_name(n.target), "bytes": out_bytes}
            if is_view and resolve(first) is not None:
                entry["alias_of"] = resolve(first)
                entry["cost"] = VIEW_OVERHEAD_S
            else:
                flops = _flops(n)
                if flops > 0:
                    entry["cost"] = flops / FLOPS_PER_S + OP_OVERHEAD_S
                else:
                    read = sum(_tensor_bytes(a.meta.get("val")) for a in n.all_input_nodes)
                    entry["cost"] = (read + out_bytes) / BYTES_PER_S + OP_OVERHEAD_S
            edges.extend([p, n.name] for p in preds)
        elif n.op == "output":
            for a in torch.fx.node.map_aggregate(n.args, lambda x: x):
                _mark_outputs(a, resolve, index)
            continue
        else:  # get_attr and friends: export lifts all state to placeholders
            continue
        rep[n.name] = n.name
        index[n.name] = entry
        nodes.append(entry)
    if not any(e.get("output") for e in nodes):
        raise GraphError(f"{name}: exported graph has no computed tensor output")
    return {"name": name, "param_bytes": param_bytes, "nodes": nodes, "edges": edges}


def _mark_outputs(a: Any, resolve: Any, index: dict[str, dict]) -> None:
    if isinstance(a, torch.fx.Node):
        r = resolve(a)
        if r is not None:
            index[r]["output"] = True
    elif isinstance(a, (tuple, list)):
        for x in a:
            _mark_outputs(x, resolve, index)


class _LossWrapper(nn.Module):
    """Make any model return a scalar loss so that a joint graph can be traced.

    A model whose first output is already a scalar (e.g. a HuggingFace model given labels) is used
    as is; otherwise the loss is the mean square of its first tensor output.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any) -> tuple[torch.Tensor]:
        out = self.model(*args)
        first = _first_tensor(out)
        if first.dim() != 0:
            first = first.float().pow(2).mean()
        return (first,)


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        for o in out:
            if isinstance(o, torch.Tensor):
                return o
    if hasattr(out, "to_tuple"):
        return _first_tensor(out.to_tuple())
    raise TypeError(f"model output {type(out).__name__} holds no tensor")


def _export_inference(model: nn.Module, args: tuple, name: str) -> dict:
    model.eval()
    with torch.no_grad():
        ep = torch.export.export(model, args, strict=False).run_decompositions()
    from torch.export.graph_signature import InputKind

    params = {
        s.arg.name
        for s in ep.graph_signature.input_specs
        if s.kind != InputKind.USER_INPUT and hasattr(s.arg, "name")
    }
    return graph_from_fx(ep.graph, name=name, param_names=params)


def _untie_parameters(model: nn.Module) -> None:
    """Give every module its own copy of a shared parameter (e.g. T5's shared embedding).

    ``aot_export_module`` sees a shared parameter once per owner but routes its gradient to only
    one of them, then rejects the graph; separate copies keep the graph honest about compute and
    count the weight once per owner.
    """
    seen: set[int] = set()
    for module in model.modules():
        for pname, p in list(module.named_parameters(recurse=False)):
            if id(p) in seen:
                setattr(module, pname, nn.Parameter(p.detach().clone(), p.requires_grad))
            seen.add(id(p))


def _export_training(model: nn.Module, args: tuple, name: str) -> dict:
    from torch._decomp import core_aten_decompositions
    from torch._functorch.aot_autograd import aot_export_module

    _untie_parameters(model)
    wrapper = _LossWrapper(model).train()

    # Parameters the loss does not depend on (e.g. a relative-position table a layer does not
    # read) get no gradient, which aot_export_module rejects; one eager step finds and freezes
    # them, which is far cheaper than a failed trace.
    wrapper.zero_grad(set_to_none=True)
    wrapper(*args)[0].backward()
    for p in wrapper.parameters():
        if p.requires_grad and p.grad is None:
            p.requires_grad_(False)
    wrapper.zero_grad(set_to_none=True)
    ep = torch.export.export(wrapper, args, strict=False)
    gm, sig = aot_export_module(
        ep.module(),
        args,
        trace_joint=True,
        output_loss_index=0,
        decompositions=core_aten_decompositions(),
    )
    params = set(sig.inputs_to_parameters) | set(sig.inputs_to_buffers)
    return graph_from_fx(gm.graph, name=name, param_names=params)


def graph_from_module(
    model: nn.Module,
    example_inputs: Sequence[Any],
    *,
    name: str,
    training: bool = False,
) -> dict:
    """Export ``model`` on ``example_inputs`` and return its graph dict.

    With ``training=True`` the graph is the joint forward+backward graph of a scalar loss (the
    model's own scalar output, else the mean square of its first output); its outputs are the
    loss, every parameter gradient and every mutated buffer. Raises ``GraphError`` naming the
    model when export fails.
    """
    args = tuple(example_inputs)
    try:
        if training:
            return _export_training(model, args, name)
        return _export_inference(model, args, name)
    except GraphError:
        raise
    except Exception as e:  # export failures come in many exception types
        kind = "training" if training else "inference"
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GraphError(f"{name}: {kind} export failed: {type(e).__name__}: {msg}") from e
