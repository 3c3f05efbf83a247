"""Losses: chunked log-probs/entropy, GRPO advantages, DynaMO modulation, baselines.

Specification: docs/algorithm.md#log-probabilities-and-entropy through docs/algorithm.md#advantage-modulation, and docs/algorithm.md#baselines. All functions are pure and jittable.

How a train step uses this package (one optimizer mini-batch, [B, L]: rows of token slots, one
sequence per row or several packed, told apart by `TokenBatch.segment_ids`):

    cfg = LossConfig.preset("dynamo")                 # or "grpo", "clip_cov", ... (docs/algorithm.md#baselines)
    loss_fn = build_loss_fn(cfg)                      # variant looked up once, here

    # log π, H (and K when cfg.needs_k) from final hidden states and the unembedding, at the
    # batch's temperature; inside a jit over a mesh with the vocab on the "tensor" axis:
    logp_N, ent_N, k_N = sharded_token_logprobs_entropy(
        hidden_NxD, w_DxV, targets_N, temperature, mesh=mesh, return_k=cfg.needs_k)
    # (inside your own shard_map: token_logprobs_entropy(..., vocab_axis="tensor"))

    batch = TokenBatch(logp, old_logp, ent, adv, mask, k=k, segment_ids=seg)   # each [B, L]
    stats = minibatch_stats(stop_gradient(whole mini-batch), cfg)   # global reductions
    for micro in micro_batches:                                     # rows of the mini-batch
        loss, metrics = loss_fn(micro, stats)    # already divided by the mini-batch normaliser
        # sum losses/grads over micro-batches; combine_metrics(...) the metrics

`minibatch_stats` applies stop-gradient itself. With ONE micro-batch per mini-batch, call it
inside the differentiated function on the same batch (no extra forward pass). With gradient
accumulation, H_min/H_max/max Ξ (and the baselines' thresholds) need the current policy's
log π/H of the whole mini-batch first: run a no-grad forward over it, then the micro-batches.
`LossConfig.stats_scope="micro_batch"` instead reproduces the authors' per-micro-batch
statistics (normalisers stay mini-batch-global).

Sequence advantages: `grpo_advantages(rewards_B, group_ids_B, ...)` (groups by prompt id,
variable sizes) or `sequence_advantages(cfg, ...)`, the configured variant's (W-REINFORCE's own).
Clip-Cov needs `TokenBatch.noise` (U[0, 1) per token, drawn once per mini-batch); the KL
penalty needs `TokenBatch.ref_logp`. Gradients flow through `logp` and `ent` only.

Variants: each baseline is one `LossVariant` record (`registry.py`), the built-in ones in
`variants.py`; `register(LossVariant(...))` adds one without touching anything else.

Metrics: `finalize_metrics(combine_metrics(m1, m2))` → clip_frac_low/high, beta_comp_mean,
beta_stab_mean, frac_damped, entropy_mean/min/max, approx_kl_mean, tokens, sequences, losses.
"""

from dynamo_jax.losses.advantages import (
    grpo_advantages,
    sequence_advantages,
    w_reinforce_advantages,
)
from dynamo_jax.losses.batch import ModStats, TokenBatch
from dynamo_jax.losses.config import LossConfig
from dynamo_jax.losses.logprobs import (
    naive_token_logprobs_entropy,
    sharded_token_logprobs_entropy,
    token_logprobs_entropy,
)
from dynamo_jax.losses.modulation import beta_comp, beta_stab, entropy_change_abs, modulate
from dynamo_jax.losses.policy import (
    build_loss_fn,
    clipped_surrogate,
    combine_metrics,
    finalize_metrics,
    policy_loss,
)
from dynamo_jax.losses.registry import LossVariant, register
from dynamo_jax.losses.stats import minibatch_stats
from dynamo_jax.losses.variants import BASELINES

__all__ = [
    "BASELINES",
    "LossConfig",
    "LossVariant",
    "ModStats",
    "TokenBatch",
    "beta_comp",
    "beta_stab",
    "build_loss_fn",
    "clipped_surrogate",
    "combine_metrics",
    "entropy_change_abs",
    "finalize_metrics",
    "grpo_advantages",
    "minibatch_stats",
    "modulate",
    "naive_token_logprobs_entropy",
    "policy_loss",
    "register",
    "sequence_advantages",
    "sharded_token_logprobs_entropy",
    "token_logprobs_entropy",
    "w_reinforce_advantages",
]
