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

import math

import numpy as np

from dynamo_jax.temperature.config import TemperatureConfig


class TemperatureScheduler:
    """Holds τ, H_init and the last step; `state_dict()` goes into the checkpoint."""

    def __init__(self, cfg: TemperatureConfig):
        self.cfg = cfg
        self.temperature = float(cfg.initial)
        self.h_init = math.nan  # set once the init batches are in
        self.init_sum = 0.0
        self.init_count = 0
        self.last_step = -1
        if cfg.mode == "e3":
            v = float(cfg.vocab_size)
            self.gain_denominator = math.log(v) + math.log(math.log(v))

    def current(self) -> float:
        """The temperature to sample the next batch at."""
        return self.temperature

    def target_entropy(self, step: int) -> float:
        """H_target(step): H_init before t_anneal (or without annealing), Eq. 5 after."""
        cfg = self.cfg
        if not cfg.anneal or step < cfg.anneal_start_step:
            return self.h_init
        start, end = cfg.anneal_start_step, cfg.total_steps
        progress = min(1.0, (step - start) / (end - start))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.h_init * (cfg.eta + (1.0 - cfg.eta) * cosine)

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
        if self.cfg.mode == "fixed":
            return self.temperature
        if self.init_count < self.cfg.init_steps:
            self.init_sum += h
            self.init_count += 1
            if self.init_count == self.cfg.init_steps:
                self.h_init = self.init_sum / self.init_count
            return self.temperature
        tau = self.temperature
        ratio = self.target_entropy(step + 1) / h
        tau = tau * (1.0 + tau * math.log(ratio) / self.gain_denominator)
        self.temperature = float(np.clip(tau, self.cfg.temperature_min, self.cfg.temperature_max))
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
