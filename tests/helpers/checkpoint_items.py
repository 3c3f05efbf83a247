"""Small checkpoint items shared by the checkpoint test modules: a sharded device tree, a host
tree, a tree comparison and a save with its meta."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def _mesh():
    return Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "tensor"))


def _items(scale: float):
    # Large enough that its data, not orbax's metadata, is the item's largest file.
    w = jnp.arange(64 * 64, dtype=jnp.float32).reshape(64, 64) * scale
    w = jax.device_put(w, NamedSharding(_mesh(), P("data", "tensor")))
    params = {"w": w, "b": jnp.full((3,), scale, jnp.bfloat16)}
    return {
        "params": params,
        "opt_state": (jax.tree.map(jnp.zeros_like, params), {"count": jnp.int32(7)}),
        "progress": {"step": jnp.int32(int(scale * 2)), "rng": jax.random.key(3)},
    }


def _host(step: int):
    return {
        "history": {"G": np.arange(5, dtype=np.int64) * step, "k": np.ones(5, np.float64) / 3},
        "data": {"epoch": 2, "position": step},
        "temperature": {"tau": 0.73, "h_init": np.float64(1.25)},
    }


def _tree_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        if jnp.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _save(ckpt, step, scale=None, config=None):
    meta = {"step": step, "config": config or {"lr": 1e-6}}
    ckpt.save(step, device=_items(scale or float(step)), host=_host(step), meta=meta)
