"""Sharding: meshes, logical-axis rules, the one jitted train step, multi-host, the dry-run planner.

How the training loop uses this package (every process runs the same code):

    initialize_distributed(DistributedConfig(...))        # multihost.py; no-op on one process
    mesh = build_mesh(mesh_cfg)                             # mesh.py: axes (data, fsdp, tensor)
    train_step, state_sh, batch_sh = make_train_step(
        model_cfg, loss_cfg, optimizer, mesh, mesh_cfg.rules,
        batch_size=B, micro_batches=M)                      # step.py: ONE jax.jit, state donated
    state = init_train_state(model_cfg, optimizer, mesh, mesh_cfg.rules, rng)
    #   or train_state_from_params(imported_params, optimizer, state_sh)       (state.py)
    logprob_fn = make_logprob_fn(model_cfg, mesh, mesh_cfg.rules, batch_size=B)   # old/ref log π
    rows = local_batch_rows(batch_sh["tokens"], B)          # this process's slice of the batch
    batch = make_global_batch(local_rows_dict, batch_sh, B)
    state, metrics = train_step(state, batch)               # metrics stay on device until logged

Batch layout (per-token arrays indexed by the token they score): see `forward.py`.
Rules and the replicate-when-indivisible choice for head counts: see `rules.py`.
Dry run for `launch.py --dry_run`: `run_dry_run(...)` and `format_report(...)` in `planner.py`.
"""

from dynamo_jax.sharding.forward import make_logprob_fn, model_param_shardings
from dynamo_jax.sharding.mesh import AXIS_NAMES, MeshConfig, build_mesh
from dynamo_jax.sharding.multihost import (
    DistributedConfig,
    initialize_distributed,
    is_primary,
    local_batch_rows,
    make_global_batch,
    sync_hosts,
)
from dynamo_jax.sharding.planner import format_report, plan, run_dry_run
from dynamo_jax.sharding.rules import DEFAULT_RULES
from dynamo_jax.sharding.state import (
    TrainState,
    abstract_train_state,
    init_train_state,
    train_state_from_params,
    train_state_shardings,
)
from dynamo_jax.sharding.step import make_train_step, train_fields

__all__ = [
    "AXIS_NAMES",
    "DEFAULT_RULES",
    "DistributedConfig",
    "MeshConfig",
    "TrainState",
    "abstract_train_state",
    "build_mesh",
    "format_report",
    "init_train_state",
    "initialize_distributed",
    "is_primary",
    "local_batch_rows",
    "make_global_batch",
    "make_logprob_fn",
    "make_train_step",
    "model_param_shardings",
    "plan",
    "run_dry_run",
    "sync_hosts",
    "train_fields",
    "train_state_from_params",
    "train_state_shardings",
]
