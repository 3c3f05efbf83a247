"""Priority formulas against references worked from docs/algorithm.md#water-level-allocation,
docs/algorithm.md#allocation-variants and docs/algorithm.md#e3-allocation."""

import math

import numpy as np
import pytest
from helpers.allocation_refs import ref_as_run_priority
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamo_jax.allocation.priorities import (
    as_run_priority,
    e3_bounds,
    e3_difficulty_rank,
    entropy_factor,
    posterior_priority,
    released_priority,
    unbiased_priority,
)


@settings(deadline=None, max_examples=100)
@given(st.integers(2, 40).flatmap(lambda g: st.tuples(st.just(g), st.integers(0, g))))
def test_unbiased_priority_is_the_sample_variance_with_ddof_1(gk):
    # Eq. 6 is the unbiased variance of G Bernoulli draws with k ones: np.var(..., ddof=1).
    g, k = gk
    sample = np.r_[np.ones(k), np.zeros(g - k)]
    expected = np.var(sample, ddof=1)
    np.testing.assert_allclose(
        unbiased_priority(np.array([g]), np.array([k])), [expected], rtol=1e-12, atol=1e-15
    )


def test_unbiased_priority_hand_values():
    # G=4,k=2: 2·2/(4·3) = 1/3;  G=2,k=1: 1·1/(2·1) = 1/2;  G=10,k=1: 1·9/(10·9) = 1/10;
    # all-correct and all-wrong are 0; G < 2 is undefined and scores 0.
    g = np.array([4, 2, 10, 5, 5, 1, 0])
    k = np.array([2, 1, 1, 5, 0, 1, 0])
    np.testing.assert_allclose(unbiased_priority(g, k), [1 / 3, 1 / 2, 1 / 10, 0, 0, 0, 0])


def test_released_priority_hand_values():
    # acc = above/generated this epoch; priority max(4·acc·(1-acc), 0.01); acc >= 0.85 -> 0.01.
    gen = np.array([4, 4, 4, 8, 8, 0])
    above = np.array([2, 1, 0, 7, 6, 0])
    previous = np.array([0.3, 0.3, 0.3, 0.3, 0.3, 0.42])
    out = released_priority(gen, above, previous, floor=0.01, mastered_acc=0.85)
    expected = [
        1.0,  # acc .5: 4·.5·.5
        0.75,  # acc .25: 4·.25·.75
        0.01,  # acc 0: 0 floored
        0.01,  # acc .875 >= .85: mastered (4·.875·.125 = .4375 otherwise)
        0.75,  # acc .75: 4·.75·.25, below the mastery line
        0.42,  # not seen this epoch: keeps its previous priority
    ]
    np.testing.assert_allclose(out, expected)


def test_e3_rank_descending_mean_reward_with_shared_ties():
    # Mean rewards .8, .2, .5, .5, 0 and one unseen prompt. Descending: .8 -> rank 1,
    # the two .5 -> ranks 2,3 -> 2.5 each, .2 -> 4, 0 -> 5; |D| = 5 seen prompts.
    total_gen = np.array([10, 10, 10, 10, 10, 0])
    total_rew = np.array([8.0, 2.0, 5.0, 5.0, 0.0, 0.0])
    k = e3_difficulty_rank(total_gen, total_rew)
    np.testing.assert_allclose(k, [1 / 5, 4 / 5, 2.5 / 5, 2.5 / 5, 5 / 5, 0.0])


def test_e3_rank_all_unseen_is_zero():
    np.testing.assert_array_equal(e3_difficulty_rank(np.zeros(3), np.zeros(3)), np.zeros(3))


def test_e3_curriculum_bounds():
    # G = 8, limits [2, 16], step 2: [8,8] -> [6,10] -> [4,12] -> [2,14] -> [2,16] -> [2,16].
    got = [e3_bounds(e, n_avg=8, g_min=2, g_max=16, step=2) for e in range(6)]
    assert got == [(8, 8), (6, 10), (4, 12), (2, 14), (2, 16), (2, 16)]


def _beta_fn(a: float, b: float) -> float:
    return math.exp(math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))


@settings(deadline=None, max_examples=200)
@given(
    st.integers(0, 60).flatmap(lambda g: st.tuples(st.just(g), st.integers(0, g))),
    st.floats(0.1, 5.0),
    st.floats(0.1, 5.0),
)
def test_posterior_priority_is_the_beta_moment(gk, a, b):
    # E[p(1−p)] under Beta(α, β) is ∫ p^α (1−p)^β dp / B(α, β) = B(α+1, β+1) / B(α, β), with
    # α = a + k, β = b + G − k: the Beta function ratio, computed independently via lgamma.
    g, k = gk
    alpha, beta = a + k, b + g - k
    expected = _beta_fn(alpha + 1, beta + 1) / _beta_fn(alpha, beta)
    got = posterior_priority(np.array([g]), np.array([k]), a, b)
    np.testing.assert_allclose(got, [expected], rtol=1e-10)


def test_posterior_priority_hand_values():
    # a = b = 1: (k+1)(G−k+1) / ((G+2)(G+3)).
    # G=0: 1·1/(2·3) = 1/6 (the prior's mean of p(1−p));  G=4,k=2: 3·3/(6·7) = 3/14;
    # G=10,k=0: 1·11/(12·13) = 11/156 (never 0, unlike Eq. 6);  G=10,k=10: 11·1/156 = 11/156.
    g = np.array([0, 4, 10, 10])
    k = np.array([0, 2, 0, 10])
    np.testing.assert_allclose(posterior_priority(g, k), [1 / 6, 3 / 14, 11 / 156, 11 / 156])
    # a = 2, b = 0.5, G = 3, k = 1: (1+2)(2+.5)/((3+2.5)(3+3.5)) = 7.5/35.75 = 30/143.
    np.testing.assert_allclose(
        posterior_priority(np.array([3]), np.array([1]), 2.0, 0.5), [30 / 143]
    )


def test_posterior_tends_to_the_unbiased_estimate():
    # k/G = 1/4 at G = 4·10^m: both tend to p(1−p) = 3/16, the gap shrinks like 1/G.
    g = 4.0 * 10.0 ** np.arange(1, 6)
    gap = np.abs(posterior_priority(g, g / 4) - unbiased_priority(g, g / 4))
    assert np.all(np.diff(gap) < 0) and gap[-1] < 1e-5


def test_entropy_factor_hand_values():
    # f(H) = sqrt(1 − e^{−H}): f(0) = 0, f(ln 2) = sqrt(1/2), f(ln 4) = sqrt(3/4), f(40) ≈ 1;
    # NaN (no entropy recorded) stays NaN for the caller to decide.
    h = np.array([0.0, math.log(2), math.log(4), 40.0, np.nan])
    f = entropy_factor(h)
    np.testing.assert_allclose(f[:4], [0.0, math.sqrt(0.5), math.sqrt(0.75), 1.0], rtol=1e-15)
    assert np.isnan(f[4])
    # small H: 1 − e^{−H} ≈ H, computed without cancellation (expm1)
    np.testing.assert_allclose(entropy_factor(np.array([1e-12])), [1e-6], rtol=1e-9)


def test_as_run_priority_hand_values():
    g = np.array([0, 3, 4, 16, 16, 16, 20, 7, 20, 16])
    k = np.array([0, 2, 2, 8, 2, 15, 1, 6, 17, 0])
    expected = [
        -1.0,  # G = 0 < 4: left out of the pour
        -1.0,  # G = 3 < 4, whatever k
        4 / 12 + 0.5e-6,  # 2·2/(4·3) + (1 − .5)·1e-6
        64 / 240 + 0.5e-6,  # 8·8/(16·15) = .266667 + .5e-6
        28 / 240 + 0.875e-6,  # 2·14/240 = .116667 + (1 − 2/16)·1e-6
        0.01,  # acc 15/16 = .9375 >= .85: mastered
        19 / 380 + 0.95e-6,  # 1·19/(20·19) = .05 + (1 − 1/20)·1e-6
        0.01,  # acc 6/7 = .857 >= .85: mastered (Eq. 6 would give 6/42 = .143)
        0.01,  # acc 17/20 = .85 exactly: mastered (>=)
        0.01,  # k = 0: 0 + 1e-6 < floor .01
    ]
    got = as_run_priority(g, k)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    np.testing.assert_allclose(got, [float(ref_as_run_priority(a, b)) for a, b in zip(g, k)])


@settings(deadline=None, max_examples=200)
@given(st.integers(0, 80).flatmap(lambda g: st.tuples(st.just(g), st.integers(0, g))))
def test_as_run_priority_matches_exact_reference(gk):
    g, k = gk
    got = as_run_priority(np.array([g]), np.array([k]))
    np.testing.assert_allclose(got, [float(ref_as_run_priority(g, k))], rtol=1e-12)


@pytest.mark.parametrize("min_history, expected", [(4, -1.0), (3, 2 / 6 + 1e-6 * 2 / 3)])
def test_as_run_priority_threshold_is_a_parameter(min_history, expected):
    # G = 3, k = 1: excluded under the authors' 4; with 3, 1·2/(3·2) + (1 − 1/3)·1e-6.
    got = as_run_priority(np.array([3]), np.array([1]), min_history=min_history)
    np.testing.assert_allclose(got, [expected], rtol=1e-12)
