"""A counter-based random generator written once over an array module (numpy, jax.numpy).

A random op's value is a pure function of its key ``(seed, stream, *point)``, so random ops
can be reordered, recomputed and batched like any other op, and every backend draws the same
numbers. Generators such as numpy's PCG64 are sequential state machines seeded through a
SeedSequence: exact elsewhere only by calling numpy on the host, and ~40 us per draw to seed.
Here each element is a hash of (key, element index) made of 32-bit integer multiplies, shifts
and xors, which every array library computes identically and a tracer can compile; a key whose
coordinates are arrays (one per point of a batch) broadcasts, so a batch of points is one draw.

The hash is a two-round composition of a 32-bit integer finaliser (multiply-xorshift, three
multiplies per round) keyed by two words derived from the key. It is a statistical generator
for exploration noise and initialisation, not a cryptographic one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


def _mix(x: Any) -> Any:
    """A 32-bit finaliser: each input bit flips each output bit with probability ~1/2.

    ``x`` is a Python int below 2**32 (masked here) or a uint32 array (wraps by itself)."""
    scalar = isinstance(x, int)
    for shift, mult in ((17, 0xED5AD4BB), (11, 0xAC4C1B51), (15, 0x31848BAB)):
        # a typed multiplier: jax refuses Python ints above int32 as weakly typed operands
        x = (x ^ (x >> shift)) * (mult if scalar else np.uint32(mult))
        if scalar:
            x &= MASK32
    return x ^ (x >> 14)


def key_words(xp: Any, key: Sequence[Any]) -> tuple[Any, Any]:
    """Two 32-bit words from ``key``: its items are ints (any width: a seed contributes all its
    bits) or integer arrays that broadcast, giving one pair of words per point of a batch."""
    h: Any = _GOLDEN
    for item in key:
        if isinstance(item, (np.ndarray, np.generic)) and item.ndim == 0:
            item = int(item)  # numpy scalars would warn on the wrap-around multiplies
        if isinstance(item, int):
            v = int(item) & (2**64 - 1)
            h = _mix(((h + (v & MASK32)) * _GOLDEN) & MASK32)
            if v >> 32:
                h = _mix(((h + (v >> 32)) * _GOLDEN) & MASK32)
            continue
        words = xp.asarray(item).astype(xp.uint32)  # modulo 2**32
        h = _mix((words + xp.uint32(h) if isinstance(h, int) else words + h) * xp.uint32(_GOLDEN))
    k1 = _mix(h ^ 0x68BC21EB) if isinstance(h, int) else _mix(h ^ xp.uint32(0x68BC21EB))
    return h, k1


def bits(
    xp: Any, key: Sequence[Any], shape: tuple[int, ...], lane: int = 0, lead: tuple[int, ...] = ()
) -> Any:
    """uint32 words of shape ``lead + shape``: ``lead`` is the batch of points the key's array
    coordinates broadcast to (empty for one point)."""
    return _lane_bits(xp, key_words(xp, key), shape, lane, lead)


def _lane_bits(
    xp: Any, words: tuple[Any, Any], shape: tuple[int, ...], lane: int, lead: tuple[int, ...]
) -> Any:
    """``bits`` from the key's words, so that several lanes of one key hash it once."""
    k0, k1 = words
    if lane:
        k1 = (
            _mix((k1 + lane * _GOLDEN) & MASK32)
            if isinstance(k1, int)
            else _mix(k1 + xp.uint32(lane * _GOLDEN & MASK32))
        )
    n = int(np.prod(shape, dtype=np.int64))
    # kept 1-d until the end: a 0-d array's arithmetic returns numpy scalars, which warn when
    # the multiplies wrap around
    counter = xp.arange(n, dtype=xp.uint32)
    if isinstance(k0, int):
        k0, k1 = xp.uint32(k0), xp.uint32(k1)
    if lead:  # one key per point of a batch: its axes lead
        k0 = xp.reshape(xp.broadcast_to(k0, lead), (*lead, 1))
        k1 = xp.reshape(xp.broadcast_to(k1, lead), (*lead, 1))
    return xp.reshape(_mix(_mix(counter + k0) ^ k1), (*lead, *shape))


def batched_key(
    xp: Any, key: Sequence[Any], batch: Sequence[tuple]
) -> tuple[tuple, tuple[int, ...]]:
    """The key of a random op vectorised over dims, and the batch shape it draws for. Each
    level ``(size, ((position, coef), ...))`` of ``batch`` (in the order the dims were
    batched) adds ``coef * arange(size)`` to those coordinates of the point (after seed and
    stream) along a new leading axis: one draw holds every point's numbers, exactly as drawn
    point by point."""
    if not batch:
        return tuple(key), ()
    key = list(key)
    m = len(batch)
    for k, (size, moved) in enumerate(batch):
        axis = m - 1 - k  # the dim batched last leads
        shape = (1,) * axis + (size,) + (1,) * (m - 1 - axis)
        steps = xp.reshape(xp.arange(size), shape)
        for pos, coef in moved:
            key[2 + pos] = key[2 + pos] + coef * steps
    return tuple(key), tuple(size for size, _ in reversed(batch))


def uniform(
    xp: Any, key: Sequence[Any], shape: tuple[int, ...], dtype: Any, batch: Sequence[tuple] = ()
) -> Any:
    """Uniform in [0, 1): 24 random bits for 32-bit floats and below, 53 for float64."""
    key, lead = batched_key(xp, key, batch)
    words = key_words(xp, key)
    dtype = np.dtype(dtype)
    hi = _lane_bits(xp, words, shape, 0, lead)
    if dtype.itemsize <= 4:
        u = (hi >> 8).astype(xp.float32) * xp.float32(2.0**-24)
        return u.astype(dtype)
    lo = _lane_bits(xp, words, shape, 1, lead)
    whole = (hi >> 5).astype(xp.float64) * 2.0**26 + (lo >> 6).astype(xp.float64)
    return (whole * 2.0**-53).astype(dtype)


def normal(
    xp: Any, key: Sequence[Any], shape: tuple[int, ...], dtype: Any, batch: Sequence[tuple] = ()
) -> Any:
    """Standard normal by Box-Muller over two independent uniforms (computed in float64, so
    backends agree to float tolerance whatever their transcendental functions). Both
    uniforms come from one draw of twice the elements: half the array calls of two draws."""
    key, lead = batched_key(xp, key, batch)
    words = bits(xp, key, (*shape, 2), lane=2, lead=lead) >> 8
    u1 = (words[..., 0].astype(xp.float64) + 1.0) * 2.0**-24  # (0, 1]: log is finite
    u2 = words[..., 1].astype(xp.float64) * (2.0 * np.pi * 2.0**-24)
    z = xp.sqrt(-2.0 * xp.log(u1)) * xp.cos(u2)
    return z.astype(np.dtype(dtype))
