"""The fused GPU path for packed rows: JAX's Pallas flash-attention kernel with segment ids.

`model.attention_impl="pallas"`. Why this kernel: in the installed JAX (0.10),
`jax.nn.dot_product_attention(implementation="cudnn")` takes `query_seq_lengths` /
`key_value_seq_lengths` (one valid prefix per row, i.e. padding) but no segment ids, so it cannot
keep the sequences of a packed row apart; `jax.experimental.pallas.ops.gpu.attention.mha` takes
`segment_ids` and a causal flag (with its own fused backward), which is exactly the training
rule when the keys are the row itself (slot = index in the row).

Adaptations, and why they keep the result equal to "matmul" on every real token:
- the kernel has one head count for q, k and v: each kv head is repeated for its G query heads
  (memory linear in length, G x the keys' size);
- lengths must be multiples of the blocks: rows are padded with segment 0 to a multiple of
  block_q and block_k (both powers of two);
- the kernel's segment mask is equality only, so empty slots (segment 0) see each other instead
  of getting "matmul"'s uniform average; real tokens (segment >= 1) never see an empty slot,
  and nothing reads an empty slot's output.

GPU only (Triton lowering); `interpret=True` runs the same kernel through Pallas' interpreter on
any backend, which is how the CPU tests check the wiring on tiny shapes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

Array = jax.Array


def _pow2_at_most(n: int, cap: int) -> int:
    return min(cap, 1 << max(4, math.ceil(math.log2(max(n, 1)))))


def pallas_attention(
    q_BxLxHxE: Array,
    k_BxLxKxE: Array,
    v_BxLxKxE: Array,
    seg_BxL: Array,
    *,
    block_q: int = 64,
    block_k: int = 64,
    block_backward: int = 32,
    interpret: bool = False,
) -> Array:
    """Causal attention within segments (training layout: keys are the queries' own row)."""
    from jax.experimental.pallas.ops.gpu import attention as pallas_gpu_attention

    b, length, h, e = q_BxLxHxE.shape
    g = h // k_BxLxKxE.shape[2]
    # The Triton kernel holds a [block_q, block_k] tile in registers. Capped at 64: at 128 with
    # head_dim 128 in float32 the forward asked an H200 for 257 KiB of shared memory (it has
    # 227 KiB) and failed to launch; 64 runs (scripts/gpu_check_attention.py, docs/scaling.md).
    bq, bk = _pow2_at_most(length, min(block_q, 64)), _pow2_at_most(length, min(block_k, 64))
    padded = -(-length // max(bq, bk)) * max(bq, bk)
    pad = ((0, 0), (0, padded - length), (0, 0), (0, 0))
    q = jnp.pad(q_BxLxHxE, pad)
    k = jnp.pad(jnp.repeat(k_BxLxKxE, g, axis=2), pad)
    v = jnp.pad(jnp.repeat(v_BxLxKxE, g, axis=2), pad)
    seg = jnp.pad(seg_BxL.astype(jnp.int32), ((0, 0), (0, padded - length)))
    # The backward kernels keep more tiles per block: 32 is JAX's own default for them
    # (BlockSizes.get_default); powers of two no larger than the forward's, so they divide the
    # padded length.
    bb = min(_pow2_at_most(length, block_backward), bq, bk)
    sizes = pallas_gpu_attention.BlockSizes(
        block_q=bq, block_k=bk, block_q_dkv=bb, block_kv_dkv=bb, block_q_dq=bb, block_kv_dq=bb
    )
    out = pallas_gpu_attention.mha(
        q,
        k,
        v,
        seg,
        sm_scale=e**-0.5,
        causal=True,
        block_sizes=sizes,
        interpret=interpret,
    )
    return out[:, :length]
