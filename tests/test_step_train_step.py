"""The jitted sharded train step (dynamo_jax/step/train_step.py, forward.py, state.py).

Oracle: the same model and loss on ONE device, and, for that single-device step itself, a direct
full-softmax computation (model logits → log_softmax(z / T) → losses) differentiated by jax.grad.
The optimizer is SGD with learning rate 1, so `params − new_params` is exactly the gradient.

Meshes exercise head counts that divide the tensor axis and ones that do not: the tiny presets
have 4 query heads and 2 KV heads, so tensor=2 splits both, tensor=4 splits Q but replicates KV,
and tensor=8 replicates both (rules.py, "Indivisible dimensions").
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers.step_setups import (
    FAST_COMPILE,
    MAX_LEN,
    MODELS,
    N_SEQ,
    PACKED,
    PADDED,
    B,
    L,
    grad_recorder,
    make_rollouts,
    sub_mesh,
)
from jax.sharding import PartitionSpec as P

from dynamo_jax.data.packing import RowLayout
from dynamo_jax.loop import assemble, behaviour_pass
from dynamo_jax.losses import LossConfig, TokenBatch, build_loss_fn, minibatch_stats
from dynamo_jax.models.qwen import forward
from dynamo_jax.sharding.rules import DEFAULT_RULES
from dynamo_jax.step.forward import (
    activation_rules,
    make_logprob_fn,
    model_param_shardings,
    token_stats,
)
from dynamo_jax.step.state import TrainState, train_state_from_params
from dynamo_jax.step.train_step import _apply_update, make_train_step

MESHES = [(8, 1, 1), (1, 8, 1), (1, 1, 8), (2, 2, 2), (1, 2, 4)]
LOSS_CFG = LossConfig()  # DynaMO: GC + UMS with exact K, token-mean, dual clip
GRAD_TOL = 2e-4


@pytest.fixture
def setups(step_setups):
    """Per model: (cfg, params, batch), built once per session (tests/conftest.py)."""
    return step_setups


def sharded_logits(cfg, params, batch, mesh):
    """The model's float32 logits under the mesh's parameter shardings and activation rules."""
    rules = activation_rules(DEFAULT_RULES, mesh, cfg)

    def fn(p, tokens, positions, mask):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
            return forward(p, cfg, tokens, positions, mask)

    p_sh = model_param_shardings(cfg, mesh, DEFAULT_RULES)
    args = (params, batch["tokens"], batch["positions"], batch["segment_ids"])
    jitted = jax.jit(fn, in_shardings=(p_sh, None, None, None))
    return np.asarray(jitted.lower(*args).compile(FAST_COMPILE)(*args))


_CACHE = {}


def run_step(setups, name, mesh_shape, micro_batches=1, loss_cfg=LOSS_CFG):
    """(loss, grads, logits, metrics, compiled step, state shardings), cached per configuration."""
    key = (name, mesh_shape, micro_batches, loss_cfg)
    if key not in _CACHE:
        cfg, params, batch = setups[name]
        mesh = sub_mesh(mesh_shape)
        opt = optax.sgd(1.0)
        step, state_sh, batch_sh = make_train_step(
            cfg, loss_cfg, opt, mesh, DEFAULT_RULES, batch_size=B, micro_batches=micro_batches
        )
        batch = {k: batch[k] for k in batch_sh}
        state = train_state_from_params(params, opt, state_sh)
        compiled = step.lower(state, batch).compile(FAST_COMPILE)
        new_state, metrics = compiled(state, batch)
        grads = jax.tree.map(lambda p, n: p - np.asarray(n), params, new_state.params)
        logits = sharded_logits(cfg, params, batch, mesh)
        metrics = {k: float(v) for k, v in metrics.items()}
        _CACHE[key] = (metrics["loss"], grads, logits, metrics, compiled, new_state)
    return _CACHE[key]


def assert_trees_close(a, b, scaled_tol):
    """max |a − b| <= scaled_tol · max |b|, per leaf.

    Per-element relative error is meaningless for gradient entries near zero; the fp32 noise of
    this computation, measured against a float64 run, is ~3e-5 of each leaf's largest entry
    for both the step and the direct oracle (the 10×-scaled tiny model is sharp).
    """
    for (path, x), y in zip(
        jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True
    ):
        err, scale = np.abs(np.asarray(x) - np.asarray(y)).max(), np.abs(np.asarray(y)).max()
        assert err <= scaled_tol * scale, (
            f"{jax.tree_util.keystr(path)}: {err} > {scaled_tol} * {scale}"
        )


def direct_loss(cfg, params, batch):
    """Unsharded oracle: full-softmax log π / H / K from the model's logits, then the losses."""
    z = forward(params, cfg, batch["tokens"], batch["positions"], batch["segment_ids"])
    logpi = jax.nn.log_softmax(z / batch["temperature"], axis=-1)[:, :-1]
    pi = jnp.exp(logpi)
    ent = -jnp.sum(pi * logpi, -1)
    k = jnp.sum(pi**2 * (logpi + ent[..., None]), -1)
    logp = jnp.take_along_axis(logpi, batch["tokens"][:, 1:, None], -1)[..., 0]
    pad = lambda x: jnp.pad(x, ((0, 0), (1, 0)))  # token t is scored by position t - 1
    adv = jnp.broadcast_to(batch["advantages"][:, None], (B, L))
    tb = TokenBatch(
        pad(logp),
        batch["old_logp"],
        pad(ent),
        adv,
        batch["loss_mask"],
        k=jax.lax.stop_gradient(pad(k)),
    )
    return build_loss_fn(LOSS_CFG)(tb, minibatch_stats(tb, LOSS_CFG))[0]


def test_single_device_step_matches_direct_full_softmax_oracle(setups):
    cfg, params, batch = setups["tiny-qwen3"]
    loss, grads, logits, metrics, _, _ = run_step(setups, "tiny-qwen3", (1, 1, 1))
    oracle = jax.jit(jax.value_and_grad(lambda p: direct_loss(cfg, p, batch)))
    ref_loss, ref_grads = oracle.lower(params).compile(FAST_COMPILE)(params)
    np.testing.assert_allclose(loss, float(ref_loss), rtol=1e-5, atol=1e-5)
    assert_trees_close(grads, ref_grads, GRAD_TOL)
    ref_logits = forward(params, cfg, batch["tokens"], batch["positions"], batch["segment_ids"])
    np.testing.assert_allclose(logits, np.asarray(ref_logits), rtol=1e-5, atol=1e-5)
    assert metrics["update_skipped"] == 0.0
    assert metrics["tokens"] == batch["loss_mask"].sum()
    assert loss != 0.0 and metrics["grad_norm"] > 0.0


# The fast tier runs each model once on a mesh with tensor > 1: tiny-qwen2 on (2, 2, 2) (tensor
# divides both head counts) and tiny-qwen3 on (1, 2, 4) (tensor divides Q's heads, not k_proj's);
# the other pairings and the one-axis meshes run in the slow tier.
_FAST_PAIRS = {("tiny-qwen2", (2, 2, 2)), ("tiny-qwen3", (1, 2, 4))}


@pytest.mark.parametrize(
    "name, mesh_shape",
    [
        (n, m) if (n, m) in _FAST_PAIRS else pytest.param(n, m, marks=pytest.mark.slow)
        for n in MODELS
        for m in MESHES
    ],
    ids=[f"{n}-{'x'.join(map(str, m))}" for n in MODELS for m in MESHES],
)
def test_sharded_step_matches_single_device(setups, name, mesh_shape):
    ref_loss, ref_grads, ref_logits, _, _, _ = run_step(setups, name, (1, 1, 1))
    loss, grads, logits, _, _, new_state = run_step(setups, name, mesh_shape)
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-5)
    assert_trees_close(grads, ref_grads, GRAD_TOL)
    # The parameters really are split as the rules say, including the non-dividing case.
    tensor = mesh_shape[2]
    attn = new_state.params["layers"]["attn"]
    q_spec = attn["q_proj"]["kernel"].sharding.spec
    k_spec = attn["k_proj"]["kernel"].sharding.spec
    assert q_spec == P(None, "fsdp", "tensor" if 4 % tensor == 0 else None, None)
    assert k_spec == P(None, "fsdp", "tensor" if 2 % tensor == 0 else None, None)


@pytest.mark.parametrize(
    "residual,mesh_shape,tol",
    # bf16-stored logits: |Δz| <= |z|·2^-9 with |z| up to ~10 for this sharpened model, so
    # π and every gradient term move by up to ~2%: 3e-2 of each leaf's largest entry.
    [
        ("store_fp32", (1, 1, 1), GRAD_TOL),
        pytest.param("store_bf16", (1, 2, 4), 3e-2, marks=pytest.mark.slow),
    ],
)
def test_stored_logits_step_matches_default(setups, residual, mesh_shape, tol):
    """The opt-in `logits_residual` modes give the default step's loss, metrics and update,
    also with the vocabulary split over tensor = 4."""
    ref_loss, ref_grads, _, ref_metrics, _, _ = run_step(setups, "tiny-qwen3", (1, 1, 1))
    loss_cfg = LossConfig(logits_residual=residual)
    loss, grads, _, metrics, _, _ = run_step(setups, "tiny-qwen3", mesh_shape, loss_cfg=loss_cfg)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-5)  # forward: same values
    for key in ("entropy_min", "entropy_max", "beta_comp_mean", "beta_stab_mean"):
        np.testing.assert_allclose(metrics[key], ref_metrics[key], rtol=2e-5, err_msg=key)
    assert_trees_close(grads, ref_grads, tol)


def test_micro_batching_does_not_change_the_update(setups):
    """M = 2 (stats from a forward pre-pass over the whole mini-batch) equals M = 1, on (2,2,2)."""
    cfg, params, batch = setups["tiny-qwen2"]
    ref_loss, ref_grads, _, ref_metrics, _, _ = run_step(setups, "tiny-qwen2", (1, 1, 1))
    mesh = sub_mesh((2, 2, 2))
    opt = optax.sgd(1.0)
    step, state_sh, batch_sh = make_train_step(
        cfg, LOSS_CFG, opt, mesh, DEFAULT_RULES, batch_size=B, micro_batches=2
    )
    state = train_state_from_params(params, opt, state_sh)
    batch = jax.device_put({k: batch[k] for k in batch_sh}, batch_sh)
    new_state, metrics = step.lower(state, batch).compile(FAST_COMPILE)(state, batch)
    assert state.params["embed"]["embedding"].is_deleted()  # donated
    grads = jax.tree.map(lambda p, n: p - np.asarray(n), params, new_state.params)
    assert_trees_close(grads, ref_grads, GRAD_TOL)
    np.testing.assert_allclose(float(metrics["loss"]), ref_loss, rtol=1e-5, atol=1e-5)
    for key in ("tokens", "beta_comp_mean", "beta_stab_mean", "entropy_min", "entropy_max"):
        np.testing.assert_allclose(float(metrics[key]), ref_metrics[key], rtol=2e-5, err_msg=key)
    assert int(new_state.step) == 1


# Clip-Cov with a wide band and a 20% pick so its random detaching touches many tokens.
CLIP_COV = LossConfig.preset("clip_cov", clip_cov_ratio=0.2, clip_cov_lb=-1e3, clip_cov_ub=1e3)


@pytest.mark.parametrize(
    "mesh_shape,micro", [pytest.param((2, 2, 2), 1, marks=pytest.mark.slow), ((1, 1, 1), 2)]
)
def test_clip_cov_noise_drawn_on_device_does_not_depend_on_layout(setups, mesh_shape, micro):
    """Clip-Cov's per-token noise comes from the step's key (no batch field): the same update on
    one device, on a (2,2,2) mesh and with two micro-batches; and it does detach tokens (the
    loss differs from the plain surrogate's)."""
    ref_loss, ref_grads, _, ref_metrics, _, _ = run_step(
        setups, "tiny-qwen3", (1, 1, 1), loss_cfg=CLIP_COV
    )
    loss, grads, _, metrics, _, _ = run_step(
        setups, "tiny-qwen3", mesh_shape, micro_batches=micro, loss_cfg=CLIP_COV
    )
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert_trees_close(grads, ref_grads, GRAD_TOL)
    plain = LossConfig.preset("grpo")
    plain_loss = run_step(setups, "tiny-qwen3", (1, 1, 1), loss_cfg=plain)[0]
    assert abs(ref_loss - plain_loss) > 1e-4 * abs(plain_loss)


def test_non_finite_loss_skips_the_update(setups):
    cfg, params, batch = setups["tiny-qwen3"]
    *_, compiled, _ = run_step(setups, "tiny-qwen3", (1, 1, 1))
    opt = optax.sgd(1.0)
    state = train_state_from_params(params, opt, compiled.input_shardings[0][0])
    bad = dict(batch, advantages=np.where(np.arange(B) == 3, np.nan, batch["advantages"]))
    bad.pop("sequence_index")  # DynaMO draws no noise
    new_state, metrics = compiled(state, bad)
    assert float(metrics["update_skipped"]) == 1.0
    assert int(new_state.step) == 0
    assert_trees_close(new_state.params, params, 0.0)


def test_a_gradient_norm_past_float32_skips_the_update_though_each_gradient_is_finite(setups):
    cfg, params, batch = setups["tiny-qwen3"]
    *_, compiled, _ = run_step(setups, "tiny-qwen3", (1, 1, 1))
    state = train_state_from_params(params, optax.sgd(1.0), compiled.input_shardings[0][0])
    # advantages of 1e30: every gradient ~1e30 or less is a float32, their squares' sum is not
    huge = dict(batch, advantages=np.full_like(batch["advantages"], 1e30))
    huge.pop("sequence_index")
    new_state, metrics = compiled(state, huge)
    assert np.isinf(float(metrics["grad_norm"]))
    assert float(metrics["update_skipped"]) == 1.0
    assert int(new_state.step) == 0
    assert_trees_close(new_state.params, params, 0.0)


@pytest.mark.parametrize("finite", [True, False])
def test_the_conditional_update_has_the_bits_of_a_where_per_leaf(setups, finite):
    """Oracle: the update as it was, each leaf of params and of AdamW's moments kept by
    `jnp.where(finite, new, old)`."""
    _, params, _ = setups["tiny-qwen3"]
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.01))
    # moments that are not zero: one update's worth
    first = lambda p, o: opt.update(jax.tree.map(jnp.sin, p), o, p)[1]
    opt_state = jax.jit(first)(params, opt.init(params))
    state = TrainState(params=params, opt_state=opt_state, step=jnp.array(3, jnp.int32))
    grads = jax.tree.map(lambda p: jnp.cos(p * 7.0), params)

    def where_per_leaf(state, grads, finite):
        updates, opt_state = opt.update(grads, state.opt_state, state.params)
        new = optax.apply_updates(state.params, updates)
        keep = lambda n, o: jnp.where(finite, n, o)
        return TrainState(
            params=jax.tree.map(keep, new, state.params),
            opt_state=jax.tree.map(keep, opt_state, state.opt_state),
            step=state.step + finite.astype(state.step.dtype),
        )

    flag = jnp.array(finite)
    ours = jax.jit(lambda s, g, f: _apply_update(s, g, f, opt))(state, grads, flag)
    oracle = jax.jit(where_per_leaf)(state, grads, flag)
    leaves = lambda t: [np.asarray(x) for x in jax.tree.leaves(t)]
    assert all(np.array_equal(a, b) for a, b in zip(leaves(ours), leaves(oracle), strict=True))
    assert int(ours.step) == (4 if finite else 3)
    kept = all(np.array_equal(a, b) for a, b in zip(leaves(ours), leaves(state), strict=True))
    assert kept == (not finite)


def test_logprob_fn_matches_full_softmax(setups):
    cfg, params, batch = setups["tiny-qwen2"]
    mesh = sub_mesh((1, 2, 4))
    # Two strided micro-batches: the outputs must come back in the batch's row order.
    layout = RowLayout(row_len=L, packing=False, micro_rows=B // 2, max_sequences=B)
    fn = make_logprob_fn(cfg, mesh, DEFAULT_RULES, layout)
    logp, ent = fn(jax.device_put(params, model_param_shardings(cfg, mesh, DEFAULT_RULES)), batch)
    logits = forward(params, cfg, batch["tokens"], batch["positions"], batch["segment_ids"])
    logpi = np.asarray(jax.nn.log_softmax(logits / 0.7, axis=-1), np.float64)
    want_logp = np.take_along_axis(logpi[:, :-1], batch["tokens"][:, 1:, None], -1)[..., 0]
    want_ent = -(np.exp(logpi) * logpi).sum(-1)[:, :-1]
    # Only the trained tokens are scored; prompt and padding come back as exactly 0.
    scored = batch["loss_mask"][:, 1:] > 0
    assert scored.any() and (~scored).any()
    for got, want in ((logp, want_logp), (ent, want_ent)):
        got = np.asarray(got)[:, 1:]
        np.testing.assert_allclose(got[scored], want[scored], rtol=1e-5, atol=1e-5)
        assert np.all(got[~scored] == 0.0)
    assert np.all(np.asarray(logp)[:, 0] == 0.0)


def test_bad_batch_geometry_fails_before_compiling(setups):
    cfg, _, _ = setups["tiny-qwen2"]
    mesh = sub_mesh((2, 2, 2))
    opt = optax.sgd(1.0)
    with pytest.raises(ValueError, match="micro_batches must be >= 1 and divide batch_size 8"):
        make_train_step(cfg, LOSS_CFG, opt, mesh, DEFAULT_RULES, batch_size=8, micro_batches=3)
    with pytest.raises(ValueError, match="batch size 2 does not divide over the act_batch"):
        make_train_step(cfg, LOSS_CFG, opt, mesh, DEFAULT_RULES, batch_size=8, micro_batches=4)


# ----------------------------------------------------------------------------- packing


def _layout_step(cfg, params, rollouts, layout, loss_cfg, mesh_shape):
    """(metrics, grads, placement) of one update on `rollouts` laid out by `layout`."""
    mesh = sub_mesh(mesh_shape)
    opt = grad_recorder()
    step, state_sh, batch_sh = make_train_step(
        cfg,
        loss_cfg,
        opt,
        mesh,
        DEFAULT_RULES,
        batch_size=layout.max_rows,
        micro_batches=layout.max_micro_batches,
    )
    rows, placement = assemble.lay_out(rollouts, np.arange(N_SEQ), layout, tuple(batch_sh))
    state = train_state_from_params(params, opt, state_sh)
    new_state, metrics = step.lower(state, rows).compile(FAST_COMPILE)(state, rows)
    grads = jax.tree.map(np.asarray, new_state.opt_state)
    return {k: float(v) for k, v in metrics.items()}, grads, placement


PACKING_CASES = [
    ("dynamo", (1, 1, 1), LossConfig()),
    ("dynamo-seq-mean", (1, 1, 1),
     LossConfig(entropy_change="sequence_mean", loss_agg_mode="seq-mean-token-mean")),
    ("kl_cov-token-sum-norm", (1, 1, 1), LossConfig.preset(
        "kl_cov", kl_cov_ratio=0.1, loss_agg_mode="seq-mean-token-sum-norm", max_len_norm=16)),
    ("dynamo-seq-mean", (2, 2, 2),
     LossConfig(entropy_change="sequence_mean", loss_agg_mode="seq-mean-token-mean")),
    ("clip_cov", (2, 2, 2), CLIP_COV),
    # prompt ids 0..3 in groups of 4, row 5 empty: group 1 has n = 3, the others 4
    ("dynamo-prompt-mean", (1, 1, 1), LossConfig(loss_agg_mode="prompt-mean")),
    ("dynamo-prompt-mean", (2, 2, 2), LossConfig(loss_agg_mode="prompt-mean")),
]  # fmt: skip


@pytest.mark.parametrize(
    "label,mesh_shape,loss_cfg",
    # The fast tier keeps the mesh case with per-segment reductions; the rest run in the slow tier.
    [
        c
        if c[0] == "dynamo-seq-mean" and c[1] == (2, 2, 2)
        else pytest.param(*c, marks=pytest.mark.slow)
        for c in PACKING_CASES
    ],
    ids=[f"{c[0]}-{'x'.join(map(str, c[1]))}" for c in PACKING_CASES],
)
def test_packed_step_equals_padded_step(setups, label, mesh_shape, loss_cfg):
    """Same loss, metrics and update (≤ 1e-5 relative) whether the sequences sit one per padded
    row in one micro-batch or packed several per row in token-budget micro-batches. The other
    baselines and aggregation modes differ from these only in the loss, whose layout
    invariance tests/test_losses_policy.py checks for every one of them, and the model's
    per-token outputs and backward pass are checked for any cotangent below."""
    cfg, params, _ = setups["tiny-qwen3"]
    rollouts, _, _ = make_rollouts(cfg, params)
    ref_m, ref_g, ref_placement = _layout_step(cfg, params, rollouts, PADDED, loss_cfg, mesh_shape)
    m, g, placement = _layout_step(cfg, params, rollouts, PACKED, loss_cfg, mesh_shape)
    # The packed layout is what it claims: rows shared by sequences, a skipped micro-batch.
    filled = len(np.unique(placement.row_S[placement.row_S >= 0]))
    # 15 sequences in 9-12 rows (3 micro-batches of 4), bucketed up to 4 micro-batches.
    assert placement.micro_batches == 4 and 8 < filled <= 12 and placement.rows == 16
    assert ref_placement.micro_batches == 1 and ref_placement.rows == N_SEQ
    assert ref_m["sequences"] == m["sequences"] == N_SEQ - 1
    assert set(m) == set(ref_m)
    for key, value in ref_m.items():
        np.testing.assert_allclose(m[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    assert abs(ref_m["loss"]) > 1e-3 and ref_m["grad_norm"] > 0
    assert_trees_close(g, ref_g, 1e-5)


def test_prompt_mean_micro_batches_on_a_mesh_give_the_one_batch_update(setups):
    """prompt-mean's 1/n_i is counted over the whole mini-batch: padded rows split into
    micro-batches on (2,2,2) give the single-device one-micro-batch update."""
    cfg, params, _ = setups["tiny-qwen3"]
    rollouts, _, _ = make_rollouts(cfg, params)
    prompt_mean = LossConfig(loss_agg_mode="prompt-mean")
    split = dataclasses.replace(PADDED, micro_rows=4)
    ref_m, ref_g, ref_placement = _layout_step(
        cfg, params, rollouts, PADDED, prompt_mean, (1, 1, 1)
    )
    m, g, placement = _layout_step(cfg, params, rollouts, split, prompt_mean, (2, 2, 2))
    assert ref_placement.micro_batches == 1 and placement.micro_batches >= 2
    for key, value in ref_m.items():
        np.testing.assert_allclose(m[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    assert_trees_close(g, ref_g, 1e-5)
    # The weights matter in this batch (groups of 4 and 3): token-mean's loss is another number.
    token_mean, _, _ = _layout_step(cfg, params, rollouts, PADDED, LossConfig(), (1, 1, 1))
    assert abs(token_mean["loss"] - ref_m["loss"]) > 1e-3 * abs(ref_m["loss"])


def test_packed_forward_and_backward_equal_padded(setups):
    """Per token, log π, H and K of a packed batch equal the padded batch's, and the parameter
    gradient of Σ_t c_t log π_t + d_t H_t (random per-token cotangents, mapped with the tokens)
    is the same: any loss's gradient is such a vector-Jacobian product of these outputs."""
    cfg, params, _ = setups["tiny-qwen2"]
    rollouts, want_logp, want_ent = make_rollouts(cfg, params)
    mesh = sub_mesh((1, 1, 1))
    rules = activation_rules(DEFAULT_RULES, mesh, cfg)
    rng = np.random.default_rng(7)
    cot = rng.normal(size=(2, N_SEQ, MAX_LEN)).astype(np.float32)
    fields = ("tokens", "positions", "segment_ids", "loss_mask", "temperature")
    out = {}
    for name, layout in (("padded", PADDED), ("packed", PACKED)):
        rows, placement = assemble.lay_out(rollouts, np.arange(N_SEQ), layout, fields)
        c, d = placement.scatter(cot[0]), placement.scatter(cot[1])

        def f(p, rows=rows, c=c, d=d):
            logp, ent, k = token_stats(
                p, rows, model_cfg=cfg, mesh=mesh, rules=rules, return_k=True
            )
            return jnp.sum(c * logp + d * ent), (logp, ent, k)

        fn = jax.jit(jax.value_and_grad(f, has_aux=True))
        (_, per_token), grads = fn.lower(params).compile(FAST_COMPILE)(params)
        back = [placement.gather(np.asarray(x), MAX_LEN) for x in per_token]
        out[name] = (back, grads)
    scored = rollouts.loss_mask > 0
    (logp, ent, k), grads = out["packed"]
    (ref_logp, ref_ent, ref_k), ref_grads = out["padded"]
    np.testing.assert_allclose(ref_logp[scored], want_logp[scored], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ref_ent[scored], want_ent[scored], rtol=1e-5, atol=1e-5)
    for got, ref in ((logp, ref_logp), (ent, ref_ent), (k, ref_k)):
        np.testing.assert_allclose(got[scored], ref[scored], rtol=1e-5, atol=1e-6)
        assert np.all(got[~scored] == 0.0)
    assert np.abs(ref_k[scored]).max() > 1e-3
    assert_trees_close(grads, ref_grads, 1e-5)


def test_old_logprobs_stage_packs_and_unpacks(setups):
    """The loop's old-log-prob stage with packed rows in micro-batches (a skipped one included)
    on a (1, 2, 4) mesh returns, per rollout row, the full-softmax log π and H of the policy."""
    cfg, params, _ = setups["tiny-qwen3"]
    rollouts, want_logp, want_ent = make_rollouts(cfg, params)
    mesh = sub_mesh((1, 2, 4))
    logprob = make_logprob_fn(cfg, mesh, DEFAULT_RULES, PACKED)
    placed = jax.device_put(params, model_param_shardings(cfg, mesh, DEFAULT_RULES))
    batch = dataclasses.replace(rollouts, old_logp=None)
    rows = assemble.device_rows(batch, np.arange(N_SEQ), logprob.layout, logprob.batch_shardings)
    got = behaviour_pass.old_logprobs(batch, rows, logprob, placed, None)
    scored = rollouts.loss_mask > 0
    for x, want in ((got.old_logp, want_logp), (got.entropy, want_ent)):
        assert x.shape == (N_SEQ, MAX_LEN)
        np.testing.assert_allclose(x[scored], want[scored], rtol=1e-5, atol=1e-5)
        assert np.all(x[~scored] == 0.0)
    assert got.ref_logp is None


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_rollout_is_weights_scale_each_tokens_policy_gradient(setups, micro_batches):
    """The step reads `rollout_is_weight` (rollout correction, is_weights=True): a weight of 2
    on every token doubles the DynaMO loss and its gradient (the modulation does not see it)."""
    cfg, params, batch = setups["tiny-qwen2"]
    ref_loss, ref_grads, _, _, _, _ = run_step(setups, "tiny-qwen2", (1, 1, 1))
    opt = optax.sgd(1.0)
    step, state_sh, batch_sh = make_train_step(
        cfg, LOSS_CFG, opt, sub_mesh((1, 1, 1)), DEFAULT_RULES, batch_size=B,
        micro_batches=micro_batches, is_weights=True,
    )  # fmt: skip
    assert "rollout_is_weight" in batch_sh
    weighted = {**batch, "rollout_is_weight": 2.0 * batch["loss_mask"]}
    weighted = {k: weighted[k] for k in batch_sh}
    state = train_state_from_params(params, opt, state_sh)
    new_state, metrics = step.lower(state, weighted).compile(FAST_COMPILE)(state, weighted)
    grads = jax.tree.map(lambda p, n: p - np.asarray(n), params, new_state.params)
    np.testing.assert_allclose(float(metrics["loss"]), 2.0 * ref_loss, rtol=1e-5, atol=1e-5)
    assert_trees_close(grads, jax.tree.map(lambda g: 2.0 * g, ref_grads), GRAD_TOL)
