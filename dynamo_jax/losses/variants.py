"""The built-in loss variants: GRPO, DynaMO and the Table 1 baselines (docs/algorithm.md#policy-loss, docs/algorithm.md#advantage-modulation, docs/algorithm.md#baselines).

One `LossVariant` record each (losses/registry.py explains the fields), registered here at import,
with its own settings record (the frozen `*Settings` dataclasses below: its config keys, their
defaults and their checks). Adding a baseline is one more record in this file (or a
`register(...)` call anywhere, e.g. a test): nothing else in the package names baselines.

Published defaults and their sources:
  grpo:         DeepSeekMath (Shao et al. 2024), ε = 0.2 both sides; token-mean as in DynaMO.
  dynamo:       DynaMO authors' scripts: ε_low 0.2, effective ε_high 0.28 (their 0.2 × 1.4),
                dual clip c = 10, tied α = 0.4, γ = 50, τ = 0.9.
  clip_higher:  DAPO (Yu et al. 2025), ε_low 0.2, ε_high 0.28.
  entropy_loss: verl's entropy_coeff default 1e-3.
  fork_tokens:  "Beyond the 80/20 Rule" (Wang et al. 2025), top ρ = 20% entropy tokens.
  entropy_adv:  "Reasoning with Exploration: An Entropy Perspective" (Cheng et al. 2025),
                κ_1 = 0.4, κ_2 = 2.
  clip_cov, kl_cov: "The Entropy Mechanism of RL for Reasoning LMs" (Cui et al. 2025):
                Clip-Cov r = 2e-4, ω ∈ (1, 5); KL-Cov k = 2e-3 (Qwen2.5-7B), β = 1.
  w_reinforce:  "The Surprising Effectiveness of Negative Reinforcement" (Zhu et al. 2025), λ = 0.1.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
from jax import lax

from dynamo_jax import validate
from dynamo_jax.losses import baselines
from dynamo_jax.losses.advantages import w_reinforce_advantages
from dynamo_jax.losses.batch import as_mask, log_ratio, masked_mean
from dynamo_jax.losses.modulation import modulate, modulation_stats
from dynamo_jax.losses.policy import clipped_surrogate
from dynamo_jax.losses.registry import LossVariant, names, register

_NO_DUAL = dict(dual_clip=None)


def _check(name: str, ok: bool, what: str, value) -> None:
    validate.must(ok, "LossConfig", name, what, value)  # errors name the flat key


ENTROPY_CHANGE_MODES = ("exact", "sequence_mean")
STATS_SCOPES = ("global", "micro_batch")


@dataclasses.dataclass(frozen=True)
class DynamoSettings:
    """DynaMO's modulation (docs/algorithm.md#advantage-modulation)."""

    enable_gc: bool = True
    enable_ums: bool = True
    alpha: float = 0.4
    alpha_comp: float | None = None  # α_c of gradient compensation; None: tied to alpha
    alpha_stab: float | None = None  # α_s of UMS (λ_min = 1 − α_s); None: tied to alpha
    gamma: float = 50.0
    ums_tau: float = 0.9  # UMS threshold on the normalised |ΔH| (not a temperature)
    entropy_change: str = "exact"
    stats_scope: str = "global"

    def __post_init__(self):
        validate.one_of("LossConfig", "entropy_change", self.entropy_change, ENTROPY_CHANGE_MODES)
        validate.one_of("LossConfig", "stats_scope", self.stats_scope, STATS_SCOPES)
        for name in ("alpha", "alpha_comp"):
            v = getattr(self, name)
            _check(name, v is None or v >= 0.0, ">= 0", v)
        v = self.alpha_stab
        _check("alpha_stab", v is None or 0.0 <= v <= 1.0, "in [0, 1] (λ_min = 1 − α_s)", v)
        _check("alpha", self.alpha_stab is not None or self.alpha <= 1.0,
               "<= 1 when alpha_stab is tied to it (λ_min = 1 − α)", self.alpha)  # fmt: skip
        _check("gamma", self.gamma >= 0.0 and math.isfinite(self.gamma), "finite, >= 0", self.gamma)
        _check("ums_tau", math.isfinite(self.ums_tau), "finite", self.ums_tau)

    def alphas(self) -> tuple[float, float]:
        """(α_c, α_s): `alpha_comp` and `alpha_stab`, each `alpha` where unset."""
        tied = lambda v: self.alpha if v is None else v
        return tied(self.alpha_comp), tied(self.alpha_stab)


@dataclasses.dataclass(frozen=True)
class EntropyLossSettings:
    entropy_coef: float = 1e-3

    def __post_init__(self):
        _check("entropy_coef", self.entropy_coef >= 0.0, ">= 0", self.entropy_coef)


@dataclasses.dataclass(frozen=True)
class ForkTokensSettings:
    fork_top_ratio: float = 0.2

    def __post_init__(self):
        _check("fork_top_ratio", 0.0 < self.fork_top_ratio <= 1.0, "in (0, 1]",
               self.fork_top_ratio)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class EntropyAdvSettings:
    ent_adv_kappa1: float = 0.4
    ent_adv_kappa2: float = 2.0

    def __post_init__(self):
        _check("ent_adv_kappa1", self.ent_adv_kappa1 >= 0.0, ">= 0", self.ent_adv_kappa1)
        _check("ent_adv_kappa2", self.ent_adv_kappa2 > 0.0, "> 0", self.ent_adv_kappa2)


@dataclasses.dataclass(frozen=True)
class ClipCovSettings:
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0

    def __post_init__(self):
        _check("clip_cov_ratio", 0.0 < self.clip_cov_ratio <= 1.0, "in (0, 1]",
               self.clip_cov_ratio)  # fmt: skip
        _check(
            "clip_cov_ub", self.clip_cov_ub > self.clip_cov_lb, "> clip_cov_lb", self.clip_cov_ub
        )


@dataclasses.dataclass(frozen=True)
class KlCovSettings:
    kl_cov_ratio: float = 2e-3
    kl_cov_coef: float = 1.0

    def __post_init__(self):
        _check("kl_cov_ratio", 0.0 < self.kl_cov_ratio <= 1.0, "in (0, 1]", self.kl_cov_ratio)
        _check("kl_cov_coef", self.kl_cov_coef >= 0.0, ">= 0", self.kl_cov_coef)


@dataclasses.dataclass(frozen=True)
class WReinforceSettings:
    w_reinforce_lambda: float = 0.1

    def __post_init__(self):
        _check("w_reinforce_lambda", self.w_reinforce_lambda >= 0.0, ">= 0",
               self.w_reinforce_lambda)  # fmt: skip


def _surrogate(adv_hat, r, cfg):
    return clipped_surrogate(adv_hat, r, cfg.clip_low, cfg.clip_high, cfg.dual_clip)


def _ones(batch):
    return jnp.ones_like(batch.adv, dtype=jnp.float32)


# ----------------------------------------------------------------------------- DynaMO (docs/algorithm.md#advantage-modulation)


def _dynamo_statistics(batch, n_tokens, cfg):
    h_min, h_max, xi_max = modulation_stats(batch, cfg)
    return {"h_min": h_min, "h_max": h_max, "xi_max": xi_max}


def _dynamo_advantages(batch, stats, cfg):
    h_min, h_max, xi_max = stats.h_min, stats.h_max, stats.xi_max
    # the authors' scope: docs/algorithm.md#scope-of-the-statistics
    if cfg.settings.stats_scope == "micro_batch":
        h_min, h_max, xi_max = modulation_stats(batch, cfg)
    return modulate(batch, h_min, h_max, xi_max, cfg)


# ----------------------------------------------------------------------------- baselines (docs/algorithm.md#baselines)


def _entropy_adv_advantages(batch, stats, cfg):
    adv = baselines.entropy_adv_advantage(
        batch.adv, batch.ent, cfg.settings.ent_adv_kappa1, cfg.settings.ent_adv_kappa2
    )
    return adv, _ones(batch), _ones(batch)


def _entropy_bonus(batch, mask, stats, cfg, aggregate):
    return "entropy_loss", aggregate(batch.ent, mask, stats, cfg), -cfg.settings.entropy_coef


def _fork_statistics(batch, n_tokens, cfg):
    mask = as_mask(batch.mask)
    return {"threshold": baselines.fork_threshold(batch.ent, mask, cfg.settings.fork_top_ratio)}


def _fork_token_loss(batch, stats, adv_hat, r, log_r, cfg):
    return jnp.where(
        lax.stop_gradient(batch.ent) >= stats.threshold, _surrogate(adv_hat, r, cfg), 0.0
    )


def _covariance_means(batch):
    mask = as_mask(batch.mask)
    return masked_mean(batch.logp, mask), masked_mean(batch.adv, mask)


def _clip_cov_statistics(batch, n_tokens, cfg):
    logp_mean, adv_mean = _covariance_means(batch)
    r = jnp.exp(log_ratio(batch.logp, batch.old_logp, as_mask(batch.mask)))
    threshold = baselines.clip_cov_threshold(batch, r, logp_mean, adv_mean, n_tokens, cfg)
    return {"logp_mean": logp_mean, "adv_mean": adv_mean, "threshold": threshold}


def _clip_cov_token_loss(batch, stats, adv_hat, r, log_r, cfg):
    r_sg = lax.stop_gradient(r)
    cand = baselines.clip_cov_candidates(batch, r_sg, stats.logp_mean, stats.adv_mean, cfg)
    detached = cand & (baselines.require_noise(batch) <= stats.threshold)
    return jnp.where(detached, 0.0, _surrogate(adv_hat, r, cfg))


def _kl_cov_statistics(batch, n_tokens, cfg):
    logp_mean, adv_mean = _covariance_means(batch)
    cut, tie_cut = baselines.kl_cov_cuts(batch, logp_mean, adv_mean, n_tokens, cfg)
    return {"logp_mean": logp_mean, "adv_mean": adv_mean, "threshold": cut, "tie_cut": tie_cut}


def _kl_cov_token_loss(batch, stats, adv_hat, r, log_r, cfg):
    penalised = baselines.kl_cov_selected(
        batch, stats.logp_mean, stats.adv_mean, stats.threshold, stats.tie_cut
    )
    penalty = cfg.settings.kl_cov_coef * baselines.abs_zero_at_zero(log_r)
    return -adv_hat * r + jnp.where(penalised, penalty, 0.0)


def _w_reinforce_advantages(cfg, rewards_B, group_ids_B, num_groups, valid_B):
    return w_reinforce_advantages(rewards_B, lam=cfg.settings.w_reinforce_lambda, valid_B=valid_B)


register(
    LossVariant(
        "grpo", "DeepSeekMath (Shao et al. 2024)", dict(clip_low=0.2, clip_high=0.2, **_NO_DUAL)
    )
)
register(
    LossVariant(
        "dynamo",
        "DynaMO (arXiv 2602.19208), the authors' scripts",
        dict(clip_low=0.2, clip_high=0.28, dual_clip=10.0, alpha=0.4, gamma=50.0, ums_tau=0.9),
        token_advantages=_dynamo_advantages,
        statistics=_dynamo_statistics,
        settings=DynamoSettings,
        needs_k=lambda cfg: cfg.settings.enable_ums and cfg.settings.entropy_change == "exact",
    )
)
register(
    LossVariant(
        "clip_higher", "DAPO (Yu et al. 2025)", dict(clip_low=0.2, clip_high=0.28, **_NO_DUAL)
    )
)
register(
    LossVariant(
        "entropy_loss",
        "verl's entropy_coeff default",
        dict(clip_low=0.2, clip_high=0.2, entropy_coef=1e-3, **_NO_DUAL),
        settings=EntropyLossSettings,
        extra_loss=_entropy_bonus,
    )
)
register(
    LossVariant(
        "fork_tokens",
        "Beyond the 80/20 Rule (Wang et al. 2025)",
        dict(clip_low=0.2, clip_high=0.2, fork_top_ratio=0.2, **_NO_DUAL),
        settings=ForkTokensSettings,
        token_loss=_fork_token_loss,
        statistics=_fork_statistics,
    )
)
register(
    LossVariant(
        "entropy_adv",
        "Reasoning with Exploration: An Entropy Perspective (Cheng et al. 2025)",
        dict(clip_low=0.2, clip_high=0.2, ent_adv_kappa1=0.4, ent_adv_kappa2=2.0, **_NO_DUAL),
        settings=EntropyAdvSettings,
        token_advantages=_entropy_adv_advantages,
    )
)
register(
    LossVariant(
        "clip_cov",
        "The Entropy Mechanism of RL for Reasoning LMs (Cui et al. 2025)",
        dict(clip_low=0.2, clip_high=0.2, clip_cov_ratio=2e-4, clip_cov_lb=1.0, clip_cov_ub=5.0,
             **_NO_DUAL),
        settings=ClipCovSettings,
        token_loss=_clip_cov_token_loss,
        statistics=_clip_cov_statistics,
        needs_noise=True,
    )
)  # fmt: skip
register(
    LossVariant(
        "kl_cov",
        "The Entropy Mechanism of RL for Reasoning LMs (Cui et al. 2025)",
        dict(clip_low=0.2, clip_high=0.2, kl_cov_ratio=2e-3, kl_cov_coef=1.0, **_NO_DUAL),
        settings=KlCovSettings,
        token_loss=_kl_cov_token_loss,
        statistics=_kl_cov_statistics,
        needs_noise=True,  # breaks ties at the covariance cut
    )
)
register(
    LossVariant(
        "w_reinforce",
        "The Surprising Effectiveness of Negative Reinforcement (Zhu et al. 2025)",
        dict(clip_low=0.2, clip_high=0.2, w_reinforce_lambda=0.1, **_NO_DUAL),
        settings=WReinforceSettings,
        sequence_advantages=_w_reinforce_advantages,
    )
)

# The built-in variants (the paper's Table 1 plus DynaMO): configs offer these as switches.
BASELINES = names()
