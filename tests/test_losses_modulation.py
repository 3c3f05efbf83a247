"""DynaMO modulation: property tests of β_comp and β_stab, α = 0 is exactly GRPO, and Â vs
the float64 reference for both ΔH modes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_losses as ref
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamo_jax.losses import (
    LossConfig,
    TokenBatch,
    beta_comp,
    beta_stab,
    build_loss_fn,
    entropy_change_abs,
    minibatch_stats,
    modulate,
)

finite = dict(allow_nan=False, allow_infinity=False)
arrays = st.lists(st.floats(-5, 5, **finite), min_size=1, max_size=24)


@jax.jit
def _beta_comp(adv, ent, alpha_c):
    return beta_comp(adv, ent, jnp.min(ent), jnp.max(ent), alpha_c)


@settings(deadline=None, max_examples=60)
@given(arrays, st.floats(0.0, 2.0, **finite), st.integers(0, 2**31 - 1))
def test_beta_comp_in_range_and_one_for_nonpositive_advantages(adv, alpha_c, seed):
    adv = jnp.asarray(adv, jnp.float32)
    ent = jnp.asarray(np.random.default_rng(seed).uniform(0, 4, adv.shape), jnp.float32)
    b = np.asarray(_beta_comp(adv, ent, alpha_c))
    assert np.all(b >= 1.0 - 1e-6) and np.all(b <= 1.0 + alpha_c + 1e-6)
    assert np.all(b[np.asarray(adv) <= 0] == 1.0)


@jax.jit
def _beta_stab(xi, alpha_s, gamma, tau):
    return beta_stab(xi, jnp.max(xi), alpha_s, gamma, tau)


@settings(deadline=None, max_examples=60)
@given(
    st.lists(st.floats(0, 1e3, **finite), min_size=1, max_size=24),
    st.floats(0.0, 1.0, **finite),
    st.floats(0.0, 200.0, **finite),
    st.floats(-1.0, 2.0, **finite),
)
def test_beta_stab_between_lambda_min_and_one(xi, alpha_s, gamma, tau):
    b = np.asarray(_beta_stab(jnp.asarray(xi, jnp.float32), alpha_s, gamma, tau))
    lam_min = 1.0 - alpha_s
    assert np.all(b >= lam_min - 1e-6) and np.all(b <= 1.0 + 1e-6)


def _to_batch(inp):
    f = lambda k: None if inp.get(k) is None else jnp.asarray(inp[k], jnp.float32)
    return TokenBatch(
        f("logp"), f("old_logp"), f("ent"), f("adv"), jnp.asarray(inp["mask"]), f("k")
    )


@jax.jit(static_argnums=1)
def _loss_and_grad(batch, cfg):
    def f(lp):
        b = batch._replace(logp=lp)
        return build_loss_fn(cfg)(b, minibatch_stats(b, cfg))[0]

    return jax.value_and_grad(f)(batch.logp)


@settings(deadline=None, max_examples=15)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["exact", "sequence_mean"]))
def test_alpha_zero_is_exactly_grpo(seed, mode):
    inp = ref.random_token_inputs(np.random.default_rng(seed), B=6, L=8)
    batch = _to_batch(inp)
    dyn = LossConfig.preset("dynamo", alpha=0.0, entropy_change=mode)
    grpo = LossConfig.preset("grpo", clip_high=dyn.clip_high, dual_clip=dyn.dual_clip)
    l_d, g_d = _loss_and_grad(batch, dyn)
    l_g, g_g = _loss_and_grad(batch, grpo)
    assert float(l_d) == float(l_g)
    assert np.array_equal(np.asarray(g_d), np.asarray(g_g))


@pytest.mark.parametrize("mode", ["exact", "sequence_mean"])
def test_modulated_advantages_match_reference(mode):
    inp = ref.random_token_inputs(np.random.default_rng(21), B=10, L=12, ratio_noise=0.15)
    cfg = LossConfig.preset(
        "dynamo", entropy_change=mode, alpha_comp=0.2, alpha_stab=0.4, ums_tau=0.5
    )
    batch = _to_batch(inp)
    stats = minibatch_stats(batch, cfg)
    ahat, b_c, b_s = modulate(batch, stats.h_min, stats.h_max, stats.xi_max, cfg)
    m = inp["mask"]
    a_ref, bc_ref, bs_ref = ref.dynamo_modulation(
        inp["logp"], inp["old_logp"], inp["ent"], inp["adv"], m, inp["k"], cfg
    )
    np.testing.assert_allclose(np.asarray(ahat)[m], a_ref[m], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(b_c)[m], bc_ref[m], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(b_s)[m], bs_ref[m], rtol=1e-5)
    # the statistics really bite: some tokens compensated, some damped
    assert (bc_ref[m] > 1.01).any() and (bs_ref[m] < 0.9).any()


def test_exact_needs_k_and_modulation_adds_no_gradient_path():
    inp = ref.random_token_inputs(np.random.default_rng(2), with_k=False)
    batch = _to_batch(inp)
    with pytest.raises(ValueError, match="needs TokenBatch.k"):
        entropy_change_abs(batch, LossConfig.preset("dynamo"))
    cfg = LossConfig.preset("dynamo", entropy_change="sequence_mean")
    stats = minibatch_stats(batch, cfg)
    g = jax.grad(
        lambda lp, ent: jnp.sum(
            modulate(batch._replace(logp=lp, ent=ent), stats.h_min, stats.h_max, stats.xi_max, cfg)[
                0
            ]
        ),
        argnums=(0, 1),
    )(batch.logp, batch.ent)
    assert all(np.all(np.asarray(x) == 0) for x in g)


def test_ablation_switches_turn_each_mechanism_off():
    inp = ref.random_token_inputs(np.random.default_rng(5), B=8, L=10)
    batch = _to_batch(inp)
    base = LossConfig.preset("dynamo")
    for field, idx in (("enable_gc", 1), ("enable_ums", 2)):
        cfg = dataclasses.replace(base, **{field: False})
        stats = minibatch_stats(batch, cfg)
        out = modulate(batch, stats.h_min, stats.h_max, stats.xi_max, cfg)
        assert np.all(np.asarray(out[idx]) == 1.0)
        assert not np.all(np.asarray(out[3 - idx])[inp["mask"]] == 1.0)
