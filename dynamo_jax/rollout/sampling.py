"""Next-token sampling for the embedded rollout engine: vLLM's temperature, top-k and top-p.

Everything here is a pure, jittable function of arrays; the engine calls `sample_tokens` once per
decode step on a whole batch.

Definitions (vLLM's, so switching engines does not change the sampling distribution):
- z = logits / T in float32; T == 0 means greedy (argmax of the raw logits) and the reported
  log-probs are then those of the T = 1 distribution, as vLLM's processed log-probs do.
- top-k (k = -1 is off) keeps every token whose tempered logit is >= the k-th largest one (ties
  at the threshold are all kept, as in vLLM's value comparison).
- top-p (p = 1 is off) is applied to the top-k survivors, renormalised: token i is kept iff the
  probability mass of the tokens with a strictly larger logit is < p. This is vLLM's ascending
  cumulative-sum rule (`cumsum <= 1 - p` is dropped, the largest token always kept) written so
  that ties are treated alike instead of by an unstable sort's order.
- The returned log-prob of a token is log softmax over the kept set, i.e. the log-probability
  under the distribution the token was actually drawn from.

Why no sort: XLA's CPU sort of a 152k vocabulary is ~35 ms per row, which would dominate a
decode step. Both thresholds are instead found by a 32-step bisection over the order-preserving
uint32 encoding of float32 (exact, one masked reduction over the vocabulary per step), and a
token is drawn by inverse-CDF with a two-level cumulative sum (one uniform per row instead of V
Gumbel draws; ~6x cheaper on CPU).

Randomness: each row's key is fold_in(key(seed), prompt_id low/high 32 bits, sample_index) and
each step folds in the step number, so a completion never depends on its position in the batch.

Shape letters: B batch rows, V vocabulary, K blocks of the two-level cumulative sum.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_BISECT_STEPS = 32  # uint32 keys: 32 halvings pin the exact threshold.
_CDF_BLOCK = 512  # inner block of the two-level cumulative sum.


def row_keys(seed: int, prompt_ids: np.ndarray, sample_indices: np.ndarray) -> jax.Array:
    """Per-row PRNG keys keyed by (seed, prompt_id, sample_index), never by batch position.

    `prompt_ids` may be any int64 (stable dataset ids): both 32-bit halves are folded in.
    """
    pid = np.asarray(prompt_ids, dtype=np.int64).astype(np.uint64)
    lo = jnp.asarray((pid & np.uint64(0xFFFFFFFF)).astype(np.uint32))
    hi = jnp.asarray((pid >> np.uint64(32)).astype(np.uint32))
    idx = jnp.asarray(np.asarray(sample_indices, dtype=np.uint32))
    base = jax.random.key(np.uint32(seed & 0xFFFFFFFF))

    def one(lo_, hi_, idx_):
        return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(base, lo_), hi_), idx_)

    return jax.vmap(one)(lo, hi, idx)


def step_keys(keys_B: jax.Array, step: jax.Array) -> jax.Array:
    """The keys for decode step `step` (0 = the token sampled from the prefill logits)."""
    return jax.vmap(lambda k: jax.random.fold_in(k, step))(keys_B)


def _ordered_bits(x: jax.Array) -> jax.Array:
    """Map float32 to uint32 so that unsigned order equals float order (-inf lowest)."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    negative = (bits >> 31) == 1
    return jnp.where(negative, ~bits, bits | jnp.uint32(0x80000000))


def _smallest_key_where(keys_BxV: jax.Array, below_fn) -> jax.Array:
    """Per row, the smallest uint32 key t with below_fn(mask_BxV = keys > t) true.

    `below_fn(mask) -> bool_B` must be monotone (false for small t, true for large t) and true at
    t = max key. Bisection over the whole uint32 range: exact after 32 halvings.
    """
    batch = keys_BxV.shape[0]
    lo = jnp.zeros((batch,), jnp.uint32)  # invariant: answer >= lo
    hi = jnp.max(keys_BxV, axis=-1)  # invariant: below_fn(hi) is true

    def body(_, carry):
        lo, hi = carry
        mid = lo + (hi - lo) // 2
        ok = below_fn(keys_BxV > mid[:, None])
        return jnp.where(ok, lo, mid + 1), jnp.where(ok, mid, hi)

    lo, hi = jax.lax.fori_loop(0, _BISECT_STEPS, body, (lo, hi))
    return hi


def restrict_top_k_top_p(
    z_BxV: jax.Array, top_k: jax.Array, top_p: jax.Array, *, use_top_k: bool, use_top_p: bool
) -> jax.Array:
    """Tempered logits with tokens outside vLLM's top-k then top-p set replaced by -inf.

    `top_k` (int32 scalar) and `top_p` (float32 scalar) are traced so that changing them does
    not recompile; `use_top_k` / `use_top_p` are static so the common unrestricted case pays
    nothing.
    """
    if not (use_top_k or use_top_p):
        return z_BxV
    keys_BxV = _ordered_bits(z_BxV)
    keep_BxV = jnp.ones(z_BxV.shape, bool)
    if use_top_k:
        # Keep i iff fewer than k tokens are strictly larger: that is "z_i >= k-th largest".
        thr = _smallest_key_where(keys_BxV, lambda gt: jnp.sum(gt, axis=-1) < top_k)
        keep_BxV = keys_BxV >= thr[:, None]
    if use_top_p:
        z_kept = jnp.where(keep_BxV, z_BxV, -jnp.inf)
        probs_BxV = jax.nn.softmax(z_kept, axis=-1)

        def mass_below_p(gt):
            return jnp.sum(jnp.where(gt, probs_BxV, 0.0), axis=-1) < top_p

        thr = _smallest_key_where(jnp.where(keep_BxV, keys_BxV, 0), mass_below_p)
        keep_BxV = keep_BxV & (keys_BxV >= thr[:, None])
    return jnp.where(keep_BxV, z_BxV, -jnp.inf)


def _inverse_cdf(probs_BxV: jax.Array, u_B: jax.Array) -> jax.Array:
    """Index drawn from each row's `probs` given uniforms u in [0, 1); never a zero-prob index."""
    batch, vocab = probs_BxV.shape
    pad = (-vocab) % _CDF_BLOCK
    probs = jnp.pad(probs_BxV, ((0, 0), (0, pad)))
    blocks_BxKxC = probs.reshape(batch, -1, _CDF_BLOCK)
    block_mass_BxK = jnp.sum(blocks_BxKxC, axis=-1)
    block_cdf_BxK = jnp.cumsum(block_mass_BxK, axis=-1)
    target_B = u_B * block_cdf_BxK[:, -1]
    # First block whose cumulative mass exceeds the target; clamped to the last block with mass
    # because rounding can leave the target at the very top.
    last_block = _last_positive(block_mass_BxK)
    block_B = jnp.minimum(jnp.sum(block_cdf_BxK <= target_B[:, None], axis=-1), last_block)
    inner_BxC = jnp.take_along_axis(blocks_BxKxC, block_B[:, None, None], axis=1)[:, 0]
    before_B = jnp.take_along_axis(block_cdf_BxK, block_B[:, None], axis=1)[:, 0]
    before_B = before_B - jnp.take_along_axis(block_mass_BxK, block_B[:, None], axis=1)[:, 0]
    inner_cdf_BxC = jnp.cumsum(inner_BxC, axis=-1)
    rest_B = target_B - before_B
    inner_B = jnp.minimum(
        jnp.sum(inner_cdf_BxC <= rest_B[:, None], axis=-1), _last_positive(inner_BxC)
    )
    return (block_B * _CDF_BLOCK + inner_B).astype(jnp.int32)


def _last_positive(x_BxN: jax.Array) -> jax.Array:
    idx = jnp.arange(x_BxN.shape[-1], dtype=jnp.int32)
    return jnp.max(jnp.where(x_BxN > 0, idx, 0), axis=-1)


def sample_tokens(
    logits_BxV: jax.Array,
    keys_B: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    *,
    greedy: bool,
    use_top_k: bool,
    use_top_p: bool,
) -> tuple[jax.Array, jax.Array]:
    """One token per row and its log-probability under the distribution it was drawn from.

    Returns (tokens_B int32, logprobs_B float32). `temperature`, `top_k`, `top_p` are traced
    scalars; `greedy`, `use_top_k`, `use_top_p` are static (a handful of compiled variants).
    """
    logits = logits_BxV.astype(jnp.float32)
    z_BxV = logits if greedy else logits / temperature
    z_BxV = restrict_top_k_top_p(z_BxV, top_k, top_p, use_top_k=use_top_k, use_top_p=use_top_p)
    logp_BxV = jax.nn.log_softmax(z_BxV, axis=-1)
    if greedy:
        # HF/torch and jnp argmax both take the first maximum, so ties resolve identically.
        tokens_B = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    else:
        u_B = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys_B)
        tokens_B = _inverse_cdf(jnp.exp(logp_BxV), u_B)
    logprobs_B = jnp.take_along_axis(logp_BxV, tokens_B[:, None], axis=-1)[:, 0]
    return tokens_B, logprobs_B
