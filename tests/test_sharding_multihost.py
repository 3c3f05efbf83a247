"""Multi-host helpers (dynamo_jax/sharding/multihost.py): config, env parsing, batch feeding."""

import jax
import numpy as np
import pytest

from dynamo_jax.sharding.mesh import MeshConfig, build_mesh
from dynamo_jax.sharding.multihost import (
    DistributedConfig,
    initialize_distributed,
    local_batch_rows,
    make_global_batch,
    resolve_distributed_config,
)
from dynamo_jax.sharding.rules import DEFAULT_RULES, batch_sharding, replicated


def test_env_vars_fill_unset_fields_and_config_wins():
    env = {
        "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234",
        "JAX_NUM_PROCESSES": "4",
        "JAX_PROCESS_ID": "3",
    }
    cfg = resolve_distributed_config(DistributedConfig(), env)
    assert (cfg.coordinator_address, cfg.num_processes, cfg.process_id) == ("10.0.0.1:1234", 4, 3)
    cfg = resolve_distributed_config(DistributedConfig(process_id=1, num_processes=2), env)
    assert (cfg.num_processes, cfg.process_id) == (2, 1)


def test_single_process_is_a_no_op_and_partial_config_fails():
    assert initialize_distributed(DistributedConfig(), environ={}) is False
    assert initialize_distributed(DistributedConfig(num_processes=1), environ={}) is False
    with pytest.raises(ValueError, match="needs coordinator_address, num_processes and process_id"):
        initialize_distributed(DistributedConfig(num_processes=2), environ={})
    with pytest.raises(ValueError, match="JAX_PROCESS_ID='x' is not an integer"):
        resolve_distributed_config(DistributedConfig(), {"JAX_PROCESS_ID": "x"})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(coordinator_address="localhost"), "must be 'host:port'"),
        (dict(num_processes=0), "num_processes must be >= 1"),
        (dict(num_processes=2, process_id=2), "process_id 2 must be < num_processes 2"),
    ],
)
def test_bad_distributed_config_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DistributedConfig(**kwargs)


def test_single_process_feeds_the_whole_batch():
    mesh = build_mesh(MeshConfig(shape=(2, 2, 2)))
    rows = batch_sharding(mesh, DEFAULT_RULES, batch_size=8, ndim=2)
    assert local_batch_rows(rows, 8) == slice(0, 8)
    local = {"tokens": np.arange(24).reshape(8, 3), "temperature": np.float32(0.5)}
    out = make_global_batch(local, {"tokens": rows, "temperature": replicated(mesh)}, 8)
    np.testing.assert_array_equal(np.asarray(out["tokens"]), local["tokens"])
    assert out["tokens"].sharding == rows and float(out["temperature"]) == 0.5
    with pytest.raises(ValueError, match="must feed rows \\[0, 8\\) = 8 rows, got 4"):
        make_global_batch({"tokens": local["tokens"][:4]}, {"tokens": rows}, 8)
    assert jax.process_count() == 1
