"""KV-cache decoding: prefill a batch of left-padded prompts, then one token at a time.

The cache has `max_len` slots per row. Every row advances by the same number of slots per call
(slot index `index` is shared), while each row's RoPE position counts only its real tokens, so a
left-padded prompt starts at position 0 exactly as it would unpadded. Padding slots are marked
invalid and never attended to.

All functions are jittable with `cfg` static, e.g. `jax.jit(decode_step, static_argnums=1)`.
Writing past `max_len` cannot be detected inside jit (the slot index is traced): size the cache
as prompt length + max new tokens.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from dynamo_jax.models.config import ModelConfig
from dynamo_jax.models.qwen import Transformer, positions_from_mask

Array = jax.Array


class KVCache(NamedTuple):
    """Each layer's keys/values, plus bookkeeping.

    k:          Ly arrays [B, K, E, S], keys after RoPE
    v:          Ly arrays [B, K, S, E], values
                (separate per-layer arrays in the attention's operand layout, so a decode loop
                writes each layer's new slot in place: models/qwen.Transformer.extend)
    valid_BxS:  int32, 1 where a slot holds a real token
    index:      int32 scalar, the next slot to write (same for every row)
    next_pos_B: int32, the RoPE position of each row's next token
    """

    k: tuple[Array, ...]
    v: tuple[Array, ...]
    valid_BxS: Array
    index: Array
    next_pos_B: Array

    @property
    def max_len(self) -> int:
        return self.v[0].shape[2]


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype: Any = jnp.float32) -> KVCache:
    """An empty cache for `batch` rows of up to `max_len` tokens (prompt + generated)."""
    if batch < 1 or max_len < 1:
        raise ValueError(f"init_cache needs batch >= 1 and max_len >= 1, got {batch}, {max_len}")
    k_shape = (batch, cfg.num_kv_heads, cfg.head_dim, max_len)
    v_shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
    return KVCache(
        k=tuple(jnp.zeros(k_shape, dtype) for _ in range(cfg.num_layers)),
        v=tuple(jnp.zeros(v_shape, dtype) for _ in range(cfg.num_layers)),
        valid_BxS=jnp.zeros((batch, max_len), jnp.int32),
        index=jnp.zeros((), jnp.int32),
        next_pos_B=jnp.zeros((batch,), jnp.int32),
    )


def _extend(
    params: Any,
    cfg: ModelConfig,
    tokens_BxL: Array,
    mask_BxL: Array,
    positions_BxL: Array,
    cache: KVCache,
) -> tuple[Array, KVCache]:
    """Append L tokens (mask 1 = real) at the cache's current slot; logits of the last one."""
    length = tokens_BxL.shape[1]
    mask_BxL = mask_BxL.astype(jnp.int32)
    valid_BxS = jax.lax.dynamic_update_slice(cache.valid_BxS, mask_BxL, (0, cache.index))
    q_slot_L = cache.index + jnp.arange(length, dtype=jnp.int32)
    logits_BxV, (k, v) = Transformer(cfg).apply(
        {"params": params},
        tokens_BxL,
        positions_BxL,
        q_slot_L,
        valid_BxS,
        cache.index,
        (cache.k, cache.v),
        method=Transformer.extend,
    )
    next_pos_B = cache.next_pos_B + jnp.sum(mask_BxL, axis=1)
    return logits_BxV, KVCache(k, v, valid_BxS, cache.index + length, next_pos_B)


def prefill(
    params: Any, cfg: ModelConfig, tokens_BxL: Array, mask_BxL: Array, cache: KVCache
) -> tuple[Array, KVCache]:
    """Run LEFT-padded prompts (mask 1 = real token) into an empty cache.

    Returns float32 logits of each prompt's last token [B, V] and the filled cache. Positions are
    derived from the mask so every row starts at 0.
    """
    if tokens_BxL.shape != mask_BxL.shape:
        raise ValueError(f"prefill: tokens {tokens_BxL.shape} and mask {mask_BxL.shape} differ")
    if tokens_BxL.shape[0] != cache.valid_BxS.shape[0]:
        raise ValueError(
            f"prefill: batch {tokens_BxL.shape[0]} != cache batch {cache.valid_BxS.shape[0]}"
        )
    if tokens_BxL.shape[1] > cache.max_len:
        raise ValueError(
            f"prefill: prompt length {tokens_BxL.shape[1]} > cache max_len {cache.max_len}"
        )
    positions_BxL = cache.next_pos_B[:, None] + positions_from_mask(mask_BxL)
    return _extend(params, cfg, tokens_BxL, mask_BxL, positions_BxL, cache)


def decode_step(
    params: Any, cfg: ModelConfig, tokens_B: Array, cache: KVCache
) -> tuple[Array, KVCache]:
    """Feed one token per row; returns float32 next-token logits [B, V] and the updated cache."""
    tokens_Bx1 = tokens_B.reshape(-1, 1)
    mask_Bx1 = jnp.ones_like(tokens_Bx1, dtype=jnp.int32)
    positions_Bx1 = cache.next_pos_B[:, None]
    return _extend(params, cfg, tokens_Bx1, mask_Bx1, positions_Bx1, cache)


def greedy_generate(
    params: Any, cfg: ModelConfig, tokens_BxL: Array, mask_BxL: Array, max_new_tokens: int
) -> Array:
    """Greedy continuation of left-padded prompts: [B, max_new_tokens] token ids (no stopping).

    A reference decoder for tests and smoke runs; the rollout engine has the real sampler.
    """
    cache = init_cache(cfg, tokens_BxL.shape[0], tokens_BxL.shape[1] + max_new_tokens)
    logits_BxV, cache = prefill_jit(params, cfg, tokens_BxL, mask_BxL, cache)
    out = []
    for _ in range(max_new_tokens):
        next_B = jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
        out.append(next_B)
        logits_BxV, cache = decode_step_jit(params, cfg, next_B, cache)
    return jnp.stack(out, axis=1)


# Shared jitted entry points (cfg static), so every caller reuses one compilation per shape.
prefill_jit = jax.jit(prefill, static_argnums=1)
decode_step_jit = jax.jit(decode_step, static_argnums=1)
