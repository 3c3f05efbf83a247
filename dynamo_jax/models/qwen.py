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
built (`ATTENTION_IMPLS`, models/attention.py): "matmul" (batched matmuls) or
`jax.nn.dot_product_attention` with implementation "xla" or "cudnn" (fused flash attention on NVIDIA GPUs, bf16/fp16; the
causal flag lets it skip the blocks above the diagonal) all build the [B, L, S] mask;
"blockwise" (models/attention_blockwise.py) computes the same rule per tile from slots and
segment ids, with memory linear in length; "pallas" (models/attention_pallas.py) is the Pallas
GPU flash kernel with segment ids, for training rows on NVIDIA GPUs.

Shared prompts (`SharedPrompts`, train.share_prompts): when rows repeat a prompt, as a GRPO
group's samples do, the forward can run each distinct prompt once and every row's response
against it: the layers then carry (prompts, rows) pairs of streams through the same modules.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from dynamo_jax.models import init_normals
from dynamo_jax.models.attention import (  # noqa: F401  (attend, attention_mask: re-exported)
    ATTENTION_IMPLS,
    attend,
    attend_cache,
    attend_shared,
    attention_mask,
)
from dynamo_jax.models.config import ModelConfig

Array = jax.Array
# One layer's KV cache, (k_BxKxExS, v_BxKxSxE), or None when running without a cache.
LayerKV = tuple[Array, Array] | None

_INIT_STD = 0.02  # HF initializer_range for Qwen


def _dtype(name: str) -> jnp.dtype:
    return jnp.dtype(name)


def _param(module: nn.Module, name: str, init, shape, axes, dtype) -> Array:
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


def _each(fn, x, *more):
    """`fn` over one array, or over each stream of a (prompts, rows) pair of shared-prompt
    streams (`SharedPrompts`) with the other arguments paired the same way."""
    if isinstance(x, tuple):
        return tuple(fn(*args) for args in zip(x, *more, strict=True))
    return fn(x, *more)


def _constrain_heads(q_BxLxHxE: Array) -> Array:
    return nn.with_logical_constraint(q_BxLxHxE, ("act_batch", "act_len", "act_heads", None))


def _tokens(x_BxLxF: Array) -> Array:
    """[B, L, ...] -> [B·L, F]: the products run on [tokens, features] operands (see `MLP`)."""
    return x_BxLxF.reshape(x_BxLxF.shape[0] * x_BxLxF.shape[1], -1)


class SharedPrompts(NamedTuple):
    """Rows whose prompts repeat (a GRPO group's samples) run each distinct prompt once.

    Every row holds its prompt in slots [0, slots) (right-aligned, left-padded) and its response
    after it. The model runs the prompt slots of the rows `table_G` only, and the response slots
    of every row; the queries of row b's response attend to the keys of prompt
    `source_B[b]` (whose slots are row b's own prompt: the caller guarantees equal prompt slots)
    then to their own. The prompt's hidden states come back on every row of it, so the output is
    the unshared forward's, up to summation order, and the prompt's gradient is the sum of its
    rows' (the gather's transpose)."""

    slots: int  # P, static: the prompt slots of every row
    table_G: Array  # int32 [G]: a row holding each distinct prompt
    source_B: Array  # int32 [B]: which of the G prompts each row's is


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


# RoPE's (cos, ±sin) at each token's position, float32 (`rope_table`): computed once per
# forward and shared by every layer's queries and keys. Computed inside each layer instead, XLA
# fused the sin/cos into the per-head fusions of every layer, forward and backward (recomputing
# them H + K times per layer).
RopeTable = tuple[Array, Array]


def rope_table(positions_BxL: Array, head_dim: int, theta: float) -> RopeTable:
    """RoPE's (cos, ±sin) at `positions_BxL`, HF's inverse frequencies, each [B, L, 1, 2, E/2]:
    cos on both halves of head_dim, sin as (−sin, +sin) (`rope`'s operands)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions_BxL.astype(jnp.float32)[:, :, None, None, None] * inv_freq
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    return jnp.concatenate([cos, cos], axis=3), jnp.concatenate([-sin, sin], axis=3)


def rope(x_BxLxHxE: Array, table: RopeTable) -> Array:
    """Rotary embedding, HF "rotate_half" layout (first half / second half of head_dim):
    (x1, x2) -> (x1 cos − x2 sin, x2 cos + x1 sin), written as x·cos + swap(x)·(−sin, sin) over
    the halves. Slicing and concatenating the halves instead cost a pad-and-add pass per
    projection in the backward on XLA:CPU (~3 ms a layer at small-qwen3)."""
    cos, sin = table
    b, length, h, e = x_BxLxHxE.shape
    x = x_BxLxHxE.astype(jnp.float32).reshape(b, length, h, 2, e // 2)
    out = x * cos + x[:, :, :, ::-1] * sin
    return out.reshape(b, length, h, e).astype(x_BxLxHxE.dtype)


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
        prompt_source_B: Array | None = None,
    ) -> tuple[Array, LayerKV]:
        cfg, dt, pdt = self.cfg, _dtype(self.cfg.dtype), _dtype(self.cfg.param_dtype)
        q = _each(_Proj(cfg, cfg.num_heads, "heads", name="q_proj"), x_BxLxD)
        k = _each(_Proj(cfg, cfg.num_kv_heads, "kv_heads", name="k_proj"), x_BxLxD)
        v = _each(_Proj(cfg, cfg.num_kv_heads, "kv_heads", name="v_proj"), x_BxLxD)
        if cfg.qk_norm:
            q = _each(RMSNorm(cfg.rms_norm_eps, "head_dim", dt, pdt, name="q_norm"), q)
            k = _each(RMSNorm(cfg.rms_norm_eps, "head_dim", dt, pdt, name="k_norm"), k)
        q, k = _each(rope, q, rope_cs), _each(rope, k, rope_cs)
        q = _each(_constrain_heads, q)
        if prompt_source_B is not None:
            out = attend_shared(cfg, q, k, v, q_slot_L, q_seg_BxL, kv_seg_BxS, prompt_source_B)
        elif layer_kv is None:
            # The keys are the queries' own slots: causal in the fused kernels' sense.
            out = ATTENTION_IMPLS[cfg.attention_impl](
                q, k, v, q_slot_L, q_seg_BxL, kv_seg_BxS, True, cfg
            )
        else:
            out, layer_kv = attend_cache(cfg, q, k, v, q_slot_L, q_seg_BxL, kv_seg_BxS,
                                          cache_index, layer_kv)  # fmt: skip
        o_kernel = _Kernel(
            (cfg.num_heads, cfg.head_dim, cfg.hidden_size),
            ("heads", "head_dim", "embed"),
            pdt,
            name="o_proj",
        )()
        w_HExD = o_kernel.reshape(-1, cfg.hidden_size).astype(dt)
        y = _each(lambda o: (_tokens(o) @ w_HExD).reshape(o.shape[:2] + (-1,)), out)
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
        kernel = _param(self, "kernel", init_normals.normal(_INIT_STD), shape, axes, pdt)
        # One [tokens, D] x [D, heads·E] product, as in `MLP`: with the einsum over [B, L, D]
        # and the [D, heads, E] kernel, XLA:CPU transposed the query gradient into a [heads·E,
        # tokens] copy for the kernel's gradient (~6 ms a layer at small-qwen3 on one core).
        y_NxHE = _tokens(x_BxLxD) @ kernel.reshape(shape[0], -1).astype(dt)
        y = y_NxHE.reshape(x_BxLxD.shape[:2] + shape[1:])
        if cfg.qkv_bias:
            bias = _param(self, "bias", nn.initializers.zeros, shape[1:], axes[1:], pdt)
            y = y + bias.astype(dt)
        return y


@jax.custom_vjp
def swiglu(gate_NxF: Array, up_NxF: Array) -> Array:
    """silu(gate) · up, with a backward that keeps only its two inputs.

    Differentiated by JAX, the forward wrote σ(gate), silu(gate) and the product in three
    memory-bound passes over [tokens, F] on XLA:CPU (~8 ms a layer at small-qwen3), two of them
    kept for the backward. Here XLA keeps σ(gate), which the backward shares, and the product:
    one pass fewer each way, 3-4% of the small-qwen3 update (the same formulas: the gradient
    test against torch in tests/test_models_qwen.py)."""
    return gate_NxF * jax.nn.sigmoid(gate_NxF) * up_NxF


def _swiglu_fwd(gate_NxF, up_NxF):
    return swiglu(gate_NxF, up_NxF), (gate_NxF, up_NxF)


def _swiglu_bwd(residuals, dh_NxF):
    gate, up = residuals
    sig = jax.nn.sigmoid(gate)
    # d silu(g)/dg = σ(g) (1 + g (1 − σ(g)))
    return dh_NxF * up * sig * (1 + gate * (1 - sig)), dh_NxF * gate * sig


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


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
        h_NxF = swiglu(x_NxD @ gate.astype(dt), x_NxD @ up.astype(dt))
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
        init = init_normals.normal(_INIT_STD)
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
        prompt_source_B: Array | None = None,
    ) -> tuple[Array, LayerKV]:
        """One layer. With `prompt_source_B`, the arrays are (prompts, rows) pairs
        (`SharedPrompts`, `Transformer._run`)."""
        cfg, dt, pdt = self.cfg, _dtype(self.cfg.dtype), _dtype(self.cfg.param_dtype)
        axes = ("act_batch", "act_len", "act_embed")
        x = _each(lambda x: nn.with_logical_constraint(x, axes), x_BxLxD)
        h = _each(RMSNorm(cfg.rms_norm_eps, "embed", dt, pdt, name="input_norm"), x)
        h, layer_kv = Attention(cfg, name="attn")(
            h, rope_cs, q_slot_L, q_seg_BxL, kv_seg_BxS, cache_index, layer_kv, prompt_source_B
        )
        x = _each(jnp.add, x, h)
        h = _each(RMSNorm(cfg.rms_norm_eps, "embed", dt, pdt, name="post_attn_norm"), x)
        x = _each(jnp.add, x, _each(MLP(cfg, name="mlp"), h))
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
                init_normals.normal(_INIT_STD), ("vocab", "embed")
            ),
        )
        if cfg.scan_layers:
            # DecoderLayer already has scan's (carry, *xs) -> (carry, ys) signature.
            self.layers = nn.scan(
                _layer_class(cfg),
                variable_axes={"params": 0},
                split_rngs={"params": True},
                in_axes=(nn.broadcast,) * 5 + (0, nn.broadcast),
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

    def _run(self, tokens_BxL, positions_BxL, segment_ids_BxL, prompts=None):
        """Embed, run all layers over the rows themselves (no cache), final norm."""
        seg = segment_ids_BxL.astype(jnp.int32)
        if prompts is None:
            x = self._embed(tokens_BxL)
            rope_cs = self._rope_table(positions_BxL)
            q_slot_L = jnp.arange(tokens_BxL.shape[1])
            masks, source = (q_slot_L, seg, seg), None
        else:  # (prompts, rows) streams: SharedPrompts
            p, source = prompts.slots, prompts.source_B
            split = lambda a: (a[prompts.table_G, :p], a[:, p:])  # noqa: E731
            x = _each(self._embed, split(tokens_BxL))
            rope_cs = _each(self._rope_table, split(positions_BxL))
            seg_prompt, seg_rows = split(seg)
            slots = (jnp.arange(p), p + jnp.arange(tokens_BxL.shape[1] - p))
            kv_seg = (seg_prompt, jnp.concatenate([seg_prompt[source], seg_rows], axis=1))
            masks = (slots, (seg_prompt, seg_rows), kv_seg)
        if self.cfg.scan_layers:
            x, _ = self.layers(x, rope_cs, *masks, None, None, source)
        else:
            for layer in self.layer_list:
                x, _ = layer(x, rope_cs, *masks, None, None, source)
        h = _each(self.final_norm, x)
        if prompts is None:
            return h
        return jnp.concatenate([h[0][source], h[1]], axis=1)

    def _rope_table(self, positions_BxL: Array) -> RopeTable:
        return rope_table(positions_BxL, self.cfg.head_dim, self.cfg.rope_theta)

    def _embed(self, tokens_BxL: Array) -> Array:
        x = self.embed(tokens_BxL.astype(jnp.int32))
        return nn.with_logical_constraint(x, ("act_batch", "act_len", "act_embed"))

    def hidden(
        self,
        tokens_BxL: Array,
        positions_BxL: Array,
        segment_ids_BxL: Array,
        prompts: SharedPrompts | None = None,
    ) -> Array:
        """Final-norm hidden states [B, L, D] in the compute dtype (no unembedding).

        `segment_ids_BxL`: 0 for empty slots, k >= 1 for the row's k-th sequence (a 0/1
        attention mask is one sequence per row); tokens attend within their segment only.
        `prompts`: run each distinct prompt once (`SharedPrompts`; the same hidden states).
        """
        return self._run(tokens_BxL, positions_BxL, segment_ids_BxL, prompts)

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
    init = lambda: Transformer(cfg).init(rng, tokens, tokens, jnp.ones((1, 1), jnp.int32))
    if cfg.scan_layers:  # the scanned body draws each kind of kernel once already
        return init()["params"]
    # Unrolled layers: every kernel's draw in one threefry call, the same bits (init_normals).
    return init_normals.batched_normals(init)["params"]


def random_params(cfg: ModelConfig, rng: Array) -> Any:
    """Random parameters (plain arrays): traceable, for a caller's own jit (`init_params`)."""
    return nn.meta.unbox(_init_boxed(cfg, rng))


def init_params(cfg: ModelConfig, rng: Array, *, shardings: Any = None) -> Any:
    """Random parameters (plain arrays). With `shardings` (a pytree of NamedSharding matching
    the params), each leaf is created directly in its sharded layout."""
    fn = lambda r: random_params(cfg, r)
    if shardings is None:
        return jax.jit(fn)(rng)
    return jax.jit(fn, out_shardings=shardings)(rng)


def param_logical_axes(cfg: ModelConfig) -> Any:
    """PartitionSpecs of logical axis names for every parameter, without allocating anything."""
    # The key made inside the trace: an eager key would compile two programs of its own.
    boxed = jax.eval_shape(lambda: _init_boxed(cfg, jax.random.key(0)))
    return nn.get_partition_spec(boxed)


def param_shapes(cfg: ModelConfig) -> Any:
    """jax.ShapeDtypeStruct for every parameter, without allocating anything."""
    return jax.eval_shape(lambda: random_params(cfg, jax.random.key(0)))


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
