"""The frozen, validated config of the sampling temperature: fixed, or E3's scheduler.

docs/algorithm.md#temperature-scheduler (E3 Eq. 4 + Eq. 5). `dynamo_jax/config.py` maps the
ConfigDict section `temperature` onto this class; nothing else reads it by key.
"""

from __future__ import annotations

import dataclasses
import math

from dynamo_jax import validate

_require = validate.require  # (ok, class name, field, message)

MODES = ("fixed", "e3")


@dataclasses.dataclass(frozen=True)
class TemperatureConfig:
    """Sampling temperature: fixed, or the E3 entropy-holding scheduler (Eq. 4 + Eq. 5).

    The E3 update uses ln|V| + ln ln|V|, so `vocab_size` must be the policy's vocabulary size.
    `temperature_min`/`temperature_max` clamp the scheduled temperature (a safety net the
    paper does not have; Eq. 4 can overshoot when entropy jumps).
    """

    mode: str = "fixed"
    initial: float = 1.0  # τ_0
    init_steps: int = 1  # H_init = mean entropy of the first `init_steps` batches
    vocab_size: int | None = None  # |V|; required for mode "e3"
    anneal: bool = False  # cosine annealing of the entropy target (Eq. 5)
    anneal_start_frac: float = 0.6  # t_anneal = ⌊frac · total_steps⌋
    eta: float = 0.9  # final target = eta · H_init
    total_steps: int | None = None  # t_max of Eq. 5; required when anneal=True
    temperature_min: float = 0.1
    temperature_max: float = 2.0

    def __post_init__(self):
        c = "TemperatureConfig"
        _require(
            self.mode in MODES,
            c,
            "mode",
            f"{self.mode!r} not one of {MODES}",
        )
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
        _require(
            isinstance(self.init_steps, int) and self.init_steps >= 1,
            c,
            "init_steps",
            f"must be an int >= 1, got {self.init_steps!r}",
        )
        _require(0.0 <= self.eta < 1.0, c, "eta", f"must be in [0, 1), got {self.eta}")
        _require(
            0.0 <= self.anneal_start_frac < 1.0,
            c,
            "anneal_start_frac",
            f"must be in [0, 1), got {self.anneal_start_frac}",
        )
        if self.mode == "e3":
            v = self.vocab_size
            _require(
                isinstance(v, int) and v >= 2,
                c,
                "vocab_size",
                f"mode 'e3' needs the vocabulary size (an int >= 2), got {v!r}",
            )
        if self.anneal:
            _require(self.mode == "e3", c, "anneal", "annealing needs mode 'e3'")
            t = self.total_steps
            _require(
                isinstance(t, int) and t >= 1,
                c,
                "total_steps",
                f"anneal=True needs the run's total step count (int >= 1), got {t!r}",
            )

    @property
    def anneal_start_step(self) -> int:
        """t_anneal = ⌊anneal_start_frac · t_max⌋ (guarded against 0.6·10 = 5.999… rounding)."""
        return int(math.floor(self.anneal_start_frac * (self.total_steps or 0) + 1e-9))
