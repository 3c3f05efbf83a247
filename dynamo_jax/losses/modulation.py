"""DynaMO token-level advantage modulation (docs/algorithm.md#advantage-modulation): Â = A · β_comp · β_stab.

Everything here is under stop-gradient: modulation rescales the advantage, it adds no gradient
path. The mini-batch statistics (H_min, H_max, max Ξ) come in as arguments so the same
function serves micro-batches of a globally normalised mini-batch (docs/algorithm.md#scope-of-the-statistics).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from dynamo_jax.losses.batch import (
    TokenBatch,
    as_mask,
    at_tokens,
    log_ratio,
    masked_max,
    masked_min,
    segment_sums,
    segments,
)
from dynamo_jax.losses.clip import clip_bounds
from dynamo_jax.losses.config import LossConfig

GC_EPS = 1e-8  # denominator guard of β_comp (docs/algorithm.md#gradient-compensation)
UMS_EPS = 1e-8  # denominator guard of x_t (docs/algorithm.md#update-magnitude-stabilisation)
DAMPED_BELOW = 0.9  # β_stab below this counts as "damped" in the metrics


def beta_comp(adv, ent, h_min, h_max, alpha_c):
    """Gradient compensation: 1 + α_c (H_max − H)/(H_max − H_min + 1e-8) where A > 0, else 1."""
    boost = 1.0 + alpha_c * (h_max - ent) / (h_max - h_min + GC_EPS)
    return jnp.where(adv > 0, boost, 1.0)


def beta_stab(xi_abs, xi_max, alpha_s, gamma, tau):
    """Update-magnitude stabilisation: λ_min + (1 − λ_min) σ(−γ (x − τ)), λ_min = 1 − α_s."""
    x = xi_abs / (xi_max + UMS_EPS)
    lam_min = 1.0 - alpha_s
    return lam_min + (1.0 - lam_min) * jax.nn.sigmoid(-gamma * (x - tau))


def _k_term(batch: TokenBatch, u, mask, cfg: LossConfig):
    """K_t: exact (from the vocab pass) or the authors' per-response mean of u (per segment)."""
    if cfg.settings.entropy_change == "exact":
        if batch.k is None:
            raise ValueError(
                "LossConfig.entropy_change='exact' needs TokenBatch.k (call the log-prob pass "
                "with return_k=True) or use entropy_change='sequence_mean'"
            )
        return batch.k
    seg = segments(batch)
    u_sum = segment_sums(jnp.where(mask, u, 0.0), seg)
    n = jnp.maximum(segment_sums(mask.astype(jnp.float32), seg), 1.0)
    return at_tokens(u_sum / n, seg)


def entropy_change_abs(batch: TokenBatch, cfg: LossConfig):
    """Ξ_t = |ΔĤ_t| = |ξ_t (u_t − K_t)|, 0 on padding (docs/algorithm.md#update-magnitude-stabilisation); stop-gradient."""
    mask = as_mask(batch.mask)
    logp = lax.stop_gradient(batch.logp)
    ent = lax.stop_gradient(batch.ent)
    adv = batch.adv
    r = jnp.exp(log_ratio(logp, batch.old_logp, mask))
    low, high = clip_bounds(cfg.clip_low, cfg.clip_high)
    in_clip = ((adv > 0) & (r <= high)) | ((adv < 0) & (r >= low))
    xi = jnp.where(in_clip, r * adv, 0.0)
    u = jnp.exp(logp) * (logp + ent)
    k = lax.stop_gradient(_k_term(batch, u, mask, cfg))
    return jnp.where(mask, jnp.abs(xi * (u - k)), 0.0)


def modulation_stats(batch: TokenBatch, cfg: LossConfig):
    """(H_min, H_max, max Ξ) over the valid tokens of `batch` (global under a jit)."""
    mask = as_mask(batch.mask)
    ent = lax.stop_gradient(batch.ent)
    xi_max = masked_max(entropy_change_abs(batch, cfg), mask) if cfg.settings.enable_ums else 0.0
    return masked_min(ent, mask), masked_max(ent, mask), jnp.asarray(xi_max, jnp.float32)


def modulate(batch: TokenBatch, h_min, h_max, xi_max, cfg: LossConfig):
    """(Â, β_comp, β_stab) for every token; switches off GC/UMS per the ablation flags."""
    adv = batch.adv
    ones = jnp.ones_like(adv, dtype=jnp.float32)
    alpha_comp, alpha_stab = cfg.settings.alphas()
    b_comp = ones
    if cfg.settings.enable_gc:
        b_comp = beta_comp(adv, lax.stop_gradient(batch.ent), h_min, h_max, alpha_comp)
    b_stab = ones
    if cfg.settings.enable_ums:
        xi = entropy_change_abs(batch, cfg)
        b_stab = beta_stab(xi, xi_max, alpha_stab, cfg.settings.gamma, cfg.settings.ums_tau)
    adv_hat = lax.stop_gradient(adv * b_comp * b_stab)
    return adv_hat, b_comp, b_stab
