"""Sharding: meshes, logical-axis rules, multi-host helpers and the dry-run planner.

    initialize_distributed(DistributedConfig(...))        # multihost.py; no-op on one process
    mesh = build_mesh(mesh_cfg)                             # mesh.py: axes (data, fsdp, tensor)
    param_shardings(shapes, logical_axes, mesh, rules)      # rules.py: logical axes → mesh axes
    rows = local_batch_rows(batch_sh["tokens"], B)          # this process's slice of the batch
    batch = make_global_batch(local_rows_dict, batch_sh, B)

The jitted train step, the log-prob function and the train state that run on these meshes are
in `dynamo_jax/step/`. Rules and the replicate-when-indivisible choice for head counts: see
`rules.py`. Dry run for `launch.py --dry_run`: `run_dry_run(...)` and `format_report(...)` in
`planner.py`.
"""

from dynamo_jax.sharding.mesh import AXIS_NAMES, MeshConfig, build_mesh
from dynamo_jax.sharding.multihost import (
    DistributedConfig,
    initialize_distributed,
    is_primary,
    local_batch_rows,
    make_global_batch,
    sync_hosts,
)
from dynamo_jax.sharding.rules import DEFAULT_RULES

__all__ = [
    "AXIS_NAMES",
    "DEFAULT_RULES",
    "DistributedConfig",
    "MeshConfig",
    "build_mesh",
    "initialize_distributed",
    "is_primary",
    "local_batch_rows",
    "make_global_batch",
    "sync_hosts",
]
