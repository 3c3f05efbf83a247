"""minibatch_stats: counts, entropy range, max Ξ and baseline thresholds vs NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import reference_losses as ref

from dynamo_jax.losses import LossConfig, TokenBatch, entropy_change_abs, minibatch_stats

_stats = jax.jit(minibatch_stats, static_argnums=1)


def _batch(inp):
    f = lambda k: jnp.asarray(inp[k], jnp.float32)
    return TokenBatch(f("logp"), f("old_logp"), f("ent"), f("adv"), jnp.asarray(inp["mask"]),
                      f("k"), f("ref_logp"), f("noise"))  # fmt: skip


def test_counts_entropy_range_and_xi_max():
    inp = ref.random_token_inputs(np.random.default_rng(8), B=7, L=9)
    m = inp["mask"]
    cfg = LossConfig.preset("dynamo")
    s = _stats(_batch(inp), cfg)
    assert float(s.n_tokens) == m.sum()
    assert float(s.n_seqs) == m.any(-1).sum() == 6  # the empty response does not count
    np.testing.assert_allclose(
        [s.h_min, s.h_max], [inp["ent"][m].min(), inp["ent"][m].max()], rtol=1e-6
    )
    xi = np.asarray(entropy_change_abs(_batch(inp), cfg))
    np.testing.assert_allclose(float(s.xi_max), xi[m].max(), rtol=1e-6)
    assert xi[m].max() > 0
    assert np.all(xi[~m] == 0)


def test_baseline_thresholds():
    inp = ref.random_token_inputs(np.random.default_rng(9), B=8, L=10)
    m = inp["mask"]
    fork = _stats(_batch(inp), LossConfig.preset("fork_tokens"))
    np.testing.assert_allclose(fork.threshold, np.quantile(inp["ent"][m], 0.8), rtol=1e-6)
    assert abs(np.mean(inp["ent"][m] >= float(fork.threshold)) - 0.2) < 0.05
    kl = _stats(_batch(inp), LossConfig.preset("kl_cov", kl_cov_ratio=0.1))
    cov = (inp["adv"] - inp["adv"][m].mean()) * (inp["logp"] - inp["logp"][m].mean())
    k_num = max(int(0.1 * m.sum()), 1)
    np.testing.assert_allclose(kl.threshold, np.sort(cov[m])[::-1][k_num - 1], rtol=1e-5)
    np.testing.assert_allclose([kl.logp_mean, kl.adv_mean], [inp["logp"][m].mean(), inp["adv"][m].mean()],
                               rtol=1e-5, atol=1e-7)  # fmt: skip


def test_empty_minibatch_is_all_zero_and_finite():
    inp = ref.random_token_inputs(np.random.default_rng(1))
    inp["mask"] = np.zeros_like(inp["mask"])
    for name in ("dynamo", "fork_tokens", "clip_cov", "kl_cov"):
        s = _stats(_batch(inp), LossConfig.preset(name))
        assert float(s.n_tokens) == float(s.n_seqs) == 0.0
        # the cuts ("threshold", "tie_cut") may be ±inf there: no token passes them
        means = [v for k, v in s.own.items() if k not in ("threshold", "tie_cut")]
        assert all(np.isfinite(float(x)) for x in [*s[:3], *means])
