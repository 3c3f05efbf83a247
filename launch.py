"""Train (or resume) a run: the command-line entry point.

    python launch.py --config configs/tiny.py --workdir workdirs/tiny
    python launch.py --config configs/qwen25_math_7b.py:baseline=clip_higher --workdir W --dry_run
    python launch.py --config configs/tiny.py --workdir W --config.train.steps=20

The config file is an ml_collections file (`file.py:arg` passes `arg` to its `get_config`), locked
so a misspelt override fails. A workdir holding checkpoints is resumed from its latest one.
`--dry_run` builds the mesh, shardings and the jitted step on abstract shapes and prints the
memory plan, without loading weights or data.

Multi-process (one process per host, same command everywhere, a workdir all hosts can reach):

    JAX_COORDINATOR_ADDRESS=host0:1234 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=<0|1> \
        python launch.py --config configs/tiny.py --workdir W --config.mesh.shape='(1,2,1)'

Without those variables the run is single-process.
"""

import os

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "ml_collections config file (configs/*.py[:arg]).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, plots.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Plan shardings and memory on abstract shapes only.")
flags.mark_flags_as_required(["config"])


def main(argv):
    del argv
    if not flags.FLAGS["verbosity"].present:
        # orbax and absl log every checkpoint step at INFO; the progress bar has the figures.
        absl_logging.set_verbosity(absl_logging.WARNING)
    # JAX fixes its share of accelerator memory when its backend starts, so set it from the
    # config (rollout.jax_memory_fraction, docs/vllm_sidecar.md) before anything can start it.
    from dynamo_jax.config import build_section

    os.environ.update(build_section("rollout", _CONFIG.value.rollout).jax_memory_env(os.environ))
    if not _DRY_RUN.value:
        # Join the job before any JAX computation (a no-op without the JAX_* variables). The dry
        # run simulates its devices in a subprocess of its own and never joins.
        from dynamo_jax.sharding.multihost import DistributedConfig, initialize_distributed

        initialize_distributed(DistributedConfig())
    from dynamo_jax import train
    from dynamo_jax.config import from_config_dict

    run_config = from_config_dict(_CONFIG.value)
    if _DRY_RUN.value:
        train.dry_run(run_config)
        return
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required unless --dry_run")
    train.run(run_config, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
