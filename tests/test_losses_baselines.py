"""Token-level pieces of the Table 1 baselines against their published formulas."""

import jax.numpy as jnp
import numpy as np

from dynamo_jax.losses.baselines import clipped_by_ppo, entropy_adv_advantage, token_covariance


def test_entropy_advantage_formula_and_sign_preservation():
    adv = jnp.asarray([1.0, -1.0, 0.0, 0.2, -0.3])
    ent = jnp.asarray([0.5, 4.0, 2.0, 3.0, 0.1])
    got = np.asarray(entropy_adv_advantage(adv, ent, 0.4, 2.0))
    want = np.asarray(adv) + np.minimum(0.4 * np.asarray(ent), np.abs(np.asarray(adv)) / 2.0)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.all(np.sign(got[[0, 1, 3, 4]]) == np.sign(np.asarray(adv)[[0, 1, 3, 4]]))
    assert got[2] == 0.0  # A = 0 stays 0


def test_ppo_clipping_indicator_and_covariance():
    adv = jnp.asarray([1.0, 1.0, -1.0, -1.0, 1.0])
    r = jnp.asarray([1.5, 1.1, 0.5, 0.9, 0.5])
    np.testing.assert_array_equal(
        clipped_by_ppo(adv, r, 0.2, 0.28), [True, False, True, False, False]
    )
    cov = token_covariance(jnp.asarray([-1.0, -3.0]), jnp.asarray([2.0, -2.0]), -2.0, 0.0)
    np.testing.assert_allclose(cov, [2.0, 2.0])


# ----------------------------------------------------------------------------- KL-Cov as verl


def _kl_cov_grad(logp, old, adv, noise, ratio):
    """(loss, ∂loss/∂log π) of KL-Cov (β = 1, token-mean) on one-token responses."""
    import jax

    from dynamo_jax.losses import LossConfig, TokenBatch, build_loss_fn, minibatch_stats

    cfg = LossConfig.preset("kl_cov", kl_cov_ratio=ratio, kl_cov_coef=1.0)
    col = lambda x: jnp.asarray(x, jnp.float32)[:, None]

    def loss(lp):
        tb = TokenBatch(lp, col(old), col(np.zeros(len(old))), col(adv),
                        jnp.ones((len(old), 1), bool), noise=col(noise))  # fmt: skip
        return build_loss_fn(cfg)(tb, minibatch_stats(tb, cfg))[0]

    value, grad = jax.value_and_grad(loss)(col(logp))
    return float(value), np.asarray(grad)[:, 0]


def test_kl_cov_gradient_at_a_zero_log_ratio_is_verls():
    """The issue's example: log π = log π_old = [−0.5, −3, −1], A = [1, −1, −1], ratio 0.34.

    k = max(⌊0.34 · 3⌋, 1) = 1. mean A = −1/3, mean log π = −1.5, so the covariances are
    (4/3)(1) = 4/3, (−2/3)(−1.5) = 1, (−2/3)(0.5) = −1/3: token 0 is penalised with
    β|log r| = 0. The loss is mean(−A·r) = −(1 − 1 − 1)/3 = 1/3, and ∂/∂log π of −A·r/3 is
    −A/3 = [−1/3, 1/3, 1/3]. torch's |x|' at 0 is 0 (verl); JAX's is +1, which added +β/N = 1/3
    to token 0.
    """
    logp = [-0.5, -3.0, -1.0]
    value, grad = _kl_cov_grad(logp, logp, [1.0, -1.0, -1.0], [0.1, 0.2, 0.3], 0.34)
    np.testing.assert_allclose(value, 1.0 / 3.0, rtol=1e-6)
    np.testing.assert_allclose(grad, [-1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0], rtol=1e-6)


def test_kl_cov_penalises_exactly_k_tokens_when_covariances_tie():
    """Equal log π: every covariance is 0, a three-way tie at the cut. k = 1, so exactly one
    token (the smallest noise: token 2) gets β|log r|; the old code (cov ≥ cut) took all three.

    log r = log π − log π_old = [0.1, 0.2, 0.4] (old = −1 − log r); r = e^{log r};
    loss = (Σ −A r + |log r_2|) / 3 with A = [1, −1, 1]."""
    logp = np.full(3, -1.0)
    log_r = np.array([0.1, 0.2, 0.4])
    adv = np.array([1.0, -1.0, 1.0])
    value, grad = _kl_cov_grad(logp, logp - log_r, adv, [0.7, 0.5, 0.2], 0.34)
    r = np.exp(log_r)
    want = (np.sum(-adv * r) + log_r[2]) / 3.0
    np.testing.assert_allclose(value, want, rtol=1e-6)
    # ∂/∂log π: −A r / 3 everywhere, + sign(log r_2) / 3 on the one penalised token.
    np.testing.assert_allclose(grad, (-adv * r + np.array([0.0, 0.0, 1.0])) / 3.0, rtol=1e-6)
    # Another noise draw picks another one of the tied tokens, still exactly one.
    value1, _ = _kl_cov_grad(logp, logp - log_r, adv, [0.1, 0.5, 0.9], 0.34)
    np.testing.assert_allclose(value1, (np.sum(-adv * r) + log_r[0]) / 3.0, rtol=1e-6)
