"""The per-token inputs of the policy loss and the mini-batch statistics it is normalised by.

Layout: every per-token array is [B, L]: B rows of L token slots, `mask` true on the valid
(trained) tokens. A row holds one sequence, or several laid end to end (packed): `segment_ids`
then numbers them 1, 2, ... within the row (0 on empty slots), and every per-sequence reduction
is per (row, segment) (`segment_sums`). A micro-batch is a subset of rows, and a device shard is
a subset of rows too, so per-sequence quantities never cross a split.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

# Log-ratios are clamped before exp (as verl does) so a stale or padded token cannot overflow
# r to inf and turn a zero advantage into NaN; |log r| ≤ 20 is never reached in sane training.
LOG_RATIO_CLAMP = 20.0


class TokenBatch(NamedTuple):
    """Per-token inputs, all [B, L]."""

    logp: jax.Array  # log π(a_t) at the batch temperature; gradient flows
    old_logp: jax.Array  # log π_old(a_t) (constant)
    ent: jax.Array  # H_t; gradient flows (entropy_loss baseline)
    adv: jax.Array  # sequence advantage A broadcast to its tokens (constant)
    mask: jax.Array  # bool or {0,1}: valid response tokens
    k: jax.Array | None = None  # K_t (docs/algorithm.md#update-magnitude-stabilisation); constant
    ref_logp: jax.Array | None = None  # frozen reference policy (KL penalty only)
    noise: jax.Array | None = None  # U[0,1) per token: Clip-Cov's random pick (clip_cov only)
    # int [B, L]: the row's k-th sequence has id k >= 1, empty slots 0; None: a row is a sequence
    segment_ids: jax.Array | None = None
    # f32 [B, L]: the sequence's weight in the step's estimator on each of its tokens (prompt-mean:
    # 1/n_i, n_i its prompt group's size in the step's batch; `assemble.prompt_weights`)
    seq_weight: jax.Array | None = None
    # f32 [B, L]: rollout correction's truncated IS weight π_old / π_engine (constant;
    # losses/rollout_correction.py), multiplying each token's policy-gradient loss; None: 1
    is_weight: jax.Array | None = None


class ModStats(NamedTuple):
    """Reductions over the WHOLE optimizer mini-batch (all micro-batches, all devices).

    Under a jit over a mesh, the plain jnp reductions in `minibatch_stats` are already global.
    The counts are every variant's; `own` holds the running variant's own statistics, by the
    names its `statistics` function returns (DynaMO's H range and max Ξ, a baseline's threshold
    or covariance means), read as attributes: `stats.h_min` is `stats.own["h_min"]`.
    """

    n_tokens: jax.Array  # valid tokens
    n_seqs: jax.Array  # sequences with at least one valid token
    seq_weight_sum: jax.Array  # Σ seq_weight over those sequences (prompt-mean's normaliser)
    own: dict[str, jax.Array] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)

    def __getattr__(self, name: str) -> jax.Array:
        own = tuple.__getitem__(self, 3)
        if name in own:
            return own[name]
        raise AttributeError(f"ModStats has no statistic {name!r} (the variant's: {sorted(own)})")


def as_mask(mask) -> jax.Array:
    return jnp.asarray(mask).astype(bool)


def segments(batch: TokenBatch) -> jax.Array:
    """int32 [B, L] segment ids of `batch` (all 1 when each row is one sequence)."""
    if batch.segment_ids is None:
        return jnp.ones(jnp.shape(batch.mask), jnp.int32)
    return jnp.asarray(batch.segment_ids).astype(jnp.int32)


def segment_sums(x_BxL, segment_ids_BxL) -> jax.Array:
    """[B, L] → [B, L + 1]: column k sums x over the row's segment k (column 0: empty slots).

    Segment ids lie in 0..L (a segment has at least one token), so L + 1 columns hold them all;
    each row is reduced on its own, so rows shard and split freely.
    """
    n = x_BxL.shape[-1] + 1
    per_row = lambda x, seg: jax.ops.segment_sum(x, seg, num_segments=n)
    return jax.vmap(per_row)(x_BxL, segment_ids_BxL)


def at_tokens(per_segment_BxS, segment_ids_BxL) -> jax.Array:
    """[B, L + 1] per-segment values (`segment_sums`' layout) → [B, L]: each token's segment's."""
    return jnp.take_along_axis(per_segment_BxS, segment_ids_BxL, axis=-1)


def count_sequences(mask_BxL, segment_ids_BxL) -> jax.Array:
    """float32 number of sequences (segments ≥ 1) with at least one valid token."""
    per_segment = segment_sums(as_mask(mask_BxL).astype(jnp.float32), segment_ids_BxL)
    return jnp.sum(per_segment[:, 1:] > 0).astype(jnp.float32)


def segment_weights(mask_BxL, segment_ids_BxL, seq_weight_BxL) -> jax.Array:
    """[B, L] → [B, L]: each sequence's weight (constant over its tokens) per (row, segment)
    column 1..L of `segment_sums`' layout, 0 for segments without a valid token."""
    m = as_mask(mask_BxL)
    count = segment_sums(m.astype(jnp.float32), segment_ids_BxL)[:, 1:]
    w_sum = segment_sums(jnp.where(m, jnp.asarray(seq_weight_BxL, jnp.float32), 0.0),
                         segment_ids_BxL)[:, 1:]  # fmt: skip
    return w_sum / jnp.maximum(count, 1.0)


def masked_sum(x, mask):
    return jnp.sum(jnp.where(mask, x, 0.0))


def masked_mean(x, mask):
    return masked_sum(x, mask) / jnp.maximum(jnp.sum(mask), 1)


def masked_min(x, mask):
    """Min over valid entries; 0 when there are none (keeps downstream formulas finite)."""
    return jnp.where(mask.any(), jnp.min(jnp.where(mask, x, jnp.inf)), 0.0)


def masked_max(x, mask):
    return jnp.where(mask.any(), jnp.max(jnp.where(mask, x, -jnp.inf)), 0.0)


def log_ratio(logp, old_logp, mask):
    """log r_t, zero on padding, clamped to ±LOG_RATIO_CLAMP."""
    d = jnp.where(mask, logp - old_logp, 0.0)
    return jnp.clip(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def masked_quantile(x, mask, q):
    """Linear-interpolation quantile of the valid entries (numpy/torch default); +inf if none."""
    flat = jnp.where(mask, x, jnp.inf).reshape(-1)
    srt = jnp.sort(flat)
    n = jnp.sum(mask)
    pos = q * jnp.maximum(n - 1, 0).astype(jnp.float32)
    lo = jnp.floor(pos).astype(jnp.int32)
    hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
    val = srt[lo] + (pos - lo) * (srt[hi] - srt[lo])
    # When lo == hi the product is 0·(inf − inf) = NaN only if srt[lo] is inf (n == 0).
    return jnp.where(n > 0, jnp.where(hi == lo, srt[lo], val), jnp.inf)


def kth_smallest(x, mask, k):
    """k-th smallest valid entry (k ≥ 1, traced); +inf when fewer than k are valid."""
    srt = jnp.sort(jnp.where(mask, x, jnp.inf).reshape(-1))
    idx = jnp.clip(k - 1, 0, srt.shape[0] - 1)
    return jnp.where(k <= srt.shape[0], srt[idx], jnp.inf)
