"""The run's `checkpoint` section: when and how checkpoint.py saves.

Apart from the orbax module, so that config.py (and everything that only reads a config) does not
load orbax.
"""

from __future__ import annotations

import dataclasses

from dynamo_jax import validate


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """When and how to checkpoint."""

    every_steps: int = 50  # save every this many optimizer steps (and at the end / on Ctrl-C)
    max_to_keep: int = 3  # older steps are deleted once a newer one is committed
    async_save: bool = False  # overlap writing with training (waits before the next save/exit)

    def __post_init__(self):
        for name in ("every_steps", "max_to_keep"):
            value = getattr(self, name)
            validate.must(value >= 1, "checkpoint", name, ">= 1", value)
