"""Policy loss of one micro-batch, normalised over the whole mini-batch (docs/algorithm.md#policy-loss, docs/algorithm.md#advantage-modulation, docs/algorithm.md#baselines).

`build_loss_fn(cfg)` looks up the configured variant (losses/registry.py) ONCE and returns
`loss_fn(batch, stats) -> (loss, metrics)`; `policy_loss(batch, stats, cfg)` is the same
thing in one call. The loss is divided by the mini-batch normaliser from `stats`, so summing
the losses (and gradients) of the micro-batches gives the mini-batch loss exactly.

Metrics are a flat dict of float32 scalars that combine across micro-batches with
`combine_metrics` (sums and counts add, `*_min`/`*_max` take min/max); `finalize_metrics`
turns them into means.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from dynamo_jax.losses import registry
from dynamo_jax.losses.batch import (
    ModStats,
    TokenBatch,
    as_mask,
    count_sequences,
    log_ratio,
    masked_max,
    masked_min,
    masked_sum,
    segment_sums,
    segment_weights,
    segments,
)
from dynamo_jax.losses.clip import clip_bounds, clip_ratio
from dynamo_jax.losses.config import LossConfig
from dynamo_jax.losses.modulation import DAMPED_BELOW

LossFn = Callable[[TokenBatch, ModStats], tuple[jax.Array, dict]]


def clipped_surrogate(adv_hat, r, clip_low, clip_high, dual_clip):
    """ℓ_t = −min(r Â, clip(r, 1−ε_low, 1+ε_high) Â); with dual clip, min(ℓ_t, −c Â) where Â < 0."""
    loss = jnp.maximum(-adv_hat * r, -adv_hat * clip_ratio(r, clip_low, clip_high))
    if dual_clip is not None:
        loss = jnp.where(adv_hat < 0, jnp.minimum(loss, -dual_clip * adv_hat), loss)
    return loss


def aggregate(
    loss_BxL, mask_BxL, stats: ModStats, cfg: LossConfig, segment_ids_BxL=None, seq_weight_BxL=None
):
    """This micro-batch's share of the mini-batch aggregate (`loss_agg_mode`).

    Sequences are the (row, segment) pairs of `segment_ids_BxL` (None: each row is one).
    prompt-mean needs `seq_weight_BxL` (each sequence's 1/n_i on its tokens): it is
    Σ_s w_s · mean_t ℓ_st / Σ_s w_s over the mini-batch's sequences (docs/estimators.md).
    """
    if cfg.loss_agg_mode == "token-mean":
        return masked_sum(loss_BxL, mask_BxL) / jnp.maximum(stats.n_tokens, 1.0)
    if cfg.loss_agg_mode in ("seq-mean-token-mean", "prompt-mean"):
        seg = (
            jnp.ones(jnp.shape(mask_BxL), jnp.int32) if segment_ids_BxL is None else segment_ids_BxL
        )
        seq_sum = segment_sums(jnp.where(mask_BxL, loss_BxL, 0.0), seg)[:, 1:]
        seq_count = segment_sums(jnp.asarray(mask_BxL, jnp.float32), seg)[:, 1:]
        seq_mean = seq_sum / jnp.maximum(seq_count, 1.0)
        if cfg.loss_agg_mode == "seq-mean-token-mean":
            return jnp.sum(seq_mean) / jnp.maximum(stats.n_seqs, 1.0)
        if seq_weight_BxL is None:
            raise ValueError(
                "loss_agg_mode 'prompt-mean' needs TokenBatch.seq_weight (batch field seq_weight)"
            )
        w = segment_weights(mask_BxL, seg, seq_weight_BxL)
        total = stats.seq_weight_sum
        return jnp.sum(w * seq_mean) / jnp.where(total > 0, total, 1.0)
    # seq-mean-token-sum-norm (Dr.GRPO): token sums over a constant length, mean over sequences.
    return masked_sum(loss_BxL, mask_BxL) / (jnp.maximum(stats.n_seqs, 1.0) * cfg.max_len_norm)


def reference_kl(logp, ref_logp, estimator: str):
    """Per-token KL(π ‖ π_ref) estimate: k1 = log π − log π_ref; k3 = e^{−k1} + k1 − 1."""
    k1 = logp - ref_logp
    return k1 if estimator == "k1" else jnp.exp(-k1) + k1 - 1.0


def plain_advantages(batch: TokenBatch, stats: ModStats, cfg: LossConfig):
    """Â = A (no token-level transform); β_comp = β_stab = 1 for the metrics."""
    ones = jnp.ones_like(batch.adv, dtype=jnp.float32)
    return jnp.asarray(batch.adv, jnp.float32), ones, ones


def surrogate_loss(batch: TokenBatch, stats: ModStats, adv_hat, r, log_r, cfg: LossConfig):
    """The clipped surrogate ℓ_t of docs/algorithm.md#policy-loss (with the dual clip when configured)."""
    return clipped_surrogate(adv_hat, r, cfg.clip_low, cfg.clip_high, cfg.dual_clip)


def _metrics(batch, mask, adv_hat, r, b_comp, b_stab, cfg, parts):
    f = lambda x: masked_sum(jnp.asarray(x, jnp.float32), mask)
    ent = lax.stop_gradient(batch.ent)
    logp = lax.stop_gradient(batch.logp)
    low, high = clip_bounds(cfg.clip_low, cfg.clip_high)
    m = {
        "tokens": jnp.sum(mask).astype(jnp.float32),
        "sequences": count_sequences(mask, segments(batch)),
        "clip_low_sum": f((adv_hat < 0) & (r < low)),
        "clip_high_sum": f((adv_hat > 0) & (r > high)),
        "beta_comp_sum": f(b_comp),
        "beta_stab_sum": f(b_stab),
        "damped_sum": f(b_stab < DAMPED_BELOW),
        "entropy_sum": f(ent),
        "entropy_min": masked_min(ent, mask),
        "entropy_max": masked_max(ent, mask),
        "approx_kl_sum": f(batch.old_logp - logp),
    }
    m.update({k: lax.stop_gradient(v) for k, v in parts.items()})
    return {k: jnp.asarray(v, jnp.float32) for k, v in m.items()}


def build_loss_fn(cfg: LossConfig) -> LossFn:
    """Look the variant up once; return `loss_fn(batch, stats) -> (loss, metrics)` (jittable)."""
    variant = registry.get(cfg.variant)
    advantage = variant.token_advantages or plain_advantages
    token_loss = variant.token_loss or surrogate_loss

    def loss_fn(batch: TokenBatch, stats: ModStats):
        mask = as_mask(batch.mask)
        # The aggregation of this batch's layout (its sequences), with the records' signature.
        agg = functools.partial(
            aggregate, segment_ids_BxL=segments(batch), seq_weight_BxL=batch.seq_weight
        )
        lr = log_ratio(batch.logp, batch.old_logp, mask)
        r = jnp.exp(lr)
        adv_hat, b_comp, b_stab = advantage(batch, stats, cfg)
        token_pg = token_loss(batch, stats, adv_hat, r, lr, cfg)
        if batch.is_weight is not None:  # rollout correction: the engine's tokens reweighted
            token_pg = token_pg * lax.stop_gradient(jnp.asarray(batch.is_weight, jnp.float32))
        pg_loss = agg(token_pg, mask, stats, cfg)
        parts = {"pg_loss": pg_loss}
        loss = pg_loss
        if variant.extra_loss is not None:
            name, value, coef = variant.extra_loss(batch, mask, stats, cfg, agg)
            parts[name] = value
            loss = loss + coef * value
        if cfg.kl != "none":
            if batch.ref_logp is None:
                raise ValueError(f"LossConfig.kl={cfg.kl!r} needs TokenBatch.ref_logp")
            kl_t = reference_kl(batch.logp, jnp.where(mask, batch.ref_logp, batch.logp), cfg.kl)
            parts["ref_kl"] = agg(kl_t, mask, stats, cfg)
            loss = loss + cfg.kl_coef * parts["ref_kl"]
        parts["loss"] = loss
        return loss, _metrics(batch, mask, adv_hat, r, b_comp, b_stab, cfg, parts)

    return loss_fn


def policy_loss(batch: TokenBatch, stats: ModStats, cfg: LossConfig):
    """(loss contribution of this micro-batch, metrics); see `build_loss_fn`."""
    return build_loss_fn(cfg)(batch, stats)


_COMBINE_BY_SUFFIX = {"_min": jnp.minimum, "_max": jnp.maximum}


def combine_metrics(a: dict, b: dict) -> dict:
    """Merge the metrics of two micro-batches (or devices' host copies) of one mini-batch."""
    out = {}
    for k in a:
        op = next((f for suf, f in _COMBINE_BY_SUFFIX.items() if k.endswith(suf)), jnp.add)
        if k.startswith("entropy_m"):  # an empty micro-batch reports 0: don't let it win
            out[k] = jnp.where(
                a["tokens"] == 0, b[k], jnp.where(b["tokens"] == 0, a[k], op(a[k], b[k]))
            )
        else:
            out[k] = op(a[k], b[k])
    return out


def finalize_metrics(m: dict) -> dict:
    """Turn `*_sum` entries into per-token means (`*_mean`); other entries pass through."""
    n = jnp.maximum(m["tokens"], 1.0)
    out = {}
    for k, v in m.items():
        if k.endswith("_sum"):
            name = k[: -len("_sum")]
            name = {"clip_low": "clip_frac_low", "clip_high": "clip_frac_high",
                    "damped": "frac_damped"}.get(name, name + "_mean")  # fmt: skip
            out[name] = v / n
        else:
            out[k] = v
    return out
