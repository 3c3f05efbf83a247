"""Mesh construction and logical-axis rule resolution (dynamo_jax/sharding/mesh.py, rules.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from dynamo_jax.sharding.mesh import AXIS_NAMES, MeshConfig, build_mesh, resolve_mesh_shape
from dynamo_jax.sharding.rules import (
    DEFAULT_RULES,
    batch_sharding,
    fit_rules,
    fit_spec,
    opt_state_shardings,
    param_shardings,
    row_shards,
)


def test_rest_axis_is_filled_and_mesh_is_auto():
    mesh = build_mesh(MeshConfig(shape=(2, -1, 2)))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert mesh.axis_names == AXIS_NAMES
    assert all(t == AxisType.Auto for t in mesh.axis_types)
    # Process-major reshape: the devices appear in jax.devices() order.
    assert list(mesh.devices.flat) == jax.devices()


def test_mesh_not_matching_device_count_fails_clearly():
    with pytest.raises(ValueError, match=r"needs 16 devices but 8 are available"):
        build_mesh(MeshConfig(shape=(2, 4, 2)))
    with pytest.raises(ValueError, match=r"fixed axes multiply to 3, which does not divide"):
        resolve_mesh_shape((3, -1, 1), 8)


@pytest.mark.parametrize(
    "shape, message",
    [
        ((1, -1, -1), "at most one -1"),
        ((1, 0, 1), r"shape\['fsdp'\] must be >= 1"),
        ((1, 8), "must have 3 entries"),
        ((1, 2.0, 4), r"shape\['fsdp'\] must be an int"),
    ],
)
def test_bad_mesh_shapes_fail_in_config(shape, message):
    with pytest.raises(ValueError, match=message):
        MeshConfig(shape=shape)


def test_rules_naming_unknown_mesh_axis_fail_before_compiling():
    rules = DEFAULT_RULES + (("act_mlp", ("tensor", "model")),)
    with pytest.raises(
        ValueError, match=r"rules\[14\] maps logical axis 'act_mlp' to unknown mesh axis 'model'"
    ):
        MeshConfig(rules=rules)
    with pytest.raises(ValueError, match="must be a \\(logical_name, mesh_axes\\) pair"):
        MeshConfig(rules=(("embed", "fsdp", "x"),))


@pytest.fixture(scope="module")
def mesh_124():
    return build_mesh(MeshConfig(shape=(1, 2, 4)))


def test_fit_spec_drops_only_axes_that_do_not_divide(mesh_124):
    # 2 KV heads on tensor=4: replicated; 8 heads: split; (data, fsdp) keeps the dividing prefix.
    assert fit_spec(P("fsdp", "tensor", None), (64, 2, 16), mesh_124) == P("fsdp", None, None)
    assert fit_spec(P("fsdp", "tensor", None), (64, 8, 16), mesh_124) == P("fsdp", "tensor", None)
    assert fit_spec(P(("fsdp", "tensor")), (4,), mesh_124) == P(("fsdp",))
    assert fit_spec(P(("tensor", "fsdp")), (4,), mesh_124) == P(("tensor",))
    assert fit_spec(P(), (3, 5), mesh_124) == P(None, None)


def test_param_and_opt_state_shardings_follow_the_rules(mesh_124):
    params = {
        "embed": jax.ShapeDtypeStruct((512, 64), jnp.float32),
        "k": jax.ShapeDtypeStruct((64, 2, 16), jnp.float32),
        "q": jax.ShapeDtypeStruct((64, 8, 16), jnp.float32),
        "norm": jax.ShapeDtypeStruct((64,), jnp.float32),
    }
    logical = {
        "embed": P("vocab", "embed"),
        "k": P("embed", "kv_heads", "head_dim"),
        "q": P("embed", "heads", "head_dim"),
        "norm": P("embed"),
    }
    shardings = param_shardings(params, logical, mesh_124, DEFAULT_RULES)
    assert shardings["embed"].spec == P("tensor", "fsdp")
    assert shardings["k"].spec == P("fsdp", None, None)
    assert shardings["q"].spec == P("fsdp", "tensor", None)
    assert shardings["norm"].spec == P("fsdp")

    opt = optax.adamw(1e-3)
    abstract_state = jax.eval_shape(opt.init, params)
    state_shardings = opt_state_shardings(opt, abstract_state, shardings, mesh_124)
    adam = state_shardings[0]
    assert adam.mu["q"].spec == P("fsdp", "tensor", None)
    assert adam.nu["k"].spec == P("fsdp", None, None)
    assert adam.count.spec == P()
    # The shardings are usable: initialising the optimizer under them places every leaf.
    concrete = jax.tree.map(
        lambda x, s: jax.device_put(jnp.zeros(x.shape, x.dtype), s), params, shardings
    )
    state = jax.jit(opt.init, out_shardings=state_shardings)(concrete)
    assert state[0].mu["embed"].sharding.spec == P("tensor", "fsdp")


def test_fit_rules_for_activations(mesh_124):
    rules = fit_rules(
        DEFAULT_RULES, mesh_124, {"act_heads": 6, "act_kv_heads": 2, "act_vocab": 512}
    )
    as_dict = dict(rules)
    assert as_dict["act_heads"] is None
    assert as_dict["act_kv_heads"] is None
    assert as_dict["act_vocab"] == "tensor"
    assert as_dict["embed"] == "fsdp"  # untouched: not in dims
    assert len(rules) == len(DEFAULT_RULES)


def test_batch_sharding_requires_whole_sequences_per_device(mesh_124):
    sharding = batch_sharding(mesh_124, DEFAULT_RULES, batch_size=4, ndim=2)
    assert sharding.spec == P(("data", "fsdp"), None)
    with pytest.raises(
        ValueError, match=r"batch size 3 does not divide over the act_batch mesh axes"
    ):
        batch_sharding(mesh_124, DEFAULT_RULES, batch_size=3, ndim=2)
    x = jax.device_put(np.arange(8.0).reshape(4, 2), sharding)
    assert isinstance(x.sharding, NamedSharding) and len(x.addressable_shards) == 8


def test_row_shards_of_a_config_and_of_its_built_mesh_agree(mesh_124):
    """The one count of the ways a batch's rows split (the act_batch axes, data x fsdp by
    default), from a config before anything is built and from the mesh built for it."""
    assert row_shards(MeshConfig(shape=(1, -1, 2)).axis_sizes(16), DEFAULT_RULES) == 8
    assert row_shards(MeshConfig(shape=(2, 2, 4)).axis_sizes(16), DEFAULT_RULES) == 4
    assert row_shards(mesh_124.shape, DEFAULT_RULES) == 2  # (data, fsdp) = (1, 2), tensor 4
    config = MeshConfig(shape=(2, -1, 2))
    built = build_mesh(config)
    assert row_shards(built.shape, config.rules) == row_shards(config.axis_sizes(8), config.rules)
    assert row_shards(built.shape, config.rules) == 4
    batch_only = (("act_batch", "data"),) + tuple(r for r in DEFAULT_RULES if r[0] != "act_batch")
    assert row_shards(built.shape, batch_only) == 2
