"""A checkpoint resumes on another mesh: 8 simulated devices with an fsdp mesh -> 4 with a tensor
mesh, and the reverse. Each leg is `launch.py` in its own process (the device count is fixed
before JAX starts).

"The same numbers", precisely: a run on mesh X trains 4 steps, checkpointing at 2 and 4 (the
uninterrupted run). Its workdir is copied without step 4 and resumed on mesh Y to step 4.
(1) The state restored on Y is bit-identical to the saved one: the restore verifies every leaf's
    checksum (exact integer sums, independent of the sharding), and here the step-2 state restored
    onto Y's shardings equals, bit for bit, the same state restored onto one device.
(2) Steps 3-4 of the resumed run equal the uninterrupted run's on X within float tolerance: the
    sampled tokens, rewards and allocation exactly, the losses, gradient norms, entropies and
    final parameters to rtol 1e-4 (the two meshes sum the same products in another order, so
    bit-equality is not promised; on one mesh the resume is exact: tests/test_loop_train.py).
"""

import os
import shutil

import jax
import numpy as np
import pytest
from helpers.scripts import launch
from helpers.train_runs import LAUNCH_ARGS, TIMING_PREFIXES, _final_state, _short_config

from dynamo_jax.checkpoint import CheckpointConfig, Checkpointer, abstract_like
from dynamo_jax.config import from_config_dict
from dynamo_jax.errors import ExitCode
from dynamo_jax.reporting.metrics import read_metrics
from dynamo_jax.sharding.mesh import MeshConfig, build_mesh
from dynamo_jax.sharding.rules import replicated
from dynamo_jax.step.optimizer import make_optimizer
from dynamo_jax.step.state import abstract_train_state, train_state_shardings

STEPS, SAVED = 4, 2
ARGS = (*LAUNCH_ARGS, f"--config.train.steps={STEPS}", f"--config.checkpoint.every_steps={SAVED}")  # fmt: skip
FSDP8, TENSOR4 = (8, (1, 8, 1)), (4, (1, 1, 4))  # (devices, mesh.shape as (data, fsdp, tensor))
# Values a float reduction order can move (the trainer's statistics, and the engine-vs-trainer
# log-prob gap, itself rounding noise of ~1e-7); every other metric (rewards, allocation,
# temperature, lengths, counts) follows the sampled tokens and must be equal.
FLOAT_PREFIXES = ("loss/", "entropy/", "rollout/engine_logp_abs_diff")


def _run(workdir, devices: int, shape: tuple[int, int, int]):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    shape_arg = "--config.mesh.shape=(" + ",".join(map(str, shape)) + ")"
    proc = launch(*ARGS, shape_arg, f"--workdir={workdir}", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _config(shape):
    config = _short_config(method="e3", steps=STEPS, every=SAVED)
    config.mesh.shape = shape
    return config


def _restore_on(workdir, cfg, mesh):
    """Step SAVED's device items restored onto `mesh`'s shardings for this config."""
    optimizer = make_optimizer(cfg.optim, cfg.total_updates)
    shardings = train_state_shardings(cfg.model, optimizer, mesh, cfg.mesh.rules)
    state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        abstract_train_state(cfg.model, optimizer),
        shardings,
    )
    rng = abstract_like(jax.device_put(jax.random.key(cfg.train.seed), replicated(mesh)))
    template = {
        "params": state.params,
        "opt_state": state.opt_state,
        "progress": {"step": state.step, "rng": rng},
    }
    ckpt = Checkpointer(workdir / "checkpoints", CheckpointConfig(), read_only=True)
    try:
        return ckpt.restore(SAVED, template).device
    finally:
        ckpt.close()


def _bits(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


def _is_float_metric(key: str, value) -> bool:
    return key.startswith(FLOAT_PREFIXES) and isinstance(value, float)


@pytest.mark.slow  # four launch.py runs of 2-4 steps on simulated devices
@pytest.mark.parametrize(
    ("before", "after"),
    [(FSDP8, TENSOR4), (TENSOR4, FSDP8)],
    ids=["fsdp8_to_tensor4", "tensor4_to_fsdp8"],
)
def test_a_checkpoint_resumes_on_another_mesh_with_the_same_numbers(tmp_path, before, after):
    uninterrupted, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    _run(uninterrupted, *before)
    shutil.copytree(uninterrupted, resumed)
    shutil.rmtree(resumed / "checkpoints" / str(STEPS))  # as if stopped after step SAVED's save
    proc = _run(resumed, *after)
    assert f"resumed {resumed} from step {SAVED}" in proc.stdout, proc.stdout[-3000:]
    assert "damaged" not in proc.stdout + proc.stderr  # every checksum held on the new mesh

    # (1) the saved state lands on the new mesh's layout bit for bit
    cfg = from_config_dict(_config(after[1]))
    mesh = build_mesh(MeshConfig(shape=after[1], rules=cfg.mesh.rules), jax.devices()[: after[0]])
    on_mesh = _restore_on(uninterrupted, cfg, mesh)
    on_one = _restore_on(
        uninterrupted, cfg, build_mesh(MeshConfig(shape=(1, 1, 1)), jax.devices()[:1])
    )
    specs = {str(leaf.sharding.spec) for leaf in jax.tree.leaves(on_mesh["params"])}
    axis = "tensor" if after is TENSOR4 else "fsdp"
    assert any(axis in spec for spec in specs), specs  # really laid out over the new axis
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(on_mesh), jax.tree.leaves(on_one), strict=True
    ):
        np.testing.assert_array_equal(_bits(a), _bits(b), jax.tree_util.keystr(path))

    # (2) the steps after the resume: the uninterrupted run's numbers within float tolerance
    got, want = read_metrics(resumed), read_metrics(uninterrupted)
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, STEPS + 1))
    compared = 0
    for g, w in zip(got[SAVED:], want[SAVED:], strict=True):
        keys = {k for k in w if not k.startswith(TIMING_PREFIXES)}
        assert {k for k in g if not k.startswith(TIMING_PREFIXES)} == keys
        for key in sorted(keys):
            if _is_float_metric(key, w[key]):
                np.testing.assert_allclose(g[key], w[key], rtol=1e-4, atol=1e-6, err_msg=key)
                compared += 1
            else:
                assert g[key] == w[key], (g["step"], key, g[key], w[key])
    assert compared >= 2 * 4, compared  # losses and gradient norms were compared, not skipped
    step, params, _ = _final_state(resumed, _config(after[1]))
    step_want, params_want, _ = _final_state(uninterrupted, _config(before[1]))
    assert step == step_want == STEPS
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(params_want), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path)
        )


def test_a_mesh_that_cannot_split_the_batches_is_refused_in_one_line(tmp_path):
    """6 devices split rows 6 ways; tiny's micro-batches hold 64 rows: no whole rows per device.
    Refused (2) before the workdir is touched, not a traceback from the build (1)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=6"}
    proc = launch(*ARGS, "--config.mesh.shape=(1,6,1)", f"--workdir={tmp_path / 'w'}", env=env)
    assert proc.returncode == ExitCode.REFUSED, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "error: config.mesh.shape: RowLayout.micro_rows (64) must be a multiple of row_shards "
        "(6): each device holds whole rows of every micro-batch"
    ]
    assert not (tmp_path / "w").exists()
