"""Per-token log-probabilities, entropy and the K term at temperature T, without [N, V] in fp32.

ALGORITHM.md §1. For tokens with final hidden states `hidden_NxD`, unembedding `w_DxV` and
targets `targets_N`, with z = (h @ W) / T:

    log π(a) = z_a − lse,   H = lse − Σ π z,   K = Σ_v π(v)² (log π(v) + H)

Shapes: N tokens, D model width, V vocabulary (V_l: the local vocabulary shard), b block size.

Memory: logits exist only for one block of `block_size` tokens at a time, forward and backward
(the backward recomputes the block's logits from the saved per-token lse and H: a custom VJP,
so no [N, V] residual is stored and only one [b, V_l] fp32 buffer is live per step).

Vocabulary sharding: with `vocab_axis` set, the function runs inside `shard_map` and `w_DxV` is
the local shard; per-token max and sums are combined with `lax.pmax`/`lax.psum` over that axis,
and the target is found in the shard that owns it (offset from `lax.axis_index`).
`sharded_token_logprobs_entropy` does the `shard_map` for callers inside a jit over a mesh.

Gradients flow through log π and H (policy loss, entropy-loss baseline). K is returned under
stop-gradient: the modulation of §4 uses it as a constant.
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


def _target_in_shard(targets_b, v_local, vocab_axis):
    """Local index of each target in this vocab shard and whether this shard owns it."""
    offset = lax.axis_index(vocab_axis) * v_local if vocab_axis is not None else 0
    local_b = targets_b - offset
    owned_b = (local_b >= 0) & (local_b < v_local)
    return jnp.clip(local_b, 0, v_local - 1), owned_b


def _block_logits(h_bxD, w_DxV, inv_temp):
    return jnp.dot(h_bxD, w_DxV, preferred_element_type=jnp.float32) * inv_temp


def _block_forward(h_bxD, w_DxV, targets_b, inv_temp, vocab_axis, return_k):
    """Statistics of one token block: (logp_b, ent_b, k_b, lse_b), all float32."""
    z_bxV = _block_logits(h_bxD, w_DxV, inv_temp)
    m_b = jnp.max(z_bxV, axis=-1)
    if vocab_axis is not None:
        m_b = lax.pmax(m_b, vocab_axis)
    # Work with d = z − m (≤ 0): sums of e·z at |z| ~ 1e4 would cancel catastrophically in H.
    d_bxV = z_bxV - m_b[:, None]
    e_bxV = jnp.exp(d_bxV)
    local_b, owned_b = _target_in_shard(targets_b, w_DxV.shape[1], vocab_axis)
    d_target_b = jnp.where(owned_b, jnp.take_along_axis(d_bxV, local_b[:, None], -1)[:, 0], 0.0)
    parts = [jnp.sum(e_bxV, -1), jnp.sum(e_bxV * d_bxV, -1), d_target_b]
    if return_k:
        e2_bxV = e_bxV * e_bxV
        parts += [jnp.sum(e2_bxV, -1), jnp.sum(e2_bxV * d_bxV, -1)]
    sums = jnp.stack(parts)
    if vocab_axis is not None:
        sums = lax.psum(sums, vocab_axis)  # one collective for all per-token sums
    s_b, sd_b, d_target_b = sums[0], sums[1], sums[2]
    log_s_b = jnp.log(s_b)
    mean_d_b = sd_b / s_b  # Σ π (z − m)
    logp_b = d_target_b - log_s_b
    ent_b = log_s_b - mean_d_b
    if return_k:
        # K = Σ π²(log π + H) = [Σ e² d − (Σ π d) Σ e²] / s², since log π + H = d − Σ π d.
        k_b = (sums[4] - mean_d_b * sums[3]) / (s_b * s_b)
    else:
        k_b = jnp.zeros_like(s_b)
    return logp_b, ent_b, k_b, m_b + log_s_b


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


def _to_blocks(x, block_size):
    """[N, ...] → [N/b, b, ...] after zero-padding N up to a multiple of b."""
    n = x.shape[0]
    pad = (-n) % block_size
    if pad:
        x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    return x.reshape((-1, block_size) + x.shape[1:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _chunked(hidden_NxD, w_DxV, targets_N, temperature, block_size, vocab_axis, return_k):
    out, _ = _chunked_fwd(
        hidden_NxD, w_DxV, targets_N, temperature, block_size, vocab_axis, return_k
    )
    return out


def _chunked_fwd(hidden_NxD, w_DxV, targets_N, temperature, block_size, vocab_axis, return_k):
    n = hidden_NxD.shape[0]
    inv_temp = 1.0 / jnp.asarray(temperature, jnp.float32)
    h_blocks = _to_blocks(hidden_NxD, block_size)
    t_blocks = _to_blocks(targets_N, block_size)

    def one_block(args):
        h_bxD, t_b = args
        return _block_forward(h_bxD, w_DxV, t_b, inv_temp, vocab_axis, return_k)

    logp, ent, k, lse = (x.reshape(-1)[:n] for x in lax.map(one_block, (h_blocks, t_blocks)))
    residuals = (hidden_NxD, w_DxV, targets_N, temperature, lse, ent)
    return (logp, ent, k), residuals


def _chunked_bwd(block_size, vocab_axis, return_k, residuals, cotangents):
    hidden_NxD, w_DxV, targets_N, temperature, lse_N, ent_N = residuals
    g_logp_N, g_ent_N, _ = cotangents  # K is stop-gradient by contract
    n, v_local = hidden_NxD.shape[0], w_DxV.shape[1]
    inv_temp = 1.0 / jnp.asarray(temperature, jnp.float32)
    blocks = tuple(
        _to_blocks(x, block_size) for x in (hidden_NxD, targets_N, lse_N, ent_N, g_logp_N, g_ent_N)
    )

    def one_block(dw_DxV, args):
        h_bxD, t_b, lse_b, ent_b, g_lp_b, g_ent_b = args
        z_bxV = _block_logits(h_bxD, w_DxV, inv_temp)
        logpi_bxV = z_bxV - lse_b[:, None]
        pi_bxV = jnp.exp(logpi_bxV)
        # ∂log π(a)/∂z = onehot(a) − π ;  ∂H/∂z = −π ⊙ (log π + H)   (§1)
        dz_bxV = -pi_bxV * (g_lp_b[:, None] + g_ent_b[:, None] * (logpi_bxV + ent_b[:, None]))
        local_b, owned_b = _target_in_shard(t_b, v_local, vocab_axis)
        onehot_bxV = (jnp.arange(v_local)[None, :] == local_b[:, None]) & owned_b[:, None]
        dz_bxV = (dz_bxV + jnp.where(onehot_bxV, g_lp_b[:, None], 0.0)) * inv_temp
        dh_bxD = jnp.dot(dz_bxV.astype(w_DxV.dtype), w_DxV.T, preferred_element_type=jnp.float32)
        if vocab_axis is not None:
            dh_bxD = lax.psum(dh_bxD, vocab_axis)  # each shard holds a partial sum over V
        dw_DxV = dw_DxV + jnp.dot(
            h_bxD.T, dz_bxV.astype(h_bxD.dtype), preferred_element_type=jnp.float32
        )
        return dw_DxV, dh_bxD.astype(hidden_NxD.dtype)

    # Inside shard_map the accumulator varies over every axis h or w varies over (scan needs
    # the carry's type fixed up front); the summed-over token shards are reduced afterwards.
    carry_axes = frozenset().union(*(_vma(x) for x in (w_DxV, *blocks)))
    dw0_DxV = _pcast_like(jnp.zeros_like(w_DxV, jnp.float32), carry_axes)
    dw_DxV, dh_blocks = lax.scan(one_block, dw0_DxV, blocks)
    dw_DxV = _reduce_to_vma(dw_DxV, _vma(w_DxV))
    dh_NxD = _reduce_to_vma(dh_blocks.reshape(-1, hidden_NxD.shape[1])[:n], _vma(hidden_NxD))
    d_targets = np.zeros(targets_N.shape, dtype=jax.dtypes.float0)
    return dh_NxD, dw_DxV.astype(w_DxV.dtype), d_targets, jnp.zeros_like(temperature)


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
):
    """(log π(a_t), H_t, K_t or None) in float32 at temperature T, blockwise over tokens.

    `temperature` may be a traced scalar (it changes every step under the E3 scheduler, and must
    not trigger a recompile). With `vocab_axis`, call inside shard_map over that mesh axis with
    `w_DxV` the local vocab shard (shards in axis-index order). Targets must be in [0, V).
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
    block_size = min(block_size, max(hidden_NxD.shape[0], 1))
    temperature = jnp.asarray(temperature, jnp.float32)
    logp, ent, k = _chunked(
        hidden_NxD,
        w_DxV,
        targets_N.astype(jnp.int32),
        temperature,
        block_size,
        vocab_axis,
        return_k,
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
    if pad:
        hidden_NxD = jnp.pad(hidden_NxD, ((0, pad), (0, 0)))
        targets_N = jnp.pad(targets_N, (0, pad))
    tok_spec = tok if tok else None

    def local(h, w, t, temp):
        lp, ent, k = token_logprobs_entropy(
            h, w, t, temp, block_size=block_size, vocab_axis=tp_axis, return_k=return_k
        )
        return lp, ent, (k if return_k else jnp.zeros_like(lp))

    fn = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(P(tok_spec, None), P(None, tp_axis), P(tok_spec), P()),
        out_specs=(P(tok_spec), P(tok_spec), P(tok_spec)),
        check_vma=True,
    )
    logp, ent, k = fn(
        hidden_NxD, w_DxV, targets_N.astype(jnp.int32), jnp.asarray(temperature, jnp.float32)
    )
    return logp[:n], ent[:n], (k[:n] if return_k else None)
