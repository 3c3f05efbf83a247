"""The Flax decoder against transformers (the oracle), and its own invariants."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_fixtures import hf_logits, make_tiny_hf_model

from dynamo_jax.models import hf_io, qwen
from dynamo_jax.models.config import ModelConfig
from dynamo_jax.models.presets import get_preset

# Left padding (row 0), right padding (row 1), no padding (row 2).
TOKENS = np.array([[0, 0, 5, 6, 7, 9, 11], [3, 1, 4, 1, 5, 0, 0], [1, 2, 3, 4, 5, 200, 17]])
MASK = np.array([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]])


def _state_dict_np(model):
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def _flax_from_hf(model, **overrides):
    cfg = ModelConfig.from_hf_config(model.config.to_dict(), **overrides)
    return cfg, hf_io.from_hf_tensors(_state_dict_np(model), cfg)


def _flax_logits(params, cfg, tokens=TOKENS, mask=MASK):
    return np.asarray(qwen.forward_jit(params, cfg, tokens, qwen.positions_from_mask(mask), mask))


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("tie", [True, False])
def test_logits_match_transformers_with_padding(family, tie):
    model = make_tiny_hf_model(family, tie=tie, seed=3)
    cfg, params = _flax_from_hf(model)
    ref = hf_logits(model, TOKENS, MASK)
    out = _flax_logits(params, cfg)
    assert out.dtype == np.float32
    real = MASK > 0  # padding positions carry no meaning in either implementation
    assert np.abs(ref[real]).max() > 1.0  # logits are not trivially ~0
    np.testing.assert_allclose(out[real], ref[real], atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("tie", [True, False])
def test_gradients_match_torch_autograd(family, tie):
    """d(Σ w · logits over real tokens)/dθ for every parameter against torch's autograd on the
    same weights: the backward of the projections, RoPE, norms, attention and SwiGLU."""
    import torch

    model = make_tiny_hf_model(family, tie=tie, seed=4)
    cfg, params = _flax_from_hf(model)
    weight_BxLxV = np.random.default_rng(0).normal(size=TOKENS.shape + (cfg.vocab_size,))
    weight_BxLxV = (weight_BxLxV * MASK[..., None]).astype(np.float32)
    positions = qwen.positions_from_mask(MASK)

    def objective(p):
        logits = qwen.forward(p, cfg, TOKENS, positions, MASK)
        return jnp.sum(logits * weight_BxLxV)

    grads = hf_io.to_hf_tensors(jax.jit(jax.grad(objective))(params), cfg)
    model.zero_grad()
    out = model(
        input_ids=torch.tensor(TOKENS),
        attention_mask=torch.tensor(MASK),
        position_ids=torch.tensor(np.asarray(positions)),
    )
    (out.logits * torch.tensor(weight_BxLxV)).sum().backward()
    ref = {name: t.grad.numpy() for name, t in model.named_parameters() if t.grad is not None}
    assert set(grads) == set(ref)
    for name, want in ref.items():
        assert np.abs(want).max() > 1e-3, name  # every parameter gets a real gradient
        scale = np.abs(want).max()
        np.testing.assert_allclose(grads[name], want, atol=2e-5 * scale, rtol=0, err_msg=name)


REAL_WIDTHS = [
    # Qwen2.5-1.5B hidden/heads/mlp/vocab (tied), 2 layers.
    ("qwen2", dict(hidden=1536, intermediate=8960, heads=12, kv_heads=2, vocab=151936)),
    # Qwen3-0.6B hidden/heads/head_dim/mlp/vocab (tied), 2 layers.
    (
        "qwen3",
        dict(hidden=1024, intermediate=3072, heads=16, kv_heads=8, head_dim=128, vocab=151936),
    ),
    # SmolLM2-135M hidden/heads/mlp/vocab (tied, rope 1e5 below is Qwen's; shape is what
    # matters here), 2 layers.
    ("llama", dict(hidden=576, intermediate=1536, heads=9, kv_heads=3, vocab=49152)),
]


@pytest.mark.parametrize(
    "family, widths",
    # The fast tier runs each model's real layer widths with an 8192-token vocabulary (the
    # ids below reach 7007); the real vocabularies (a 150k x 1.5k embedding in both
    # implementations) run in the slow tier.
    [(f, dict(w, vocab=8192)) for f, w in REAL_WIDTHS]
    + [pytest.param(f, w, marks=pytest.mark.slow) for f, w in REAL_WIDTHS],
    ids=[f"{f}-vocab8192" for f, _ in REAL_WIDTHS] + [f"{f}-real-vocab" for f, _ in REAL_WIDTHS],
)
def test_logits_match_transformers_at_real_widths(family, widths):
    model = make_tiny_hf_model(family, tie=True, layers=2, rope_theta=1e6, seed=5, **widths)
    cfg, params = _flax_from_hf(model)
    tokens, mask = TOKENS[:2, :5] * 1000 + 7, MASK[:2, :5]  # ids spread over the large vocab
    ref = hf_logits(model, tokens, mask)
    del model
    out = _flax_logits(params, cfg, tokens, mask)
    real = mask > 0
    assert np.abs(ref[real]).max() > 1.0
    np.testing.assert_allclose(out[real], ref[real], atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def tiny3():
    model = make_tiny_hf_model("qwen3", tie=False, seed=11)
    return model, _state_dict_np(model)


def test_scan_and_unrolled_layers_give_same_logits(tiny3):
    model, sd = tiny3
    base = ModelConfig.from_hf_config(model.config.to_dict())
    scanned = base.replace(scan_layers=True)
    unrolled = base.replace(scan_layers=False)
    out_scan = _flax_logits(hf_io.from_hf_tensors(sd, scanned), scanned)
    out_unrolled = _flax_logits(hf_io.from_hf_tensors(sd, unrolled), unrolled)
    np.testing.assert_allclose(out_scan, out_unrolled, atol=1e-5, rtol=0)


def test_unrolled_layers_splits_the_stack_into_the_unrolled_tree(tiny3):
    model, sd = tiny3
    base = ModelConfig.from_hf_config(model.config.to_dict())
    scanned, unrolled = base.replace(scan_layers=True), base.replace(scan_layers=False)
    params, cfg = qwen.unrolled_layers(hf_io.from_hf_tensors(sd, scanned), scanned)
    assert cfg == unrolled
    # The very tree (and arrays) the unrolled layout loads from the same checkpoint.
    jax.tree.map(np.testing.assert_array_equal, params, hf_io.from_hf_tensors(sd, unrolled))
    same, same_cfg = qwen.unrolled_layers(params, unrolled)
    assert same is params and same_cfg is unrolled


def test_hidden_times_unembedding_is_logits(tiny3):
    model, sd = tiny3
    for tie in (False, True):
        cfg = ModelConfig.from_hf_config(model.config.to_dict(), tie_word_embeddings=tie)
        tensors = {k: v for k, v in sd.items() if not (tie and k == "lm_head.weight")}
        params = hf_io.from_hf_tensors(tensors, cfg)
        pos = qwen.positions_from_mask(MASK)
        h = qwen.Transformer(cfg).apply(
            {"params": params}, TOKENS, pos, MASK, method=qwen.Transformer.hidden
        )
        assert h.shape == (*TOKENS.shape, cfg.hidden_size)
        w = qwen.unembedding(params, cfg)
        expected = params["embed"]["embedding"].T if tie else params["lm_head"]["kernel"]
        assert w.shape == (cfg.hidden_size, cfg.vocab_size) and np.array_equal(w, expected)
        np.testing.assert_allclose(h @ w, _flax_logits(params, cfg), atol=1e-5, rtol=0)


def test_bf16_compute_close_to_fp32(tiny3):
    model, sd = tiny3
    cfg32 = ModelConfig.from_hf_config(model.config.to_dict())
    cfg16 = cfg32.replace(dtype="bfloat16")
    params = hf_io.from_hf_tensors(sd, cfg32)  # fp32 params for both
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    h16 = qwen.Transformer(cfg16).apply(
        {"params": params},
        TOKENS,
        qwen.positions_from_mask(MASK),
        MASK,
        method=qwen.Transformer.hidden,
    )
    assert h16.dtype == jnp.bfloat16
    out16, out32 = _flax_logits(params, cfg16), _flax_logits(params, cfg32)
    assert out16.dtype == np.float32 and np.isfinite(out16).all()
    real = MASK > 0
    rel = np.abs(out16[real] - out32[real]).max() / np.abs(out32[real]).max()
    assert rel < 0.05, rel
    # bf16 is actually used: the results are not bit-identical to fp32.
    assert not np.array_equal(out16, out32)


def test_remat_policies_give_same_gradients():
    base = get_preset("tiny-qwen2", num_layers=2)
    params = qwen.init_params(base, jax.random.key(0))
    params = jax.tree.map(lambda x: x * 10 if x.ndim > 1 else x, params)
    pos = qwen.positions_from_mask(MASK)
    weights = jax.random.normal(jax.random.key(1), (*TOKENS.shape, base.vocab_size))

    def grads(cfg):
        loss = lambda p: jnp.sum(
            jax.nn.log_softmax(qwen.forward(p, cfg, TOKENS, pos, MASK)) * weights
        )
        return jax.jit(jax.grad(loss))(params)

    ref = grads(base)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(ref)) > 1e-3
    for policy in ("full", "dots_saveable"):
        got = grads(base.replace(remat_policy=policy))
        for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
            # Recomputation changes which ops XLA fuses, so the sums round differently: on a GPU
            # (full float32 matmuls) entries near 0 moved 3e-4 of themselves, 1e-7 of the leaf's
            # scale. A dropped or wrong term moves the gradient by far more than 1e-5 of it.
            scale = float(jnp.abs(a).max())
            np.testing.assert_allclose(b, a, atol=1e-5 * scale, rtol=1e-5)


def test_param_logical_axes_names_and_ranks():
    allowed = {"vocab", "embed", "heads", "kv_heads", "head_dim", "mlp", "layers"}
    is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)
    for name, scan in (("tiny-qwen3", True), ("tiny-qwen2", False)):
        cfg = get_preset(name, scan_layers=scan)
        specs, shapes = qwen.param_logical_axes(cfg), qwen.param_shapes(cfg)
        flat = jax.tree_util.tree_flatten_with_path(specs, is_leaf=is_spec)[0]
        assert len(flat) == len(jax.tree.leaves(shapes))
        for path, spec in flat:
            shape = shapes
            for key in path:
                shape = shape[key.key]
            assert len(spec) == len(shape.shape) and set(spec) <= allowed, (path, spec)
            stacked = scan and path[0].key == "layers"
            assert ("layers" in spec) == stacked and (not stacked or spec[0] == "layers")
        assert specs["embed"]["embedding"] == jax.sharding.PartitionSpec("vocab", "embed")
    specs = qwen.param_logical_axes(get_preset("tiny-qwen3"))
    assert specs["layers"]["attn"]["q_proj"]["kernel"] == jax.sharding.PartitionSpec(
        "layers", "embed", "heads", "head_dim"
    )


def test_sharded_init_and_forward_under_logical_rules():
    """Params created sharded from logical names; activation constraints resolve on a mesh."""
    import flax.linen as nn
    from jax.sharding import Mesh

    if len(jax.devices()) < 8:  # the CPU tests simulate 8 (conftest); one GPU is one
        pytest.skip("needs 8 devices")
    cfg = get_preset("tiny-qwen3")
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tensor"))
    rules = (
        ("vocab", "tensor"),
        ("embed", "fsdp"),
        ("heads", "tensor"),
        ("kv_heads", None),
        ("mlp", "tensor"),
        ("head_dim", None),
        ("layers", None),
        ("act_batch", "fsdp"),
        ("act_len", None),
        ("act_embed", None),
        ("act_heads", "tensor"),
        ("act_mlp", "tensor"),
        ("act_vocab", "tensor"),
    )
    shardings = nn.logical_to_mesh_sharding(qwen.param_logical_axes(cfg), mesh, rules)
    params = qwen.init_params(cfg, jax.random.key(0), shardings=shardings)
    up = params["layers"]["mlp"]["up_proj"]["kernel"]
    assert up.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    tokens, mask = TOKENS[:2], MASK[:2]
    pos = qwen.positions_from_mask(mask)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        out = jax.jit(qwen.forward, static_argnums=1)(params, cfg, tokens, pos, mask)
        assert out.sharding.spec == jax.sharding.PartitionSpec("fsdp", None, "tensor")
    host = jax.tree.map(np.asarray, params)
    np.testing.assert_allclose(out, _flax_logits(host, cfg, tokens, mask), atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- packed rows
# Three sequences of 5, 7 and 4 tokens laid end to end in one row of 20 slots (4 empty), and a
# second row holding the 7-token sequence alone: segment ids restart per row, positions per
# sequence.
SEQS = [np.array([5, 6, 7, 9, 11]), np.array([3, 1, 4, 1, 5, 9, 2]), np.array([200, 17, 2, 8])]


def _packed_rows(seqs=SEQS, width=20):
    tokens = np.zeros((2, width), np.int64)
    seg = np.zeros((2, width), np.int32)
    pos = np.zeros((2, width), np.int32)
    start = 0
    for k, s in enumerate(seqs, start=1):
        tokens[0, start : start + len(s)] = s
        seg[0, start : start + len(s)] = k
        pos[0, start : start + len(s)] = np.arange(len(s))
        start += len(s)
    tokens[1, : len(seqs[1])], seg[1, : len(seqs[1])] = seqs[1], 1
    pos[1, : len(seqs[1])] = np.arange(len(seqs[1]))
    return tokens, pos, seg


@pytest.mark.parametrize("impl", ["matmul", "xla", "blockwise"])
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_packed_row_matches_transformers_per_sequence(family, impl):
    """Each packed sequence's logits are transformers' for that sequence run alone (attention
    within the segment, RoPE positions from 0), with every CPU attention implementation
    (blockwise in tiles of 4 queries x 8 keys, so sequences straddle tiles)."""
    model = make_tiny_hf_model(family, tie=False, seed=4)
    blocks = dict(attention_block_q=4, attention_block_k=8)
    cfg, params = _flax_from_hf(model, attention_impl=impl, **blocks)
    tokens, pos, seg = _packed_rows()
    out = np.asarray(qwen.forward_jit(params, cfg, tokens, pos, seg))
    start = 0
    for s in SEQS:
        ref = hf_logits(model, s[None], np.ones((1, len(s))))[0]
        assert np.abs(ref).max() > 1.0
        np.testing.assert_allclose(out[0, start : start + len(s)], ref, atol=1e-4, rtol=0)
        start += len(s)
    np.testing.assert_allclose(out[1, : len(SEQS[1])], out[0, 5:12], atol=1e-5, rtol=0)


@pytest.mark.parametrize("impl", ["matmul", "xla", "blockwise"])
def test_segments_never_see_each_other(tiny3, impl):
    """Changing every token of the middle sequence leaves the other sequences' logits (before
    and after it in the row) bit-identical, and does change its own."""
    model, sd = tiny3
    cfg = ModelConfig.from_hf_config(model.config.to_dict(), attention_impl=impl)
    params = hf_io.from_hf_tensors(sd, cfg)
    tokens, pos, seg = _packed_rows()
    other = tokens.copy()
    other[0, 5:12] = (other[0, 5:12] + 37) % cfg.vocab_size
    a = np.asarray(qwen.forward_jit(params, cfg, tokens, pos, seg))
    b = np.asarray(qwen.forward_jit(params, cfg, other, pos, seg))
    untouched = (seg[0] != 2) & (seg[0] > 0)
    np.testing.assert_array_equal(a[0, untouched], b[0, untouched])
    np.testing.assert_array_equal(a[1], b[1])
    assert np.abs(a[0, 5:12] - b[0, 5:12]).max() > 1e-2


def test_attention_impls_give_the_same_gradients():
    """`jax.nn.dot_product_attention` (XLA) and the batched-matmul attention agree on the loss
    gradient of a packed batch (both are exact masked softmax attention)."""
    base = get_preset("tiny-qwen2", num_layers=1)
    params = jax.tree.map(
        lambda x: x * 10 if x.ndim > 1 else x, qwen.init_params(base, jax.random.key(0))
    )
    tokens, pos, seg = _packed_rows()
    weights = jax.random.normal(jax.random.key(1), (*tokens.shape, base.vocab_size))

    def grads(cfg):
        loss = lambda p: jnp.sum(
            jax.nn.log_softmax(qwen.forward(p, cfg, tokens, pos, seg)) * weights
        )
        return jax.jit(jax.grad(loss))(params)

    ref = grads(base)
    got = grads(base.replace(attention_impl="xla"))
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(ref)) > 1e-3
    # The two sum the softmax and its gradient in different float32 orders; with weights scaled
    # ×10 a handful of elements differ by ~2e-5 relative. Tolerance: 1e-5 of each leaf's scale.
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5 * float(jnp.abs(a).max()), rtol=1e-5)


def test_attention_impl_names_match_the_config_and_cudnn_needs_bf16():
    from dynamo_jax.models.config import ATTENTION_IMPLS

    assert tuple(qwen.ATTENTION_IMPLS) == ATTENTION_IMPLS
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        get_preset("tiny-qwen3", attention_impl="flash")
    with pytest.raises(ValueError, match="'cudnn'.*needs dtype='bfloat16'"):
        get_preset("tiny-qwen3", attention_impl="cudnn")
    assert (
        get_preset("tiny-qwen3", attention_impl="cudnn", dtype="bfloat16").attention_impl == "cudnn"
    )


def _shared_prompt_rows(vocab, slots=6, width=5, seed=0):
    """Rows of 3 prompts (4, 6, 3 tokens) right-aligned to `slots` and responses of 1..width
    tokens after them; prompt g of row b = GROUPS[b]; the table holds a padding entry."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, vocab, size=n) for n in (4, 6, 3)]
    groups = [0, 1, 0, 2, 1, 0, 2]
    tokens = np.zeros((len(groups), slots + width), np.int32)
    seg, pos = np.zeros_like(tokens), np.zeros_like(tokens)
    for b, g in enumerate(groups):
        p, r = prompts[g], rng.integers(1, vocab, size=rng.integers(1, width + 1))
        start, end = slots - len(p), slots + len(r)
        tokens[b, start:slots], tokens[b, slots:end] = p, r
        seg[b, start:end], pos[b, start:end] = 1, np.arange(end - start)
    shared = qwen.SharedPrompts(slots, jnp.array([0, 1, 3, 0]), jnp.array(groups, jnp.int32))
    return tokens, pos, seg, shared


@pytest.mark.parametrize(
    "preset, overrides",
    [
        ("tiny-qwen3", dict(scan_layers=False)),
        ("tiny-qwen3", dict(scan_layers=True, remat_policy="full")),
        (
            "tiny-llama",
            dict(
                scan_layers=False,
                attention_impl="blockwise",
                attention_block_q=4,
                attention_block_k=4,
            ),
        ),  # fmt: skip
        ("tiny-qwen2", dict(scan_layers=False)),
    ],
    ids=["qwen3", "qwen3-scan-remat", "llama-blockwise", "qwen2-bias"],
)
def test_shared_prompts_give_the_same_hidden_states_and_gradients(preset, overrides):
    """Each distinct prompt run once (`SharedPrompts`) against every row run whole: the same
    final hidden states on every real token and the same parameter gradients (float32
    summation order apart)."""
    cfg = get_preset(preset, vocab_size=64, **overrides)
    params = jax.tree.map(
        lambda x: x * 10 if x.ndim > 1 else x, qwen.init_params(cfg, jax.random.key(0))
    )
    tokens, pos, seg, shared = _shared_prompt_rows(cfg.vocab_size)
    weights = (
        jax.random.normal(jax.random.key(1), (*tokens.shape, cfg.hidden_size)) * seg[..., None]
    )

    def hidden(p, prompts):
        model = qwen.Transformer(cfg)
        return model.apply({"params": p}, tokens, pos, seg, prompts, method=model.hidden)

    whole, once = hidden(params, None), hidden(params, shared)
    real = seg > 0
    assert float(jnp.abs(whole[real]).max()) > 1.0
    np.testing.assert_allclose(once[real], whole[real], atol=2e-5, rtol=0)
    grad = lambda prompts: jax.jit(jax.grad(lambda p: jnp.sum(hidden(p, prompts) * weights)))(
        params
    )
    ref, got = grad(None), grad(shared)
    # Each prompt's gradient is summed over its rows in another float32 order: with weights
    # x10 (gradients ~1e3) a few entries differ by ~1.5e-5 of their leaf's largest.
    for path, a in jax.tree_util.tree_leaves_with_path(ref):
        b = got
        for key in path:
            b = b[key.key]
        scale = float(jnp.abs(a).max())
        assert scale > 1e-4 or "lm_head" in str(path)  # hidden states never reach the head
        np.testing.assert_allclose(b, a, atol=5e-5 * scale, rtol=0, err_msg=str(path))
    # The control: a row pointed at another group's prompt changes its hidden states and the
    # gradients by far more than that.
    wrong = shared._replace(source_B=shared.source_B.at[3].set(0))
    assert float(jnp.abs(hidden(params, wrong)[3] - whole[3])[real[3]].max()) > 1e-2
    off = max(
        float(jnp.abs(a - b).max() / jnp.abs(a).max())
        for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(grad(wrong)), strict=True)
        if float(jnp.abs(a).max()) > 0
    )
    assert off > 1e-2
