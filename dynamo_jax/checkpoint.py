"""Save and restore everything a run needs to continue exactly where it stopped.

A checkpoint is one orbax step directory with three items:
- `state`: the device pytree (parameters, optimizer state, step, base RNG key), restored onto the
  shardings of an abstract template so a resumed run lands on the same mesh layout;
- `host`: host-side NumPy trees (data-iterator state, allocator history, temperature-scheduler
  state). They hold arrays, so they go in a `StandardSave` item (`JsonSave` cannot hold arrays);
- `meta`: JSON (the resolved config and small scalars), for humans and for checking that a
  resumed run uses the config it was started with.

Atomicity: orbax writes each step into a temporary directory and renames it on commit, so a run
killed mid-save leaves no half-written step that `latest_step` would pick up. A step that is
damaged anyway (disk error, hand-edited files) fails to restore; `restore_latest` then falls back
to the previous step and says so. `save` refuses state with NaN/Inf, so a corrupted update can
never become the checkpoint a later run resumes from.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """When and how to checkpoint."""

    every_steps: int = 50  # save every this many optimizer steps (and at the end / on Ctrl-C)
    max_to_keep: int = 3  # older steps are deleted once a newer one is committed
    async_save: bool = False  # overlap writing with training (waits before the next save/exit)

    def __post_init__(self):
        if self.every_steps < 1:
            raise ValueError(f"checkpoint.every_steps must be >= 1, got {self.every_steps}")
        if self.max_to_keep < 1:
            raise ValueError(f"checkpoint.max_to_keep must be >= 1, got {self.max_to_keep}")


@dataclasses.dataclass
class Restored:
    """What `Checkpointer.restore_latest` found."""

    step: int
    state: Any  # device pytree, same structure and shardings as the template
    host: dict  # NumPy trees as saved
    meta: dict  # JSON as saved


class NonFiniteStateError(ValueError):
    """Raised instead of writing a checkpoint whose state holds NaN or Inf."""


def _nonfinite_paths(tree: Any) -> list[str]:
    """Key paths of floating leaves that hold a NaN or Inf (checked on device, fetched once)."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    checks = {}
    for path, leaf in leaves:
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and jnp.issubdtype(dtype, jnp.floating):
            checks[jax.tree_util.keystr(path)] = jnp.all(jnp.isfinite(leaf))
    fetched = jax.device_get(checks)
    return [name for name, ok in fetched.items() if not bool(ok)]


def _to_numpy_tree(tree: Any) -> Any:
    """Python scalars → 0-d arrays so orbax stores (and restores) every host leaf as an array."""
    return jax.tree.map(np.asarray, tree)


class Checkpointer:
    """orbax CheckpointManager with the run's three items and a damaged-step fallback."""

    def __init__(self, directory: str | Path, config: CheckpointConfig):
        self.directory = Path(directory).absolute()
        self.config = config
        options = ocp.CheckpointManagerOptions(
            max_to_keep=config.max_to_keep,
            create=True,
            enable_async_checkpointing=config.async_save,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, *, state: Any, host: dict, meta: dict) -> None:
        """Write step `step`; raises `NonFiniteStateError` (writing nothing) if state is not finite."""
        bad = _nonfinite_paths(state)
        if bad:
            raise NonFiniteStateError(
                f"refusing to checkpoint step {step}: non-finite values in {', '.join(bad[:5])}"
            )
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            host=ocp.args.StandardSave(_to_numpy_tree(host)),
            meta=ocp.args.JsonSave(meta),
        )
        # force=True: the caller decides when to save (every M steps, at the end, on Ctrl-C).
        self._manager.save(step, args=args, force=True)

    def restore(self, step: int, abstract_state: Any) -> Restored:
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            host=ocp.args.StandardRestore(),
            meta=ocp.args.JsonRestore(),
        )
        out = self._manager.restore(step, args=args)
        return Restored(step=step, state=out["state"], host=dict(out["host"]), meta=out["meta"])

    def restore_latest(self, abstract_state: Any) -> Restored | None:
        """Newest step that restores cleanly; damaged newer steps are reported and skipped."""
        self.wait()
        for step in reversed(self.all_steps()):
            try:
                return self.restore(step, abstract_state)
            except Exception as err:  # orbax raises many types for damaged files
                log.warning(
                    "checkpoint step %d in %s is damaged (%s: %s); trying the previous one",
                    step,
                    self.directory,
                    type(err).__name__,
                    str(err)[:200],
                )
        return None

    def wait(self) -> None:
        """Block until an async save has been committed."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def abstract_like(state: Any) -> Any:
    """Shape/dtype/sharding template of `state` for `Checkpointer.restore`."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
