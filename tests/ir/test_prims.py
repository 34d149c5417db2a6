"""The primitive registry: every entry is complete, its traits say what the passes used to read
off names, and the torch lowering computes what the numpy reference (``impl``) defines."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from timerl.ir import prims

try:
    import torch

    from timerl.runtime.torch_lowering import LOWERINGS, register_lowering, torch_dtype
except ImportError:  # the numpy-only install: the registry is still checked
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs the torch extra")

rng = np.random.default_rng(0)


def f32(*shape: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return rng.uniform(low, high, size=shape).astype(np.float32)


def i64(*shape: int, high: int = 5) -> np.ndarray:
    return rng.integers(0, high, size=shape).astype(np.int64)


def bools(*shape: int) -> np.ndarray:
    return rng.random(shape) < 0.5


# name -> list of (inputs, attrs): small inputs covering each primitive's attribute forms
POS = {"log", "sqrt", "lgamma", "digamma", "trigamma"}  # on positive inputs here
UNARY = ["neg", "exp", "log", "tanh", "sigmoid", "sqrt", "abs", "sign", "sin", "cos", "floor"]
UNARY += ["lgamma", "digamma", "trigamma"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "lt", "le", "gt", "ge", "eq", "ne"]


class _TwoOutputs:
    """A ``pure_call`` function: traceable by any array module, ``host`` on numpy arrays."""

    def __call__(self, x):
        return x * 2.0, x + 1.0

    def host(self, x):
        return tuple(np.asarray(v) for v in self(np.asarray(x)))


CASES: dict[str, list[tuple[list, dict]]] = {
    **{n: [([f32(3, 4, low=0.1) if n in POS else f32(3, 4)], {})] for n in UNARY},
    **{n: [([f32(3, 4), f32(4)], {}), ([i64(2, 3), i64(2, 3) + 1], {})] for n in BINARY},
    "pow": [([f32(3, 4, low=0.1), f32(3, 4)], {})],
    "floordiv": [([i64(3, 4, high=9), i64(3, 4, high=4) + 1], {}), ([f32(5), f32(5, low=0.5)], {})],
    "mod": [([i64(3, 4, high=9), i64(3, 4, high=4) + 1], {}), ([f32(5), f32(5, low=0.5)], {})],
    "logical_not": [([bools(3, 4)], {})],
    "logical_and": [([bools(3, 4), bools(4)], {})],
    "logical_or": [([bools(3, 4), bools(3, 4)], {})],
    "where": [([bools(3, 4), f32(3, 4), f32(4)], {})],
    "cast": [
        ([f32(3, 4)], {"dtype": "int64"}),
        ([i64(3)], {"dtype": np.dtype("float32")}),
        ([f32(3)], {"dtype": "float32"}),  # to its own dtype: still a new array
    ],
    "identity": [([f32(2, 3)], {})],
    "detach": [([f32(2, 3)], {})],
    "sum": [
        ([f32(3, 4, 2)], {}),
        ([f32(3, 4, 2)], {"axes": (0, 2), "keepdims": True}),
        ([f32(3, 4)], {"axes": ()}),
        ([bools(3, 4)], {"axes": (1,), "_sum": True}),
    ],
    "sumsq": [([f32(3, 4, 2)], {}), ([f32()], {})],
    "max": [
        ([f32(3, 4, 2)], {"axes": (1,)}),
        ([f32(3, 4)], {"axes": None, "keepdims": True}),
        ([f32(3, 4)], {"axes": ()}),
    ],
    "argmax": [([f32(3, 4)], {"axis": 1}), ([f32(3, 4)], {"axis": 0, "keepdims": True})],
    "reshape": [([f32(3, 4)], {"shape": (2, 6)}), ([f32(1)], {"shape": ()})],
    "permute": [([f32(2, 3, 4)], {"perm": (2, 0, 1)})],
    "expand": [([f32(1, 4)], {"shape": (3, 4)}), ([f32()], {"shape": ()})],
    "getitem": [([f32(4, 5)], {"key": (slice(1, 3), 2)}), ([f32(4, 5)], {"key": (None, Ellipsis)})],
    "getitem_grad": [([f32(2)], {"key": (slice(1, 3), 2), "shape": (4, 5)})],
    "narrow": [([f32(3, 6)], {"axis": 1, "start": 2, "length": 3})],
    "pad_axis": [([f32(3, 2)], {"axis": 1, "before": 1, "size": 5})],
    "cat": [([f32(2, 3), f32(4, 3)], {"axis": 0})],
    "matmul": [([f32(3, 4), f32(4, 2)], {}), ([f32(2, 3, 4), f32(4, 5)], {})],
    "gather": [([f32(3, 4), i64(3, 2, high=4)], {"axis": 1})],
    "scatter_add": [
        ([f32(3, 2), np.array([[0, 0], [1, 3], [2, 2]])], {"axis": 1, "shape": (3, 4)})
    ],
    "select_at": [([f32(5, 2)], {"index": 3})],
    "place_at": [([f32(2, 3)], {"index": 1, "size": 4})],
    "take": [([f32(5, 3), i64(2, 2, high=5)], {"axis": 0})],
    "take_matmul": [
        ([f32(6, 3), i64(4, high=6), f32(3, 2)], {"trans": False}),
        ([f32(6, 3), i64(2, 2, high=6), f32(3, 2)], {}),
        ([f32(6, 3), i64(4, high=6), f32(4, 5)], {"trans": True}),
        ([f32(6, 2, 3), i64(4, high=6), f32(6, 2)], {}),  # rows flattened
        ([f32(6, 2, 3), i64(4, high=6), f32(4, 5)], {"trans": True}),
    ],
    "index_add": [([f32(2, 2, 3), np.array([[0, 4], [4, 1]])], {"axis": 0, "size": 5})],
    "cumsum": [([f32(3, 4)], {"axis": 1}), ([f32(3, 4)], {"axis": 0, "reverse": True})],
    "linear_scan": [  # the row at the base's point unused
        ([f32(5, 3), f32(5, 3), f32(3)], {"reverse": True}),
        ([f32(5, 3), f32(5), f32(3)], {"reverse": False}),  # one coefficient a row
        ([f32(4), f32(4), f32()], {"reverse": True}),  # 0-d rows
        ([f32(1, 2), f32(1, 2), f32(2)], {"reverse": False}),  # T = 1: the base alone
    ],
    "argsort": [([np.array([[3.0, 1.0, 3.0, 0.0]], dtype=np.float32)], {"axis": 1})],
    "full": [([], {"shape": (2, 3), "value": 1.5, "dtype": "float32"})],
    "const": [([], {"value": f32(2, 3)})],
    "orthogonal": [([], {"shape": (5, 3), "dtype": "float32", "gain": 1.5, "seed": 3})],
    "iota": [([], {"length": 4}), ([], {"length": 3, "dtype": "float32"})],
    "uniform": [([], {"shape": (2, 3), "dtype": "float32", "key": (7, 1, 2)})],
    "normal": [([], {"shape": (4,), "dtype": "float64", "key": (7, 3)})],
    "tuple_get": [([(f32(2), f32(3))], {"item": 1})],
    "pure_call": [([f32(3)], {"fn": _TwoOutputs()})],
    "merge": [([f32(3), f32(3)], {})],
    "add_n": [([f32(2, 3), f32(2, 3), f32(2, 3)], {})],
    "conv2d": [
        ([f32(2, 3, 9, 11), f32(4, 3, 3, 2)], {"stride": (2, 1), "padding": (1, 0)}),
        ([f32(2, 2, 3, 8, 8), f32(4, 3, 3, 3)], {"stride": (1, 2), "padding": (0, 1)}),
        ([f32(3, 7, 7), f32(2, 3, 4, 4)], {"stride": (3, 3), "padding": (2, 2)}),  # no batch
    ],
    "conv2d_input_grad": [
        (
            [f32(2, 4, 5, 10), f32(4, 3, 3, 2)],
            {"stride": (2, 1), "padding": (1, 0), "size": (9, 11)},
        ),
        (
            [f32(2, 2, 4, 6, 4), f32(4, 3, 3, 3)],
            {"stride": (1, 2), "padding": (0, 1), "size": (8, 8)},
        ),
    ],
    "conv2d_weight_grad": [
        (
            [f32(2, 3, 9, 11), f32(2, 4, 5, 10)],
            {"stride": (2, 1), "padding": (1, 0), "kernel": (3, 2)},
        ),
        (
            [f32(2, 2, 3, 8, 8), f32(2, 2, 4, 6, 4)],
            {"stride": (1, 2), "padding": (0, 1), "kernel": (3, 3), "batch": 1},
        ),
    ],
    "max_pool2d": [
        ([f32(2, 3, 9, 8)], {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)}),
        ([f32(2, 2, 3, 6, 6)], {"kernel": (2, 3), "stride": (2, 1), "padding": (0, 0)}),
    ],
    "max_pool2d_grad": [
        (
            [f32(2, 3, 9, 8), f32(2, 3, 5, 4)],
            {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)},
        ),
    ],
    # the third point lies outside its input: zeros stand in (see the reference's comment)
    "diag_gather": [
        (
            [[f32(4, 2), f32(4, 2), f32(1, 2)]],
            {"first": 0, "step": 1, "shape": (3, 2), "dtype": "float32"},
        ),
        ([[]], {"first": 0, "step": 1, "shape": (0, 2), "dtype": "float32"}),
    ],
}


def _to_torch(x):
    if isinstance(x, np.ndarray):
        return torch.as_tensor(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_torch(v) for v in x)
    return x


def _to_numpy(x):
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def test_every_primitive_has_inference_semantics_and_traits():
    assert len(prims.REGISTRY) > 40
    for name, p in prims.REGISTRY.items():
        assert p.name == name
        assert callable(p.infer) and callable(p.impl), name
        assert isinstance(p.traits, prims.Traits), name
        assert set(p.array_attrs).isdisjoint(p.point_attrs), name


def test_traits_agree_with_the_flags_they_replace():
    for name, p in prims.REGISTRY.items():
        assert p.traits.elementwise == p.elementwise, name
        assert p.traits.random == p.keyed, name
        # an op through which gradients stop is not differentiated at all
        assert not (p.traits.stops_gradient and p.differentiable), name
        # views allocate nothing, so cost nothing
        if p.traits.view:
            assert p.cost(100, [100], {}) == 0.0, name
    # the primitives that passes and executors used to recognise by name
    by_trait = {
        t: {n for n, p in prims.REGISTRY.items() if getattr(p.traits, t)}
        for t in ("piecewise", "host", "stops_gradient", "broadcast", "random", "constant")
    }
    assert by_trait["piecewise"] == {"merge"}
    assert by_trait["host"] == {"udf"}
    assert by_trait["stops_gradient"] == {"detach"}
    assert by_trait["broadcast"] == {"expand"}
    assert by_trait["random"] == {"uniform", "normal"}
    assert by_trait["constant"] == {"const", "full", "iota"}
    assert not any(
        p.traits.mergeable for p in prims.REGISTRY.values() if p.traits.random or p.traits.host
    )


def _matches_reference(name, got, ref, inputs):
    """A lowering's value equals the reference's. Where the library's promotion differs from
    numpy's, the backend casts a mixed-dtype elementwise result to the declared dtype
    (tests/runtime), so only there may the raw lowering's dtype differ."""
    assert got.shape == ref.shape
    cast_by_backend = prims.REGISTRY[name].traits.elementwise and any(
        np.asarray(x).dtype != ref.dtype for x in inputs
    )
    if not cast_by_backend:
        assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    if np.issubdtype(ref.dtype, np.floating):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, ref)


@needs_torch
def test_every_primitive_but_host_calls_has_a_torch_lowering():
    host = {n for n, p in prims.REGISTRY.items() if p.traits.host}
    assert set(LOWERINGS) == set(prims.REGISTRY) - host
    assert all(callable(fn) for fn in LOWERINGS.values())


@needs_torch
def test_register_lowering_rejects_unknown_and_duplicate_primitives():
    with pytest.raises(KeyError, match="no primitive 'nope'"):
        register_lowering("nope", lambda x: x)
    with pytest.raises(KeyError, match="'tanh' already has a torch lowering"):
        register_lowering("tanh", torch.tanh)
    assert LOWERINGS["tanh"] is torch.tanh


@needs_torch
@pytest.mark.parametrize("layout", ["contiguous_format", "channels_last"])
@pytest.mark.parametrize("name", ["conv2d", "conv2d_input_grad", "conv2d_weight_grad"])
def test_torch_convolutions_agree_with_the_reference_in_either_layout(name, layout, monkeypatch):
    """The CPU lowering times both memory layouts per shape and keeps the faster: each must
    give the reference's values, contiguous (a 4-channel 8x8 stride-4 input, where
    channels-last wins the weight gradient)."""
    from timerl.runtime import torch_lowering

    monkeypatch.setattr(torch_lowering, "_LAYOUT", {})
    chosen = getattr(torch, layout)
    monkeypatch.setattr(torch_lowering, "_faster_layout", lambda fn: (chosen, fn(chosen)))
    x, w, g = f32(3, 4, 20, 20), f32(5, 4, 8, 8), f32(3, 5, 4, 4)
    attrs = {"stride": (4, 4), "padding": (0, 0)}
    inputs, extra = {
        "conv2d": ((x, w), {}),
        "conv2d_input_grad": ((g, w), {"size": (20, 20)}),
        "conv2d_weight_grad": ((x, g), {"kernel": (8, 8)}),
    }[name]
    ref = np.asarray(prims.REGISTRY[name].impl(*inputs, **attrs, **extra))
    got = LOWERINGS[name](*map(torch.from_numpy, inputs), **attrs, **extra)
    assert got.is_contiguous() or name == "conv2d_weight_grad"
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4, atol=1e-4)
    assert list(torch_lowering._LAYOUT.values()) == [chosen]


@needs_torch
def test_the_timed_first_call_returns_the_op_s_value(monkeypatch):
    """The first call of a shape returns what its timing computed; later calls compute it in
    the layout kept."""
    from timerl.runtime import torch_lowering

    monkeypatch.setattr(torch_lowering, "_LAYOUT", {})
    x, w = f32(3, 4, 20, 20), f32(5, 4, 8, 8)
    attrs = {"stride": (4, 4), "padding": (0, 0)}
    ref = np.asarray(prims.REGISTRY["conv2d"].impl(x, w, **attrs))
    for _ in range(2):
        got = LOWERINGS["conv2d"](torch.from_numpy(x), torch.from_numpy(w), **attrs)
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4, atol=1e-4)
    assert len(torch_lowering._LAYOUT) == 1


def test_prims_module_does_not_import_torch():
    code = "import sys, timerl.ir.prims, timerl.compiler.simplify; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@needs_torch
def test_every_lowered_primitive_is_checked_against_its_reference():
    assert set(CASES) == set(LOWERINGS)


@needs_torch
@pytest.mark.parametrize(
    ("name", "k"), [(n, k) for n, cases in CASES.items() for k in range(len(cases))]
)
def test_torch_lowering_matches_numpy_reference(name, k):
    inputs, attrs = CASES[name][k]
    ref = np.asarray(prims.REGISTRY[name].impl(*inputs, **attrs))
    t_attrs = {a: _to_torch(v) if a == "value" else v for a, v in attrs.items()}
    got = _to_numpy(LOWERINGS[name](*[_to_torch(x) for x in inputs], **t_attrs))
    _matches_reference(name, got, ref, inputs)


def _arrays(x):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _arrays(v)
    elif isinstance(x, (np.ndarray, np.generic)) or type(x).__module__.startswith("torch"):
        yield x


def _shares(out, inputs) -> bool:
    """Whether any array of ``out`` shares memory with any array of ``inputs``."""
    outs, ins = list(_arrays(out)), list(_arrays(inputs))
    if any(isinstance(o, np.ndarray) for o in outs):
        return any(
            np.shares_memory(o, i)
            for o in outs
            for i in ins
            if isinstance(o, np.ndarray) and isinstance(i, np.ndarray)
        )
    held = {i.untyped_storage().data_ptr() for i in ins if hasattr(i, "untyped_storage")}
    return any(
        hasattr(o, "untyped_storage") and o.untyped_storage().data_ptr() in held for o in outs
    )


@pytest.mark.parametrize("backend", ["numpy", pytest.param("torch", marks=needs_torch)])
def test_a_result_that_shares_an_input_buffer_is_declared_so(backend):
    """Donation and circular buffers write into a buffer once its last reader has run; a
    reader whose value is (part of) that buffer must say so (``Traits.shares_input``), or the
    write changes a value still in use. Each lowering is run on every case and its result
    compared with its inputs' memory."""
    undeclared = []
    for name, cases in CASES.items():
        traits = prims.get(name).traits
        for inputs, attrs in cases:
            if backend == "numpy":
                out = prims.REGISTRY[name].impl(*inputs, **attrs)
                ins = inputs
            else:
                ins = [_to_torch(x) for x in inputs]
                t_attrs = {a: _to_torch(v) if a == "value" else v for a, v in attrs.items()}
                out = LOWERINGS[name](*ins, **t_attrs)
            if _shares(out, ins) and not traits.shares_input:
                undeclared.append((name, attrs))
            if traits.fresh and traits.shares_input:
                undeclared.append((name, "fresh and sharing"))
    assert not undeclared


def test_every_view_and_merge_may_share_its_input():
    for prim in prims.REGISTRY.values():
        if prim.traits.view or prim.traits.piecewise or prim.traits.host:
            assert prim.traits.shares_input, prim.name


@needs_torch
def test_random_lowerings_draw_the_reference_numbers_for_a_key():
    for name in ("uniform", "normal"):
        a = LOWERINGS[name]((3,), "float32", (1, 2, 3))
        b = LOWERINGS[name]((3,), "float32", (1, 2, 4))
        np.testing.assert_array_equal(a.numpy(), prims.get(name).impl((3,), "float32", (1, 2, 3)))
        assert not np.array_equal(a.numpy(), b.numpy())


@needs_torch
def test_torch_dtype_maps_numpy_names_including_bool():
    assert torch_dtype(np.dtype(bool)) is torch.bool
    assert torch_dtype("float32") is torch.float32
    assert torch_dtype(np.int64) is torch.int64


def test_reference_semantics_fold_constants_through_impl():
    """Constant folding evaluates ``impl``: a sum of a constant becomes one constant op."""
    import timerl as tl

    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,))
        x[0] = tl.arange(4, dtype="float32").sum() * 2.0
        x[t + 1] = x[t] + 1.0
    prog = ctx.compile(bounds={T: 3}, outputs=[x])
    prog.run()
    np.testing.assert_array_equal(prog.value(x), [12.0, 13.0, 14.0])
    assert not any(op.prim == "sum" for op in prog.ops)


# --- the jax backend's lowerings ---------------------------------------------------------------

try:
    import jax
    import jax.numpy as jnp

    from timerl.runtime import jax_lowering
except ImportError:  # the numpy-only install
    jax = None
needs_jax = pytest.mark.skipif(jax is None, reason="needs the jax extra")


def _to_jax(x):
    if isinstance(x, np.ndarray):
        return jnp.asarray(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_jax(v) for v in x)
    return x


@needs_jax
def test_every_primitive_but_host_calls_has_a_jax_lowering_and_a_case():
    host = {n for n, p in prims.REGISTRY.items() if p.traits.host}
    assert set(jax_lowering.LOWERINGS) == set(prims.REGISTRY) - host
    assert set(CASES) == set(jax_lowering.LOWERINGS)
    with pytest.raises(KeyError, match="'tanh' already has a jax lowering"):
        jax_lowering.register_lowering("tanh", jnp.tanh)


@needs_jax
@pytest.mark.parametrize(
    ("name", "k"), [(n, k) for n, cases in CASES.items() for k in range(len(cases))]
)
def test_jax_lowering_matches_numpy_reference(name, k):
    """Eagerly and under ``jax.jit`` (static attributes closed over, as a region does)."""
    inputs, attrs = CASES[name][k]
    ref = np.asarray(prims.REGISTRY[name].impl(*inputs, **attrs))
    fn = jax_lowering.LOWERINGS[name]
    j_attrs = {a: _to_jax(v) if a == "value" else v for a, v in attrs.items()}
    with jax.enable_x64(True):
        eager = np.asarray(fn(*[_to_jax(x) for x in inputs], **j_attrs))
        jitted = np.asarray(jax.jit(lambda *xs: fn(*xs, **j_attrs))(*_to_jax(inputs)))
    for got in (eager, jitted):
        _matches_reference(name, got, ref, inputs)


@needs_jax
def test_jax_random_lowerings_draw_the_reference_numbers_for_a_key():
    for name in ("uniform", "normal"):
        with jax.enable_x64(True):
            a = np.asarray(jax_lowering.LOWERINGS[name]((3,), "float64", (1, 2, 3)))
            b = np.asarray(jax_lowering.LOWERINGS[name]((3,), "float64", (1, 2, 4)))
        np.testing.assert_array_equal(a, prims.get(name).impl((3,), "float64", (1, 2, 3)))
        assert a.dtype == np.float64
        assert not np.array_equal(a, b)


@needs_jax
def test_jax_traced_attributes_are_taken_as_traced_scalars():
    """An attribute in ``TRACED_ATTRS`` may be a tracer inside ``jax.jit``: one trace serves
    every value, and each value gives the reference's result."""
    assert set(jax_lowering.TRACED_ATTRS) <= set(jax_lowering.LOWERINGS)
    for name, names in jax_lowering.TRACED_ATTRS.items():
        for inputs, attrs in CASES[name]:
            fixed = {a: v for a, v in attrs.items() if a not in names}
            traces = []

            def run(xs, traced, fixed=fixed, fn=jax_lowering.LOWERINGS[name], traces=traces):
                traces.append(1)
                return fn(*xs, **fixed, **traced)

            jitted = jax.jit(run)
            for bump in (0, 1):
                varied = {a: attrs[a] + bump for a in names}
                ref = np.asarray(prims.REGISTRY[name].impl(*inputs, **fixed, **varied))
                with jax.enable_x64(True):
                    got = np.asarray(jitted(_to_jax(list(inputs)), varied))
                np.testing.assert_allclose(got, ref, rtol=1e-6)
                assert got.dtype == ref.dtype
            assert len(traces) == 1, name


def test_sumsq_is_the_sum_of_squares_and_its_gradient_twice_the_input():
    import timerl as tl

    x = np.linspace(-2, 3, 12).reshape(3, 4)
    with tl.Context(dims=("t",)):
        w = tl.from_numpy(x, requires_grad=True)
        loss = w.square_sum()
        loss.backward()
        outs = [loss, w.grad]
    got, grad = tl.evaluate(outs)
    np.testing.assert_allclose(got, (x.astype(np.float32) ** 2).sum(), rtol=1e-6)
    np.testing.assert_allclose(grad, 2 * x, rtol=1e-6)
    with pytest.raises(Exception, match="floating-point"):
        prims.get("sumsq").infer([()], [np.dtype("int64")], {})


def test_gather_refuses_an_index_whose_rows_do_not_match_the_tensor():
    from timerl.errors import ShapeError
    from timerl.symbolic import Const

    rule = prims.get("gather")
    f32, i64 = np.dtype("float32"), np.dtype("int64")

    def shape(*sizes):
        return tuple(Const(s) for s in sizes)

    # one entry per row of the tensor: the policy's log-probability of its action
    out, dtype = rule.infer([shape(4, 3), shape(4, 1)], [f32, i64], {"axis": -1})
    assert out == shape(4, 1) and dtype == f32
    with pytest.raises(ShapeError, match=r"index of shape \(5, 1\) does not match .* on axis 0"):
        rule.infer([shape(4, 3), shape(5, 1)], [f32, i64], {"axis": -1})


class _Shapes:
    """``Sizes`` measured from operand shapes (as ``schedule/to_graph.py`` measures them)."""

    def __init__(self, out, *shapes):
        self.out_shape, self.shapes = out, shapes

    def out(self):
        return int(np.prod(self.out_shape))

    def read(self, k):
        return int(np.prod(self.shapes[k]))

    def axis(self, k, axis):
        return self.shapes[k][axis]


def test_a_convolution_costs_two_operations_per_output_and_weight_of_its_channel():
    from timerl.ir.prims.cost import estimate

    flops = 2 * (8 * 5 * 5) * 16 * (3 * 4 * 4)  # 2 N Ho Wo O C kh kw
    conv = _Shapes((8, 16, 5, 5), (8, 3, 12, 12), (16, 3, 4, 4))
    assert estimate("conv2d", conv, {}) == flops
    back = _Shapes((8, 3, 12, 12), (8, 16, 5, 5), (16, 3, 4, 4))
    assert estimate("conv2d_input_grad", back, {}) == flops
    weights = _Shapes((16, 3, 4, 4), (8, 3, 12, 12), (8, 16, 5, 5))
    assert estimate("conv2d_weight_grad", weights, {}) == flops
    per_step = _Shapes((2, 16, 3, 4, 4), (2, 4, 3, 12, 12), (2, 4, 16, 5, 5))
    assert estimate("conv2d_weight_grad", per_step, {"batch": 1}) == flops
    pool = _Shapes((8, 3, 6, 6), (8, 3, 12, 12))
    assert estimate("max_pool2d", pool, {"kernel": (3, 3)}) == 8 * 3 * 6 * 6 * 9
