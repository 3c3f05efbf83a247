"""The frozen, validated config of the sampling temperature: a registered schedule (fixed, E3).

docs/algorithm.md#temperature-scheduler (E3 Eq. 4 + Eq. 5). `dynamo_jax/config.py` maps the
ConfigDict section `temperature` onto this class; nothing else reads it by key.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dynamo_jax import validate
from dynamo_jax.registry import flat_fields, flat_values, init_flat
from dynamo_jax.temperature import registry

_require = validate.require  # (ok, class name, field, message)


@dataclasses.dataclass(frozen=True, init=False)
class TemperatureConfig:
    """Sampling temperature: a registered schedule (`mode`: "fixed", or E3's entropy-holding
    scheduler, Eq. 4 + Eq. 5; temperature/registry.py) and the keys every schedule shares; the
    schedule's own keys (E3: `init_steps`, `anneal`, `anneal_start_frac`, `eta`) are its
    settings record, `settings`.

    `vocab_size` and `total_steps` are not config keys: the run config derives them from
    `model.vocab_size` (the E3 gain's |V|) and `train.steps` (Eq. 5's t_max) (config.DERIVED).
    `temperature_min`/`temperature_max` clamp the scheduled temperature (a safety net the
    paper does not have; Eq. 4 can overshoot when entropy jumps).
    """

    mode: str = "fixed"  # a registered temperature schedule
    initial: float = 1.0  # τ_0
    temperature_min: float = 0.1
    temperature_max: float = 2.0
    vocab_size: int | None = None  # |V| (derived: model.vocab_size)
    total_steps: int | None = None  # t_max of Eq. 5 (derived: train.steps)
    settings: Any = None  # the schedule's own keys (registry.init_flat builds it)

    def __init__(self, **values: Any):
        init_flat(self, registry.SCHEDULES, "mode", values, "TemperatureConfig")
        self.__post_init__()

    def __post_init__(self):
        c = "TemperatureConfig"
        _require(
            math.isfinite(self.initial) and self.initial > 0,
            c,
            "initial",
            f"must be a finite temperature > 0, got {self.initial}",
        )
        _require(
            0 < self.temperature_min <= self.temperature_max,
            c,
            "temperature_min",
            f"need 0 < temperature_min <= temperature_max, got "
            f"[{self.temperature_min}, {self.temperature_max}]",
        )
        _require(
            self.temperature_min <= self.initial <= self.temperature_max,
            c,
            "initial",
            f"{self.initial} lies outside [temperature_min={self.temperature_min}, "
            f"temperature_max={self.temperature_max}]",
        )
        check = registry.get(self.mode).check
        if check is not None:
            check(self)

    @property
    def reads_entropy(self) -> bool:
        """Whether the schedule reads each batch's mean token entropy (from the log-prob pass)."""
        return registry.get(self.mode).reads_entropy

    @classmethod
    def flat_fields(cls) -> dict[str, tuple[Any, Any]]:
        """The section's fields (config.py builds it from these, less the derived ones): the
        shared keys, then every registered schedule's own keys."""
        return flat_fields(cls, registry.SCHEDULES)

    def flat(self) -> dict[str, Any]:
        """The section's flat keys as a config file holds them, with the derived values."""
        return flat_values(self, registry.SCHEDULES)
