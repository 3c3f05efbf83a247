"""Sampling temperature: fixed, or E3's entropy-holding scheduler (E3 Eq. 4 + Eq. 5).

    τ_{t+1} = τ_t · (1 + τ_t · ln(H_target / H_t) / (ln|V| + ln ln|V|))

H_t is the mean token entropy of batch t (computed at that batch's temperature, docs/algorithm.md#log-probabilities-and-entropy), H_init
the mean over the first `init_steps` batches (τ stays at its initial value meanwhile). With
annealing, the target follows Eq. 5 from t_anneal = ⌊anneal_start_frac · t_max⌋:

    H_target(t) = H_init · [η + (1 − η) · ½(1 + cos(π (t − t_anneal) / (t_max − t_anneal)))]

Step convention: `update(H_t, t)` is called with the entropy of the batch of step t (0-based)
and sets the temperature for step t + 1, aiming at H_target(t + 1). **Choice**: the authors'
code applies the step-t target one step late; here each batch aims at its own target.
The scheduled τ is clamped to [temperature_min, temperature_max] (a safety net the paper has
not got: Eq. 4 can go negative when H_t ≫ H_target).

**Code differs** (E3's `TemperatureScheduler`, LiaoMengqi/E3-RL4LLMs at 7e90b8e):
- annealing starts at t_max − int(0.4 · t_max), the ceiling of 0.6 · t_max where the paper's
  ⌊0.6 · t_max⌋ is used here (`anneal_start_frac`), and their target moves after τ is
  updated, so each step aims at the previous step's target (the Choice above);
- τ is not clamped;
- the entropy fed to it is the actor's `entropy_loss` metric, which is only computed when the
  entropy coefficient is non-zero; the released scripts set it to 0, so their temperature
  never changes (docs/algorithm.md#temperature-scheduler). Here every batch's mean token entropy is used.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dynamo_jax import validate
from dynamo_jax.temperature.config import TemperatureConfig
from dynamo_jax.temperature.registry import TemperatureSchedule, get, register

_require = validate.require  # (ok, class name, field, message)


@dataclasses.dataclass(frozen=True)
class E3Settings:
    """E3's own keys (Eq. 4 + Eq. 5)."""

    init_steps: int = 1  # H_init = mean entropy of the first `init_steps` batches
    anneal: bool = False  # cosine annealing of the entropy target (Eq. 5)
    anneal_start_frac: float = 0.6  # t_anneal = ⌊frac · total_steps⌋
    eta: float = 0.9  # final target = eta · H_init

    def __post_init__(self):
        c = "TemperatureConfig"
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

    def anneal_start_step(self, total_steps: int) -> int:
        """t_anneal = ⌊anneal_start_frac · t_max⌋ (guarded against 0.6·10 = 5.999… rounding)."""
        return int(math.floor(self.anneal_start_frac * total_steps + 1e-9))


def _e3_check(cfg: TemperatureConfig) -> None:
    """E3's gain needs |V|, and Eq. 5 the run's length (both derived by the run config)."""
    c, v = "TemperatureConfig", cfg.vocab_size
    _require(
        isinstance(v, int) and v >= 2,
        c,
        "vocab_size",
        f"mode 'e3' needs the vocabulary size (an int >= 2), got {v!r}",
    )
    if cfg.settings.anneal:
        t = cfg.total_steps
        _require(
            isinstance(t, int) and t >= 1,
            c,
            "total_steps",
            f"anneal=True needs the run's total step count (int >= 1), got {t!r}",
        )


def _e3_target_entropy(s: TemperatureScheduler, step: int) -> float:
    """H_target(step): H_init before t_anneal (or without annealing), Eq. 5 after."""
    cfg = s.cfg
    own = cfg.settings
    start = own.anneal_start_step(cfg.total_steps or 0)
    if not own.anneal or step < start:
        return s.h_init
    progress = min(1.0, (step - start) / (cfg.total_steps - start))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return s.h_init * (own.eta + (1.0 - own.eta) * cosine)


def _e3_next(s: TemperatureScheduler, h: float, step: int) -> float:
    """Eq. 4 once H_init is known (the first `init_steps` batches only measure it)."""
    cfg = s.cfg
    if s.init_count < cfg.settings.init_steps:
        s.init_sum += h
        s.init_count += 1
        if s.init_count == cfg.settings.init_steps:
            s.h_init = s.init_sum / s.init_count
        return s.temperature
    v = float(cfg.vocab_size)
    gain_denominator = math.log(v) + math.log(math.log(v))
    tau = s.temperature
    ratio = _e3_target_entropy(s, step + 1) / h
    tau = tau * (1.0 + tau * math.log(ratio) / gain_denominator)
    return float(np.clip(tau, cfg.temperature_min, cfg.temperature_max))


register(TemperatureSchedule("fixed", "τ stays at `initial`"))
register(
    TemperatureSchedule(
        "e3",
        "E3's entropy-holding scheduler (Eq. 4), with the annealed target of Eq. 5",
        settings=E3Settings,
        reads_entropy=True,
        next_temperature=_e3_next,
        check=_e3_check,
    )
)


class TemperatureScheduler:
    """Holds τ, H_init and the last step; `state_dict()` goes into the checkpoint. The running
    schedule's rule (`TemperatureConfig.mode`, temperature/registry.py) sets each next τ."""

    def __init__(self, cfg: TemperatureConfig):
        self.cfg = cfg
        self.schedule = get(cfg.mode)
        self.temperature = float(cfg.initial)
        self.h_init = math.nan  # set once the init batches are in
        self.init_sum = 0.0
        self.init_count = 0
        self.last_step = -1

    def current(self) -> float:
        """The temperature to sample the next batch at."""
        return self.temperature

    def target_entropy(self, step: int) -> float:
        """E3's H_target(step) (docs/algorithm.md#temperature-scheduler)."""
        return _e3_target_entropy(self, step)

    def update(self, mean_entropy: float, step: int) -> float:
        """Fold in batch `step`'s mean token entropy; returns the temperature for step + 1."""
        if step <= self.last_step:
            raise ValueError(
                f"TemperatureScheduler.update: step {step} is not after the last "
                f"step seen ({self.last_step})"
            )
        h = float(mean_entropy)
        if not (math.isfinite(h) and h > 0):
            raise ValueError(
                f"TemperatureScheduler.update: mean_entropy at step {step} must be "
                f"finite and > 0, got {mean_entropy!r}"
            )
        self.last_step = int(step)
        rule = self.schedule.next_temperature
        if rule is not None:
            self.temperature = rule(self, h, step)
        return self.temperature

    def state_dict(self) -> dict[str, np.ndarray]:
        return {
            "temperature": np.asarray(self.temperature, dtype=np.float64),
            "h_init": np.asarray(self.h_init, dtype=np.float64),
            "init_sum": np.asarray(self.init_sum, dtype=np.float64),
            "init_count": np.asarray(self.init_count, dtype=np.int64),
            "last_step": np.asarray(self.last_step, dtype=np.int64),
        }

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        expected = {"temperature", "h_init", "init_sum", "init_count", "last_step"}
        if set(state) != expected:
            raise ValueError(
                f"TemperatureScheduler state: missing {sorted(expected - set(state))}"
                f", unexpected {sorted(set(state) - expected)}"
            )
        self.temperature = float(np.asarray(state["temperature"]))
        self.h_init = float(np.asarray(state["h_init"]))
        self.init_sum = float(np.asarray(state["init_sum"]))
        self.init_count = int(np.asarray(state["init_count"]))
        self.last_step = int(np.asarray(state["last_step"]))
