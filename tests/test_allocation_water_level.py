"""Budget-splitting primitives: hand-worked Alg. 1 / E3 / DynaMO-as-run cases, an exact-arithmetic
(fractions.Fraction) scalar reference of docs/algorithm.md#water-level-allocation step 2, and a float64 scalar transcription
of the DynaMO authors' `get_rollout_n_per_prompt`, compared under hypothesis."""

import numpy as np
from helpers.allocation_refs import ref_as_run_fill, ref_water_fill
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamo_jax.allocation.priorities import as_run_priority
from dynamo_jax.allocation.water_level import (
    as_run_fill,
    bounded_split,
    give_round_robin,
    proportional_fill,
    spread_evenly,
    water_fill,
)


def test_water_fill_hand_worked():
    # G=4 for all, k=(2,1,0,4) -> P=(1/3, 1/4, 0, 0); B=16, [2, 8].
    # Start at 2 each (8), B_rem=8, ΣP=7/12: Δ0=⌊8·(1/3)/(7/12)⌋=⌊32/7⌋=4, Δ1=⌊8·(1/4)/(7/12)⌋=⌊24/7⌋=3
    # -> (6,5,2,2), B_rem=1: ⌊1·4/7⌋=⌊1·3/7⌋=0 -> the unit goes to the largest P (prompt 0).
    p = np.array([1 / 3, 1 / 4, 0.0, 0.0])
    np.testing.assert_array_equal(water_fill(p, np.arange(4), 16, 2, 8), [7, 5, 2, 2])


def test_water_fill_saturates_at_g_max():
    # P=(1/2, 5/18, 1/10) [G,k=(2,1),(10,5),(10,1)], B=12, [2, 6]. Start 2 each, B_rem=6, ΣP=79/90.
    # Round 1: Δ=(⌊6·45/79⌋, ⌊6·25/79⌋, ⌊6·9/79⌋)=(3,1,0) -> (5,3,2), B_rem=2.
    # Round 2: Δ=(⌊2·45/79⌋=1 (cap 1), ⌊50/79⌋=0, 0) -> (6,3,2), B_rem=1; prompt 0 is full.
    # Round 3: E={1,2}, ΣP=34/90: both ⌊⌋ are 0 -> the unit goes to prompt 1 (larger P).
    p = np.array([1 / 2, 5 / 18, 1 / 10])
    np.testing.assert_array_equal(water_fill(p, np.arange(3), 12, 2, 6), [6, 4, 2])


def test_water_fill_equal_priorities_hit_integers_exactly():
    # 3 prompts with P=1/3: B_rem·P/ΣP = 3·(1/3)/1 must be 1 each, not ⌊0.999…⌋ = 0.
    p = np.full(3, 1 / 3)
    np.testing.assert_array_equal(water_fill(p, np.arange(3), 9, 2, 8), [3, 3, 3])


def test_proportional_fill_hand_worked():
    # k=(.2,.8,.5,.5,1), B=20, [2,6]: B−N·lo = 10, Σk = 3; ⌊10k/3⌋ = (0,2,1,1,3) -> (2,4,3,3,5) = 17;
    # leftover 3 in descending k: prompt 4 (1.0), prompt 1 (.8), prompt 2 (.5, lower index) -> +1.
    k = np.array([0.2, 0.8, 0.5, 0.5, 1.0])
    np.testing.assert_array_equal(proportional_fill(k, np.arange(5), 20, 2, 6), [2, 5, 4, 3, 6])


def test_round_robin_cycles_and_skips_full():
    n = give_round_robin(np.array([2, 5, 2]), np.array([1, 0, 2]), 6, 6)
    # 6 units, order 1,0,2: +1 each (3,6,3); 1 is full -> 0,2 (4,6,4); last unit to 0 -> (5,6,4).
    np.testing.assert_array_equal(n, [5, 6, 4])


def test_spread_evenly_remainder_by_key_not_position():
    np.testing.assert_array_equal(spread_evenly(np.array([9, 3, 5, 1]), 10), [2, 3, 2, 3])


def test_bounded_split_shortfall_and_floor():
    keys = np.arange(3)
    fill = lambda pos, b: water_fill(np.zeros(pos.size), keys[pos], b, 2, 4)
    n, short, lowered = bounded_split(20, keys, 2, 4, fill, keys)
    assert (n.tolist(), short, lowered) == ([4, 4, 4], 8, False)
    # B=4 < 3·2: floor ⌊4/3⌋ = 1, remainder 1 along floor_order (prompt 2 first).
    n, short, lowered = bounded_split(4, keys, 2, 4, fill, np.array([2, 0, 1]))
    assert (n.tolist(), short, lowered) == ([1, 1, 2], 0, True)
    n, short, _ = bounded_split(5, np.zeros(0, np.int64), 2, 4, fill, keys[:0])
    assert (n.size, short) == (0, 5)


priorities = st.lists(
    st.one_of(st.just(0.0), st.fractions(0, 1, max_denominator=30)), min_size=1, max_size=25
)


@settings(deadline=None, max_examples=300)
@given(priorities, st.integers(1, 4), st.integers(0, 8), st.data())
def test_water_fill_matches_exact_reference(prio, lo, width, data):
    hi = lo + width
    size = len(prio)
    budget = data.draw(st.integers(size * lo, size * hi))
    keys = np.array(data.draw(st.permutations(range(size))))
    got = water_fill(np.array([float(x) for x in prio]), keys, budget, lo, hi)
    expected = ref_water_fill(prio, keys.tolist(), budget, lo, hi)
    assert got.tolist() == expected
    assert got.sum() == budget and got.min() >= lo and got.max() <= hi


# ---------------------------------------------------------------- DynaMO as the authors ran it


def test_as_run_fill_issue_example():
    # P = (1, .5) given directly (as their function takes it), G = (0, 10), B = 16, [2, 12],
    # b = max(n_low = 2, 4) = 4. Exploration: prompt 0 has G < 4 -> min(4 − 0, 12) = 4; prompt 1 0.
    # Raise to n_low: (4, 2), 6 <= 16, B_rem = 10. Pour over P > 1e-8: a = 10·(2/3, 1/3) =
    # (6.67, 3.33) -> ⌊⌋ (6, 3), remainder 10 − 9 = 1 to the largest fraction (.67, prompt 0)
    # -> (7, 3), within the room (8, 10) -> n = (11, 5).
    n = as_run_fill(np.array([0, 10]), np.array([1.0, 0.5]), np.arange(2), 16, 2, 12, 4)
    assert n.tolist() == [11, 5]


def test_as_run_fill_first_epoch_is_uniform():
    # The script's setting: n = 16, [n_low, n_high] = [8, 24], b = max(8, 4) = 8. First epoch:
    # G = 0 and priority −1 everywhere. Exploration 8 each (24 of 48), no raise needed, nobody
    # has P > 1e-8, so the 24 left cycle over the prompts below 24: +8 each -> 16 each.
    n = as_run_fill(np.zeros(3), np.full(3, -1.0), np.arange(3), 48, 8, 24, 4)
    assert n.tolist() == [16, 16, 16]


def test_as_run_fill_pours_over_rounds_with_largest_fractions():
    # [8, 24], b = 8, B = 96 = 6·16. Priorities as `update_rank` gives them (see
    # test_allocation_priorities): P = (.2666672, .1166675, .01, .05000095, −1, .2000008) for
    # (G, k) = (16, 8), (16, 2), (16, 15), (20, 1), (0, 0), (5, 1).
    # Exploration: prompt 4 (G = 0) gets 8, prompt 5 (G = 5) 8 − 5 = 3; raise all to 8 -> 8 each,
    # B_rem = 96 − 48 = 48.
    # Round 1, E = {0, 1, 2, 3, 5}, ΣP = .6433365: a = 48·P/ΣP = (19.896, 8.705, .746, 3.731,
    #   14.922) -> ⌊⌋ (19, 8, 0, 3, 14) = 44; remainder 4 to the largest fractions .922 (5),
    #   .896 (0), .746 (2), .731 (3) -> (20, 8, 1, 4, 15); room 16 caps prompt 0 at 16
    #   -> n = (24, 16, 9, 12, 8, 23), B_rem = 4.
    # Round 2, E = {1, 2, 3, 5}, ΣP = .3766693: a = 4·P/ΣP = (1.239, .106, .531, 2.124) -> ⌊⌋
    #   (1, 0, 0, 2), remainder 1 to .531 (3) -> (1, 0, 1, 2); prompt 5 has room 1
    #   -> n = (24, 17, 9, 13, 8, 24), B_rem = 1.
    # Round 3, E = {1, 2, 3}: a = (.660, .057, .283) -> all ⌊⌋ 0, the unit to .660 (prompt 1).
    gen = np.array([16, 16, 16, 20, 0, 5])
    prio = as_run_priority(gen, np.array([8, 2, 15, 1, 0, 1]))
    n = as_run_fill(gen, prio, np.arange(6), 96, 8, 24, 4)
    assert n.tolist() == [24, 18, 9, 13, 8, 24]


def test_as_run_fill_scaled_exploration_when_it_exceeds_the_budget():
    # G = (0, 0, 0, 10), [2, 8], b = 4, B = 10: exploration needs (4, 4, 4, 0) = 12 > 10, so
    # their scaled branch: ⌊4 · 10/12⌋ = ⌊3.33⌋ = 3 each, then max(·, n_low = 2) -> (3, 3, 3, 2)
    # = 11 > 10: one unit off the largest (the first of the three 3s) -> (2, 3, 3, 2).
    prio = np.array([-1.0, -1.0, -1.0, 0.3])
    n = as_run_fill(np.array([0, 0, 0, 10]), prio, np.arange(4), 10, 2, 8, 4)
    assert n.tolist() == [2, 3, 3, 2]


def test_as_run_fill_scales_unequal_exploration_in_proportion():
    # G = (0, 5, 10), [2, 12], explore_to 8 -> b = 8: exploration needs (8, 3, 0) = 11 > B = 9.
    # Scaled: ⌊8·9/11⌋ = ⌊6.55⌋ = 6, ⌊3·9/11⌋ = ⌊2.45⌋ = 2, 0 -> max(·, 2) = (6, 2, 2) = 10,
    # one unit off the largest -> (5, 2, 2). (Cutting (8, 3, 2) from the top alone would give
    # (4, 3, 2).)
    prio = np.array([-1.0, -1.0, 0.3])
    n = as_run_fill(np.array([0, 5, 10]), prio, np.arange(3), 9, 2, 12, 8)
    assert n.tolist() == [5, 2, 2]


def test_as_run_fill_keeps_n_low_where_their_raise_would_not():
    # **Choice**: G = (0, 0, 10, 10), [2, 8], b = 4 > n_low, B = 9. Exploration (4, 4, 0, 0)
    # = 8 fits, but raising the others to 2 needs 4 more than the 1 left; their code would
    # give ⌊2 · 1/4⌋ = 0 each and pour the unit by priority: (4, 4, 1, 0), below n_low.
    # Here: (4, 4, 2, 2) = 12, cut 3 from the top: both 4s -> (3, 3, 2, 2), then the first
    # 3 -> (2, 3, 2, 2).
    prio = np.array([-1.0, -1.0, 0.3, 0.2])
    n = as_run_fill(np.array([0, 0, 10, 10]), prio, np.arange(4), 9, 2, 8, 4)
    assert n.tolist() == [2, 3, 2, 2]


def test_as_run_fill_ties_go_by_key_not_position():
    # Equal priorities .01: B_rem = 3 over 2 prompts at [2, 8]: a = (1.5, 1.5) -> (1, 1) and the
    # remainder unit to the tied fraction with the smaller key (position 1, key 3).
    prio = np.array([0.01, 0.01])
    n = as_run_fill(np.array([10, 10]), prio, np.array([7, 3]), 7, 2, 8, 4)
    assert n.tolist() == [3, 4]


@settings(deadline=None, max_examples=300)
@given(st.integers(1, 20), st.integers(1, 6), st.integers(0, 10), st.integers(0, 8), st.data())
def test_as_run_fill_matches_scalar_transcription(size, lo, width, explore_to, data):
    hi = lo + width
    gen = np.array(data.draw(st.lists(st.integers(0, 30), min_size=size, max_size=size)))
    frac = np.array(data.draw(st.lists(st.floats(0, 1), min_size=size, max_size=size)))
    prio = as_run_priority(gen, np.floor(gen * frac))
    # tight budgets too, where the exploration does not fit
    budget = data.draw(
        st.one_of(st.integers(size * lo, size * hi), st.integers(size * lo, size * (lo + 2)))
    )
    budget = min(budget, size * hi)
    keys = np.array(data.draw(st.permutations(range(size))))
    got = as_run_fill(gen, prio, keys, budget, lo, hi, explore_to)
    expected = ref_as_run_fill(
        gen.tolist(), prio.tolist(), keys.tolist(), budget, lo, hi, explore_to
    )
    assert got.tolist() == expected
    assert got.sum() == budget and got.min() >= lo and got.max() <= hi
