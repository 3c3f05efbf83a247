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
token is drawn by inverse-CDF with a two-level cumulative sum done as two small triangular
matmuls (one uniform per row instead of V Gumbel draws, and no XLA CPU cumsum, which is slow).

Randomness: each row's key is fold_in(key(seed), prompt_id low/high 32 bits, sample_index) and
each step folds in the step number, so a completion never depends on its position in the batch.

Shape letters (docs/design.md#shape-letters): B batch rows, V vocabulary, J blocks and C entries
per block of the two-level cumulative sum.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_BISECT_STEPS = 32  # uint32 keys: 32 halvings pin the exact threshold.
_PAD_BLOCK = 256  # block of the two-level cumulative sum when the vocabulary has no divisor.


def row_keys(seed: int, prompt_ids: np.ndarray, sample_indices: np.ndarray) -> jax.Array:
    """Per-row PRNG keys keyed by (seed, prompt_id, sample_index), never by batch position.

    `seed` and `prompt_ids` may be any int64 (stable dataset ids): both 32-bit halves of each
    are used.
    """
    pid = np.asarray(prompt_ids, dtype=np.int64).astype(np.uint64)
    lo = (pid & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    hi = (pid >> np.uint64(32)).astype(np.uint32)
    idx = np.asarray(sample_indices, dtype=np.uint32)
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF  # two's complement, so negative seeds are distinct too
    return _row_keys(np.uint32(seed & 0xFFFFFFFF), np.uint32(seed >> 32), lo, hi, idx)


@jax.jit
def _row_keys(seed_lo, seed_hi, lo_B, hi_B, idx_B):
    # One compiled program: run eagerly, the fold-ins were a dispatch each, ~2 ms a batch.
    base = jax.random.fold_in(jax.random.key(seed_lo), seed_hi)

    def one(lo_, hi_, idx_):
        return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(base, lo_), hi_), idx_)

    return jax.vmap(one)(lo_B, hi_B, idx_B)


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


def _cumsum_by_matmul(x: jax.Array) -> jax.Array:
    """Inclusive cumulative sum along the last axis ([B, J] or [B, C]) as a triangular matmul.

    XLA's CPU cumsum is a slow windowed reduction; for the short axes used here (a few hundred)
    an n × n matmul is both faster and, summing at most n terms, accurate in float32.
    """
    n = x.shape[-1]
    upper = jnp.triu(jnp.ones((n, n), x.dtype))
    return jnp.dot(x, upper, precision=jax.lax.Precision.HIGHEST)


def _cdf_block(vocab: int) -> int:
    """Inner block size for the two-level cumulative sum: a divisor of `vocab` near sqrt(vocab).

    A divisor lets the [B, V] weights be viewed as [B, V/C, C] without a padded copy (the copy
    alone costs as much as the whole draw on CPU). Both levels are triangular matmuls, so sizes
    near sqrt(V) balance them; Qwen's 151,936 = 128 * 1187 gives C = 1187.
    """
    root = vocab**0.5
    divisors = [d for d in range(16, min(vocab, 4096) + 1) if vocab % d == 0]
    if not divisors:
        return _PAD_BLOCK
    return min(divisors, key=lambda d: abs(np.log(d / root)))


def _inverse_cdf(weights_BxV: jax.Array, u_B: jax.Array) -> jax.Array:
    """Index drawn with probability proportional to non-negative `weights` (unnormalised),
    given uniforms u in [0, 1); never an index of zero weight.

    Two levels: pick a block of `_cdf_block(V)` entries by its mass, then an entry inside it, so
    the only full-vocabulary pass is one reduction.
    """
    batch, vocab = weights_BxV.shape
    block = _cdf_block(vocab)
    pad = (-vocab) % block
    if pad:
        weights_BxV = jnp.pad(weights_BxV, ((0, 0), (0, pad)))
    blocks_BxJxC = weights_BxV.reshape(batch, -1, block)
    block_mass_BxJ = jnp.sum(blocks_BxJxC, axis=-1)
    block_cdf_BxJ = _cumsum_by_matmul(block_mass_BxJ)
    target_B = u_B * block_cdf_BxJ[:, -1]
    # First block whose cumulative mass exceeds the target; clamped to the last block with mass
    # because rounding can leave the target at the very top.
    block_B = jnp.minimum(
        jnp.sum(block_cdf_BxJ <= target_B[:, None], axis=-1), _last_positive(block_mass_BxJ)
    )
    inner_BxC = jnp.take_along_axis(blocks_BxJxC, block_B[:, None, None], axis=1)[:, 0]
    before_B = jnp.take_along_axis(block_cdf_BxJ - block_mass_BxJ, block_B[:, None], axis=1)[:, 0]
    inner_cdf_BxC = _cumsum_by_matmul(inner_BxC)
    rest_B = target_B - before_B
    inner_B = jnp.minimum(
        jnp.sum(inner_cdf_BxC <= rest_B[:, None], axis=-1), _last_positive(inner_BxC)
    )
    return (block_B * block + inner_B).astype(jnp.int32)


def _last_positive(x: jax.Array) -> jax.Array:
    """[B, J] or [B, C] → [B]: the last index along the last axis where x > 0 (0 if none)."""
    idx = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.max(jnp.where(x > 0, idx, 0), axis=-1)


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
    # One exp pass over the vocabulary serves both the draw (unnormalised weights) and the
    # log-prob (z_tok - max - log sum); a materialised log_softmax would cost a second one.
    max_B = jnp.max(z_BxV, axis=-1)
    weights_BxV = jnp.exp(z_BxV - max_B[:, None])
    log_total_B = jnp.log(jnp.sum(weights_BxV, axis=-1))
    if greedy:
        # HF/torch and jnp argmax both take the first maximum, so ties resolve identically.
        tokens_B = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    else:
        u_B = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys_B)
        tokens_B = _inverse_cdf(weights_BxV, u_B)
    z_tok_B = jnp.take_along_axis(z_BxV, tokens_B[:, None], axis=-1)[:, 0]
    return tokens_B, z_tok_B - max_B - log_total_B
