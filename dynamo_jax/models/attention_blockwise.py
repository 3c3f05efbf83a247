"""Blockwise (flash-style) attention: no [B, L, S] mask, no [B, H, L, S] scores.

`model.attention_impl="blockwise"`. The same rule as `attention.attention_mask` (a query at slot q sees
a key at slot s iff s <= q and both carry the same non-zero segment id), computed per
(query block, key block) tile from the slots and segment ids, so memory is linear in length:

- forward: queries in blocks of `block_q`, keys in blocks of `block_k`, an online softmax
  (running max m, running sum l, float32 accumulator); a query block visits only the key blocks
  at or below its largest slot (the causal bound), so roughly half the tiles of a training row
  are never computed;
Shape letters (docs/design.md#shape-letters): B, K kv heads, G query heads per kv head, E head
dim; Q query slots and S key slots of one tile, nq / nk query / key blocks.

- grouped-query heads: a kv head's G query heads are stacked into one [G·block_q, E] operand
  against that kv head's keys, as in `attention.attend`; K/V are never repeated;
- backward (`jax.custom_vjp`): only the output and the log-sum-exp are saved; each tile's
  probabilities are recomputed from them (FlashAttention-2's backward): dq per query block,
  dk/dv accumulated into float32 buffers of the keys' size.

A query that may see no key (an empty slot, segment 0) gets the uniform average of all S values,
exactly what "matmul" gives it (softmax over scores that are all the mask value), so the two
implementations agree on every slot, not only on real tokens; nothing reads those slots.

Scores, softmax statistics and accumulators are float32 (float64 when the inputs are float64);
the probabilities meet V in V's dtype, as in "matmul".
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array

DEFAULT_BLOCK = 512
# The same finite "minus infinity" as attention._MASK_VALUE; masked entries never enter a sum here
# (they are zeroed with `where`), it only seeds the running max.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def _acc_dtype(dtype) -> jnp.dtype:
    return jnp.promote_types(dtype, jnp.float32)


def _tile_mask(q_slot_Q: Array, q_seg_BxQ: Array, k_slot_S: Array, k_seg_BxS: Array) -> Array:
    """bool [B, Q, S] for one tile: causal by slot, same non-zero segment."""
    causal_QxS = k_slot_S[None, :] <= q_slot_Q[:, None]
    same_BxQxS = k_seg_BxS[:, None, :] == q_seg_BxQ[:, :, None]
    return causal_QxS[None] & same_BxQxS & (k_seg_BxS[:, None, :] > 0)


def _num_key_blocks(q_slot_Q: Array, block_k: int, nk: int) -> Array:
    """Key blocks a query block needs: those holding a slot <= its largest query slot (padded
    queries carry slot -1 and need none)."""
    return jnp.clip(jnp.max(q_slot_Q) // block_k + 1, 0, nk)


def _scores(q_BxKxGQxE, k_BxKxTxE, g, scale, acc):
    b, kh, gq, _ = q_BxKxGQxE.shape
    s = jnp.matmul(q_BxKxGQxE, k_BxKxTxE.swapaxes(-1, -2), preferred_element_type=acc)
    return s.reshape(b, kh, g, gq // g, -1) * scale  # [B, K, G, Q, S]


def _forward(q_blocks, k_blocks, v_blocks, q_slot_blocks, q_seg_blocks, kv_seg_blocks, s_real):
    """q_blocks [nq, B, K, G, Q, E]; k/v_blocks [nk, B, K, S, E]; q_slot_blocks [nq, Q];
    q_seg_blocks [nq, B, Q]; kv_seg_blocks [nk, B, S]. Returns (out like q_blocks, lse
    [nq, B, K, G, Q] in the accumulator dtype, empty [nq, B, K, G, Q] bool)."""
    nq, b, kh, g, bq, e = q_blocks.shape
    nk, bk = k_blocks.shape[0], k_blocks.shape[3]
    acc = _acc_dtype(q_blocks.dtype)
    scale = e**-0.5
    # What an empty query gets: the mean of the real values (padding keys excluded).
    v_mean_BxKxE = jnp.sum(v_blocks.astype(acc), axis=(0, 3)) / s_real

    def q_block(_, xs):
        q_BxKxGxQxE, q_slot_Q, q_seg_BxQ = xs
        q_op = q_BxKxGxQxE.reshape(b, kh, g * bq, e)

        def k_block(j, carry):
            m, l_sum, o = carry
            s = _scores(q_op, k_blocks[j], g, scale, acc)
            mask = _tile_mask(q_slot_Q, q_seg_BxQ, j * bk + jnp.arange(bk), kv_seg_blocks[j])
            mask = mask[:, None, None]  # [B, 1, 1, Q, S]
            m_new = jnp.maximum(m, jnp.max(jnp.where(mask, s, _MASK_VALUE), axis=-1))
            p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
            alpha = jnp.exp(m - m_new)
            l_sum = alpha * l_sum + jnp.sum(p, axis=-1)
            pv = jnp.matmul(
                p.astype(v_blocks.dtype).reshape(b, kh, g * bq, bk),
                v_blocks[j],
                preferred_element_type=acc,
            ).reshape(b, kh, g, bq, e)
            return m_new, l_sum, alpha[..., None] * o + pv

        init = (
            jnp.full((b, kh, g, bq), _MASK_VALUE, acc),
            jnp.zeros((b, kh, g, bq), acc),
            jnp.zeros((b, kh, g, bq, e), acc),
        )
        m, l_sum, o = jax.lax.fori_loop(0, _num_key_blocks(q_slot_Q, bk, nk), k_block, init)
        empty = l_sum == 0
        o = jnp.where(
            empty[..., None],
            v_mean_BxKxE[:, :, None, None],
            o / jnp.where(empty, 1, l_sum)[..., None],
        )
        lse = jnp.where(empty, 0.0, m + jnp.log(jnp.where(empty, 1, l_sum)))
        return None, (o.astype(q_blocks.dtype), lse, empty)

    _, (out, lse, empty) = jax.lax.scan(q_block, None, (q_blocks, q_slot_blocks, q_seg_blocks))
    return out, lse, empty


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _flash(q_blocks, k_blocks, v_blocks, q_slot_blocks, q_seg_blocks, kv_seg_blocks, s_real):
    out, _, _ = _forward(
        q_blocks, k_blocks, v_blocks, q_slot_blocks, q_seg_blocks, kv_seg_blocks, s_real
    )
    return out


def _flash_fwd(q_blocks, k_blocks, v_blocks, q_slot_blocks, q_seg_blocks, kv_seg_blocks, s_real):
    out, lse, empty = _forward(
        q_blocks, k_blocks, v_blocks, q_slot_blocks, q_seg_blocks, kv_seg_blocks, s_real
    )
    res = (
        q_blocks,
        k_blocks,
        v_blocks,
        q_slot_blocks,
        q_seg_blocks,
        kv_seg_blocks,
        out,
        lse,
        empty,
    )
    return out, res


def _flash_bwd(s_real, res, d_out):
    q_blocks, k_blocks, v_blocks, q_slot_blocks, q_seg_blocks, kv_seg_blocks, out, lse, empty = res
    nq, b, kh, g, bq, e = q_blocks.shape
    nk, bk = k_blocks.shape[0], k_blocks.shape[3]
    acc = _acc_dtype(q_blocks.dtype)
    scale = e**-0.5
    # D_i = sum_e dO_ie O_ie: the softmax backward's row term (ds = p (dp - D)).
    d_rows = jnp.sum(d_out.astype(acc) * out.astype(acc), axis=-1)  # [nq, B, K, G, Q]

    def q_block(carry, xs):
        dk_acc, dv_acc = carry
        q_BxKxGxQxE, do_BxKxGxQxE, lse_q, d_q, q_slot_Q, q_seg_BxQ = xs
        q_op = q_BxKxGxQxE.reshape(b, kh, g * bq, e)
        do_op = do_BxKxGxQxE.reshape(b, kh, g * bq, e)

        def k_block(j, inner):
            dq, dk_acc, dv_acc = inner
            s = _scores(q_op, k_blocks[j], g, scale, acc)
            mask = _tile_mask(q_slot_Q, q_seg_BxQ, j * bk + jnp.arange(bk), kv_seg_blocks[j])
            p = jnp.where(mask[:, None, None], jnp.exp(s - lse_q[..., None]), 0.0)
            p_op = p.reshape(b, kh, g * bq, bk)
            dv = jnp.matmul(
                p_op.astype(v_blocks.dtype).swapaxes(-1, -2), do_op, preferred_element_type=acc
            )
            dp = jnp.matmul(do_op, v_blocks[j].swapaxes(-1, -2), preferred_element_type=acc)
            ds = (p * (dp.reshape(p.shape) - d_q[..., None]) * scale).reshape(p_op.shape)
            dq = dq + jnp.matmul(ds.astype(k_blocks.dtype), k_blocks[j], preferred_element_type=acc)
            dk = jnp.matmul(
                ds.astype(q_op.dtype).swapaxes(-1, -2), q_op, preferred_element_type=acc
            )
            return dq, dk_acc.at[j].add(dk), dv_acc.at[j].add(dv)

        dq0 = jnp.zeros((b, kh, g * bq, e), acc)
        n = _num_key_blocks(q_slot_Q, bk, nk)
        dq, dk_acc, dv_acc = jax.lax.fori_loop(0, n, k_block, (dq0, dk_acc, dv_acc))
        return (dk_acc, dv_acc), dq.reshape(b, kh, g, bq, e)

    zeros = jnp.zeros(k_blocks.shape, acc)
    (dk, dv), dq = jax.lax.scan(
        q_block,
        (zeros, zeros),
        (q_blocks, d_out, lse, d_rows, q_slot_blocks, q_seg_blocks),
    )
    # Empty queries' output is the mean of the real values: each real key's value gets
    # 1/S of their output cotangents (summed over the kv head's query heads).
    d_mean_BxKxE = jnp.sum(jnp.where(empty[..., None], d_out.astype(acc), 0), axis=(0, 3, 4))
    real_key = (jnp.arange(nk * bk) < s_real).reshape(nk, 1, 1, bk, 1)
    dv = dv + jnp.where(real_key, d_mean_BxKxE[None, :, :, None] / s_real, 0)
    return (
        dq.astype(q_blocks.dtype),
        dk.astype(k_blocks.dtype),
        dv.astype(v_blocks.dtype),
        None,
        None,
        None,
    )


_flash.defvjp(_flash_fwd, _flash_bwd)


def _blocks(n: int, block: int) -> tuple[int, int]:
    """(block size, number of blocks) covering n: one exact block when n <= block."""
    block = min(block, n)
    return block, -(-n // block)


def blockwise_attention(
    q_BxLxHxE: Array,
    k_BxSxKxE: Array,
    v_BxSxKxE: Array,
    q_slot_L: Array,
    q_seg_BxL: Array,
    kv_seg_BxS: Array,
    *,
    block_q: int = DEFAULT_BLOCK,
    block_k: int = DEFAULT_BLOCK,
) -> Array:
    """Masked grouped-query attention, equal to `attention.attend(q, k, v, attention_mask(q_slot_L,
    q_seg_BxL, kv_seg_BxS))`, in tiles of block_q queries x block_k keys.

    Lengths need not be multiples of the blocks: queries are padded with slot -1 and segment 0,
    keys with segment 0, and the padding is cut off again.
    """
    b, length, h, e = q_BxLxHxE.shape
    s, kh = k_BxSxKxE.shape[1], k_BxSxKxE.shape[2]
    g = h // kh
    bq, nq = _blocks(length, block_q)
    bk, nk = _blocks(s, block_k)
    pad_q, pad_k = nq * bq - length, nk * bk - s

    q = jnp.pad(q_BxLxHxE, ((0, 0), (0, pad_q), (0, 0), (0, 0)))
    q_blocks = q.reshape(b, nq, bq, kh, g, e).transpose(1, 0, 3, 4, 2, 5)  # [nq, B, K, G, Q, E]
    q_slot = jnp.pad(q_slot_L.astype(jnp.int32), (0, pad_q), constant_values=-1)
    q_seg = jnp.pad(q_seg_BxL.astype(jnp.int32), ((0, 0), (0, pad_q)))
    q_seg_blocks = q_seg.reshape(b, nq, bq).transpose(1, 0, 2)

    def kv_blocks(x_BxSxKxE):
        x = jnp.pad(x_BxSxKxE, ((0, 0), (0, pad_k), (0, 0), (0, 0)))
        return x.reshape(b, nk, bk, kh, e).transpose(1, 0, 3, 2, 4)  # [nk, B, K, S, E]

    kv_seg = jnp.pad(kv_seg_BxS.astype(jnp.int32), ((0, 0), (0, pad_k)))
    out = _flash(
        q_blocks,
        kv_blocks(k_BxSxKxE),
        kv_blocks(v_BxSxKxE),
        q_slot.reshape(nq, bq),
        q_seg_blocks,
        kv_seg.reshape(b, nk, bk).transpose(1, 0, 2),
        s,
    )
    out = out.transpose(1, 0, 4, 2, 3, 5).reshape(b, nq * bq, h, e)
    return out[:, :length]
