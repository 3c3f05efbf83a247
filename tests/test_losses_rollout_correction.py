"""Rollout correction (losses/rollout_correction.py) against the float64 reference, the identity
when the engine's log-probs are the trainer's exactly, and the weighted loss of every variant."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_losses as ref

from dynamo_jax.losses import BASELINES, LossConfig, TokenBatch, build_loss_fn, minibatch_stats
from dynamo_jax.losses.rollout_correction import IS_LEVELS, RS_LEVELS, RolloutCorrection, correct

correct_jit = jax.jit(correct, static_argnames=("cfg",))


def engine_inputs(seed=0, B=8, L=11, noise=0.4):
    """Loss inputs and engine log-probs off the trainer's π_old by N(0, noise) per token (some
    tokens and sequences then fall outside [1/2, 2], some inside)."""
    rng = np.random.default_rng(seed)
    inp = ref.random_token_inputs(rng, B=B, L=L)
    inp["engine_logp"] = inp["old_logp"] + rng.normal(0.0, noise, size=(B, L))
    return inp


@pytest.mark.parametrize(
    "is_level,rs_level", list(itertools.product(IS_LEVELS, RS_LEVELS))[1:], ids=str
)
def test_correction_matches_reference(is_level, rs_level):
    inp = engine_inputs()
    cfg = RolloutCorrection(is_level=is_level, rs_level=rs_level, is_threshold=1.5,
                            rs_upper=1.3, rs_lower=0.85)  # fmt: skip
    out = correct_jit(inp["old_logp"], inp["engine_logp"], inp["mask"], cfg=cfg)
    weight, keep, metrics = ref.rollout_correction(
        inp["old_logp"], inp["engine_logp"], inp["mask"], cfg
    )
    np.testing.assert_allclose(np.asarray(out.is_weight)[inp["mask"]], weight[inp["mask"]],
                               rtol=1e-5)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(out.mask) > 0, keep)
    assert set(out.metrics) == set(metrics)
    for name, value in metrics.items():
        np.testing.assert_allclose(
            float(out.metrics[name]), value, rtol=1e-5, atol=1e-7, err_msg=name
        )
    if rs_level != "none":  # the check would be vacuous if nothing (or everything) were rejected
        assert 0 < metrics["rs_masked_frac"] < 1
    if is_level != "none":
        assert 0 < metrics["is_truncated_frac"] < 1


def test_truncation_and_rejection_on_exact_numbers():
    # One sequence of two tokens: ρ = 3 and ρ = 1/2 (log-ratios exact in float32 up to rounding).
    old = np.log(np.array([[3.0, 0.5, 1.0]], np.float32))
    engine = np.zeros_like(old)
    mask = np.array([[1, 1, 0]], np.float32)
    token = correct(old, engine, mask, RolloutCorrection("token", 2.0, "token", 2.0))
    np.testing.assert_allclose(np.asarray(token.is_weight), [[2.0, 0.5, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(token.mask), [[0, 1, 0]])  # 3 > 2 rejected
    np.testing.assert_allclose(float(token.metrics["is_weight_max"]), 3.0, rtol=1e-6)
    assert float(token.metrics["is_truncated_frac"]) == 0.5
    # The sequence's ratio is 3 · 1/2 = 1.5: one weight 1.5 on both tokens, inside [1/2, 2].
    seq = correct(old, engine, mask, RolloutCorrection("sequence", 2.0, "sequence", 2.0))
    np.testing.assert_allclose(np.asarray(seq.is_weight), [[1.5, 1.5, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(seq.mask), [[1, 1, 0]])
    # Geometric mean sqrt(1.5) ≈ 1.22 lies outside [0.9, 1.2]: the whole sequence goes.
    geo = correct(old, engine, mask, RolloutCorrection("none", 2.0, "geometric", 1.2, 0.9))
    np.testing.assert_array_equal(np.asarray(geo.mask), [[0, 0, 0]])
    assert float(geo.metrics["rs_seq_masked_frac"]) == 1.0


@pytest.mark.parametrize("is_level,rs_level", [("token", "token"), ("sequence", "geometric")])
def test_identity_when_engine_equals_trainer(is_level, rs_level):
    inp = engine_inputs()
    cfg = RolloutCorrection(is_level=is_level, rs_level=rs_level, rs_upper=1.001)
    out = correct_jit(inp["old_logp"], inp["old_logp"], inp["mask"], cfg=cfg)
    np.testing.assert_array_equal(np.asarray(out.is_weight), inp["mask"].astype(np.float32))
    np.testing.assert_array_equal(np.asarray(out.mask), inp["mask"].astype(np.float32))
    assert float(out.metrics["kl"]) == 0.0 and float(out.metrics["k3_kl"]) == 0.0
    assert float(out.metrics["rs_masked_frac"]) == 0.0


def to_batch(inp, is_weight=None) -> TokenBatch:
    f = lambda k: None if inp.get(k) is None else jnp.asarray(inp[k], jnp.float32)
    return TokenBatch(
        logp=f("logp"), old_logp=f("old_logp"), ent=f("ent"), adv=f("adv"),
        mask=jnp.asarray(inp["mask"]), k=f("k"), ref_logp=f("ref_logp"), noise=f("noise"),
        seq_weight=f("seq_weight"), is_weight=is_weight,
    )  # fmt: skip


@jax.jit(static_argnums=1)
def loss_and_grad(batch, cfg):
    def loss(logp):
        b = batch._replace(logp=logp)
        return build_loss_fn(cfg)(b, minibatch_stats(b, cfg))[0]

    return jax.value_and_grad(loss)(batch.logp)


def variant_cfg(baseline):
    extra = {f"{baseline}_ratio": 0.1} if baseline in ("clip_cov", "kl_cov") else {}
    return LossConfig.preset(baseline, **extra)


@pytest.mark.parametrize("baseline", BASELINES)
def test_weighted_loss_matches_reference_for_every_variant(baseline):
    inp = engine_inputs(seed=1)
    cfg = variant_cfg(baseline)
    corr = RolloutCorrection(is_level="token", is_threshold=1.5)
    weight = correct_jit(inp["old_logp"], inp["engine_logp"], inp["mask"], cfg=corr).is_weight
    loss, _ = loss_and_grad(to_batch(inp, weight), cfg)
    expected, _ = ref.policy_loss({**inp, "is_weight": np.asarray(weight)}, cfg)
    unweighted, _ = ref.policy_loss(inp, cfg)
    assert abs(expected - unweighted) > 1e-4 * abs(unweighted)  # the weights matter here
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("baseline", BASELINES)
def test_weights_of_one_leave_loss_and_gradient_unchanged(baseline):
    """Engine = trainer exactly: the corrected update is the uncorrected one."""
    inp = engine_inputs(seed=2)
    cfg = variant_cfg(baseline)
    corr = RolloutCorrection(is_level="sequence", rs_level="token")
    out = correct_jit(inp["old_logp"], inp["old_logp"], inp["mask"], cfg=corr)
    masked = {**inp, "mask": np.asarray(out.mask) > 0}
    loss_w, grad_w = loss_and_grad(to_batch(masked, out.is_weight), cfg)
    loss, grad = loss_and_grad(to_batch(inp), cfg)
    # Multiplying by exactly 1 may still let XLA fuse the sums another way: float32 rounding.
    np.testing.assert_allclose(float(loss_w), float(loss), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad_w), np.asarray(grad), rtol=1e-6, atol=1e-9)


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="train.rollout_is must be one of"):
        RolloutCorrection(is_level="tis")
    with pytest.raises(ValueError, match="train.rollout_is_threshold"):
        RolloutCorrection(is_level="token", is_threshold=0.0)
    with pytest.raises(ValueError, match="train.rollout_rs_threshold_lower"):
        RolloutCorrection(rs_level="token", rs_upper=2.0, rs_lower=3.0)
    assert dataclasses.replace(RolloutCorrection(), rs_upper=4.0).lower == 0.25
