"""Masked grouped-query attention: the rule, its implementations, and the KV-cache and
shared-prompt variants the decoder (models/qwen.py) calls.

Shape letters as in models/qwen.py: B batch, L query length, S key length, H query heads,
K kv heads, G = H // K, E head_dim.

The rule: a query at slot q may see a key at slot s iff s <= q and both tokens belong to the same
segment (`attention_mask`; segment 0, an empty slot, sees and is seen by nothing).
`ModelConfig.attention_impl` picks how it is computed, once, where the model is built
(`ATTENTION_IMPLS`; models/qwen.py's docstring describes each).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dynamo_jax.models.attention_blockwise import blockwise_attention

Array = jax.Array

# A finite "minus infinity": a fully masked row (a padding query) softmaxes to a uniform row
# instead of NaN, and NaNs never leak into gradients through `where`.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def attention_mask(q_slot_L: Array, q_seg_BxL: Array, kv_seg_BxS: Array) -> Array:
    """bool [B, L, S]: the query at slot q_slot_L[l] may see the key at slot s iff s <= that slot
    and both have the same segment id; segment 0 (empty slots) sees and is seen by nothing."""
    s_idx = jnp.arange(kv_seg_BxS.shape[1])
    causal_LxS = s_idx[None, :] <= q_slot_L[:, None]
    same_BxLxS = kv_seg_BxS[:, None, :] == q_seg_BxL[:, :, None]
    return causal_LxS[None] & same_BxLxS & (kv_seg_BxS[:, None, :] > 0)


def attend(
    q_BxLxHxE: Array,
    k_BxSxKxE: Array,
    v_BxSxKxE: Array,
    allowed_BxLxS: Array,
    causal: bool,
) -> Array:
    """Grouped-query attention over the keys `allowed_BxLxS` permits (`attention_mask`).

    `causal` (queries are the keys' own slots) is implied by the mask; this implementation does
    not need it. A query that may see nothing (an empty slot) gets a uniform average, finite.
    The keys and values are turned into the matmul layout `attend_kv_major` takes.
    """
    del causal
    k_BxKxExS = k_BxSxKxE.transpose(0, 2, 3, 1)
    v_BxKxSxE = v_BxSxKxE.transpose(0, 2, 1, 3)
    return attend_kv_major(q_BxLxHxE, k_BxKxExS, v_BxKxSxE, allowed_BxLxS)


def attend_kv_major(
    q_BxLxHxE: Array, k_BxKxExS: Array, v_BxKxSxE: Array, allowed_BxLxS: Array
) -> Array:
    """`attend` with keys as [B, K, E, S] and values as [B, K, S, E]: the KV cache's layout.

    Scores and softmax run in float32; the value product in the compute dtype. The products
    run as batched matmuls over (batch, kv head) with operands already in [rows, contraction]
    layout, and a kv head's G query heads stacked into one [G·L, E] operand: on XLA:CPU the
    same einsums in the [B, L, H, E] layout measured 1.6x (forward) and 1.8x (forward and
    backward) slower at 8 x 256 tokens, 4 heads of 64 (the dots ran on transposed copies).
    The cache is stored in this layout so a decode step reads it without transposing it.
    """
    b, length, h, e = q_BxLxHxE.shape
    kv_heads, s = k_BxKxExS.shape[1], k_BxKxExS.shape[3]
    g = h // kv_heads
    q_BxKxQLxE = (
        q_BxLxHxE.reshape(b, length, kv_heads, g, e)
        .transpose(0, 2, 3, 1, 4)
        .reshape(b, kv_heads, g * length, e)
    )
    scores = jnp.matmul(q_BxKxQLxE, k_BxKxExS, preferred_element_type=jnp.float32)
    scores = scores.reshape(b, kv_heads, g, length, s) * (e**-0.5)
    scores = jnp.where(allowed_BxLxS[:, None, None], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BxKxSxE.dtype)
    out = jnp.matmul(probs.reshape(b, kv_heads, g * length, s), v_BxKxSxE)
    return out.reshape(b, kv_heads, g, length, e).transpose(0, 3, 1, 2, 4).reshape(b, length, h, e)


# Every attention implementation takes (q, k, v, q_slot_L, q_seg_BxL, kv_seg_BxS, causal, cfg):
# the ingredients of `attention_mask`, so an implementation that never builds the mask can skip it.


def _masked(q_BxLxHxE, k_BxSxKxE, v_BxSxKxE, q_slot_L, q_seg_BxL, kv_seg_BxS, causal, cfg):
    allowed_BxLxS = attention_mask(q_slot_L, q_seg_BxL, kv_seg_BxS)
    return attend(q_BxLxHxE, k_BxSxKxE, v_BxSxKxE, allowed_BxLxS, causal)


def _dot_product_attention(implementation: str):
    """`attend` through `jax.nn.dot_product_attention` with the given implementation."""

    def attend_dpa(q_BxLxHxE, k_BxSxKxE, v_BxSxKxE, q_slot_L, q_seg_BxL, kv_seg_BxS, causal, cfg):
        allowed_BxLxS = attention_mask(q_slot_L, q_seg_BxL, kv_seg_BxS)
        return jax.nn.dot_product_attention(
            q_BxLxHxE,
            k_BxSxKxE,
            v_BxSxKxE,
            mask=allowed_BxLxS[:, None],
            is_causal=causal,
            implementation=implementation,
        )

    return attend_dpa


def _blockwise(q_BxLxHxE, k_BxSxKxE, v_BxSxKxE, q_slot_L, q_seg_BxL, kv_seg_BxS, causal, cfg):
    # `causal` is implied by the slots; the blockwise bound skips the tiles above the diagonal.
    return blockwise_attention(
        q_BxLxHxE,
        k_BxSxKxE,
        v_BxSxKxE,
        q_slot_L,
        q_seg_BxL,
        kv_seg_BxS,
        block_q=cfg.attention_block_q,
        block_k=cfg.attention_block_k,
    )


def _pallas(q_BxLxHxE, k_BxSxKxE, v_BxSxKxE, q_slot_L, q_seg_BxL, kv_seg_BxS, causal, cfg):
    # Imported on use: Pallas' GPU lowering is only needed where this implementation is chosen.
    from dynamo_jax.models.attention_pallas import pallas_attention

    if jax.default_backend() != "gpu":
        raise ValueError(
            "ModelConfig.attention_impl='pallas' runs a Triton kernel and needs an NVIDIA GPU "
            f"(backend here: {jax.default_backend()}); use 'blockwise' elsewhere"
        )
    if not causal:  # decoding against a KV cache: the kernel only knows the training layout
        return _blockwise(
            q_BxLxHxE, k_BxSxKxE, v_BxSxKxE, q_slot_L, q_seg_BxL, kv_seg_BxS, False, cfg
        )
    return pallas_attention(
        q_BxLxHxE,
        k_BxSxKxE,
        v_BxSxKxE,
        q_seg_BxL,
        block_q=cfg.attention_block_q,
        block_k=cfg.attention_block_k,
    )


# ModelConfig.attention_impl → the attention function (models/config.py lists the same names).
ATTENTION_IMPLS = {
    "matmul": _masked,
    "xla": _dot_product_attention("xla"),
    "cudnn": _dot_product_attention("cudnn"),
    "blockwise": _blockwise,
    "pallas": _pallas,
}


def attend_shared(cfg, q, k, v, q_slot_L, q_seg_BxL, kv_seg_BxS, source_B):
    """Attention over (prompts, rows) streams (`SharedPrompts`): the prompts causally among
    themselves; each row's response over its prompt's keys and values, then its own."""
    impl = ATTENTION_IMPLS[cfg.attention_impl]
    out_prompt = impl(q[0], k[0], v[0], q_slot_L[0], q_seg_BxL[0], kv_seg_BxS[0], True, cfg)
    k_BxSxKxE = jnp.concatenate([k[0][source_B], k[1]], axis=1)
    v_BxSxKxE = jnp.concatenate([v[0][source_B], v[1]], axis=1)
    # Not causal in the fused kernels' sense (the queries sit at slots P.. of S = P + C keys):
    # the mask comes from the slots and segments.
    out_rows = impl(
        q[1], k_BxSxKxE, v_BxSxKxE, q_slot_L[1], q_seg_BxL[1], kv_seg_BxS[1], False, cfg
    )
    return out_prompt, out_rows


def attend_cache(cfg, q_BxLxHxE, k_BxLxKxE, v_BxLxKxE, q_slot_L, q_seg_BxL, kv_seg_BxS,
                  cache_index, layer_kv):  # fmt: skip
    """Write L new keys/values into one layer's cache at `cache_index`, attend over the cache.

    The cache (`LayerKV`) keeps keys as [B, K, E, S] and values as [B, K, S, E], the operands'
    layout in `attend_kv_major`, so a decode step writes its one slot in place and reads the
    cache as it is: transposing the whole cache for every token cost more than the attention
    itself on XLA:CPU (benchmarks/decode_profile.py). The other implementations take [B, S, K, E]
    and get transposed copies.
    """
    dt = q_BxLxHxE.dtype
    k_cache, v_cache = layer_kv
    new_k = k_BxLxKxE.transpose(0, 2, 3, 1).astype(k_cache.dtype)
    new_v = v_BxLxKxE.transpose(0, 2, 1, 3).astype(v_cache.dtype)
    k_cache = jax.lax.dynamic_update_slice(k_cache, new_k, (0, 0, 0, cache_index))
    v_cache = jax.lax.dynamic_update_slice(v_cache, new_v, (0, 0, cache_index, 0))
    k, v = k_cache.astype(dt), v_cache.astype(dt)
    if cfg.attention_impl == "matmul":
        allowed_BxLxS = attention_mask(q_slot_L, q_seg_BxL, kv_seg_BxS)
        out = attend_kv_major(q_BxLxHxE, k, v, allowed_BxLxS)
    else:
        k_BxSxKxE, v_BxSxKxE = k.transpose(0, 3, 1, 2), v.transpose(0, 2, 1, 3)
        out = ATTENTION_IMPLS[cfg.attention_impl](
            q_BxLxHxE, k_BxSxKxE, v_BxSxKxE, q_slot_L, q_seg_BxL, kv_seg_BxS, False, cfg
        )
    return out, (k_cache, v_cache)
