"""Multi-host helpers (dynamo_jax/sharding/multihost.py): config, env parsing, batch feeding,
and two real processes joined by jax.distributed against one process with the same devices."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest
from jax.experimental import multihost_utils
from processes import communicate_all

from dynamo_jax.losses import LossConfig
from dynamo_jax.models.presets import get_preset
from dynamo_jax.models.qwen import positions_from_mask
from dynamo_jax.sharding.mesh import MeshConfig, build_mesh
from dynamo_jax.sharding.multihost import (
    DistributedConfig,
    allgather_host,
    global_batch_from_host,
    global_from_host,
    host_copy,
    initialize_distributed,
    is_multiprocess,
    local_batch_rows,
    make_global_batch,
    resolve_distributed_config,
)
from dynamo_jax.sharding.rules import DEFAULT_RULES, batch_sharding, replicated
from dynamo_jax.step.state import init_train_state
from dynamo_jax.step.train_step import make_train_step


def local_rows_of(x: jax.Array) -> np.ndarray:
    """This process's rows of a batch-sharded global array, in order (replicas counted once).

    Call on EVERY process; each gets its own `local_batch_rows` block (the whole array on one
    process). For per-row host work such as logging a process's own sequences.
    """
    by_start = {}
    for shard in x.addressable_shards:
        start = (shard.index[0].start or 0) if shard.index else 0
        by_start.setdefault(start, shard)
    return np.concatenate([np.asarray(by_start[k].data) for k in sorted(by_start)])


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
    np.testing.assert_array_equal(local_rows_of(out["tokens"]), local["tokens"])
    again = make_global_batch(dict(local, tokens=out["tokens"]), {"tokens": rows}, 8)
    assert again["tokens"] is out["tokens"]  # already global with this sharding: passed through
    with pytest.raises(ValueError, match="must feed rows \\[0, 8\\) = 8 rows, got 4"):
        make_global_batch({"tokens": local["tokens"][:4]}, {"tokens": rows}, 8)
    assert jax.process_count() == 1


def test_host_copies_to_global_arrays_and_back():
    """The whole-batch helpers the training loop uses; the two-process paths run in
    tests/test_loop_train_multihost.py (the loop) and in the test below (the step)."""
    mesh = build_mesh(MeshConfig(shape=(1, 4, 2)))
    assert not is_multiprocess(mesh) and not is_multiprocess(replicated(mesh))
    rows = batch_sharding(mesh, DEFAULT_RULES, batch_size=8, ndim=2)
    x = np.arange(40, dtype=np.float32).reshape(8, 5)
    g = global_from_host(x, rows)
    assert g.sharding == rows and g.addressable_shards[0].data.shape == (2, 5)
    np.testing.assert_array_equal(host_copy(g), x)
    # PRNG keys travel as key data and come back as the same keys, sharded by row.
    keys = jax.random.split(jax.random.key(3), 8)
    gk = global_from_host(keys, batch_sharding(mesh, DEFAULT_RULES, batch_size=8, ndim=1))
    np.testing.assert_array_equal(
        np.asarray(jax.random.key_data(gk)), np.asarray(jax.random.key_data(keys))
    )
    assert jax.random.key_impl(gk) == jax.random.key_impl(keys)
    full = {"tokens": x.astype(np.int32), "temperature": np.float32(0.7)}
    out = global_batch_from_host(full, {"tokens": rows, "temperature": replicated(mesh)}, 8)
    np.testing.assert_array_equal(host_copy(out["tokens"]), full["tokens"])
    assert out["tokens"].sharding == rows and float(out["temperature"]) == np.float32(0.7)
    np.testing.assert_array_equal(allgather_host(np.arange(3)), [[0, 1, 2]])


# --- Two processes on 127.0.0.1 vs one process, both running the real train step. -----------

MH_BATCH, MH_LEN, MH_STEPS = 8, 12, 2


def _worker(out_path: str, num_processes: int, process_id: int, port: int, agg: str) -> None:
    """One process of the comparison: 2 optimizer steps of tiny-qwen2 on a (1, 2, 2) mesh.

    With two processes the `fsdp` axis spans them (devices are ordered process-major), so every
    step all-gathers parameters and reduce-scatters gradients across processes.
    """
    if num_processes > 1:
        initialize_distributed(DistributedConfig(f"127.0.0.1:{port}", num_processes, process_id))
    cfg = get_preset("tiny-qwen2")
    mesh = build_mesh(MeshConfig(shape=(1, 2, 2)))
    opt = optax.adamw(1e-2)
    step, state_sh, batch_sh = make_train_step(
        cfg, LossConfig(loss_agg_mode=agg), opt, mesh, DEFAULT_RULES, batch_size=MH_BATCH
    )
    state = init_train_state(cfg, opt, mesh, DEFAULT_RULES, jax.random.key(0))
    losses = []
    for i in range(MH_STEPS):
        rng = np.random.default_rng(i)  # the same global batch on every process
        mask = np.ones((MH_BATCH, MH_LEN), np.int32)
        loss_mask = np.zeros((MH_BATCH, MH_LEN), np.float32)
        loss_mask[:, 4:] = 1.0
        full = dict(
            tokens=rng.integers(1, cfg.vocab_size, (MH_BATCH, MH_LEN)).astype(np.int32),
            positions=np.asarray(positions_from_mask(mask)),
            segment_ids=mask,  # one sequence per row
            loss_mask=loss_mask,
            advantages=rng.normal(size=MH_BATCH).astype(np.float32),
            old_logp=np.full((MH_BATCH, MH_LEN), -6.2, np.float32),
            temperature=np.float32(1.0),
            on_policy=np.float32(0.0),
            # prompt-mean's 1/n_i: prompt groups of sizes 3, 1, 4, one split over the processes
            seq_weight=np.repeat(
                np.array([1 / 3] * 3 + [1.0] + [1 / 4] * 4, np.float32)[:, None], MH_LEN, axis=1
            ),  # fmt: skip
        )
        full = {k: v for k, v in full.items() if k in batch_sh}
        rows = local_batch_rows(batch_sh["tokens"], MH_BATCH)
        local = {k: (v if np.ndim(v) == 0 else v[rows]) for k, v in full.items()}
        batch = make_global_batch(local, batch_sh, MH_BATCH)
        np.testing.assert_array_equal(local_rows_of(batch["tokens"]), local["tokens"])
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    params = multihost_utils.process_allgather(state.params, tiled=True)
    if process_id == 0:
        flat = {
            jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_leaves_with_path(params)
        }
        np.savez(
            out_path, losses=np.asarray(losses), rows=np.asarray([rows.start, rows.stop]), **flat
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(out_path, num_processes, process_id, port, devices, agg):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    cmd = [sys.executable, __file__, str(out_path), str(num_processes), str(process_id), str(port)]
    cmd.append(agg)
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.slow  # two JAX processes against one: a minute of CPU
@pytest.mark.parametrize("agg", ["token-mean", "prompt-mean"])
def test_two_processes_match_one_process_with_four_devices(tmp_path, agg):
    port = _free_port()
    procs = [
        _spawn(tmp_path / "multi.npz", 2, 0, port, devices=2, agg=agg),
        _spawn(tmp_path / "multi_p1.npz", 2, 1, port, devices=2, agg=agg),
        _spawn(tmp_path / "single.npz", 1, 0, 0, devices=4, agg=agg),
    ]
    communicate_all(procs, ("process 0", "process 1", "single"), timeout=600)
    multi, single = np.load(tmp_path / "multi.npz"), np.load(tmp_path / "single.npz")
    assert list(multi["rows"]) == [0, MH_BATCH // 2]  # process 0 fed only its half
    assert list(single["rows"]) == [0, MH_BATCH]
    assert set(multi.files) == set(single.files)
    np.testing.assert_allclose(multi["losses"], single["losses"], rtol=1e-6, atol=1e-7)
    for key in set(multi.files) - {"losses", "rows"}:
        np.testing.assert_allclose(multi[key], single[key], rtol=1e-6, atol=1e-7, err_msg=key)
    # Two adamw steps at lr 1e-2 moved every matrix: the comparison is not of untouched params.
    assert not np.allclose(multi["['embed']['embedding']"], 0.0)


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
