"""Your own PyTorch model as a graphopt graph: :func:`from_torch`.

Inference graphs come from ``torch.export.export(..., strict=False).run_decompositions()``, i.e.
the functional core-ATen graph a compiler would see. Training graphs are the *joint* forward and
backward graph: the module is wrapped so that it returns a scalar loss, exported with
``torch.export`` in train mode (which copes with data-dependent Python in HuggingFace models by
tracing non-strictly), and the resulting graph module is traced again by
``torch._functorch.aot_autograd.aot_export_module(..., trace_joint=True, output_loss_index=0)``
with the core-ATen decompositions. On torch 2.13 this is the route that works for every model
family of the corpus; ``aot_export_module`` on the raw HuggingFace module fails on data-dependent
mask code, and ``torch.export.experimental._export_forward_backward`` shares its limits.
:func:`from_torch` then adds the optimizer's step per parameter (:func:`_add_optimizer_step`).

Modelling choices:

* Parameters, buffers and constants are folded away, with their views (e.g. the ``permute`` of
  a weight feeding an ``addmm``); their total is the graph's ``param_bytes``. On one device a
  weight is resident for the whole program under every order, so it is a constant that no
  decision can change; as a schedulable node it would invent savings (loading a weight late,
  freeing it after its last use). The optimizer's state (Adam's two moments) is resident the
  same way: ``optimizer_state_bytes``. User inputs stay as ``"input"`` nodes with zero cost.
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

torch is imported on first use: it is an optional extra, and graphopt imports nothing of timerl
but its errors.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from timerl.errors import GraphError

if TYPE_CHECKING:
    from timerl.graphopt.graph import Graph

FLOPS_PER_S = 1e12
BYTES_PER_S = 1e12
OP_OVERHEAD_S = 1e-6
VIEW_OVERHEAD_S = 1e-7

OPTIMIZERS = ("adam", "sgd")

# Ops that reinterpret their input's buffer although their schema does not say so.
_EXTRA_VIEW_OPS = {"aten::_unsafe_view", "aten::_reshape_alias", "aten::lift_fresh"}


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise GraphError(
            "importing a PyTorch model needs torch, which is not installed: "
            "pip install 'timerl[torch]'"
        ) from None
    return torch


def from_torch(
    model: Any,
    example_inputs: Any,
    training: bool = False,
    *,
    optimizer: str | None = "adam",
    name: str | None = None,
) -> Graph:
    """The graph of ``model`` run on ``example_inputs`` (a tensor or a tuple of them), for
    ``timerl graphopt optimize`` and the search functions.

    ``training=False``: one forward pass (in eval mode, without gradients). ``training=True``:
    the forward pass of a scalar loss (the model's own scalar output, else the mean square of
    its first output), its backward pass and the ``optimizer``'s step on every parameter
    (``"adam"`` or ``"sgd"`` as ``torch.optim`` runs them one tensor at a time; ``None``:
    forward and backward only, the gradients being the graph's outputs). The model is
    copied first, so neither its mode nor its parameters change.

    Node bytes are activations, gradients and temporaries; the parameters (and the
    optimizer's state) are resident under every order and left out, their totals kept as
    the graph's ``param_bytes`` and ``optimizer_state_bytes``.
    """
    from timerl.graphopt.graph import Graph

    torch = _torch()
    if not isinstance(model, torch.nn.Module):
        raise GraphError(f"from_torch: model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, Sequence) or not example_inputs:
        raise GraphError(
            "from_torch: example_inputs must be a tensor or a non-empty tuple of the model's "
            f"inputs, got {type(example_inputs).__name__}"
        )
    if training and optimizer is not None and optimizer not in OPTIMIZERS:
        raise GraphError(
            f"from_torch: unknown optimizer {optimizer!r}; choose one of {list(OPTIMIZERS)} or None"
        )
    name = name or type(model).__name__
    try:
        model = copy.deepcopy(model)
    except Exception as err:  # a module holding something that does not copy
        raise GraphError(f"{name}: cannot copy the model to export it: {err}") from err
    data = graph_from_module(
        model, example_inputs, name=name, training=training, optimizer=optimizer
    )
    return Graph.from_json(data)


def _tensor_bytes(val: Any) -> int:
    """Bytes of a (fake) tensor, or the sum over a tuple/list of them; 0 for non-tensors."""
    torch = _torch()
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


def _flops(node: Any) -> int:
    """FLOPs of one ATen call from the registered formula, 0 when the op has none."""
    torch = _torch()
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


def graph_from_fx(graph: Any, *, name: str, param_names: set[str]) -> dict:
    """Convert an FX graph with fake-tensor metadata into a graph dict.

    ``param_names`` lists the placeholders that hold parameters, buffers or constants: they and
    their views are folded away and summed into the dict's ``param_bytes``. The other tensor
    placeholders become ``"input"`` nodes.
    """
    return _convert_fx(graph, name=name, param_names=param_names)[0]


def _convert_fx(graph: Any, *, name: str, param_names: set[str]) -> tuple[dict, dict[str, str]]:
    """:func:`graph_from_fx`, and which graph node stands for each FX node."""
    torch = _torch()
    nodes: list[dict] = []
    index: dict[str, dict] = {}
    edges: list[list[str]] = []
    # Maps an FX node name to the graph node that stands for it (getitem is folded).
    rep: dict[str, str] = {}
    folded: set[str] = set()  # parameters and views of them
    param_bytes = 0

    def resolve(n: Any) -> str | None:
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
    data = {"name": name, "param_bytes": param_bytes, "nodes": nodes, "edges": edges}
    return data, rep


def _mark_outputs(a: Any, resolve: Any, index: dict[str, dict]) -> None:
    torch = _torch()
    if isinstance(a, torch.fx.Node):
        r = resolve(a)
        if r is not None:
            index[r]["output"] = True
    elif isinstance(a, (tuple, list)):
        for x in a:
            _mark_outputs(x, resolve, index)


_LOSS_WRAPPER: list[type] = []


def _loss_wrapper(model: Any) -> Any:
    """The model wrapped to return a scalar loss, so that a joint graph can be traced.

    A model whose first output is already a scalar (e.g. a HuggingFace model given labels) is
    used as is; otherwise the loss is the mean square of its first tensor output. (The class
    is made on first use: torch is an optional dependency.)
    """
    if not _LOSS_WRAPPER:
        torch = _torch()

        class LossWrapper(torch.nn.Module):
            def __init__(self, model: Any) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args: Any) -> tuple[Any]:
                out = self.model(*args)
                first = _first_tensor(out)
                if first.dim() != 0:
                    first = first.float().pow(2).mean()
                return (first,)

        _LOSS_WRAPPER.append(LossWrapper)
    return _LOSS_WRAPPER[0](model)


def _first_tensor(out: Any) -> Any:
    torch = _torch()
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


def _export_inference(model: Any, args: tuple, name: str) -> dict:
    torch = _torch()
    from torch.export.graph_signature import InputKind

    model.eval()
    with torch.no_grad():
        ep = torch.export.export(model, args, strict=False).run_decompositions()
    params = {
        s.arg.name
        for s in ep.graph_signature.input_specs
        if s.kind != InputKind.USER_INPUT and hasattr(s.arg, "name")
    }
    return graph_from_fx(ep.graph, name=name, param_names=params)


def _untie_parameters(model: Any) -> None:
    """Give every module its own copy of a shared parameter (e.g. T5's shared embedding).

    ``aot_export_module`` sees a shared parameter once per owner but routes its gradient to only
    one of them, then rejects the graph; separate copies keep the graph honest about compute and
    count the weight once per owner.
    """
    nn = _torch().nn
    seen: set[int] = set()
    for module in model.modules():
        for pname, p in list(module.named_parameters(recurse=False)):
            if id(p) in seen:
                setattr(module, pname, nn.Parameter(p.detach().clone(), p.requires_grad))
            seen.add(id(p))


def _export_training(model: Any, args: tuple, name: str, optimizer: str | None) -> dict:
    torch = _torch()
    from torch._decomp import core_aten_decompositions
    from torch._functorch.aot_autograd import aot_export_module

    _untie_parameters(model)
    wrapper = _loss_wrapper(model).train()

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
    data, rep = _convert_fx(gm.graph, name=name, param_names=params)
    if optimizer is None:
        return data
    sizes = {
        sig.inputs_to_parameters[n.name]: _tensor_bytes(n.meta.get("val"))
        for n in gm.graph.nodes
        if n.op == "placeholder" and n.name in sig.inputs_to_parameters
    }
    grads = sig.backward_signature.gradients_to_parameters  # output name -> parameter
    outputs = [a.name for a in _output_nodes(gm.graph)]
    kept = {rep[o] for o in outputs if o not in grads and o in rep}
    steps = [(rep[g], p, sizes[p]) for g, p in grads.items() if g in rep and p in sizes]
    _add_optimizer_step(data, steps, optimizer, kept)
    return data


def _output_nodes(graph: Any) -> list[Any]:
    torch = _torch()
    found: list[Any] = []
    for n in graph.nodes:
        if n.op == "output":
            torch.fx.node.map_aggregate(n.args, lambda x: found.append(x) or x)
    return [a for a in found if isinstance(a, torch.fx.Node)]


def _add_optimizer_step(
    data: dict, steps: list[tuple[str, str, int]], optimizer: str, kept: set[str]
) -> None:
    """Add each parameter's update, as ``torch.optim`` runs it one tensor at a time.

    ``steps``: (the graph node holding the gradient, the parameter, its bytes). The update
    reads the gradient, so a gradient is no longer an output kept to the end: it lives until
    its parameter's step has run, and the order decides when that is. Parameters and the
    optimizer's state are updated in place (resident, outside the graph); what an update
    allocates is its temporaries: SGD ``param.add_(grad, alpha=-lr)`` none; Adam
    ``exp_avg.lerp_(grad)``, ``exp_avg_sq.mul_().addcmul_(grad, grad)`` in place, then
    ``denom = (exp_avg_sq.sqrt() / c).add_(eps)`` (the square root and the quotient, one
    parameter's size each, both live while the quotient is made) and
    ``param.addcdiv_(exp_avg, denom)`` in place. Cost: bytes read and written at 1 TB/s.
    """
    nodes, edges = data["nodes"], data["edges"]
    by_id = {n["id"]: n for n in nodes}
    for grad, _, _ in steps:
        if grad not in kept:
            by_id[grad].pop("output", None)

    def add(node_id: str, op: str, nbytes: int, moved: int, preds: list[str]) -> str:
        entry = {"id": node_id, "op": op, "bytes": nbytes}
        entry["cost"] = moved / BYTES_PER_S + OP_OVERHEAD_S
        nodes.append(entry)
        edges.extend([p, node_id] for p in preds)
        return node_id

    for k, (grad, param, size) in enumerate(steps):
        tag = f"{optimizer}_{k}_{param.removeprefix('model.')}"  # not the loss wrapper's
        if optimizer == "sgd":
            add(f"{tag}_add_", "add_", 0, 3 * size, [grad])
        else:
            moments = add(f"{tag}_moments", "lerp_addcmul_", 0, 5 * size, [grad])
            root = add(f"{tag}_sqrt", "sqrt", size, 2 * size, [moments])
            denom = add(f"{tag}_div", "div", size, 2 * size, [root])
            add(f"{tag}_addcdiv_", "addcdiv_", 0, 4 * size, [denom, moments])
        nodes[-1]["output"] = True  # the update is the point of the step
    total = sum(size for _, _, size in steps)
    data["optimizer"] = optimizer
    data["optimizer_state_bytes"] = 2 * total if optimizer == "adam" else 0


def graph_from_module(
    model: Any,
    example_inputs: Sequence[Any],
    *,
    name: str,
    training: bool = False,
    optimizer: str | None = None,
) -> dict:
    """Export ``model`` on ``example_inputs`` and return its graph dict (the JSON format).

    With ``training=True`` the graph is the joint forward+backward graph of a scalar loss (the
    model's own scalar output, else the mean square of its first output); its outputs are the
    loss, every parameter gradient and every mutated buffer; with an ``optimizer``, its step
    per parameter reads the gradients instead (see :func:`_add_optimizer_step`). Changes
    ``model`` (its mode; shared parameters are untied): :func:`from_torch` gives it a copy.
    Raises ``GraphError`` naming the model when export fails.
    """
    args = tuple(example_inputs)
    try:
        if training:
            return _export_training(model, args, name, optimizer)
        return _export_inference(model, args, name)
    except GraphError:
        raise
    except Exception as e:  # export failures come in many exception types
        kind = "training" if training else "inference"
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GraphError(f"{name}: {kind} export failed: {type(e).__name__}: {msg}") from e


def load_model(spec: str) -> tuple[Any, tuple | None]:
    """``"module:factory"`` -> the factory's model, and its example inputs when it returns
    ``(model, example_inputs)`` (else None). The module is imported as ``python`` would from
    the current folder."""
    import importlib
    import os
    import sys

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise GraphError(f"{spec!r}: expected module:factory, e.g. mymodels:make_mlp")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise GraphError(f"{spec}: cannot import module {module_name!r}: {err}") from None
    factory: Any = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
    if factory is None or not callable(factory):
        raise GraphError(f"{spec}: module {module_name} has no function or class {attr!r}")
    made = factory()
    torch = _torch()
    if isinstance(made, torch.nn.Module):
        return made, None
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        inputs = made[1]
        return made[0], (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    raise GraphError(
        f"{spec}: the factory must return a torch.nn.Module or (module, example_inputs), "
        f"got {type(made).__name__}"
    )


def example_tensors(shapes: Sequence[Sequence[int]], dtype: str = "float32") -> tuple:
    """Example inputs of these shapes: standard normal floats, or zeros of an integer dtype
    (token ids); only their shapes and dtypes matter to the graph."""
    torch = _torch()
    kind = getattr(torch, dtype, None)
    if not isinstance(kind, torch.dtype):
        raise GraphError(f"unknown dtype {dtype!r} for the example inputs (e.g. float32, int64)")
    gen = torch.Generator().manual_seed(0)
    if kind.is_floating_point:
        return tuple(torch.randn(*s, generator=gen).to(kind) for s in shapes)
    return tuple(torch.zeros(*s, dtype=kind) for s in shapes)
