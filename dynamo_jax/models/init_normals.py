"""Random-normal parameter initialisation drawn by one threefry call, with the same bits.

Why: every `nn.initializers.normal` call is a threefry hash of its own in the init program, and
XLA:CPU compiles each one separately (vmapping the draws of one shape together did not help:
each distinct draw still cost ~0.45 s of compile). The tiny model's 15 draws made its state's
init program take 4-5 s to compile; one threefry call over all of them takes a fraction of
that (benchmarks/README.md#work-per-parameter).

How, with the same bits: `normal(std)` is a drop-in for `nn.initializers.normal(std)`. Outside
`batched_normals` it is that initializer. Inside, it records the key flax derived for the
parameter and returns a placeholder; `batched_normals` then hashes every recorded draw's
elements in one `threefry2x32` call (per dtype and std), each element with its own draw's key
and its index in that draw, which is what jax.random's partitionable threefry hashes for a draw
of its own; the bits then go through `jax.random.normal`'s transform (uniform in (-1, 1), then
sqrt(2)·erfinv) and the std, and each slice replaces its placeholder.
tests/test_models_init_normals.py proves the bits equal to flax's own draws, on one device and
sharded over a mesh. Draws it cannot batch exactly (a key that is not threefry, a 64-bit float,
the non-partitionable threefry, over `MAX_BATCHED_ELEMENTS` in all) are each drawn directly.

Only for unrolled layers: under `nn.scan` the initializer runs inside the scan's body, where a
placeholder cannot leave the trace (and the body's draws are compiled once anyway).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.random import threefry2x32_p


@dataclasses.dataclass(frozen=True)
class _Draw:
    """One deferred `normal(std)(key, shape, dtype)` and the placeholder standing for it."""

    key: jax.Array
    shape: tuple[int, ...]
    dtype: Any
    std: float
    placeholder: jax.Array


_DRAWS: contextvars.ContextVar[list[_Draw] | None] = contextvars.ContextVar(
    "dynamo_jax_deferred_normals", default=None
)


def normal(std: float) -> Callable[..., jax.Array]:
    """`nn.initializers.normal(std)`, deferred to one batched draw inside `batched_normals`."""
    direct = nn.initializers.normal(std)

    def init(key: jax.Array, shape, dtype=jnp.float32) -> jax.Array:
        draws = _DRAWS.get()
        if draws is None:
            return direct(key, shape, dtype)
        shape = tuple(int(d) for d in shape)
        # A new array per draw: the placeholder's identity is how its value finds its place.
        placeholder = jnp.zeros(shape, dtype)
        draws.append(_Draw(key, shape, jnp.dtype(dtype), std, placeholder))
        return placeholder

    return init


@contextlib.contextmanager
def _recording() -> Iterator[list[_Draw]]:
    draws: list[_Draw] = []
    token = _DRAWS.set(draws)
    try:
        yield draws
    finally:
        _DRAWS.reset(token)


# The draws go into one flat vector of this many elements at most (with its keys and counters,
# about five times its size in memory, unsharded): small models, where the init's compile time
# is what a run waits for. Larger models draw each parameter directly, in its sharded layout.
MAX_BATCHED_ELEMENTS = 1 << 24


def _batchable(draws: list[_Draw]) -> bool:
    """Whether one threefry call reproduces every draw: typed threefry keys (a raw uint32 key
    or another generator is drawn directly), floats of at most 32 bits (a 64-bit draw joins two
    hashes' bits, which `_uniform_from_bits` does not), the partitionable bits, and a size under
    the cap."""
    typed = all(
        jnp.issubdtype(draw.key.dtype, jax.dtypes.prng_key)
        and draw.key.shape == ()
        and jnp.finfo(draw.dtype).bits <= 32
        for draw in draws
    )
    return (
        typed
        and all(str(jax.random.key_impl(draw.key)) == "threefry2x32" for draw in draws)
        and bool(jax.config.jax_threefry_partitionable)
        and sum(math.prod(draw.shape) for draw in draws) <= MAX_BATCHED_ELEMENTS
    )


def _uniform_from_bits(bits32: jax.Array, dtype) -> jax.Array:
    """jax.random.uniform(key, shape, dtype, lo, 1.0)'s transform of its threefry bits (the
    mantissa filled from the bits at exponent 0, then scaled), lo = the float above -1, as
    `jax.random.normal` calls it."""
    finfo = jnp.finfo(dtype)
    nbits, nmant = finfo.bits, finfo.nmant
    rng_bits = 8 if nmant < 8 else nbits
    uint = jnp.dtype(f"uint{nbits}")
    bits = bits32 if rng_bits == 32 else bits32.astype(jnp.dtype(f"uint{rng_bits}"))
    bits = bits.astype(uint)
    float_bits = lax.shift_right_logical(bits, jnp.array(rng_bits - nmant, uint))
    float_bits = lax.bitwise_or(float_bits, jnp.asarray(np.array(1.0, dtype).view(uint), uint))
    floats = lax.bitcast_convert_type(float_bits, dtype) - jnp.array(1.0, dtype)
    lo = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype), dtype=dtype)
    minval, maxval = jnp.array(lo, dtype), jnp.array(1.0, dtype)
    return lax.max(minval, floats * (maxval - minval) + minval)


def _flat_normals(group: list[_Draw], dtype, std: float) -> jax.Array:
    """`normal(std)(draw.key, draw.shape, dtype)` of every draw, flattened and concatenated,
    from one threefry call: element j of a draw hashes (its key, j), as jax.random's
    partitionable threefry does for a draw of its own."""
    sizes = [math.prod(draw.shape) for draw in group]
    keys = [jax.random.key_data(draw.key) for draw in group]
    k1 = jnp.concatenate([jnp.full((n,), k[0], jnp.uint32) for n, k in zip(sizes, keys)])
    k2 = jnp.concatenate([jnp.full((n,), k[1], jnp.uint32) for n, k in zip(sizes, keys)])
    counts_lo = jnp.concatenate([lax.iota(jnp.uint32, n) for n in sizes])
    counts_hi = jnp.zeros_like(counts_lo)  # every draw has < 2**32 elements (MAX_BATCHED_ELEMENTS)
    bits1, bits2 = threefry2x32_p.bind(k1, k2, counts_hi, counts_lo)
    u = _uniform_from_bits(bits1 ^ bits2, dtype)
    normals = lax.mul(np.array(np.sqrt(2), dtype), lax.erf_inv(u))
    return normals * std  # as nn.initializers.normal scales jax.random.normal


def _draw_groups(draws: list[_Draw]) -> dict[int, jax.Array]:
    """Each placeholder's id -> its values: one threefry call per (dtype, std) when the draws
    are batchable, else each draw directly."""
    if not _batchable(draws):
        return {
            id(d.placeholder): nn.initializers.normal(d.std)(d.key, d.shape, d.dtype) for d in draws
        }
    groups: dict[tuple, list[_Draw]] = {}
    for draw in draws:
        groups.setdefault((draw.dtype, draw.std), []).append(draw)
    values: dict[int, jax.Array] = {}
    for (dtype, std), group in groups.items():
        flat = _flat_normals(group, dtype, std)
        offset = 0
        for draw in group:
            size = math.prod(draw.shape)
            values[id(draw.placeholder)] = flat[offset : offset + size].reshape(draw.shape)
            offset += size
    return values


def batched_normals(build: Callable[[], Any]) -> Any:
    """`build()` (a flax init returning a params tree), its `normal` draws made in batches.

    Every placeholder must come back as exactly one leaf of the tree: a draw that flax used
    otherwise (or dropped) is an error, not a silently different parameter."""
    with _recording() as draws:
        tree = build()
    if not draws:
        return tree
    values = _draw_groups(draws)
    placed: list[int] = []

    def fill(leaf: Any) -> Any:
        value = values.get(id(leaf))
        if value is None:
            return leaf
        placed.append(id(leaf))
        return value

    tree = jax.tree.map(fill, tree)
    if sorted(placed) != sorted(values):
        raise RuntimeError(
            f"batched_normals: {len(values)} deferred draws but {len(placed)} placed in the tree"
        )
    return tree
