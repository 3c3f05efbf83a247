"""dynamo_jax/models/init_normals.py: the init's normal draws made in one batch, same bits.

Oracle: flax's own per-parameter draws (`Transformer.init` with nothing deferred, each
parameter drawn by `nn.initializers.normal` from the key flax derived for it), compared bit for
bit in the same kind of program (jitted against jitted, eager against eager), on one device and
with the parameters sharded over 8 simulated devices.
"""

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from dynamo_jax.models import init_normals, qwen
from dynamo_jax.models.presets import get_preset
from dynamo_jax.sharding.mesh import MeshConfig, build_mesh
from dynamo_jax.sharding.rules import DEFAULT_RULES
from dynamo_jax.step.forward import model_param_shardings


def _flax_draws(cfg):
    """Every parameter drawn on its own by flax's initializers: the layout before batching."""
    tokens = jnp.zeros((1, 1), jnp.int32)
    model = qwen.Transformer(cfg.replace(attention_impl="matmul"))
    return lambda key: nn.meta.unbox(
        model.init(key, tokens, tokens, jnp.ones((1, 1), jnp.int32))["params"]
    )


def _bits(tree):
    return {
        jax.tree_util.keystr(path): (leaf.dtype, leaf.shape, np.asarray(leaf).tobytes())
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    }


def _random_bits_calls(fn, *args) -> int:
    """Threefry hashes of random bits in `fn`'s program (jaxpr equations, nested ones too)."""
    count = 0

    def walk(jaxpr):
        nonlocal count
        for eqn in jaxpr.eqns:
            count += eqn.primitive.name in ("random_bits", "threefry2x32")
            for value in eqn.params.values():
                for inner in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(inner, jax.extend.core.ClosedJaxpr):
                        walk(inner.jaxpr)
                    elif isinstance(inner, jax.extend.core.Jaxpr):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return count


@pytest.mark.parametrize(
    "preset, param_dtype",
    [
        ("tiny-qwen3", "float32"),
        ("tiny-qwen2", "float32"),  # q/k/v biases
        ("tiny-llama", "float32"),  # untied lm_head
        ("tiny-qwen3", "bfloat16"),  # 8 random bits per element, not 32
    ],
)
def test_batched_draws_give_every_parameter_its_own_draws_bits(preset, param_dtype):
    # two layers where the layers' kernels share their shapes; one for the other families
    layers = 2 if (preset, param_dtype) == ("tiny-qwen3", "float32") else 1
    cfg = get_preset(preset, scan_layers=False, param_dtype=param_dtype, num_layers=layers)
    batched = jax.jit(lambda key: qwen.random_params(cfg, key))(jax.random.key(11))
    direct = jax.jit(_flax_draws(cfg))(jax.random.key(11))
    assert _bits(batched) == _bits(direct)
    # eager too: each is compared with the same kind of program (eager and jitted erf_inv may
    # round differently, with or without batching)
    eager = qwen.random_params(cfg, jax.random.key(3))
    assert _bits(eager) == _bits(_flax_draws(cfg)(jax.random.key(3)))


def test_the_batched_init_hashes_once_where_flax_hashed_once_a_parameter():
    cfg = get_preset("tiny-qwen3", scan_layers=False)
    key = jax.random.key(0)
    assert _random_bits_calls(lambda k: qwen.random_params(cfg, k), key) == 1
    # 15 kernels: the embedding, and 7 in each of the 2 layers
    assert _random_bits_calls(_flax_draws(cfg), key) == 15


def test_sharded_over_a_mesh_the_bits_are_the_same():
    cfg = get_preset("tiny-qwen3", scan_layers=False)
    mesh = build_mesh(MeshConfig(shape=(1, 2, 4)))
    shardings = model_param_shardings(cfg, mesh, DEFAULT_RULES)
    assert any(not s.is_fully_replicated for s in jax.tree.leaves(shardings))
    key = jax.random.key(5)
    batched = jax.jit(lambda k: qwen.random_params(cfg, k), out_shardings=shardings)(key)
    direct = jax.jit(_flax_draws(cfg), out_shardings=shardings)(key)
    assert _bits(batched) == _bits(direct)
    assert jax.tree.map(lambda x: x.sharding, batched) == shardings


def test_draws_over_the_cap_are_each_drawn_directly(monkeypatch):
    cfg = get_preset("tiny-qwen3", scan_layers=False)
    monkeypatch.setattr(init_normals, "MAX_BATCHED_ELEMENTS", 1000)
    key = jax.random.key(2)
    assert _random_bits_calls(lambda k: qwen.random_params(cfg, k), key) == 15
    batched = jax.jit(lambda k: qwen.random_params(cfg, k))(key)
    assert _bits(batched) == _bits(jax.jit(_flax_draws(cfg))(key))


@pytest.mark.parametrize(
    "key",
    [jax.random.PRNGKey(6), jax.random.key(6, impl="rbg")],
    ids=["raw uint32 key", "rbg key"],
)
def test_keys_one_threefry_call_cannot_reproduce_are_drawn_directly(key):
    cfg = get_preset("tiny-qwen3", scan_layers=False, num_layers=1)
    assert _random_bits_calls(lambda k: qwen.random_params(cfg, k), key) > 1
    batched = jax.jit(lambda k: qwen.random_params(cfg, k))(key)
    assert _bits(batched) == _bits(jax.jit(_flax_draws(cfg))(key))


def test_a_64_bit_draw_is_drawn_directly():
    """float64 bits join two hashes (jax.random's 64-bit path): one threefry call of 32-bit
    bits would give other values, so such a draw is not batched."""
    with jax.enable_x64(True):
        key = jax.random.key(8)
        build = lambda: {"w": init_normals.normal(0.5)(key, (3, 4), jnp.float64)}
        batched = init_normals.batched_normals(build)["w"]
        direct = nn.initializers.normal(0.5)(key, (3, 4), jnp.float64)
        assert batched.dtype == jnp.float64
        assert np.asarray(batched).tobytes() == np.asarray(direct).tobytes()


def test_scanned_layers_draw_inside_the_scan_as_before():
    cfg = get_preset("tiny-qwen3", scan_layers=True)
    key = jax.random.key(4)
    params = jax.jit(lambda k: qwen.random_params(cfg, k))(key)
    assert _bits(params) == _bits(jax.jit(_flax_draws(cfg))(key))


def test_outside_a_batch_the_initializer_is_flaxs_normal():
    key = jax.random.key(9)
    ours = init_normals.normal(0.5)(key, (3, 4), jnp.float32)
    theirs = nn.initializers.normal(0.5)(key, (3, 4), jnp.float32)
    assert np.asarray(ours).tobytes() == np.asarray(theirs).tobytes()


def test_a_draw_that_does_not_come_back_as_a_leaf_is_an_error():
    def build():
        init_normals.normal(1.0)(jax.random.key(0), (2,), jnp.float32)  # drawn, then dropped
        return {"kept": init_normals.normal(1.0)(jax.random.key(1), (2,), jnp.float32)}

    with pytest.raises(RuntimeError, match="2 deferred draws but 1 placed"):
        init_normals.batched_normals(build)


def test_a_build_without_draws_is_returned_unchanged():
    tree = {"a": jnp.ones(2)}
    assert init_normals.batched_normals(lambda: tree) is tree
