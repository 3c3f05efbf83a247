"""The checksums a checkpoint's meta item records for every other item (checkpoint.py).

Checksums: each device leaf gets two 32-bit sums of its raw bits, each bit-word weighted by an
odd number that depends on its position (`_leaf_sums`). Any single flipped bit changes the
first sum (an odd weight times ±2^b is never 0 mod 2^32), and any other change survives both
with probability about 2^-64. The sums are exact integer reductions, so they do not depend on
how the array is sharded, are computed on device where the data lives, and are read back as two
scalars per leaf. Host leaves get a SHA-256, the config another. `restore` recomputes them and
reports a mismatch as damage: a checksum of the values (not of the files) flags exactly the
corruption that would change what the run resumes with.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dynamo_jax.sharding import multihost


def _as_words(x: jax.Array) -> jax.Array:
    """The raw bits of `x` as uint32 words (narrower types widened, 64-bit types split)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    size = jnp.dtype(x.dtype).itemsize
    if size >= 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    narrow = {1: jnp.uint8, 2: jnp.uint16}[size]
    return jax.lax.bitcast_convert_type(x, narrow).astype(jnp.uint32)


def _leaf_sums(x: jax.Array) -> jax.Array:
    """[2] uint32: Σ w·(2i+1) and Σ (w ^ w>>16)·(i·φ | 1) over the words w at linear index i.

    The linear index is built from per-axis iotas (mod 2^32), so a sharded array is never
    flattened (which would gather it); uint32 sums wrap, so the result is order-independent."""
    w = _as_words(x)
    index = jnp.zeros(w.shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(w.ndim)):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, w.shape, axis) * jnp.uint32(stride)
        stride = (stride * w.shape[axis]) % 2**32
    s1 = jnp.sum(w * (index * jnp.uint32(2) + jnp.uint32(1)), dtype=jnp.uint32)
    mixed = w ^ (w >> jnp.uint32(16))
    s2 = jnp.sum(mixed * ((index * jnp.uint32(0x9E3779B1)) | jnp.uint32(1)), dtype=jnp.uint32)
    return jnp.stack([s1, s2])


def _leaf_record(x: jax.Array) -> jax.Array:
    """[3] uint32: the two sums, and 1 if every value is finite (non-floating leaves: 1)."""
    finite = jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.floating) else True
    return jnp.concatenate([_leaf_sums(x), jnp.asarray(finite, jnp.uint32)[None]])


_leaf_records = jax.jit(lambda leaves: [_leaf_record(x) for x in leaves])


def _devices(x: Any) -> tuple[int, ...]:
    sharding = getattr(x, "sharding", None)
    return tuple(sorted(d.id for d in sharding.device_set)) if sharding is not None else ()


def _describe(x: Any) -> str:
    return f"{x.dtype}[{','.join(map(str, x.shape))}]"


def inspect_items(items: Mapping[str, Any]) -> dict[str, dict[str, tuple[str, bool]]]:
    """Item → key path → ("dtype[shape]:sum1:sum2", all finite) of every leaf of every item,
    computed on device in one jitted call per set of devices the leaves live on (a run's
    params, opt_state and progress: one call, one program; every process must call it)."""
    flat = [
        (name, path, leaf)
        for name in sorted(items)  # save's and restore's order alike: the same program
        for path, leaf in jax.tree_util.tree_leaves_with_path(items[name])
    ]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (_, _, leaf) in enumerate(flat):
        groups.setdefault(_devices(leaf), []).append(i)
    records: dict[int, Any] = {}
    for members in groups.values():
        records.update(zip(members, _leaf_records([flat[i][2] for i in members]), strict=True))
    out: dict[str, dict[str, tuple[str, bool]]] = {name: {} for name in items}
    for i, (name, path, leaf) in enumerate(flat):
        a, b, finite = (int(v) for v in multihost.host_copy(records[i]))
        out[name][jax.tree_util.keystr(path)] = (
            f"{_describe(leaf)}:{a:08x}:{b:08x}",
            bool(finite),
        )
    return out


def device_checksums(tree: Any) -> dict[str, str]:
    """Key path → "dtype[shape]:sum1:sum2" of every leaf (call on every process)."""
    return {path: checksum for path, (checksum, _) in inspect_items({"": tree})[""].items()}


def host_checksums(tree: Any) -> dict[str, str]:
    """Key path → SHA-256 of (dtype, shape, bytes) of every leaf of a host NumPy tree."""
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        arr = np.ascontiguousarray(np.asarray(leaf))
        digest = hashlib.sha256(f"{arr.dtype.str}{arr.shape}".encode())
        digest.update(arr.tobytes())
        out[jax.tree_util.keystr(path)] = digest.hexdigest()
    return out


def config_checksum(config: Any) -> str:
    """SHA-256 of the config's JSON (keys sorted)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def mismatches(want: Mapping[str, str], got: Mapping[str, str]) -> list[str]:
    """The keys whose checksums differ, or that one side lacks."""
    return sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
