"""The tiny-config run helpers tests/test_loop_train.py and tests/test_loop_train_async.py share."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from configs import tiny
from dynamo_jax.checkpoint import CheckpointConfig, Checkpointer, abstract_like
from dynamo_jax.config import from_config_dict
from dynamo_jax.step.optimizer import make_optimizer

ROOT = Path(__file__).resolve().parents[2]
# Metrics that measure wall-clock time differ between runs; everything else must not.
TIMING_PREFIXES = ("time/", "perf/tokens_per_s")


def _quiet(config):
    config.logging.progress_bar = False
    config.logging.tensorboard = False
    return config


def _short_config(method="e3", steps=10, every=3):
    """The tiny config, shortened; e3 so the temperature scheduler and epoch hooks are live."""
    config = _quiet(tiny.get_config(f"method={method}"))
    config.train.steps = steps
    config.checkpoint.every_steps = every
    config.checkpoint.max_to_keep = 2
    config.logging.plots_at_end = False
    config.eval.every_steps = 0
    return config


def _deterministic(records):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in records]


def _final_state(workdir, config):
    """(step, params as export reads them, everything restored) of the newest checkpoint."""
    from dynamo_jax.export import restore_params

    cfg = from_config_dict(config)
    step, params = restore_params(Path(workdir), cfg, None)
    ckpt = Checkpointer(Path(workdir) / "checkpoints", CheckpointConfig(), read_only=True)
    restored = ckpt.restore(step, _abstract(cfg))
    ckpt.close()
    return step, params, restored


def _abstract(cfg):
    """The checkpoint's device items as a template on one device."""
    from dynamo_jax.step.state import abstract_train_state

    optimizer = make_optimizer(cfg.optim, cfg.total_updates)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    place = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device)
    state = jax.tree.map(place, abstract_train_state(cfg.model, optimizer))
    progress = {"step": state.step, "rng": abstract_like(jax.random.key(cfg.train.seed))}
    return {"params": state.params, "opt_state": state.opt_state, "progress": progress}


def _assert_same_tree(a, b):
    for (path, x), y in zip(
        jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True
    ):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), jax.tree_util.keystr(path))


# launch.py flags of a short e3 run on the tiny config (kill/resume tests).
LAUNCH_ARGS = (
    f"--config={ROOT / 'configs' / 'tiny.py'}:method=e3",
    "--config.checkpoint.max_to_keep=2",
    "--config.logging.progress_bar=False",
    "--config.logging.tensorboard=False",
    "--config.logging.plots_at_end=False",
    "--config.eval.every_steps=0",
)
