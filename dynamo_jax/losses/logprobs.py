"""Per-token log-probabilities, entropy and the K term at temperature T, without [N, V] in fp32.

docs/algorithm.md#log-probabilities-and-entropy. For tokens with final hidden states `hidden_NxD`, unembedding `w_DxV` and
targets `targets_N`, with z = (h @ W) / T:

    log π(a) = z_a − lse,   H = lse − Σ π z,   K = Σ_v π(v)² (log π(v) + H)

Shape letters (docs/design.md#shape-letters): N tokens, Np N padded to whole blocks, b block size,
D model width, V vocabulary (V_l: the local vocabulary shard, Vt one tile). K = Σ π²(log π + H)
is the concentration term K_t, not a shape.

Memory: logits exist only for one (token block of `block_size`, vocab tile of `vocab_tile`)
pair at a time, forward and backward. Both loop over vocab tiles outside and token blocks
inside: the forward keeps per-token running (max, Σe, Σe·d, ...) sums and merges tiles with an
online softmax; the backward (a custom VJP) recomputes each tile's logits from the saved
per-token lse and H, so no [N, V] residual is stored, and writes each [D, V_t] dW tile once into
the dW output (a token-outer loop would hold a second full [D, V] product/accumulator: ~1 GB
for Qwen2.5-1.5B in fp32). Compiled temp memory then depends on D, b and V_t only: 216 MB at
D = 1536, b = 256, V_t = 8192 for N = 2048 … 16384 (fp32: the [N, D] dh carry is the output);
every logit is still computed once forward and once backward (same FLOPs as before).

Speed: the backward loops only over tokens with a non-zero cotangent (loss_mask = 0 tokens,
i.e. prompt and padding, contribute exactly zero): they are ordered first (an argsort of N
flags) and the token-block loop stops after their last block, so a batch with a quarter prompt
does a quarter fewer backward tiles. Rows of h are gathered and dh rows scattered per block, so
no reordered [N, D] copy exists. dW multiplies an explicitly transposed [D, b] block (XLA:CPU
runs the [b, D]ᵀ-contracting form at half speed). With `token_mask_N` (the trainer passes the
shifted loss_mask) the forward does the same: only the scored tokens' blocks, gathered in
scored-first order, and the unscored outputs are 0; in RL batches that skips the prompt and the
response padding, which no loss reads (the old-log-prob pass is forward only).

Opt-in `logits_residual` ("store_bf16" / "store_fp32", LossConfig.logits_residual): the forward
also writes each logit tile into an [N_p, V_l] residual (2 or 4 bytes per logit, as raw bits)
and the backward reads it instead of recomputing the tile: 3 unembedding matmuls instead of 4,
for devices that have the memory (short sequences on accelerators). bf16 rounds z to 8
significant bits (|Δz| <= |z|·2^-9) in the gradients only; forward outputs are identical.

Vocabulary sharding: with `vocab_axis` set, the function runs inside `shard_map` and `w_DxV` is
the local shard; per-token max and sums are combined with `lax.pmax`/`lax.psum` over that axis,
and the target is found in the shard that owns it (offset from `lax.axis_index`).
`sharded_token_logprobs_entropy` does the `shard_map` for callers inside a jit over a mesh.

Gradients flow through log π and H (policy loss, entropy-loss baseline). K is returned under
stop-gradient: the modulation (docs/algorithm.md#advantage-modulation) uses it as a constant.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

DEFAULT_BLOCK_SIZE = 256
# Backward vocab tile: [b, 8192] fp32 logit tiles and a [D, 8192] dW accumulator stay small
# (8 MB and 50 MB at b = 256, D = 1536) while the matmuls stay wide enough to run at full speed.
DEFAULT_VOCAB_TILE = 8192
# What the backward gets the logits from (LossConfig.logits_residual): "recompute" (default, no
# [N, V] residual) or the forward's logits kept in bf16 / fp32 (V·2 / V·4 bytes per token).
LOGITS_RESIDUALS = ("recompute", "store_bf16", "store_fp32")
# Stored as raw bits (uint16 for bf16): XLA:CPU otherwise widens bf16 buffer updates to fp32,
# adding a full [N, V] fp32 copy; integer buffers are moved as they are on every backend.
_STORE_DTYPES = {"store_bf16": (jnp.bfloat16, jnp.uint16), "store_fp32": (jnp.float32, jnp.uint32)}


def _to_bits(z, store):
    return lax.bitcast_convert_type(z.astype(store[0]), store[1])


def _from_bits(bits, store):
    return lax.bitcast_convert_type(bits, store[0]).astype(jnp.float32)


def _target_in_shard(targets_b, v_local, vocab_axis):
    """Local index of each target in this vocab shard and whether this shard owns it."""
    offset = lax.axis_index(vocab_axis) * v_local if vocab_axis is not None else 0
    local_b = targets_b - offset
    owned_b = (local_b >= 0) & (local_b < v_local)
    return jnp.clip(local_b, 0, v_local - 1), owned_b


def _block_logits(h_bxD, w_DxV, inv_temp):
    return jnp.dot(h_bxD, w_DxV, preferred_element_type=jnp.float32) * inv_temp


def _vma(x) -> frozenset:
    """Mesh axes that `x` varies over inside shard_map (empty outside)."""
    mat = getattr(jax.typeof(x), "manual_axis_type", None)
    return frozenset(mat.varying) if mat is not None else frozenset()


def _pcast_like(x, axes: frozenset):
    missing = tuple(sorted(axes - _vma(x)))
    return lax.pcast(x, missing, to="varying") if missing else x


def _reduce_to_vma(ct, axes: frozenset):
    """Sum a cotangent over the axes its primal is replicated on (the primal's total gradient)."""
    extra = tuple(sorted(_vma(ct) - axes))
    return lax.psum(ct, extra) if extra else ct


def _pad_rows(x, block_size):
    """Zero-pad the leading (token) axis of `x` up to a multiple of `block_size`."""
    pad = (-x.shape[0]) % block_size
    return jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)) if pad else x


def _over_vocab_tiles(w_DxV, tile, fn, carry):
    """carry = fn(w_DxVt, col0, carry) for each vocab tile of `w_DxV`, in order.

    Vocab outside, tokens inside (in `fn`): each W tile is sliced once, and per-tile results
    (dW tiles, per-token running sums) are written in place into loop carries, so no [D, V] or
    [b, V] temporary exists. The last tile is narrower when V is not a multiple of `tile`
    (151,936 = 2^7·1187 has no convenient divisor), handled outside the loop with static shapes.
    """
    v_local = w_DxV.shape[1]
    tile = min(tile, v_local)
    n_full, rem = divmod(v_local, tile)

    def full_tile(j, carry):
        col0 = j * tile
        return fn(lax.dynamic_slice_in_dim(w_DxV, col0, tile, 1), col0, carry)

    carry = lax.fori_loop(0, n_full, full_tile, carry)
    if rem:
        carry = fn(w_DxV[:, n_full * tile :], n_full * tile, carry)
    return carry


def _rescale(m_shift, sums):
    """Sums Σe^{d}·{1, d} and Σe^{2d}·{1, d} of d = z − m, re-expressed for d' = d + m_shift.

    m_shift ≤ 0 (the new max is larger). Both terms of each new Σe·d are ≤ 0: no cancellation,
    so H stays exact for logits of ±1e4 (the online softmax of flash attention, plus H and K).
    """
    sc = jnp.exp(m_shift)
    out = [sums[0] * sc, (sums[1] + m_shift * sums[0]) * sc]
    if len(sums) > 2:
        sc2 = sc * sc
        out += [sums[2] * sc2, (sums[3] + m_shift * sums[2]) * sc2]
    return out


def _tile_forward(z_bxVt, col0, local_b, run, return_k):
    """Merge one (token block, vocab tile) of logits into the running (max, target logit, sums)."""
    m_b = jnp.max(z_bxVt, axis=-1)
    d_bxVt = z_bxVt - m_b[:, None]
    e_bxVt = jnp.exp(d_bxVt)
    sums = [jnp.sum(e_bxVt, -1), jnp.sum(e_bxVt * d_bxVt, -1)]
    if return_k:
        e2_bxVt = e_bxVt * e_bxVt
        sums += [jnp.sum(e2_bxVt, -1), jnp.sum(e2_bxVt * d_bxVt, -1)]
    hit_bxVt = jnp.arange(z_bxVt.shape[1])[None, :] == (local_b - col0)[:, None]
    z_target_b = run[1] + jnp.sum(jnp.where(hit_bxVt, z_bxVt, 0.0), -1)
    new_m_b = jnp.maximum(run[0], m_b)
    merged = _rescale(run[0] - new_m_b, run[2:])
    merged = [a + b for a, b in zip(merged, _rescale(m_b - new_m_b, sums), strict=True)]
    return (new_m_b, z_target_b, *merged)


def _flagged_first(flags_Np, block_size):
    """(stable order putting the flagged tokens first, the number of blocks they fill)."""
    order_Np = jnp.argsort(jnp.logical_not(flags_Np).astype(jnp.int32), stable=True)
    n_blocks = (jnp.sum(flags_Np.astype(jnp.int32)) + block_size - 1) // block_size
    return order_Np, n_blocks


def _scored_first(mask_N, block_size):
    """(order putting the scored tokens first, each token's place in it, their block count).

    With a token mask the forward visits only the scored tokens' blocks, in this order; its
    per-token sums (and stored logits) sit at the tokens' places in it.
    """
    order_Np, n_blocks = _flagged_first(_pad_rows(mask_N, block_size), block_size)
    place_Np = jnp.zeros_like(order_Np).at[order_Np].set(jnp.arange(order_Np.shape[0]))
    return order_Np, place_Np, n_blocks


def _chunked_fwd(
    hidden_NxD,
    w_DxV,
    targets_N,
    temperature,
    mask_N,
    block_size,
    vocab_tile,
    vocab_axis,
    return_k,
    logits_residual,
):
    n = hidden_NxD.shape[0]
    inv_temp = 1.0 / jnp.asarray(temperature, jnp.float32)
    local_N, owned_N = _target_in_shard(targets_N, w_DxV.shape[1], vocab_axis)
    local_N = jnp.where(owned_N, local_N, -1)  # −1: in no tile of this shard
    h_NpxD, local_Np = _pad_rows(hidden_NxD, block_size), _pad_rows(local_N, block_size)
    n_blocks = h_NpxD.shape[0] // block_size
    order_Np = place_Np = None
    if mask_N is not None:  # only the scored tokens' blocks, gathered in scored-first order
        order_Np, place_Np, n_blocks = _scored_first(mask_N, block_size)
        local_Np = local_Np[order_Np]
    carry_axes = frozenset().union(*(_vma(x) for x in (w_DxV, h_NpxD, local_Np)))
    n_sums = 4 if return_k else 2
    # Running max starts at the most negative finite float, not −inf: (−inf)·0 would be NaN.
    m0 = jnp.full(local_Np.shape, jnp.finfo(jnp.float32).min)
    zeros = jnp.zeros(local_Np.shape, jnp.float32)
    run0 = tuple(_pcast_like(x, carry_axes) for x in (m0, zeros, *[zeros] * n_sums))
    store = _STORE_DTYPES.get(logits_residual)
    z0 = None
    if store is not None:  # opt-in: keep the logits for the backward (no recompute)
        z0 = _pcast_like(jnp.zeros((h_NpxD.shape[0], w_DxV.shape[1]), store[1]), carry_axes)

    def tile_fn(w_DxVt, col0, carry):
        def one_block(i, carry):
            run, z_NpxV = carry
            rows = (i * block_size, block_size)
            run_b = [lax.dynamic_slice_in_dim(x, *rows) for x in run]
            if order_Np is None:
                h_bxD = lax.dynamic_slice_in_dim(h_NpxD, *rows)
            else:
                h_bxD = jnp.take(h_NpxD, lax.dynamic_slice_in_dim(order_Np, *rows), axis=0)
            local_b = lax.dynamic_slice_in_dim(local_Np, *rows)
            z_bxVt = _block_logits(h_bxD, w_DxVt, inv_temp)
            new_b = _tile_forward(z_bxVt, col0, local_b, run_b, return_k)
            run = tuple(
                lax.dynamic_update_slice_in_dim(x, y, rows[0], 0)
                for x, y in zip(run, new_b, strict=True)
            )
            if z_NpxV is not None:
                z_NpxV = lax.dynamic_update_slice(
                    z_NpxV, _to_bits(z_bxVt, store), (rows[0], jnp.int32(col0))
                )
            return run, z_NpxV

        return lax.fori_loop(0, n_blocks, one_block, carry)

    run, z_NpxV = _over_vocab_tiles(w_DxV, vocab_tile, tile_fn, (run0, z0))
    if place_Np is not None:  # back to token order
        run = tuple(x[place_Np] for x in run)
    m_N, z_target_N, *sums = (x[:n] for x in run)
    primals = (hidden_NxD, w_DxV, targets_N, temperature, mask_N)
    out, residuals = _finish_forward(m_N, z_target_N, sums, vocab_axis, return_k, *primals)
    if mask_N is not None:  # unscored tokens: 0, and never their unfinished sums (NaN, ±inf)
        out = tuple(jnp.where(mask_N, x, 0.0) for x in out)
    return out, (*residuals, z_NpxV)


def _finish_forward(m_N, z_target_N, sums, vocab_axis, return_k, *primals):
    """Combine the shards' running sums (one pmax, one psum) into log π(a), H, K."""
    if vocab_axis is not None:
        m_global_N = lax.pmax(m_N, vocab_axis)
        parts = jnp.stack([z_target_N, *_rescale(m_N - m_global_N, sums)])
        z_target_N, *sums = lax.psum(parts, vocab_axis)  # one collective for all sums
        m_N = m_global_N
    s_N, sd_N = sums[0], sums[1]
    log_s_N = jnp.log(s_N)
    mean_d_N = sd_N / s_N  # Σ π (z − m)
    logp_N = (z_target_N - m_N) - log_s_N
    ent_N = log_s_N - mean_d_N
    # K = Σ π²(log π + H) = [Σ e² d − (Σ π d) Σ e²] / s², since log π + H = d − Σ π d.
    k_N = (sums[3] - mean_d_N * sums[2]) / (s_N * s_N) if return_k else jnp.zeros_like(s_N)
    residuals = (*primals, m_N + log_s_N, ent_N)
    return (logp_N, ent_N, k_N), residuals


def _tile_dz(z_bxVt, col0, vec_b, inv_temp):
    """∂loss/∂z of one (token block, vocab tile) from its logits z = h W / T (docs/algorithm.md#log-probabilities-and-entropy)."""
    local_b, lse_b, ent_b, g_lp_b, g_ent_b = vec_b
    logpi_bxVt = z_bxVt - lse_b[:, None]
    pi_bxVt = jnp.exp(logpi_bxVt)
    # ∂log π(a)/∂z = onehot(a) − π ;  ∂H/∂z = −π ⊙ (log π + H)
    dz_bxVt = -pi_bxVt * (g_lp_b[:, None] + g_ent_b[:, None] * (logpi_bxVt + ent_b[:, None]))
    onehot_bxVt = jnp.arange(z_bxVt.shape[1])[None, :] == (local_b - col0)[:, None]
    return (dz_bxVt + jnp.where(onehot_bxVt, g_lp_b[:, None], 0.0)) * inv_temp


def _stored_tile(z_NpxV, store, rows_b, col0, width):
    """Rows `rows_b` (any order), columns [col0, col0 + width) of the stored logits, as fp32."""
    take = lambda r: lax.dynamic_slice(z_NpxV, (r, jnp.int32(col0)), (1, width))[0]
    return _from_bits(jax.vmap(take)(rows_b), store)  # one row-slice gather, no [N, V_t] copy


def _tile_grads(w_DxVt, col0, bwd, dh_NpxD, n_blocks):
    """dW of one vocab tile (returned) and its share of dh (added into `dh_NpxD` in place).

    Loops over the first `n_blocks` token blocks of the active-first order `perm_Np`: only
    [b, V_t] logits and a [D, V_t] accumulator are live, so no [D, V] product is ever formed
    (a full-width dot per token block is what made XLA allocate a second D×V buffer). The
    block's rows of h (and of the stored logits) are gathered, and its dh rows scattered back,
    so no reordered [N, D] copy exists either: temp memory stays independent of N.
    """
    h_NpxD, vec_Np, perm_Np, z_NpxV, store, block_size, inv_temp, carry_axes, place_Np = bwd

    def one_block(i, carry):
        dw_DxVt, dh_NpxD = carry
        row0 = i * block_size
        rows_b = lax.dynamic_slice_in_dim(perm_Np, row0, block_size)
        vec_b = tuple(lax.dynamic_slice_in_dim(x, row0, block_size) for x in vec_Np)
        h_bxD = jnp.take(h_NpxD, rows_b, axis=0)
        if place_Np is not None:
            # Unscored tokens sharing the last block have no forward sums (lse, H zeroed): zero
            # rows give z = 0, π = 1 and, with zero cotangents, exactly zero dz.
            h_bxD = jnp.where(vec_b[5][:, None], h_bxD, 0)
        if z_NpxV is None:  # default: recompute the tile's logits (no [N, V] residual)
            z_bxVt = _block_logits(h_bxD, w_DxVt, inv_temp)
        else:  # stored at the tokens' places in the forward's scored-first order
            z_rows_b = rows_b if place_Np is None else place_Np[rows_b]
            z_bxVt = _stored_tile(z_NpxV, store, z_rows_b, col0, w_DxVt.shape[1])
            if place_Np is not None:
                z_bxVt = jnp.where(vec_b[5][:, None], z_bxVt, 0.0)
        dz_bxVt = _tile_dz(z_bxVt, col0, vec_b[:5], inv_temp)
        dh_bxD = jnp.dot(dz_bxVt.astype(w_DxVt.dtype), w_DxVt.T, preferred_element_type=jnp.float32)
        dh_NpxD = dh_NpxD.at[rows_b].add(dh_bxD, unique_indices=True)
        # dW from an explicitly transposed [D, b] block: a plain [D, b] @ [b, V_t] product runs
        # ~2× faster on CPU than contracting over the leading axis of h ([b, D]ᵀ @ [b, V_t]);
        # the barrier keeps XLA from folding the transpose back into the dot.
        hT_Dxb = lax.optimization_barrier(h_bxD.T)
        dw_DxVt = dw_DxVt + jnp.dot(
            hT_Dxb, dz_bxVt.astype(hT_Dxb.dtype), preferred_element_type=jnp.float32
        )
        return dw_DxVt, dh_NpxD

    dw0_DxVt = _pcast_like(jnp.zeros(w_DxVt.shape, jnp.float32), carry_axes)
    return lax.fori_loop(0, n_blocks, one_block, (dw0_DxVt, dh_NpxD))


def _active_first(vec_Np, block_size):
    """The order that puts tokens with a non-zero cotangent first, and their block count.

    A token whose cotangents (g_logp, g_ent) are both zero (prompt, padding: loss_mask = 0)
    adds exactly zero to dh and dW, so the backward loops only over the active tokens' blocks:
    with a quarter prompt that is a quarter fewer logit tiles, dh and dW matmuls. NaN
    cotangents count as active, so non-finite losses still reach the gradients.
    """
    return _flagged_first((vec_Np[3] != 0) | (vec_Np[4] != 0), block_size)


def _chunked_bwd(block_size, vocab_tile, vocab_axis, return_k, logits_residual, res, cotangents):
    """Vocab tiles outside, active token blocks inside: each dW tile is written once, in place."""
    hidden_NxD, w_DxV, targets_N, temperature, mask_N, lse_N, ent_N, z_NpxV = res
    g_logp_N, g_ent_N, _ = cotangents  # K is stop-gradient by contract
    n = hidden_NxD.shape[0]
    inv_temp = 1.0 / jnp.asarray(temperature, jnp.float32)
    local_N, owned_N = _target_in_shard(targets_N, w_DxV.shape[1], vocab_axis)
    local_N = jnp.where(owned_N, local_N, -1)  # −1: in no tile of this shard
    h_NpxD = _pad_rows(hidden_NxD, block_size)
    vec_N = (local_N, lse_N, ent_N, g_logp_N, g_ent_N)
    place_Np = None
    if mask_N is not None:
        # Unscored outputs are the constant 0: their cotangents (even NaN) do not reach h or W,
        # and their lse / H were never finished; zero all of it.
        vec_N = (local_N, *(jnp.where(mask_N, x, 0.0) for x in vec_N[1:]), mask_N)
        place_Np = _scored_first(mask_N, block_size)[1]
    vec_Np = tuple(_pad_rows(x, block_size) for x in vec_N)
    perm_Np, n_blocks = _active_first(vec_Np, block_size)
    vec_Np = tuple(x[perm_Np] for x in vec_Np)  # per-token scalars: cheap to reorder up front
    # Inside shard_map the loop carries vary over every axis h or w varies over (loops need
    # their carry types fixed up front); the summed-over shards are reduced afterwards.
    carry_axes = frozenset().union(*(_vma(x) for x in (w_DxV, h_NpxD, *vec_Np)))
    dw_DxV = _pcast_like(jnp.zeros(w_DxV.shape, jnp.float32), carry_axes)
    dh_NpxD = _pcast_like(jnp.zeros(h_NpxD.shape, jnp.float32), carry_axes)
    store = _STORE_DTYPES.get(logits_residual)
    bwd = (h_NpxD, vec_Np, perm_Np, z_NpxV, store, block_size, inv_temp, carry_axes, place_Np)

    def tile_fn(w_DxVt, col0, carry):
        dw_DxV, dh_NpxD = carry
        dw_DxVt, dh_NpxD = _tile_grads(w_DxVt, col0, bwd, dh_NpxD, n_blocks)
        return lax.dynamic_update_slice_in_dim(dw_DxV, dw_DxVt, col0, 1), dh_NpxD

    dw_DxV, dh_NpxD = _over_vocab_tiles(w_DxV, vocab_tile, tile_fn, (dw_DxV, dh_NpxD))
    dw_DxV = _reduce_to_vma(dw_DxV, _vma(w_DxV))
    # Each vocab shard holds a partial sum over V of dh: the vocab axis is reduced here too.
    dh_NxD = _reduce_to_vma(dh_NpxD[:n], _vma(hidden_NxD))
    d_targets = np.zeros(targets_N.shape, dtype=jax.dtypes.float0)
    d_mask = None if mask_N is None else np.zeros(mask_N.shape, dtype=jax.dtypes.float0)
    return (
        dh_NxD.astype(hidden_NxD.dtype),
        dw_DxV.astype(w_DxV.dtype),
        d_targets,
        jnp.zeros_like(temperature),
        d_mask,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def _chunked(
    hidden_NxD,
    w_DxV,
    targets_N,
    temperature,
    mask_N,
    block_size,
    vocab_tile,
    vocab_axis,
    return_k,
    logits_residual,
):
    # Without differentiation nothing reads the residuals: never build the stored logits.
    out, _ = _chunked_fwd(
        hidden_NxD, w_DxV, targets_N, temperature, mask_N, block_size, vocab_tile, vocab_axis,
        return_k, "recompute",
    )  # fmt: skip
    return out


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def token_logprobs_entropy(
    hidden_NxD,
    w_DxV,
    targets_N,
    temperature,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    vocab_axis: str | None = None,
    return_k: bool = False,
    vocab_tile: int = DEFAULT_VOCAB_TILE,
    logits_residual: str = "recompute",
    token_mask_N=None,
):
    """(log π(a_t), H_t, K_t or None) in float32 at temperature T, blockwise over tokens.

    `temperature` may be a traced scalar (it changes every step under the E3 scheduler, and must
    not trigger a recompile). With `vocab_axis`, call inside shard_map over that mesh axis with
    `w_DxV` the local vocab shard (shards in axis-index order). Targets must be in [0, V).
    `vocab_tile` bounds the live logits to [block_size, vocab_tile] (see the module docstring).
    `logits_residual` (one of LOGITS_RESIDUALS) trades memory for the backward's recompute.
    `token_mask_N` (bool [N], optional): only these tokens are scored; the others get 0 in all
    three outputs, no gradient, and no unembedding work forward or backward (prompt and padding
    positions, whose log-probs no loss reads).
    """
    if hidden_NxD.ndim != 2 or w_DxV.ndim != 2 or targets_N.ndim != 1:
        raise ValueError(
            "token_logprobs_entropy: expected hidden_NxD [N, D], w_DxV [D, V], targets_N [N]; "
            f"got {hidden_NxD.shape}, {w_DxV.shape}, {targets_N.shape}"
        )
    if hidden_NxD.shape[1] != w_DxV.shape[0] or hidden_NxD.shape[0] != targets_N.shape[0]:
        raise ValueError(
            f"token_logprobs_entropy: shapes disagree: hidden {hidden_NxD.shape}, "
            f"w {w_DxV.shape}, targets {targets_N.shape}"
        )
    if block_size < 1:
        raise ValueError(f"token_logprobs_entropy: block_size must be >= 1, got {block_size}")
    if vocab_tile < 1:
        raise ValueError(f"token_logprobs_entropy: vocab_tile must be >= 1, got {vocab_tile}")
    if logits_residual not in LOGITS_RESIDUALS:
        raise ValueError(
            f"token_logprobs_entropy: logits_residual must be one of {LOGITS_RESIDUALS}, "
            f"got {logits_residual!r}"
        )
    if token_mask_N is not None:
        if token_mask_N.shape != targets_N.shape:
            raise ValueError(
                f"token_logprobs_entropy: token_mask_N has shape {token_mask_N.shape}, "
                f"targets {targets_N.shape}"
            )
        token_mask_N = token_mask_N.astype(bool)
    block_size = min(block_size, max(hidden_NxD.shape[0], 1))
    temperature = jnp.asarray(temperature, jnp.float32)
    logp, ent, k = _chunked(
        hidden_NxD,
        w_DxV,
        targets_N.astype(jnp.int32),
        temperature,
        token_mask_N,
        block_size,
        vocab_tile,
        vocab_axis,
        return_k,
        logits_residual,
    )
    return logp, ent, (lax.stop_gradient(k) if return_k else None)


def naive_token_logprobs_entropy(hidden_NxD, w_DxV, targets_N, temperature, *, return_k=False):
    """Full-softmax reference in JAX: materialises [N, V] fp32 logits (tests and benchmarks)."""
    z_NxV = jnp.dot(hidden_NxD, w_DxV, preferred_element_type=jnp.float32) / temperature
    logpi_NxV = jax.nn.log_softmax(z_NxV, axis=-1)
    pi_NxV = jnp.exp(logpi_NxV)
    logp_N = jnp.take_along_axis(logpi_NxV, targets_N[:, None].astype(jnp.int32), -1)[:, 0]
    ent_N = -jnp.sum(pi_NxV * logpi_NxV, -1)
    k_N = None
    if return_k:
        k_N = lax.stop_gradient(jnp.sum(pi_NxV**2 * (logpi_NxV + ent_N[:, None]), -1))
    return logp_N, ent_N, k_N


def _present_axes(mesh: Mesh, axes) -> tuple[str, ...]:
    return tuple(a for a in axes if a in mesh.axis_names)


def sharded_token_logprobs_entropy(
    hidden_NxD,
    w_DxV,
    targets_N,
    temperature,
    *,
    mesh: Mesh,
    tensor_axis: str = "tensor",
    token_axes: tuple[str, ...] = ("data", "fsdp"),
    block_size: int = DEFAULT_BLOCK_SIZE,
    return_k: bool = False,
    vocab_tile: int = DEFAULT_VOCAB_TILE,
    logits_residual: str = "recompute",
    token_mask_N=None,
):
    """`token_logprobs_entropy` with tokens split over `token_axes` and V over `tensor_axis`.

    Callable inside a jit over `mesh` (or outside it). Axes missing from the mesh are ignored,
    so the same call works on a 1-device mesh. N is zero-padded to a multiple of the token
    shard count; V must divide evenly by the tensor-axis size.
    """
    tok = _present_axes(mesh, token_axes)
    tp_axis = tensor_axis if tensor_axis in mesh.axis_names else None
    tp = mesh.shape[tp_axis] if tp_axis else 1
    if w_DxV.shape[1] % tp:
        raise ValueError(
            f"sharded_token_logprobs_entropy: vocab size {w_DxV.shape[1]} is not divisible by "
            f"the '{tensor_axis}' axis size {tp}; pad the unembedding"
        )
    n_shards = int(np.prod([mesh.shape[a] for a in tok])) if tok else 1
    n = hidden_NxD.shape[0]
    pad = (-n) % n_shards
    masked = token_mask_N is not None
    if pad:
        hidden_NxD = jnp.pad(hidden_NxD, ((0, pad), (0, 0)))
        targets_N = jnp.pad(targets_N, (0, pad))
        token_mask_N = jnp.pad(token_mask_N, (0, pad)) if masked else None
    tok_spec = tok if tok else None

    def local(h, w, t, temp, *mask):
        lp, ent, k = token_logprobs_entropy(
            h,
            w,
            t,
            temp,
            block_size=block_size,
            vocab_axis=tp_axis,
            return_k=return_k,
            vocab_tile=vocab_tile,
            logits_residual=logits_residual,
            token_mask_N=mask[0] if mask else None,
        )
        return lp, ent, (k if return_k else jnp.zeros_like(lp))

    fn = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(P(tok_spec, None), P(None, tp_axis), P(tok_spec), P()) + (P(tok_spec),) * masked,
        out_specs=(P(tok_spec), P(tok_spec), P(tok_spec)),
        check_vma=True,
    )
    args = (hidden_NxD, w_DxV, targets_N.astype(jnp.int32), jnp.asarray(temperature, jnp.float32))
    logp, ent, k = fn(*args, *((token_mask_N.astype(bool),) if masked else ()))
    return logp[:n], ent[:n], (k[:n] if return_k else None)
