"""Blockwise (flash-style) attention against the dense "matmul" attention and a float64 NumPy
reference: padded and packed rows, GQA, lengths that are not multiples of the blocks, forward and
gradients, the whole model, KV-cache decoding; and the Pallas GPU kernel through its interpreter.

Tolerances: float32 1e-5 (absolute and relative; both implementations sum the same products in
float32, in a different order), whole-model logits 1e-4 absolute
(as against transformers), gradients 1e-4 of each leaf's largest entry; float64
1e-12 against the float64 NumPy reference and a dense float64 gradient.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynamo_jax.models import decode, qwen
from dynamo_jax.models.attention_blockwise import blockwise_attention
from dynamo_jax.models.presets import get_preset

F32 = dict(atol=1e-5, rtol=1e-5)
F64 = dict(atol=1e-12, rtol=1e-12)


def _rows(kind: str, length: int) -> np.ndarray:
    """Segment ids [2, length]: "padded" = a left-padded and a right-padded row (0/1 masks);
    "packed" = three sequences then empty slots, and one sequence after empty slots."""
    seg = np.zeros((2, length), np.int32)
    if kind == "padded":
        seg[0, 5:] = 1
        seg[1, : length - 7] = 1
    else:
        a, b = length // 4, length // 2
        seg[0, :a], seg[0, a:b], seg[0, b : length - 3] = 1, 2, 3
        seg[1, 3 : length - 1] = 1
    return seg


def _qkv(length, heads, kv_heads, e=8, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(2, length, heads, e))
    k = rng.normal(size=(2, length, kv_heads, e))
    v = rng.normal(size=(2, length, kv_heads, e))
    return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


def _matmul(q, k, v, slot, seg):
    return qwen.attend(q, k, v, qwen.attention_mask(slot, seg, seg), True)


def _numpy_reference(q, k, v, slot, seg):
    """float64 masked softmax attention, one (row, head) at a time; empty queries get the mean
    of all values (the uniform softmax "matmul" gives them)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, length, h, e = q.shape
    g = h // k.shape[2]
    out = np.zeros_like(q)
    for r in range(b):
        for i in range(length):
            ok = (np.arange(k.shape[1]) <= slot[i]) & (seg[r] == seg[r, i]) & (seg[r] > 0)
            for head in range(h):
                kv = head // g
                if not ok.any():
                    out[r, i, head] = v[r, :, kv].mean(axis=0)
                    continue
                s = k[r, ok, kv] @ q[r, i, head] / np.sqrt(e)
                p = np.exp(s - s.max())
                out[r, i, head] = (p / p.sum()) @ v[r, ok, kv]
    return out


CASES = [
    # (length, heads, kv heads, block_q, block_k): GQA 2 and 4, MHA, one-head; lengths not
    # multiples of the blocks, blocks of unequal sizes, a single block.
    (37, 4, 2, 8, 16),
    (29, 4, 1, 16, 8),
    (23, 2, 2, 5, 7),
    (16, 4, 2, 64, 64),
]


# Each case compiles its own forward and gradient. The fast tier runs every geometry once and
# each row kind on two of them (a Latin square); the other pairing of each runs in the slow tier.
_FAST_PAIRS = {("padded", 37), ("packed", 29), ("padded", 23), ("packed", 16)}


@pytest.mark.parametrize(
    "kind, length, heads, kv_heads, bq, bk",
    [
        pytest.param(kind, *case, marks=() if (kind, case[0]) in _FAST_PAIRS else pytest.mark.slow)
        for case in CASES
        for kind in ("padded", "packed")
    ],
)
def test_forward_and_gradients_equal_matmul_float32(kind, length, heads, kv_heads, bq, bk):
    q, k, v = _qkv(length, heads, kv_heads)
    seg = jnp.asarray(_rows(kind, length))
    slot = jnp.arange(length)
    blockwise = lambda q, k, v: blockwise_attention(q, k, v, slot, seg, seg, block_q=bq, block_k=bk)
    ref, got = _matmul(q, k, v, slot, seg), jax.jit(blockwise)(q, k, v)
    np.testing.assert_allclose(got, ref, **F32)  # every slot, empty ones included
    w = jnp.asarray(np.random.default_rng(1).normal(size=ref.shape), jnp.float32)
    g_ref = jax.grad(lambda *a: jnp.sum(_matmul(*a, slot, seg) * w), argnums=(0, 1, 2))(q, k, v)
    g_got = jax.jit(jax.grad(lambda *a: jnp.sum(blockwise(*a) * w), argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(g_ref, g_got, strict=True):
        assert float(jnp.abs(a).max()) > 1e-2  # the gradient is not trivially zero
        np.testing.assert_allclose(b, a, **F32)


def _dense_f64(q, k, v, slot, seg):
    """Dense masked softmax in plain jnp (float64 under x64): the gradient oracle."""
    g = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
    allowed = qwen.attention_mask(slot, seg, seg)[:, None]  # [B, 1, L, S]
    s = jnp.einsum("blhe,bshe->bhls", q, k) / jnp.sqrt(q.shape[-1])
    p = jax.nn.softmax(jnp.where(allowed, s, -jnp.inf), axis=-1)
    empty = ~allowed.any(-1, keepdims=True)
    p = jnp.where(empty, 1.0 / k.shape[1], jnp.where(allowed, p, 0.0))
    return jnp.einsum("bhls,bshe->blhe", p, v)


@pytest.mark.parametrize("kind", ["padded", "packed"])
def test_float64_matches_numpy_reference_and_dense_gradients(kind):
    length, heads, kv_heads = 37, 4, 2
    with jax.enable_x64(True):
        q, k, v = _qkv(length, heads, kv_heads, dtype=jnp.float64)
        seg_np = _rows(kind, length)
        seg, slot = jnp.asarray(seg_np), jnp.arange(length)
        bw = lambda q, k, v: blockwise_attention(q, k, v, slot, seg, seg, block_q=8, block_k=16)
        got = jax.jit(bw)(q, k, v)
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(got, _numpy_reference(q, k, v, np.arange(length), seg_np), **F64)
        w = jnp.asarray(np.random.default_rng(2).normal(size=got.shape))
        g_ref = jax.grad(lambda *a: jnp.sum(_dense_f64(*a, slot, seg) * w), argnums=(0, 1, 2))(
            q, k, v
        )
        g_got = jax.jit(jax.grad(lambda *a: jnp.sum(bw(*a) * w), argnums=(0, 1, 2)))(q, k, v)
        for a, b in zip(g_ref, g_got, strict=True):
            assert a.dtype == b.dtype == jnp.float64
            np.testing.assert_allclose(b, a, **F64)


def _packed_batch(length=40):
    seg = _rows("packed", length)
    pos = np.zeros_like(seg)
    for r in range(seg.shape[0]):
        for s in np.unique(seg[r][seg[r] > 0]):
            idx = np.flatnonzero(seg[r] == s)
            pos[r, idx] = np.arange(len(idx))
    tokens = np.random.default_rng(3).integers(1, 500, size=seg.shape) * (seg > 0)
    return tokens, pos, seg


@pytest.mark.parametrize(
    "preset, remat",
    # Four whole-model compiles each: the fast tier runs each preset and each remat policy
    # once; the other two pairings run in the slow tier.
    [
        ("tiny-qwen2", "none"),
        ("tiny-qwen3", "full"),
        pytest.param("tiny-qwen2", "full", marks=pytest.mark.slow),
        pytest.param("tiny-qwen3", "none", marks=pytest.mark.slow),
    ],
)
def test_whole_model_logits_and_loss_gradients_equal_matmul(preset, remat):
    base = get_preset(preset, remat_policy=remat)
    params = jax.tree.map(
        lambda x: x * 10 if x.ndim > 1 else x, qwen.init_params(base, jax.random.key(0))
    )
    tokens, pos, seg = _packed_batch()
    weights = jax.random.normal(jax.random.key(1), (*tokens.shape, base.vocab_size))
    blockwise = base.replace(attention_impl="blockwise", attention_block_q=8, attention_block_k=16)

    def loss(p, cfg):
        return jnp.sum(jax.nn.log_softmax(qwen.forward(p, cfg, tokens, pos, seg)) * weights)

    np.testing.assert_allclose(
        qwen.forward_jit(params, blockwise, tokens, pos, seg),
        qwen.forward_jit(params, base, tokens, pos, seg),
        atol=1e-4,  # logits of O(10) through two layers of x10 weights (the HF tests' 1e-4)
        rtol=0,
    )
    grad = jax.jit(jax.grad(loss), static_argnums=1)
    ref, got = grad(params, base), grad(params, blockwise)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(ref)) > 1e-3
    # Per leaf, within 1e-4 of its largest entry: the weights x10 make the logits large and the
    # float32 rounding of the softmax backward's row term differs (blockwise: sum(dO·O), as in
    # flash attention; matmul: sum(P·dP)); measured up to 3.5e-5, and 1e-12 in float64 (test above).
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(b, a, atol=1e-4 * float(jnp.abs(a).max()), rtol=0)


def test_kv_cache_decode_equals_matmul():
    """Prefill of left-padded prompts then decode steps: blockwise attention against the cache
    (queries at slots index.., keys = the cache) gives matmul's logits at every step."""
    base = get_preset("tiny-qwen3")
    params = qwen.init_params(base, jax.random.key(0))
    blockwise = base.replace(attention_impl="blockwise", attention_block_q=4, attention_block_k=8)
    tokens = jnp.array([[0, 0, 0, 5, 6, 7, 9, 11, 4, 2, 8], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]])
    mask = (tokens > 0).astype(jnp.int32).at[1].set(1)
    runs = []
    for cfg in (base, blockwise):
        cache = decode.init_cache(cfg, 2, 27)
        logits, cache = decode.prefill_jit(params, cfg, tokens, mask, cache)
        steps = [logits]
        for t in range(5):
            logits, cache = decode.decode_step_jit(params, cfg, jnp.array([7 + t, 100 + t]), cache)
            steps.append(logits)
        runs.append(jnp.stack(steps))
    assert float(jnp.abs(runs[0]).max()) > 1e-2
    np.testing.assert_allclose(runs[1], runs[0], **F32)


def _shapes_in(jaxpr, found):
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            found.add(tuple(getattr(var.aval, "shape", ())))
        for sub in jax.core.jaxprs_in_params(eqn.params):
            _shapes_in(sub, found)
    return found


def test_no_length_by_length_array_in_the_blockwise_gradient():
    """The blockwise model's forward and backward hold no array with two axes of the row length
    (no [B, L, S] mask, no [B, H, L, S] scores); the matmul model does (the check can fail)."""
    length = 96  # differs from every other dimension of the tiny model
    tokens, pos, seg = _packed_batch(length)
    base = get_preset("tiny-qwen3", remat_policy="full")
    params = qwen.init_params(base, jax.random.key(0))

    def shapes(cfg):
        loss = lambda p: jnp.sum(qwen.forward(p, cfg, tokens, pos, seg))
        return _shapes_in(jax.make_jaxpr(jax.grad(loss))(params).jaxpr, set())

    quadratic = lambda shape: sum(d == length for d in shape) >= 2
    assert any(quadratic(s) for s in shapes(base))
    blockwise = base.replace(attention_impl="blockwise", attention_block_q=32, attention_block_k=32)
    assert not [s for s in shapes(blockwise) if quadratic(s)]


@pytest.mark.parametrize("kind", ["padded", "packed"])
def test_pallas_kernel_through_the_interpreter_equals_matmul_on_real_tokens(kind):
    """The GPU path's wiring (GQA repeat, padding to blocks, segment ids, causal flag, its fused
    backward), run by Pallas' interpreter on CPU. Empty slots are excluded: the kernel lets them
    see each other (attention_pallas.py), and nothing reads them."""
    from dynamo_jax.models.attention_pallas import pallas_attention

    length = 37
    q, k, v = _qkv(length, 4, 2, e=16)
    seg = jnp.asarray(_rows(kind, length))
    slot = jnp.arange(length)
    real = (seg > 0)[..., None, None]
    pal = lambda q, k, v: pallas_attention(q, k, v, seg, block_q=16, block_k=16, interpret=True)
    ref = _matmul(q, k, v, slot, seg)
    np.testing.assert_allclose(jnp.where(real, pal(q, k, v), 0), jnp.where(real, ref, 0), **F32)
    w = jnp.asarray(np.random.default_rng(1).normal(size=ref.shape), jnp.float32) * real
    g_ref = jax.grad(lambda *a: jnp.sum(_matmul(*a, slot, seg) * w), argnums=(0, 1, 2))(q, k, v)
    g_got = jax.grad(lambda *a: jnp.sum(pal(*a) * w), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_ref, g_got, strict=True):
        np.testing.assert_allclose(b, a, **F32)


def test_pallas_impl_says_it_needs_a_gpu_on_cpu():
    cfg = get_preset("tiny-qwen3", attention_impl="pallas")
    params = qwen.init_params(cfg, jax.random.key(0))
    tokens = jnp.ones((1, 8), jnp.int32)
    with pytest.raises(ValueError, match="'pallas' runs a Triton kernel and needs an NVIDIA GPU"):
        qwen.forward(params, cfg, tokens, jnp.arange(8)[None], tokens)
