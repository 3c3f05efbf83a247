"""The built-in loss variants: GRPO, DynaMO and the Table 1 baselines (docs/algorithm.md#policy-loss, docs/algorithm.md#advantage-modulation, docs/algorithm.md#baselines).

One `LossVariant` record each (losses/registry.py explains the fields), registered here at import.
Adding a baseline is one more record in this file (or a `register(...)` call anywhere, e.g. a
test): nothing else in the package names baselines.

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

import jax.numpy as jnp
from jax import lax

from dynamo_jax.losses import baselines
from dynamo_jax.losses.advantages import w_reinforce_advantages
from dynamo_jax.losses.batch import as_mask, log_ratio, masked_mean
from dynamo_jax.losses.modulation import modulate, modulation_stats
from dynamo_jax.losses.policy import clipped_surrogate
from dynamo_jax.losses.registry import LossVariant, names, register

_NO_DUAL = dict(dual_clip=None)


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
    if cfg.stats_scope == "micro_batch":  # the authors' (docs/algorithm.md#scope-of-the-statistics)
        h_min, h_max, xi_max = modulation_stats(batch, cfg)
    return modulate(batch, h_min, h_max, xi_max, cfg)


# ----------------------------------------------------------------------------- baselines (docs/algorithm.md#baselines)


def _entropy_adv_advantages(batch, stats, cfg):
    adv = baselines.entropy_adv_advantage(
        batch.adv, batch.ent, cfg.ent_adv_kappa1, cfg.ent_adv_kappa2
    )
    return adv, _ones(batch), _ones(batch)


def _entropy_bonus(batch, mask, stats, cfg, aggregate):
    return "entropy_loss", aggregate(batch.ent, mask, stats, cfg), -cfg.entropy_coef


def _fork_statistics(batch, n_tokens, cfg):
    mask = as_mask(batch.mask)
    return {"threshold": baselines.fork_threshold(batch.ent, mask, cfg.fork_top_ratio)}


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
    penalty = cfg.kl_cov_coef * baselines.abs_zero_at_zero(log_r)
    return -adv_hat * r + jnp.where(penalised, penalty, 0.0)


def _w_reinforce_advantages(cfg, rewards_B, group_ids_B, num_groups, valid_B):
    return w_reinforce_advantages(rewards_B, lam=cfg.w_reinforce_lambda, valid_B=valid_B)


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
        needs_k=lambda cfg: cfg.enable_ums and cfg.entropy_change == "exact",
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
        extra_loss=_entropy_bonus,
    )
)
register(
    LossVariant(
        "fork_tokens",
        "Beyond the 80/20 Rule (Wang et al. 2025)",
        dict(clip_low=0.2, clip_high=0.2, fork_top_ratio=0.2, **_NO_DUAL),
        token_loss=_fork_token_loss,
        statistics=_fork_statistics,
    )
)
register(
    LossVariant(
        "entropy_adv",
        "Reasoning with Exploration: An Entropy Perspective (Cheng et al. 2025)",
        dict(clip_low=0.2, clip_high=0.2, ent_adv_kappa1=0.4, ent_adv_kappa2=2.0, **_NO_DUAL),
        token_advantages=_entropy_adv_advantages,
    )
)
register(
    LossVariant(
        "clip_cov",
        "The Entropy Mechanism of RL for Reasoning LMs (Cui et al. 2025)",
        dict(clip_low=0.2, clip_high=0.2, clip_cov_ratio=2e-4, clip_cov_lb=1.0, clip_cov_ub=5.0,
             **_NO_DUAL),
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
        sequence_advantages=_w_reinforce_advantages,
    )
)

# The built-in variants (the paper's Table 1 plus DynaMO): configs offer these as switches.
BASELINES = names()
