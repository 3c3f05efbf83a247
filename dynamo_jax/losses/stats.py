"""`minibatch_stats`: the global reductions a micro-batch's loss needs (ALGORITHM.md §3, §4.3).

Call it once per optimizer mini-batch on the WHOLE mini-batch (current-policy log-probs and
entropies under stop-gradient), then pass the result to every micro-batch's `policy_loss`.
Inside a jit over a mesh, plain jnp reductions are already global, so the statistics are the
same on 1 device and on 8.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from dynamo_jax.losses import baselines
from dynamo_jax.losses.batch import ModStats, TokenBatch, as_mask, log_ratio, masked_mean
from dynamo_jax.losses.config import LossConfig
from dynamo_jax.losses.modulation import modulation_stats


def _frozen(batch: TokenBatch) -> TokenBatch:
    return batch._replace(logp=lax.stop_gradient(batch.logp), ent=lax.stop_gradient(batch.ent))


def minibatch_stats(batch: TokenBatch, cfg: LossConfig) -> ModStats:
    """Token/sequence counts, H range, max Ξ and the baseline's threshold over `batch`."""
    batch = _frozen(batch)
    mask = as_mask(batch.mask)
    n_tokens = jnp.sum(mask).astype(jnp.float32)
    n_seqs = jnp.sum(mask.any(axis=-1)).astype(jnp.float32)
    zero = jnp.float32(0.0)
    h_min = h_max = xi_max = zero
    if cfg.baseline == "dynamo":
        h_min, h_max, xi_max = modulation_stats(batch, cfg)
    logp_mean = adv_mean = threshold = zero
    if cfg.baseline in ("clip_cov", "kl_cov"):
        logp_mean = masked_mean(batch.logp, mask)
        adv_mean = masked_mean(batch.adv, mask)
    if cfg.baseline == "fork_tokens":
        threshold = baselines.fork_threshold(batch.ent, mask, cfg.fork_top_ratio)
    elif cfg.baseline == "clip_cov":
        r = jnp.exp(log_ratio(batch.logp, batch.old_logp, mask))
        threshold = baselines.clip_cov_threshold(batch, r, logp_mean, adv_mean, n_tokens, cfg)
    elif cfg.baseline == "kl_cov":
        threshold = baselines.kl_cov_threshold(batch, logp_mean, adv_mean, n_tokens, cfg)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return ModStats(
        n_tokens=n_tokens, n_seqs=n_seqs, h_min=f32(h_min), h_max=f32(h_max), xi_max=f32(xi_max),
        logp_mean=f32(logp_mean), adv_mean=f32(adv_mean), threshold=f32(threshold),
    )  # fmt: skip
