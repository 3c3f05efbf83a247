"""Qwen2/Qwen2.5 and Qwen3 decoder in Flax linen.

Shape letters (docs/design.md#shape-letters): B batch, L query length, S key length (cache
slots), D hidden, V vocab, H query heads, K kv heads, G = H // K query heads per kv head, E
head_dim, F mlp width, Ly layers.

Parameters (scan_layers=True stacks every layer's leaves along a leading `layers` axis under
"layers"; unrolled layers are "layers_0", "layers_1", ...):
    embed/embedding            [V, D]     (vocab, embed)
    layers/attn/q_proj/kernel  [D, H, E]  (embed, heads, head_dim)    + bias [H, E] if qkv_bias
    layers/attn/k_proj/kernel  [D, K, E]  (embed, kv_heads, head_dim) + bias [K, E] if qkv_bias
    layers/attn/v_proj/kernel  [D, K, E]
    layers/attn/o_proj/kernel  [H, E, D]  (heads, head_dim, embed)
    layers/attn/q_norm/scale   [E]        (head_dim)   if qk_norm (Qwen3)
    layers/attn/k_norm/scale   [E]
    layers/mlp/{gate,up}_proj/kernel [D, F] (embed, mlp); layers/mlp/down_proj/kernel [F, D]
    layers/input_norm/scale, layers/post_attn_norm/scale [D]; final_norm/scale [D]
    lm_head/kernel             [D, V]     (embed, vocab)  only when embeddings are untied

One attention rule serves training (keys = the row itself) and decoding (keys = the KV cache):
a query at slot q may see a key at slot s iff s <= q and both tokens belong to the same segment
(`attention_mask`). Training rows carry per-token segment ids: 1, 2, ... for the sequences packed
into a row, 0 for empty slots, so a 0/1 attention mask is the one-sequence-per-row case; a cache
has one segment per row (its valid slots). Slots, not positions, decide causality, so left and
right padding both work; RoPE uses the explicit positions, which restart at 0 for every packed
sequence. Segments never see each other, so packed and padded sequences get the same outputs.

`ModelConfig.attention_impl` picks how the masked attention is computed, once, where the model is
built (`ATTENTION_IMPLS`): "matmul" (batched matmuls, below) or `jax.nn.dot_product_attention`
with implementation "xla" or "cudnn" (fused flash attention on NVIDIA GPUs, bf16/fp16; the
causal flag lets it skip the blocks above the diagonal) all build the [B, L, S] mask;
"blockwise" (models/attention_blockwise.py) computes the same rule per tile from slots and
segment ids, with memory linear in length; "pallas" (models/attention_pallas.py) is the Pallas
GPU flash kernel with segment ids, for training rows on NVIDIA GPUs.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from dynamo_jax.models.attention_blockwise import blockwise_attention
from dynamo_jax.models.config import ModelConfig

Array = jax.Array
# One layer's KV cache, (k_BxKxExS, v_BxKxSxE), or None when running without a cache.
LayerKV = tuple[Array, Array] | None

_INIT_STD = 0.02  # HF initializer_range for Qwen
# A finite "minus infinity": a fully masked row (a padding query) softmaxes to a uniform row
# instead of NaN, and NaNs never leak into gradients through `where`.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def _dtype(name: str) -> jnp.dtype:
    return jnp.dtype(name)


def _param(module: nn.Module, name: str, init, shape, axes, dtype) -> Array:
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


class RMSNorm(nn.Module):
    """RMSNorm as in HF Qwen: statistics in float32, then scale, then back to compute dtype."""

    eps: float
    axis_name: str
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = _param(
            self, "scale", nn.initializers.ones, (x.shape[-1],), (self.axis_name,), self.param_dtype
        )
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (scale.astype(jnp.float32) * x32).astype(self.dtype)


# RoPE's (cos, sin) at each token's position, each [B, L, 1, E/2] float32: computed once per
# forward and shared by every layer's queries and keys. Computed inside each layer instead, XLA
# fused the sin/cos into the per-head fusions of every layer, forward and backward (recomputing
# them H + K times per layer): ~10% of the small-qwen3 update on XLA:CPU.
RopeTable = tuple[Array, Array]


def rope_table(positions_BxL: Array, head_dim: int, theta: float) -> RopeTable:
    """(cos, sin) of RoPE's angles at `positions_BxL`, HF's inverse frequencies."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles_BxLxE2 = positions_BxL.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(angles_BxLxE2)[:, :, None, :], jnp.sin(angles_BxLxE2)[:, :, None, :]


def rope(x_BxLxHxE: Array, table: RopeTable) -> Array:
    """Rotary embedding, HF "rotate_half" layout (first half / second half of head_dim)."""
    cos, sin = table
    e = x_BxLxHxE.shape[-1]
    x = x_BxLxHxE.astype(jnp.float32)
    x1, x2 = x[..., : e // 2], x[..., e // 2 :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BxLxHxE.dtype)


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


def _attend_cache(cfg, q_BxLxHxE, k_BxLxKxE, v_BxLxKxE, q_slot_L, q_seg_BxL, kv_seg_BxS,
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


class Attention(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(
        self,
        x_BxLxD: Array,
        rope_cs: RopeTable,
        q_slot_L: Array,
        q_seg_BxL: Array,
        kv_seg_BxS: Array,
        cache_index: Array | None,
        layer_kv: LayerKV,
    ) -> tuple[Array, LayerKV]:
        cfg, dt, pdt = self.cfg, _dtype(self.cfg.dtype), _dtype(self.cfg.param_dtype)
        q = _Proj(cfg, cfg.num_heads, "heads", name="q_proj")(x_BxLxD)
        k = _Proj(cfg, cfg.num_kv_heads, "kv_heads", name="k_proj")(x_BxLxD)
        v = _Proj(cfg, cfg.num_kv_heads, "kv_heads", name="v_proj")(x_BxLxD)
        if cfg.qk_norm:
            q = RMSNorm(cfg.rms_norm_eps, "head_dim", dt, pdt, name="q_norm")(q)
            k = RMSNorm(cfg.rms_norm_eps, "head_dim", dt, pdt, name="k_norm")(k)
        q = rope(q, rope_cs)
        k = rope(k, rope_cs)
        q = nn.with_logical_constraint(q, ("act_batch", "act_len", "act_heads", None))
        if layer_kv is None:
            # The keys are the queries' own slots: causal in the fused kernels' sense.
            out = ATTENTION_IMPLS[cfg.attention_impl](
                q, k, v, q_slot_L, q_seg_BxL, kv_seg_BxS, True, cfg
            )
        else:
            out, layer_kv = _attend_cache(cfg, q, k, v, q_slot_L, q_seg_BxL, kv_seg_BxS,
                                          cache_index, layer_kv)  # fmt: skip
        o_kernel = _Kernel(
            (cfg.num_heads, cfg.head_dim, cfg.hidden_size),
            ("heads", "head_dim", "embed"),
            pdt,
            name="o_proj",
        )()
        b, length = out.shape[:2]
        y = out.reshape(b * length, -1) @ o_kernel.reshape(-1, cfg.hidden_size).astype(dt)
        y = y.reshape(b, length, cfg.hidden_size)
        return y, layer_kv


class _Proj(nn.Module):
    """x @ kernel[D, heads, E] (+ bias[heads, E]): a q/k/v projection kept per head."""

    cfg: ModelConfig
    heads: int
    heads_axis: str

    @nn.compact
    def __call__(self, x_BxLxD: Array) -> Array:
        cfg, dt, pdt = self.cfg, _dtype(self.cfg.dtype), _dtype(self.cfg.param_dtype)
        shape = (cfg.hidden_size, self.heads, cfg.head_dim)
        axes = ("embed", self.heads_axis, "head_dim")
        kernel = _param(self, "kernel", nn.initializers.normal(_INIT_STD), shape, axes, pdt)
        # One [tokens, D] x [D, heads·E] product, as in `MLP`: with the einsum over [B, L, D]
        # and the [D, heads, E] kernel, XLA:CPU transposed the query gradient into a [heads·E,
        # tokens] copy for the kernel's gradient (~6 ms a layer at small-qwen3 on one core).
        b, length, d = x_BxLxD.shape
        y_NxHE = x_BxLxD.reshape(b * length, d) @ kernel.reshape(d, -1).astype(dt)
        y = y_NxHE.reshape(b, length, self.heads, cfg.head_dim)
        if cfg.qkv_bias:
            bias = _param(self, "bias", nn.initializers.zeros, shape[1:], axes[1:], pdt)
            y = y + bias.astype(dt)
        return y


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BxLxD: Array) -> Array:
        cfg, dt, pdt = self.cfg, _dtype(self.cfg.dtype), _dtype(self.cfg.param_dtype)
        d, f = cfg.hidden_size, cfg.intermediate_size
        gate = _Kernel((d, f), ("embed", "mlp"), pdt, name="gate_proj")()
        up = _Kernel((d, f), ("embed", "mlp"), pdt, name="up_proj")()
        down = _Kernel((f, d), ("mlp", "embed"), pdt, name="down_proj")()
        # The products run on [tokens, features] operands: on XLA:CPU the backward of the same
        # SwiGLU over [B, L, ...] operands measured ~1.8x slower (small-qwen3 gradient: 311 ms
        # -> 260 ms).
        b, length = x_BxLxD.shape[:2]
        x_NxD = x_BxLxD.reshape(b * length, d)
        h_NxF = jax.nn.silu(x_NxD @ gate.astype(dt)) * (x_NxD @ up.astype(dt))
        h = h_NxF.reshape(b, length, f)
        h = nn.with_logical_constraint(h, ("act_batch", "act_len", "act_mlp"))
        return (h.reshape(b * length, f) @ down.astype(dt)).reshape(b, length, d)


class _Kernel(nn.Module):
    """A bare weight matrix at <name>/kernel, so parameter paths mirror HF module names."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]
    param_dtype: Any

    @nn.compact
    def __call__(self) -> Array:
        init = nn.initializers.normal(_INIT_STD)
        return _param(self, "kernel", init, self.shape, self.axes, self.param_dtype)


class DecoderLayer(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(
        self,
        x_BxLxD: Array,
        rope_cs: RopeTable,
        q_slot_L: Array,
        q_seg_BxL: Array,
        kv_seg_BxS: Array,
        cache_index: Array | None,
        layer_kv: LayerKV,
    ) -> tuple[Array, LayerKV]:
        cfg, dt, pdt = self.cfg, _dtype(self.cfg.dtype), _dtype(self.cfg.param_dtype)
        x = nn.with_logical_constraint(x_BxLxD, ("act_batch", "act_len", "act_embed"))
        h = RMSNorm(cfg.rms_norm_eps, "embed", dt, pdt, name="input_norm")(x)
        h, layer_kv = Attention(cfg, name="attn")(
            h, rope_cs, q_slot_L, q_seg_BxL, kv_seg_BxS, cache_index, layer_kv
        )
        x = x + h
        h = RMSNorm(cfg.rms_norm_eps, "embed", dt, pdt, name="post_attn_norm")(x)
        x = x + MLP(cfg, name="mlp")(h)
        return x, layer_kv


_REMAT_POLICIES = {
    "full": None,  # save nothing: recompute the whole layer in the backward pass
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "everything_saveable": jax.checkpoint_policies.everything_saveable,
}


def _layer_class(cfg: ModelConfig):
    if cfg.remat_policy == "none":
        return DecoderLayer
    return nn.remat(
        DecoderLayer, policy=_REMAT_POLICIES[cfg.remat_policy], prevent_cse=not cfg.scan_layers
    )


class Transformer(nn.Module):
    """The decoder. `__call__` gives float32 logits; `hidden` the final-norm output."""

    cfg: ModelConfig

    def setup(self):
        cfg = self.cfg
        self.embed = nn.Embed(
            cfg.vocab_size,
            cfg.hidden_size,
            dtype=_dtype(cfg.dtype),
            param_dtype=_dtype(cfg.param_dtype),
            embedding_init=nn.with_logical_partitioning(
                nn.initializers.normal(_INIT_STD), ("vocab", "embed")
            ),
        )
        if cfg.scan_layers:
            # DecoderLayer already has scan's (carry, *xs) -> (carry, ys) signature.
            self.layers = nn.scan(
                _layer_class(cfg),
                variable_axes={"params": 0},
                split_rngs={"params": True},
                in_axes=(nn.broadcast,) * 5 + (0,),
                length=cfg.num_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )(cfg)
        else:
            self.layer_list = [
                _layer_class(cfg)(cfg, name=f"layers_{i}") for i in range(cfg.num_layers)
            ]
        dt, pdt = _dtype(cfg.dtype), _dtype(cfg.param_dtype)
        self.final_norm = RMSNorm(cfg.rms_norm_eps, "embed", dt, pdt)
        if not cfg.tie_word_embeddings:
            self.lm_head = _Kernel((cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pdt)

    def _run(self, tokens_BxL, positions_BxL, segment_ids_BxL):
        """Embed, run all layers over the rows themselves (no cache), final norm."""
        x = self._embed(tokens_BxL)
        q_slot_L = jnp.arange(tokens_BxL.shape[1])
        seg = segment_ids_BxL.astype(jnp.int32)
        masks = (q_slot_L, seg, seg)
        rope_cs = self._rope_table(positions_BxL)
        if self.cfg.scan_layers:
            x, _ = self.layers(x, rope_cs, *masks, None, None)
        else:
            for layer in self.layer_list:
                x, _ = layer(x, rope_cs, *masks, None, None)
        return self.final_norm(x)

    def _rope_table(self, positions_BxL: Array) -> RopeTable:
        return rope_table(positions_BxL, self.cfg.head_dim, self.cfg.rope_theta)

    def _embed(self, tokens_BxL: Array) -> Array:
        x = self.embed(tokens_BxL.astype(jnp.int32))
        return nn.with_logical_constraint(x, ("act_batch", "act_len", "act_embed"))

    def hidden(self, tokens_BxL: Array, positions_BxL: Array, segment_ids_BxL: Array) -> Array:
        """Final-norm hidden states [B, L, D] in the compute dtype (no unembedding).

        `segment_ids_BxL`: 0 for empty slots, k >= 1 for the row's k-th sequence (a 0/1
        attention mask is one sequence per row); tokens attend within their segment only.
        """
        h = self._run(tokens_BxL, positions_BxL, segment_ids_BxL)
        return h

    def logits(self, hidden_BxLxD: Array) -> Array:
        """float32 logits from hidden states, with the (tied or separate) unembedding."""
        if self.cfg.tie_word_embeddings:
            w_DxV = self.embed.embedding.T
        else:
            w_DxV = self.lm_head()
        logits = jnp.einsum(
            "bld,dv->blv",
            hidden_BxLxD,
            w_DxV.astype(hidden_BxLxD.dtype),
            preferred_element_type=jnp.float32,
        )
        return nn.with_logical_constraint(logits, ("act_batch", "act_len", "act_vocab"))

    def __call__(self, tokens_BxL: Array, positions_BxL: Array, segment_ids_BxL: Array) -> Array:
        return self.logits(self.hidden(tokens_BxL, positions_BxL, segment_ids_BxL))

    def extend(self, tokens_BxL, positions_BxL, q_slot_L, kv_valid_BxS, cache_index, kv):
        """Run L new tokens against a KV cache: (k, v), each a tuple of one array per layer
        (`LayerKV` layout).

        `kv_valid_BxS` already marks the new tokens' slots (1 = real): a row of the cache is one
        segment. Returns (float32 logits of the last of the L tokens [B, V], updated (k, v)).

        The layers run unrolled here whatever `scan_layers` says, each on its own cache arrays:
        a decode loop then updates every layer's cache in place. Scanning would slice each
        layer's cache out of a stacked one and stack it again, copying the whole cache for every
        token (3-8x the attention's own time on XLA:CPU, benchmarks/decode_profile.py).
        """
        kv_seg_BxS = kv_valid_BxS.astype(jnp.int32)
        q_seg_BxL = jax.lax.dynamic_slice_in_dim(kv_seg_BxS, cache_index, q_slot_L.shape[0], axis=1)
        masks = (q_slot_L, q_seg_BxL, kv_seg_BxS)
        x = self._embed(tokens_BxL)
        rope_cs = self._rope_table(positions_BxL)
        new_k, new_v = [], []
        for i, layer_params in enumerate(self._per_layer_params()):
            # Unbound (parent=None): the layer's parameters are passed in, not owned here.
            layer = DecoderLayer(self.cfg, parent=None)
            x, (k, v) = layer.apply(
                {"params": layer_params},
                x,
                rope_cs,
                *masks,
                cache_index,
                (kv[0][i], kv[1][i]),
            )
            new_k.append(k)
            new_v.append(v)
        h = self.final_norm(x)
        return self.logits(h[:, -1:])[:, 0], (tuple(new_k), tuple(new_v))

    def _per_layer_params(self) -> list[Any]:
        """Each layer's parameter tree, sliced out of the stacked ones when layers are scanned."""
        params, _ = unrolled_layers(self.variables["params"], self.cfg)
        return [params[f"layers_{i}"] for i in range(self.cfg.num_layers)]


def unrolled_layers(params: Any, cfg: ModelConfig) -> tuple[Any, ModelConfig]:
    """The same model with scanned layers split into layers_0 .. layers_{Ly-1}: (params, cfg).

    A decode loop calls this once, outside the loop: with stacked parameters XLA:CPU copied every
    layer's weights out of the stack on every decode step (it does not hoist the slices)."""
    if not cfg.scan_layers:
        return params, cfg
    out = {name: tree for name, tree in params.items() if name != "layers"}
    for i in range(cfg.num_layers):
        out[f"layers_{i}"] = jax.tree.map(lambda p, i=i: p[i], params["layers"])
    return out, cfg.replace(scan_layers=False)


def _init_boxed(cfg: ModelConfig, rng: Array):
    # The parameters do not depend on how attention is computed: init traces "matmul", so a
    # GPU-only implementation can still be initialised or shape-evaluated anywhere.
    cfg = cfg.replace(attention_impl="matmul")
    tokens = jnp.zeros((1, 1), jnp.int32)
    return Transformer(cfg).init(rng, tokens, tokens, jnp.ones((1, 1), jnp.int32))["params"]


def init_params(cfg: ModelConfig, rng: Array, *, shardings: Any = None) -> Any:
    """Random parameters (plain arrays). With `shardings` (a pytree of NamedSharding matching
    the params), each leaf is created directly in its sharded layout."""
    fn = lambda r: nn.meta.unbox(_init_boxed(cfg, r))
    if shardings is None:
        return jax.jit(fn)(rng)
    return jax.jit(fn, out_shardings=shardings)(rng)


def param_logical_axes(cfg: ModelConfig) -> Any:
    """PartitionSpecs of logical axis names for every parameter, without allocating anything."""
    boxed = jax.eval_shape(lambda r: _init_boxed(cfg, r), jax.random.key(0))
    return nn.get_partition_spec(boxed)


def param_shapes(cfg: ModelConfig) -> Any:
    """jax.ShapeDtypeStruct for every parameter, without allocating anything."""
    return jax.eval_shape(lambda r: nn.meta.unbox(_init_boxed(cfg, r)), jax.random.key(0))


def unembedding(params: Any, cfg: ModelConfig) -> Array:
    """The [D, V] output projection: the embedding transposed when tied, else lm_head."""
    if cfg.tie_word_embeddings:
        return params["embed"]["embedding"].T
    return params["lm_head"]["kernel"]


def forward(params: Any, cfg: ModelConfig, tokens_BxL, positions_BxL, segment_ids_BxL) -> Array:
    """float32 logits [B, L, V]: a functional shorthand for Transformer(cfg).apply.

    `segment_ids_BxL` as in `Transformer.hidden` (a 0/1 attention mask: one sequence per row).
    """
    return Transformer(cfg).apply({"params": params}, tokens_BxL, positions_BxL, segment_ids_BxL)


# Jitted shorthand (cfg static) shared by all callers, so equal shapes compile once.
forward_jit = jax.jit(forward, static_argnums=1)


def positions_from_mask(mask_BxL: Array) -> Array:
    """Positions counting only real tokens, so every row starts at 0 whatever its padding."""
    return jnp.maximum(jnp.cumsum(mask_BxL.astype(jnp.int32), axis=1) - 1, 0)
