"""`minibatch_stats`: the global reductions a micro-batch's loss needs (docs/algorithm.md#aggregation-modes, docs/algorithm.md#scope-of-the-statistics).

Call it once per optimizer mini-batch on the WHOLE mini-batch (current-policy log-probs and
entropies under stop-gradient), then pass the result to every micro-batch's `policy_loss`.
Inside a jit over a mesh, plain jnp reductions are already global, so the statistics are the
same on 1 device and on 8.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from dynamo_jax.losses import registry
from dynamo_jax.losses.batch import (
    ModStats,
    TokenBatch,
    as_mask,
    count_sequences,
    segment_weights,
    segments,
)
from dynamo_jax.losses.config import LossConfig


def _frozen(batch: TokenBatch) -> TokenBatch:
    return batch._replace(logp=lax.stop_gradient(batch.logp), ent=lax.stop_gradient(batch.ent))


def minibatch_stats(batch: TokenBatch, cfg: LossConfig) -> ModStats:
    """Token/sequence counts (and the sum of the sequences' weights), then the variant's own statistics (H range and max Ξ for DynaMO,
    a threshold and covariance means for the baselines), over `batch`."""
    batch = _frozen(batch)
    mask = as_mask(batch.mask)
    n_tokens = jnp.sum(mask).astype(jnp.float32)
    n_seqs = count_sequences(mask, segments(batch))
    # prompt-mean's normaliser: the mini-batch's sequences' weights (1 each when none are given,
    # so it is then n_seqs)
    if batch.seq_weight is None:
        seq_weight_sum = n_seqs
    else:
        seq_weight_sum = jnp.sum(segment_weights(mask, segments(batch), batch.seq_weight))
    variant = registry.get(cfg.variant)
    own = {} if variant.statistics is None else variant.statistics(batch, n_tokens, cfg)
    return ModStats(
        n_tokens=n_tokens,
        n_seqs=n_seqs,
        seq_weight_sum=jnp.asarray(seq_weight_sum, jnp.float32),
        own={k: jnp.asarray(v, jnp.float32) for k, v in own.items()},
    )
