"""Policy loss vs the float64 reference for every baseline, aggregation mode and ΔH mode;
invariance to micro-batching and to the device mesh."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_losses as ref
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dynamo_jax.losses import (
    BASELINES,
    LossConfig,
    TokenBatch,
    build_loss_fn,
    combine_metrics,
    finalize_metrics,
    minibatch_stats,
    modulate,
    sharded_token_logprobs_entropy,
    token_logprobs_entropy,
)

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "prompt-mean")
RTOL = 1e-5


def to_batch(inp) -> TokenBatch:
    f = lambda k: None if inp.get(k) is None else jnp.asarray(inp[k], jnp.float32)
    return TokenBatch(
        logp=f("logp"), old_logp=f("old_logp"), ent=f("ent"), adv=f("adv"),
        mask=jnp.asarray(inp["mask"]), k=f("k"), ref_logp=f("ref_logp"), noise=f("noise"),
        seq_weight=f("seq_weight"),
    )  # fmt: skip


@jax.jit(static_argnums=1)
def full_loss(batch, cfg):
    """The mini-batch as a single micro-batch: stats and loss over the same rows."""
    stats = minibatch_stats(batch, cfg)
    return build_loss_fn(cfg)(batch, stats)


def assert_close(actual, expected, rtol=RTOL, atol=1e-7):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


def cfg_for(baseline, agg="token-mean", **kw):
    extra = dict(max_len_norm=12) if agg == "seq-mean-token-sum-norm" else {}
    if baseline in ("clip_cov", "kl_cov"):  # pick several tokens on a tiny batch
        extra[f"{baseline}_ratio"] = 0.1
    return LossConfig.preset(baseline, loss_agg_mode=agg, **extra, **kw)


@pytest.fixture(scope="module")
def inputs():
    return ref.random_token_inputs(np.random.default_rng(0), B=8, L=11)


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("baseline", BASELINES)
def test_every_baseline_and_mode_matches_reference(inputs, baseline, agg):
    cfg = cfg_for(baseline, agg)
    loss, metrics = full_loss(to_batch(inputs), cfg)
    expected, _ = ref.policy_loss(inputs, cfg)
    assert abs(expected) > 1e-4  # the check would be vacuous on a zero loss
    assert_close(loss, expected)
    assert float(metrics["tokens"]) == inputs["mask"].sum()


@pytest.mark.parametrize(
    "overrides",
    [
        dict(entropy_change="exact"),
        dict(entropy_change="sequence_mean"),
        dict(enable_gc=False),
        dict(enable_ums=False),
        dict(alpha=0.3, alpha_comp=0.2, alpha_stab=0.4, ums_tau=0.99, dual_clip=None),
        dict(kl="k3", kl_coef=0.05),
        dict(kl="k1", kl_coef=0.05, loss_agg_mode="seq-mean-token-mean"),
        dict(loss_agg_mode="prompt-mean", enable_gc=False),
        dict(loss_agg_mode="prompt-mean", stats_scope="micro_batch", kl="k3", kl_coef=0.05),
    ],
    ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()),
)
def test_dynamo_variants_match_reference_including_modulated_advantages(inputs, overrides):
    cfg = LossConfig.preset("dynamo", **overrides)
    batch = to_batch(inputs)
    loss, _ = full_loss(batch, cfg)
    expected, ahat_ref = ref.policy_loss(inputs, cfg)
    assert_close(loss, expected)
    stats = minibatch_stats(batch, cfg)
    ahat, _, _ = modulate(batch, stats.h_min, stats.h_max, stats.xi_max, cfg)
    m = inputs["mask"]
    assert_close(np.asarray(ahat)[m], ahat_ref[m])


def test_edge_cases_match_reference():
    """All-equal group rewards (A = 0), lone responses, empty rows, constant entropy (H_max = H_min)."""
    rng = np.random.default_rng(3)
    inp = ref.random_token_inputs(rng, B=6, L=7)
    adv_seq = ref.grpo_advantages([1, 1, 0, 1, 0, 1], [5, 5, 9, 7, 7, 42])  # g5 equal, g42 alone
    inp["adv"] = np.repeat(adv_seq[:, None], 7, axis=1)
    inp["ent"] = np.full((6, 7), 0.7)  # H_max == H_min
    for cfg in (cfg_for("dynamo"), cfg_for("dynamo", entropy_change="sequence_mean"),
                cfg_for("fork_tokens"), cfg_for("entropy_adv")):  # fmt: skip
        loss, _ = full_loss(to_batch(inp), cfg)
        assert_close(loss, ref.policy_loss(inp, cfg)[0])
        assert np.isfinite(float(loss))


@pytest.mark.parametrize("baseline", ["dynamo", "grpo", "clip_cov", "kl_cov", "fork_tokens"])
def test_fully_masked_minibatch_gives_zero_loss_and_finite_grads(inputs, baseline):
    inp = dict(inputs, mask=np.zeros_like(inputs["mask"]))
    cfg = cfg_for(baseline)
    grad = jax.grad(lambda lp: full_loss(to_batch(inp)._replace(logp=lp), cfg)[0])
    g = grad(jnp.asarray(inp["logp"], jnp.float32))
    assert float(full_loss(to_batch(inp), cfg)[0]) == 0.0
    assert np.all(np.asarray(g) == 0.0)


@jax.jit(static_argnums=0)
def _loss_and_grads(cfg, batch, stats):
    def f(lp, ent):
        return build_loss_fn(cfg)(batch._replace(logp=lp, ent=ent), stats)

    return jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(batch.logp, batch.ent)


@pytest.mark.parametrize(
    "baseline,agg",
    [("dynamo", "token-mean"), ("dynamo", "seq-mean-token-mean"), ("entropy_loss", "token-mean"),
     ("clip_cov", "token-mean"), ("kl_cov", "seq-mean-token-sum-norm"),
     ("dynamo", "prompt-mean"), ("entropy_loss", "prompt-mean")],
)  # fmt: skip
def test_micro_batching_does_not_change_loss_or_gradient(inputs, baseline, agg):
    cfg = cfg_for(baseline, agg)
    batch = to_batch(inputs)
    stats = jax.jit(minibatch_stats, static_argnums=1)(batch, cfg)
    (loss, m_full), (g_lp, g_ent) = _loss_and_grads(cfg, batch, stats)
    total, metrics, grads = 0.0, None, []
    for rows in (slice(0, 4), slice(4, 8)):  # two micro-batches (one compile)
        micro = jax.tree.map(lambda x, rows=rows: x[rows], batch)
        (l_m, m_m), g_m = _loss_and_grads(cfg, micro, stats)
        total += l_m
        metrics = m_m if metrics is None else combine_metrics(metrics, m_m)
        grads.append(g_m)
    assert_close(total, float(loss))
    assert_close(np.concatenate([g[0] for g in grads]), np.asarray(g_lp), atol=1e-7)
    assert_close(np.concatenate([g[1] for g in grads]), np.asarray(g_ent), atol=1e-7)
    fin, fin_full = finalize_metrics(metrics), finalize_metrics(m_full)
    for k in fin_full:
        assert_close(fin[k], float(fin_full[k]), atol=1e-6)


def test_micro_batch_stats_scope_differs_from_global(inputs):
    """The authors' per-micro-batch statistics change Â with the split; ours do not (docs/algorithm.md#scope-of-the-statistics)."""
    cfg_g = cfg_for("dynamo")
    cfg_m = dataclasses.replace(cfg_g, stats_scope="micro_batch")
    batch = to_batch(inputs)
    stats = minibatch_stats(batch, cfg_g)
    micro = jax.tree.map(lambda x: x[2:6], batch)
    l_g = build_loss_fn(cfg_g)(micro, stats)[0]
    l_m = build_loss_fn(cfg_m)(micro, stats)[0]
    assert abs(float(l_g) - float(l_m)) > 1e-6


MESHES = [((8,), ("data",)), ((2, 4), ("data", "fsdp")), ((4, 2), ("fsdp", "data"))]


@pytest.mark.parametrize("agg", ["token-mean", "prompt-mean"])
@pytest.mark.parametrize("shape,names", MESHES)
def test_loss_adv_and_grad_same_on_one_and_eight_devices(inputs, shape, names, agg):
    cfg = cfg_for("dynamo", agg)
    inp = ref.random_token_inputs(np.random.default_rng(1), B=16, L=8)
    batch = to_batch(inp)

    def step(b):
        stats = minibatch_stats(b, cfg)
        (loss, _), grads = _loss_and_grads(cfg, b, stats)
        ahat, _, _ = modulate(b, stats.h_min, stats.h_max, stats.xi_max, cfg)
        return loss, ahat, grads

    one = jax.jit(step)(batch)
    mesh = Mesh(np.array(jax.devices()).reshape(shape), names)
    rows = NamedSharding(mesh, P(names))
    sharded = jax.device_put(batch, jax.tree.map(lambda _: rows, batch))
    eight = jax.jit(step)(sharded)
    assert len(eight[1].sharding.device_set) == 8
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(eight)):
        assert_close(np.asarray(b), np.asarray(a), atol=1e-7)


VOCAB_MESHES = [
    ((2, 4), ("data", "tensor")),
    ((2, 2, 2), ("data", "fsdp", "tensor")),
    ((1, 8), ("data", "tensor")),
]


@pytest.mark.parametrize("shape,names", VOCAB_MESHES, ids=lambda x: str(x))
def test_end_to_end_from_hidden_states_vocab_sharded(shape, names):
    """hidden → vocab-sharded log π, H, K → stats → DynaMO loss: loss, Â and the gradient
    w.r.t. hidden states and unembedding agree between 1 device and an 8-device mesh."""
    B, L, Dm, Vv = 8, 6, 16, 64
    rng = np.random.default_rng(11)
    inp = ref.random_token_inputs(rng, B=B, L=L)
    hidden = jnp.asarray(rng.normal(size=(B * L, Dm)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(Dm, Vv)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, Vv, size=B * L), jnp.int32)
    base = to_batch(inp)
    cfg = cfg_for("dynamo")
    mesh = Mesh(np.array(jax.devices()).reshape(shape), names)

    def step(hidden, w, mesh):
        def loss(hidden, w):
            if mesh is None:
                lp, ent, k = token_logprobs_entropy(
                    hidden, w, targets, 0.9, block_size=8, return_k=True
                )
            else:
                lp, ent, k = sharded_token_logprobs_entropy(
                    hidden, w, targets, 0.9, mesh=mesh, block_size=8, return_k=True
                )
            b = base._replace(logp=lp.reshape(B, L), ent=ent.reshape(B, L), k=k.reshape(B, L))
            stats = minibatch_stats(b, cfg)
            loss_val, _ = build_loss_fn(cfg)(b, stats)
            return loss_val, modulate(b, stats.h_min, stats.h_max, stats.xi_max, cfg)[0]

        return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(hidden, w)

    (l1, a1), g1 = jax.jit(lambda h, w: step(h, w, None))(hidden, w)
    (l8, a8), g8 = jax.jit(lambda h, w: step(h, w, mesh))(hidden, w)
    assert_close(l8, float(l1))
    assert_close(np.asarray(a8), np.asarray(a1), atol=1e-6)
    for a, b in zip(g1, g8):
        assert_close(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("baseline", ["grpo", "dynamo"])
def test_dual_clip_active_matches_reference(baseline):
    """Large ratios on negative-advantage tokens: the dual clip −c·Â is what binds."""
    inp = ref.random_token_inputs(np.random.default_rng(13), B=8, L=10, ratio_noise=2.0)
    cfg = cfg_for(baseline, dual_clip=3.0)
    r = np.exp(inp["logp"] - inp["old_logp"])
    assert ((inp["adv"] < 0) & (r > 3.0) & inp["mask"]).any()
    loss, _ = full_loss(to_batch(inp), cfg)
    assert_close(loss, ref.policy_loss(inp, cfg)[0])
    no_dual, _ = full_loss(to_batch(inp), dataclasses.replace(cfg, dual_clip=None))
    assert abs(float(no_dual) - float(loss)) > 1e-4


@pytest.mark.parametrize("baseline", ["grpo", "entropy_loss", "kl_cov", "w_reinforce"])
def test_gradient_matches_finite_differences_of_reference(baseline):
    """jax.grad of the loss w.r.t. log π and H equals central differences of the float64
    reference (baselines whose loss has no stop-gradient path through log π or H)."""
    inp = ref.random_token_inputs(np.random.default_rng(17), B=5, L=6)
    cfg = cfg_for(baseline)
    batch = to_batch(inp)
    stats = minibatch_stats(batch, cfg)
    _, (g_lp, g_ent) = _loss_and_grads(cfg, batch, stats)
    eps = 1e-6
    for name, g in (("logp", g_lp), ("ent", g_ent)):
        num = np.zeros(inp["mask"].shape)
        for idx in zip(*np.nonzero(inp["mask"])):
            hi, lo = dict(inp), dict(inp)
            hi[name] = inp[name].copy()
            lo[name] = inp[name].copy()
            hi[name][idx] += eps
            lo[name][idx] -= eps
            num[idx] = (ref.policy_loss(hi, cfg)[0] - ref.policy_loss(lo, cfg)[0]) / (2 * eps)
        assert_close(np.asarray(g), num, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- packed layout


def _layouts(seed=21, S=10, L=9, prompt_max=3):
    """The same S sequences as two TokenBatches of one [S, W] shape (one compile each config):
    padded, one sequence per row (segment ids 1 on its tokens), and packed several per row by
    `data.packing` (rows left over are empty). Sequence s = p_s untrained prompt slots, then its
    response (the reference's ragged mask: one empty, some with A = 0); rows are twice the
    longest sequence. Returns (padded inputs dict, padded batch, packed batch, placement)."""
    from dynamo_jax.data.packing import RowLayout

    rng = np.random.default_rng(seed)
    resp = ref.random_token_inputs(rng, B=S, L=L)
    p = rng.integers(1, prompt_max + 1, S)
    W = 2 * (L + prompt_max)
    lengths = p + resp["mask"].sum(1)
    inp = {}
    for key, value in resp.items():
        if key == "group":  # one prompt id per sequence, not per token
            continue
        arr = rng.normal(size=(S, W))  # junk on untrained slots: must never be read
        for s in range(S):
            arr[s, p[s] : p[s] + L] = value[s]
        inp[key] = arr
    inp["mask"] = np.zeros((S, W), bool)
    for s in range(S):
        inp["mask"][s, p[s] : lengths[s]] = True
    inp["adv"] = np.repeat(resp["adv"][:, :1], W, axis=1)  # one advantage per sequence
    inp["group"] = resp["group"]
    padded = to_batch(inp)._replace(
        segment_ids=jnp.asarray(np.arange(W)[None] < lengths[:, None], jnp.int32)
    )
    placement = RowLayout(row_len=W, packing=True, micro_rows=S, max_sequences=S).place(lengths)
    packed_inp = {
        k: placement.scatter(v, fill=0.0) for k, v in inp.items() if k not in ("mask", "group")
    }
    packed_inp["mask"] = placement.scatter(inp["mask"], fill=False)
    packed = to_batch(packed_inp)._replace(segment_ids=jnp.asarray(placement.segment_ids()))
    return inp, padded, packed, placement


@jax.jit(static_argnums=0)
def _loss_metrics_grads(cfg, batch):
    """Loss, finalized metrics and d loss / d (log π, H), statistics from the batch itself."""

    def f(logp, ent):
        b = batch._replace(logp=logp, ent=ent)
        loss, metrics = build_loss_fn(cfg)(b, minibatch_stats(b, cfg))
        return loss, finalize_metrics(metrics)

    return jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(batch.logp, batch.ent)


LAYOUT_CONFIGS = (
    [cfg_for(b, agg) for b in BASELINES for agg in AGG_MODES]
    + [cfg_for("dynamo", agg, entropy_change="sequence_mean") for agg in AGG_MODES]
    + [cfg_for("dynamo", "seq-mean-token-mean", kl="k3", kl_coef=0.05)]
)


@pytest.mark.parametrize(
    "cfg",
    LAYOUT_CONFIGS,
    ids=lambda c: (
        f"{c.variant}-{c.loss_agg_mode}-{getattr(c.settings, 'entropy_change', '-')}-{c.kl}"
    ),
)
def test_packed_rows_give_the_padded_loss_metrics_and_gradients(cfg):
    """docs/algorithm.md#packed-sequences: the same sequences packed several to a row (segment ids) or one per
    padded row give the same loss, metrics and per-token gradients, for every baseline and
    aggregation mode and both ΔH modes; the padded value is also the float64 reference's."""
    inp, padded, packed, placement = _layouts()
    assert placement.rows < len(inp["mask"]) and placement.segment_ids().max() >= 3  # really packed
    (loss, metrics), (g_lp, g_ent) = _loss_metrics_grads(cfg, padded)
    (p_loss, p_metrics), (p_lp, p_ent) = _loss_metrics_grads(cfg, packed)
    assert_close(loss, ref.policy_loss(inp, cfg)[0])
    assert abs(float(loss)) > 1e-4
    assert_close(p_loss, float(loss))
    assert float(metrics["sequences"]) == float(p_metrics["sequences"]) == 9  # one is empty
    for key in metrics:
        assert_close(p_metrics[key], float(metrics[key]), atol=1e-6)
    width = inp["mask"].shape[1]
    for got, want in ((p_lp, g_lp), (p_ent, g_ent)):
        assert_close(
            placement.gather(np.asarray(got), width), np.asarray(want) * inp["mask"], atol=1e-7
        )


# ----------------------------------------------------------------------------- prompt-mean


@pytest.mark.parametrize("baseline", ["grpo", "dynamo", "entropy_loss"])
def test_prompt_mean_equals_seq_mean_token_mean_with_equal_group_sizes(baseline):
    """Every prompt with the same n: each group's 1/(N n) is 1/(number of sequences)."""
    inp = ref.random_token_inputs(np.random.default_rng(5), B=9, L=8)
    inp["mask"][1, 0] = True  # no empty row: every group then has 3 sequences
    inp["group"] = np.repeat(np.arange(3), 3)
    inp["seq_weight"] = ref.seq_weights(inp["group"], inp["mask"], 8)
    pm, _ = full_loss(to_batch(inp), cfg_for(baseline, "prompt-mean"))
    sm, _ = full_loss(to_batch(inp), cfg_for(baseline, "seq-mean-token-mean"))
    assert_close(pm, float(sm))
    # ... and unequal sizes really do weigh differently (the equality above is not vacuous).
    inp["group"] = np.array([0, 0, 0, 0, 0, 0, 0, 1, 2])
    inp["seq_weight"] = ref.seq_weights(inp["group"], inp["mask"], 8)
    pm2, _ = full_loss(to_batch(inp), cfg_for(baseline, "prompt-mean"))
    assert_close(pm2, ref.policy_loss(inp, cfg_for(baseline, "prompt-mean"))[0])
    assert abs(float(pm2) - float(sm)) > 1e-4


def test_prompt_mean_minibatch_holding_part_of_groups(inputs):
    """A PPO mini-batch of some of the step's sequences: each keeps its step weight 1/n_i
    (n_i counted in the whole step's batch), renormalised over the mini-batch, so the weights
    sum to 1 (a constant per-token loss aggregates to exactly that constant); the value is the
    float64 reference's with the step-level group sizes."""
    cfg = cfg_for("grpo", "prompt-mean")
    rows = np.array([0, 2, 3, 5, 6])  # cuts groups of the 8-row step batch
    sub = {k: (v[rows] if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}
    sub["group_size"] = 1.0 / inputs["seq_weight"][rows, 0]  # the step's n_i (no empty row)
    step_n = {g: (inputs["group"] == g).sum() for g in set(inputs["group"].tolist())}
    sub_n = {g: (sub["group"] == g).sum() for g in set(sub["group"].tolist())}
    assert any(sub_n[g] < step_n[g] for g in sub_n)  # the mini-batch cuts a group
    assert any(sub_n[g] > 1 for g in sub_n)  # and holds two sequences of one
    loss, _ = full_loss(to_batch(sub), cfg)
    assert_close(loss, ref.policy_loss(sub, cfg)[0])
    batch = to_batch(sub)
    stats = minibatch_stats(batch, cfg)
    from dynamo_jax.losses.policy import aggregate

    mask = jnp.asarray(sub["mask"], bool)
    ones = aggregate(jnp.full(mask.shape, 3.0), mask, stats, cfg, None, batch.seq_weight)
    assert_close(ones, 3.0)


def test_prompt_mean_without_weights_is_an_error(inputs):
    batch = to_batch(inputs)._replace(seq_weight=None)
    with pytest.raises(ValueError, match="prompt-mean' needs TokenBatch.seq_weight"):
        full_loss(batch, cfg_for("grpo", "prompt-mean"))
