"""The user guide's examples run as written, and its claims about unsupported gradients hold."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
from core_helpers import ctx_it, ctx_t

import timerl as tl

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guide.md"


def test_guide_code_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) >= 5
    namespace: dict = {}
    for k, block in enumerate(blocks):
        exec(compile(block, f"{GUIDE.name} block {k}", "exec"), namespace)  # noqa: S102


def _unsupported_two_slices_one_dim():
    ctx, i, t, I, T = ctx_it()  # noqa: E741
    with ctx:
        h = tl.from_numpy(np.ones((3, 3)), domain=(i, t), requires_grad=True)
        h[t:T, i:I].sum().backward()


def _unsupported_mixed_index():
    ctx, i, t, I, T = ctx_it()  # noqa: E741
    with ctx:
        x = tl.from_numpy(np.ones(4), domain=(t,), requires_grad=True)
        x[tl.min(i + t, T - 1)].sum().backward()


def _unsupported_fast_slice():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.from_numpy(np.ones(8), domain=(t,), requires_grad=True)
        x[0 : tl.min(2 * t + 1, T)].sum().backward()


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (_unsupported_two_slices_one_dim, "slices dims that its other indices use"),
        (_unsupported_mixed_index, "mixes several dims"),
        (_unsupported_fast_slice, "one step per step"),
    ],
)
def test_unsupported_gradients_say_so(build, says):
    with pytest.raises(tl.ProgramError, match=f"{says}.*not supported"):
        build()
