"""Token-level pieces of the paper's Table 1 baselines (docs/algorithm.md#baselines).

Each baseline is a (advantage transform, per-token loss transform, threshold statistic) triple
picked once by `policy.build_loss_fn`; nothing here branches on the baseline at run time.
Sources and published hyperparameters are listed in `losses/config.py`.

- Entropy Advantages (Cheng et al. 2025): Â = A + min(κ_1 · sg(H), |A| / κ_2).
- Fork Tokens (Wang et al. 2025): only tokens with H ≥ the (1 − ρ) quantile of the
  mini-batch's token entropies keep their policy-gradient term; the normaliser is unchanged
  (the indicator sits inside the paper's token-mean).
- Clip-Cov (Cui et al. 2025): cov_t = (A_t − mean A)(log π_t − mean log π) over the valid
  tokens. Among tokens not already clipped by the PPO rule with lb < cov_t < ub, a random
  max(⌊r · N⌋, 1) get their gradient detached (loss term multiplied by 0), as in verl.
  Randomness: the caller supplies `TokenBatch.noise` ~ U[0, 1) per token and the tokens with
  the smallest noise win, so the pick is the same however the mini-batch is split.
- KL-Cov (Cui et al. 2025): unclipped −A·r for all tokens; exactly max(⌊k · N⌋, 1) tokens,
  the largest cov_t (ties at the cut broken by the step's per-token noise), get
  + β · |log π − log π_old|, with the derivative of |·| taken as 0 at 0 as torch does.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from dynamo_jax.losses.batch import TokenBatch, as_mask, kth_smallest, masked_quantile
from dynamo_jax.losses.clip import clip_ratio


def entropy_adv_advantage(adv, ent, kappa1, kappa2):
    """Cheng et al.: Â = A + min(κ_1 H_detached, |A| / κ_2)."""
    return adv + jnp.minimum(kappa1 * lax.stop_gradient(ent), jnp.abs(adv) / kappa2)


def fork_threshold(ent, mask, top_ratio):
    """Entropy cut of the top-ρ tokens: the (1 − ρ) quantile over valid tokens."""
    return masked_quantile(lax.stop_gradient(ent), mask, 1.0 - top_ratio)


def token_covariance(logp, adv, logp_mean, adv_mean):
    """Centred covariance term (A − mean A)(log π − mean log π), stop-gradient."""
    return lax.stop_gradient((adv - adv_mean) * (logp - logp_mean))


def clipped_by_ppo(adv, r, clip_low, clip_high):
    """Tokens where the clipped term wins the PPO max (verl's `clip_by_origin`)."""
    return -adv * clip_ratio(r, clip_low, clip_high) > -adv * r


def clip_cov_candidates(batch: TokenBatch, r, logp_mean, adv_mean, cfg):
    mask = as_mask(batch.mask)
    cov = token_covariance(batch.logp, batch.adv, logp_mean, adv_mean)
    band = (cov > cfg.settings.clip_cov_lb) & (cov < cfg.settings.clip_cov_ub)
    return mask & band & ~clipped_by_ppo(batch.adv, r, cfg.clip_low, cfg.clip_high)


def clip_cov_threshold(batch: TokenBatch, r, logp_mean, adv_mean, n_tokens, cfg):
    """Noise cut: the clip_num-th smallest noise among the candidates (+inf if fewer)."""
    cand = clip_cov_candidates(batch, r, logp_mean, adv_mean, cfg)
    clip_num = jnp.maximum(jnp.floor(cfg.settings.clip_cov_ratio * n_tokens), 1.0).astype(jnp.int32)
    return kth_smallest(require_noise(batch), cand, clip_num)


def kl_cov_cuts(batch: TokenBatch, logp_mean, adv_mean, n_tokens, cfg):
    """(covariance cut, noise cut) that select exactly k = max(⌊ratio · N⌋, 1) tokens.

    The cut is the k-th largest covariance t; every token above t is selected, and of the tokens
    tied at t the ones with the smallest noise fill the remaining k − #(cov > t) places (verl's
    `torch.topk` picks exactly k and leaves the order of ties unspecified).
    """
    mask = as_mask(batch.mask)
    cov = token_covariance(batch.logp, batch.adv, logp_mean, adv_mean)
    k_num = jnp.maximum(jnp.floor(cfg.settings.kl_cov_ratio * n_tokens), 1.0).astype(jnp.int32)
    cut = -kth_smallest(-cov, mask, k_num)
    above = jnp.sum(mask & (cov > cut)).astype(jnp.int32)
    tie_cut = kth_smallest(require_noise(batch), mask & (cov == cut), k_num - above)
    return cut, tie_cut


def kl_cov_selected(batch: TokenBatch, logp_mean, adv_mean, cut, tie_cut):
    """The tokens KL-Cov penalises: above the covariance cut, or tied at it within the noise cut."""
    cov = token_covariance(batch.logp, batch.adv, logp_mean, adv_mean)
    tied = (cov == cut) & (require_noise(batch) <= tie_cut)
    return as_mask(batch.mask) & ((cov > cut) | tied)


def abs_zero_at_zero(x):
    """|x| whose derivative at 0 is 0 (torch's abs), not JAX's +1: a token whose log-ratio is
    exactly 0 (every token of a first PPO pass) sits at the penalty's minimum."""
    return jnp.where(x == 0, 0.0, jnp.abs(x))


def require_noise(batch: TokenBatch):
    if batch.noise is None:
        raise ValueError(
            "the clip_cov and kl_cov variants need TokenBatch.noise (uniform [0, 1) per token, drawn once "
            "per mini-batch, e.g. jax.random.uniform(key, mask.shape))"
        )
    return batch.noise
