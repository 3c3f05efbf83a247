"""Priority formulas against references worked from ALGORITHM.md §5-6."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamo_jax.allocation.priorities import (
    e3_bounds,
    e3_difficulty_rank,
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
