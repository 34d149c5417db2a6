"""A ``schedule/fused.LoopPlan`` traced as one ``lax.fori_loop``.

The carry holds, per value read at another iteration or kept after the loop, either its latest
value or an array of every iteration's value (``compiler/fusion_loops`` decides which). Index
expressions, merge conditions and random keys are evaluated on the traced loop index with
``vevaluate`` over ``jax.numpy``. The function returns the last iteration's values and, for
values whose points outlive the loop, the array of every iteration's value (stored whole:
``stores.RowStore``; splitting it inside the compiled call would make XLA's compilation of a
128-step loop take seconds per output).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from timerl.schedule.fused import BodyPlan, LoopPlan, LoopStep
from timerl.symbolic import Condition, Expr, vevaluate


def _exact(value: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """``value`` with exactly the declared shape and dtype (a loop carry's type is fixed)."""
    value = jnp.asarray(value)
    if tuple(value.shape) != tuple(shape):
        value = jnp.broadcast_to(value, shape)
    return lax.convert_element_type(value, dtype)


def _evaluate(item: Any, env: dict) -> Any:
    if isinstance(item, (tuple, list)):
        return tuple(_evaluate(x, env) for x in item)
    if isinstance(item, (Expr, Condition)):
        return vevaluate(item, env, jnp)
    return item


def apply_step(st: LoopStep, ins: list, env: dict) -> Any:
    """One op of a traced body on its inputs, its index expressions evaluated in ``env``."""
    if st.merge:  # the first branch whose condition holds
        out = _exact(ins[-1], st.shape, st.dtype)
        for cond, value in zip(st.conds[-2::-1], ins[-2::-1], strict=True):
            out = jnp.where(_evaluate(cond, env), _exact(value, st.shape, st.dtype), out)
        return out
    extra = {name: _evaluate(v, env) for name, v in st.traced.items()}
    if st.key is not None:
        (seed, stream), coords = st.key
        extra["key"] = (seed, stream, *_evaluate(tuple(coords), env))
    out = st.fn(*ins, **st.kwargs, **extra)
    return out if st.multi else _exact(out, st.shape, st.dtype)


def loop_function(plan: LoopPlan) -> Callable[..., tuple[dict, dict]]:
    """``fn(closed, rows, symbols)``: ``closed`` the values read once, ``rows`` per
    per-iteration input one array of ``plan.extent`` rows (iteration ``k`` at ``k``),
    ``symbols`` the enclosing loops' indices; returns ``(finals, rows_out)``, ``rows_out`` one
    array of every iteration's value per value."""
    n = plan.extent

    def run(closed: tuple, rows: tuple, symbols: tuple) -> tuple[dict, dict]:
        env0: dict = dict(plan.consts)
        env0.update(zip(plan.symbols, symbols, strict=True))
        stacked = rows
        init_last = {m: jnp.zeros(s, d) for m, (s, d) in plan.last.items()}
        init_hist = {m: jnp.zeros((n, *s), d) for m, (s, d) in plan.hist.items()}

        def body(k: Any, carry: tuple[dict, dict]) -> tuple[dict, dict]:
            last, hist = carry[0], dict(carry[1])
            u = k if plan.forward else n - 1 - k
            env = dict(env0)
            env[plan.dim] = u
            vals: dict[int, Any] = {}

            def read(ref: tuple) -> Any:
                kind = ref[0]
                if kind == "val":
                    return vals[ref[1]]
                if kind == "last":
                    return last[ref[1]]
                if kind == "hist":
                    return hist[ref[1]][_evaluate(ref[2], env)]
                if kind == "closed":
                    return closed[ref[1]]
                return stacked[ref[1]][u]

            for st in plan.steps:
                vals[st.op_id] = apply_step(st, [read(r) for r in st.refs], env)
                if st.op_id in hist:  # at once: a later read at a fixed point may be this one
                    hist[st.op_id] = hist[st.op_id].at[u].set(vals[st.op_id])
            return {m: vals[m] for m in last}, hist

        if n > 1 and plan.parallel:
            return parallel(closed, stacked, env0)
        if n == 1:  # one iteration (one epoch of one minibatch): no XLA while loop around it
            last, hist = body(0, (init_last, init_hist))
        else:
            last, hist = lax.fori_loop(0, n, body, (init_last, init_hist))
        # a final value read at other points too is kept whole, not carried: its last row
        final = n - 1 if plan.forward else 0
        finals = {m: last[m] if m in last else hist[m][final] for m in plan.finals}
        return finals, _rows_out(hist)

    def _rows_out(every: dict) -> dict:
        """Each stacked value's array; a derived one is its source's, reshaped (a view)."""
        out = {}
        for m in plan.rows_out:
            if m in plan.derived:
                source, shape = plan.derived[m]
                out[m] = every[source].reshape((n, *shape))
            else:
                out[m] = every[m]
        return out

    def parallel(closed: tuple, stacked: tuple, env0: dict) -> tuple[dict, dict]:
        """Iterations that read nothing of each other run as one ``vmap`` over the loop
        index: no while loop, whose every iteration costs a launch and a predicate on a GPU
        (PPO's ``next_value[t] = value[t + 1]`` loop: 250 of them per iteration)."""
        kept = (set(plan.finals) | set(plan.rows_out)) - set(plan.derived)
        kept |= {source for source, _ in plan.derived.values()}

        def one(u: Any, row: tuple) -> dict:
            env = dict(env0)
            env[plan.dim] = u
            vals: dict[int, Any] = {}
            sources = {"val": vals, "closed": closed, "rows": row}
            for st in plan.steps:
                ins = [sources[kind][k] for kind, k, *_ in st.refs]
                vals[st.op_id] = apply_step(st, ins, env)
            return {m: vals[m] for m in kept}

        every = jax.vmap(one)(jnp.arange(n), stacked)  # row u: iteration at index u
        final = n - 1 if plan.forward else 0
        rows = _rows_out(every)
        finals = {m: (rows if m in plan.derived else every)[m][final] for m in plan.finals}
        return finals, rows

    return run


def body_function(plan: BodyPlan) -> Callable[..., tuple[dict, tuple]]:
    """``fn(inputs, index)``: one iteration of the outer loop, ``index`` its traced value and
    ``inputs`` the values read from stores before the call; returns the top-level values
    ``plan.outs`` and, per nested loop, its ``(finals, rows_out)`` restricted to what is kept."""
    inner = [loop_function(nest.plan) for nest in plan.loops]

    def run(inputs: tuple, index: Any) -> tuple[dict, tuple]:
        env: dict = dict(plan.consts)
        env[plan.dim] = index
        vals: dict[int, Any] = {}
        last: dict[int, Any] = {}
        rows: dict[int, Any] = {}

        def read(ref: tuple) -> Any:
            kind = ref[0]
            if kind == "in":
                return inputs[ref[1]]
            if kind == "val":
                return vals[ref[1]]
            if kind == "fin":
                return last[ref[1]]
            if kind == "at":
                return rows[ref[1]][_evaluate(ref[2], env)]
            if kind == "slice":
                return rows[ref[1]][ref[2] : ref[3]]
            if kind == "rows":
                return rows[ref[1]]
            # "moving": row k of a nested loop's input is the point at the loop index k
            _, op_id, idx, dim, n = ref
            return rows[op_id][vevaluate(idx, {**env, dim: jnp.arange(n)}, jnp)]

        kept: list[tuple[dict, dict]] = []
        for item in plan.items:
            if isinstance(item, LoopStep):
                vals[item.op_id] = apply_step(item, [read(r) for r in item.refs], env)
                continue
            nest = plan.loops[item]
            closed = tuple(read(r) for r in nest.closed)
            moving = tuple(read(r) for r in nest.rows)
            syms = tuple(env[s] for s in nest.plan.symbols)
            finals, stacked = inner[item](closed, moving, syms)
            last.update(finals)
            rows.update(stacked)
            kept.append(
                (
                    {m: finals[m] for m in nest.keep if m in finals},
                    {m: stacked[m] for m in nest.keep_rows if m in stacked},
                )
            )
        return {m: vals[m] for m in plan.outs}, tuple(kept)

    return run
