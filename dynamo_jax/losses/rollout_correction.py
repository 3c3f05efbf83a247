"""Rollout correction: the trainer's π_old against the engine's sampling policy (docs/algorithm.md#rollout-correction).

The engine samples with its own kernels and numerics (bf16, the vLLM sidecar) and, with
staleness, may hold other weights than the π_old the trainer recomputes, so the tokens were not
drawn from π_old. Following verl's `algorithm.rollout_correction` (the decoupled mode: π_old from
the trainer, the engine's log-probs only for the correction), per token

    log ρ_t = log π_old(a_t) − log π_engine(a_t)    (0 off the trained tokens, clamped to ±20)

and two independent corrections:

- importance sampling (`is_level`): each token's policy-gradient loss is multiplied by the
  truncated, constant weight min(w, `is_threshold`), w = ρ_t ("token", verl's token TIS; TRL's
  vllm_importance_sampling_correction with its cap) or w = Π_t ρ_t of the token's sequence
  ("sequence");
- rejection (`rs_level`): tokens, or whole sequences, whose ratio lies outside
  [`rs_lower`, `rs_upper`] leave the loss mask: ρ_t ("token"), Π_t ρ_t ("sequence") or the
  geometric mean exp(mean_t log ρ_t) ("geometric"). The rejected tokens leave the normalisers
  too (the loss mask is what every aggregation counts), as in verl.

`correct(old_logp, engine_logp, mask, cfg)` is pure and jittable (`cfg` static); a row of its
[B, L] inputs is one sequence. Its metrics are over the trained tokens before rejection.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dynamo_jax import validate
from dynamo_jax.losses.batch import LOG_RATIO_CLAMP

IS_LEVELS = ("none", "token", "sequence")
RS_LEVELS = ("none", "token", "sequence", "geometric")


@dataclasses.dataclass(frozen=True)
class RolloutCorrection:
    """What the correction does (TrainConfig's rollout_is*/rollout_rs* fields, verl's names)."""

    is_level: str = "none"  # "none" | "token" | "sequence"
    is_threshold: float = 2.0  # the weights' upper truncation
    rs_level: str = "none"  # "none" | "token" | "sequence" | "geometric"
    rs_upper: float = 2.0  # a token or sequence is kept when rs_lower <= ratio <= rs_upper
    rs_lower: float | None = None  # None: 1 / rs_upper (verl's default)

    def __post_init__(self):
        validate.one_of("train", "rollout_is", self.is_level, IS_LEVELS)
        validate.one_of("train", "rollout_rs", self.rs_level, RS_LEVELS)
        ok = lambda v: validate.is_number(v) and math.isfinite(v) and v > 0
        validate.must(ok(self.is_threshold), "train", "rollout_is_threshold", "a finite number > 0",
                      self.is_threshold)  # fmt: skip
        validate.must(ok(self.rs_upper), "train", "rollout_rs_threshold", "a finite number > 0",
                      self.rs_upper)  # fmt: skip
        if self.rs_lower is not None:
            validate.must(ok(self.rs_lower) and self.rs_lower <= self.rs_upper, "train",
                          "rollout_rs_threshold_lower",
                          f"None or a number in (0, rollout_rs_threshold = {self.rs_upper}]",
                          self.rs_lower)  # fmt: skip

    @property
    def enabled(self) -> bool:
        return self.is_level != "none" or self.rs_level != "none"

    @property
    def weights(self) -> bool:
        """Whether the loss takes per-token IS weights."""
        return self.is_level != "none"

    @property
    def lower(self) -> float:
        return 1.0 / self.rs_upper if self.rs_lower is None else self.rs_lower


class Correction(NamedTuple):
    """What `correct` gives: [B, L] arrays and the step's scalar metrics."""

    is_weight: jax.Array  # f32: the truncated weight on trained tokens, 0 elsewhere (1 if IS off)
    mask: jax.Array  # f32 {0, 1}: the loss mask less the rejected tokens
    metrics: dict[str, jax.Array]


def _row_sum(x, mask):
    return jnp.sum(jnp.where(mask, x, 0.0), axis=-1, keepdims=True)


def correct(old_logp_BxL, engine_logp_BxL, mask_BxL, cfg: RolloutCorrection) -> Correction:
    """The IS weights, the rejection mask and the metrics (module docstring); rows = sequences.

    Metrics (over the trained tokens of `mask_BxL`, before rejection): `is_weight_mean`/`_max`
    of w before truncation (ρ_t, or the sequence's Π ρ_t on each of its tokens), with IS on
    `is_truncated_frac` (w > is_threshold), with rejection on `rs_masked_frac` (tokens) and
    `rs_seq_masked_frac` (sequences with a rejected token), and the mismatch KL(π_engine ‖ π_old)
    as verl estimates it: `kl` = mean(log π_engine − log π_old), `k3_kl` = mean(ρ − log ρ − 1).
    """
    mask = jnp.asarray(mask_BxL) > 0
    old = jnp.asarray(old_logp_BxL, jnp.float32)
    engine = jnp.asarray(engine_logp_BxL, jnp.float32)
    log_rho = jnp.clip(jnp.where(mask, old - engine, 0.0), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    seq_log_rho = jnp.clip(_row_sum(log_rho, mask), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    n_tokens = jnp.maximum(jnp.sum(mask), 1).astype(jnp.float32)
    mean = lambda x: jnp.sum(jnp.where(mask, x, 0.0)) / n_tokens
    maximum = lambda x: jnp.where(mask.any(), jnp.max(jnp.where(mask, x, -jnp.inf)), 0.0)

    log_w = seq_log_rho if cfg.is_level == "sequence" else log_rho
    w = jnp.broadcast_to(jnp.exp(log_w), mask.shape)
    metrics = {
        "is_weight_mean": mean(w),
        "is_weight_max": maximum(w),
        "kl": mean(engine - old),
        "k3_kl": mean(jnp.exp(log_rho) - log_rho - 1.0),
    }
    is_weight = jnp.ones(mask.shape, jnp.float32)
    if cfg.weights:
        is_weight = jnp.where(mask, jnp.minimum(w, cfg.is_threshold), 0.0)
        metrics["is_truncated_frac"] = mean(w > cfg.is_threshold)
    keep = mask
    if cfg.rs_level != "none":
        if cfg.rs_level == "token":
            stat = log_rho
        elif cfg.rs_level == "sequence":
            stat = seq_log_rho
        else:  # geometric: the mean log-ratio of the sequence
            count = jnp.maximum(_row_sum(jnp.ones_like(log_rho), mask), 1.0)
            stat = _row_sum(log_rho, mask) / count
        inside = (stat >= math.log(cfg.lower)) & (stat <= math.log(cfg.rs_upper))
        keep = mask & jnp.broadcast_to(inside, mask.shape)
        rejected = mask & ~keep
        has_tokens = mask.any(axis=-1)
        metrics["rs_masked_frac"] = mean(rejected)
        metrics["rs_seq_masked_frac"] = jnp.sum(rejected.any(axis=-1)) / jnp.maximum(
            jnp.sum(has_tokens), 1
        ).astype(jnp.float32)
    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
    return Correction(is_weight, keep.astype(jnp.float32), metrics)
