"""The temperature schedules: one `TemperatureSchedule` each, in one table (chosen by name).

`TemperatureConfig.mode` names a schedule here (the shape every extension point shares,
`dynamo_jax.registry`): its own config keys (`settings`, a frozen dataclass; the running
schedule's record is `TemperatureConfig.settings`), whether it reads each batch's mean token
entropy (`reads_entropy`: the log-prob pass must then run, `RunConfig.first_update_on_policy`),
and its rule for the next temperature (`next_temperature(scheduler, mean_entropy, step) -> τ`,
called after the scheduler has recorded `step`; None: τ stays at `initial`), and `check(cfg)`,
the checks of the shared keys it relies on (raising ValueError). `scheduler.py`
registers the built-in ones ("fixed", "e3"); a new schedule is one more `register(...)` call.

This module imports nothing of the package but the generic registry, so `TemperatureConfig` can
validate names against it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from dynamo_jax.registry import NoSettings, Registry

# The keys every schedule shares (TemperatureConfig's own fields): no schedule's settings reuse them.
SHARED_KEYS = (
    "mode", "initial", "temperature_min", "temperature_max", "vocab_size", "total_steps",
)  # fmt: skip
SCHEDULES: Registry[TemperatureSchedule] = Registry("temperature schedule", shared=SHARED_KEYS)


@dataclasses.dataclass(frozen=True)
class TemperatureSchedule:
    """One schedule: its own config keys, whether it reads the entropy, and its rule."""

    name: str
    summary: str
    settings: type = NoSettings
    reads_entropy: bool = False
    next_temperature: Callable[[Any, float, int], float] | None = None
    check: Callable[[Any], None] | None = None  # checks of the shared keys it needs (cfg → raise)


# The table's own functions under the names every extension point's module exposes
# (register refuses a second entry under one name unless replace=True).
register, unregister, names, get = (
    SCHEDULES.register,
    SCHEDULES.unregister,
    SCHEDULES.names,
    SCHEDULES.get,
)
