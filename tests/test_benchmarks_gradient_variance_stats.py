"""The statistics of benchmarks/gradient_variance.py (gradient_variance_stats.py).

Oracles: hand-worked numbers (arithmetic in the comments) and float64 NumPy computed directly
on the draws.
"""

import numpy as np
import pytest

from benchmarks import gradient_variance_stats as gv


def test_total_variance_hand_worked_and_against_direct_float64():
    # Draws (0,0), (2,0), (1,3): mean (1,1); deviations (-1,-1), (1,-1), (0,2) with squared
    # norms 2, 2, 4; unbiased total variance 8 / (3 - 1) = 4.
    g = np.asarray([[0.0, 0.0], [2.0, 0.0], [1.0, 3.0]])
    assert gv.total_variance(g @ g.T) == pytest.approx(4.0, rel=1e-12)
    rng = np.random.default_rng(0)
    g = rng.normal(size=(30, 50)) * rng.uniform(0.1, 3.0, 50) + 5.0
    direct = np.var(g, axis=0, ddof=1).sum()
    assert gv.total_variance(g @ g.T) == pytest.approx(direct, rel=1e-10)


def test_bootstrap_variances_are_the_variances_of_the_resampled_draws():
    rng = np.random.default_rng(1)
    g = rng.normal(size=(12, 7))
    boot = gv.bootstrap_variances(g @ g.T, 5, np.random.default_rng(7))
    counts = np.random.default_rng(7).multinomial(12, np.full(12, 1 / 12), size=5)
    for value, w in zip(boot, counts):
        resampled = np.repeat(g, w, axis=0)
        assert value == pytest.approx(np.var(resampled, axis=0, ddof=1).sum(), rel=1e-10)


def test_appendix_c_and_the_two_models_of_an_allocation():
    # sigma = [1, 1, 2, 0]: (sum sigma)^2 / (N sum sigma^2) = 16 / (4 * 6) = 2/3.
    assert gv.appendix_c_optimum(np.asarray([1.0, 1.0, 2.0, 0.0])) == pytest.approx(2 / 3)
    sigma2, n = np.asarray([1.0, 4.0]), np.asarray([4, 12])
    # Prompt-mean model: (1/4 + 4/12) / ((1 + 4) / 8) = 0.583333 / 0.625 = 0.933333.
    assert gv.prompt_mean_ratio(sigma2, n, 8) == pytest.approx(0.58333333 / 0.625)
    # Token-mean model: (4*1 + 12*4) / (8 * (1 + 4)) = 52 / 40 = 1.3.
    assert gv.token_mean_ratio(sigma2, n, 8) == pytest.approx(1.3)
    # A prompt with sigma = 0 adds nothing to either (and no 0 / n_i term).
    sigma2, n = np.asarray([1.0, 0.0]), np.asarray([8, 8])
    assert gv.prompt_mean_ratio(sigma2, n, 8) == pytest.approx(1.0)
    # p = 1/2, n = 2: P(mixed) = 1 - 1/4 - 1/4 = 1/2; p = 0 or 1: never mixed.
    assert gv.mixed_group_probability(np.asarray([0.5, 0.0, 1.0]), 2) == pytest.approx(
        [0.5, 0.0, 0.0]
    )


def test_predicted_ratio_interval_brackets_the_prediction_and_is_the_resampled_sigmas():
    """Appendix C's predicted ratio recomputed on per-prompt bootstrap resamples of sigma_i's
    draws: with one prompt's sigma the ratio is n_avg / n_i whatever the resample, and on
    random draws the interval holds the point prediction."""
    rng = np.random.default_rng(2)
    one = rng.normal(size=(10, 4))
    m = {"n_avg": 8, "sigma_grams": [one @ one.T]}
    lo, hi = gv.predicted_ratio_interval(m, np.asarray([4]), 50, np.random.default_rng(0))
    assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)
    draws = [rng.normal(size=(40, 6)) * s for s in (0.5, 1.0, 3.0)]
    m = {"n_avg": 8, "sigma_grams": [g @ g.T for g in draws]}
    sigma2 = np.asarray([8 * gv.total_variance(g) for g in m["sigma_grams"]])
    n = np.asarray([4, 8, 12])
    point = gv.prompt_mean_ratio(sigma2, n, 8)
    lo, hi = gv.predicted_ratio_interval(m, n, 400, np.random.default_rng(1))
    assert lo < point < hi and hi - lo > 1e-3


def test_draw_stats_cosine_and_bias_hand_worked():
    # Draws (1,0), (0,1) against g_ref (1,0): cos^2 = 1 and 0, mean 1/2. Mean (1/2, 1/2),
    # ||mean - g_ref||^2 = 1/4 + 1/4 = 1/2; variance (1/2 + 1/2) / 1 = 1, over D = 2 is 1/2;
    # bias^2 = (1/2 - 1/2 - 0) / ||g_ref||^2 = 0, and with Var(g_ref) = 0.1 it is -0.1.
    g_ref = np.asarray([1.0, 0.0])
    stats = gv.DrawStats.of(np.asarray([[1.0, 0.0], [0.0, 1.0]], np.float32), g_ref)
    assert stats.variance == pytest.approx(1.0)
    assert stats.mean_cos2(g_ref) == pytest.approx(0.5)
    assert stats.relative_bias2(g_ref, 0.0) == pytest.approx(0.0, abs=1e-12)
    assert stats.relative_bias2(g_ref, 0.1) == pytest.approx(-0.1)


def test_the_draw_store_gives_the_in_memory_stats_block_by_block_and_removes_its_file(tmp_path):
    rng = np.random.default_rng(3)
    draws = (rng.normal(size=(5, 1000)) * rng.uniform(0.1, 10, size=1000)).astype(np.float32)
    g_ref = rng.normal(size=1000)
    with gv.DrawStore(5, directory=str(tmp_path)) as store:
        for grad in draws.astype(np.float64):  # what pipe.gradient returns: float64 of float32
            store.add(grad)
        blocked = store.stats(g_ref, block=64)  # 16 blocks, the last one partial
        assert store.stats(None, block=64).ref_dot is None
        assert list(tmp_path.iterdir())  # the draws are on disk, not in memory
    whole = gv.DrawStats.of(draws, g_ref)
    np.testing.assert_allclose(blocked.gram, whole.gram, rtol=1e-12)
    np.testing.assert_array_equal(blocked.mean, whole.mean)
    np.testing.assert_allclose(blocked.ref_dot, whole.ref_dot, rtol=1e-12)
    assert not list(tmp_path.iterdir())
