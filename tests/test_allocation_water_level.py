"""Budget-splitting primitives: hand-worked Alg. 1 / E3 cases, and an exact-arithmetic
(fractions.Fraction) scalar reference of ALGORITHM.md §5 step 2 compared under hypothesis."""

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamo_jax.allocation.water_level import (
    bounded_split,
    give_round_robin,
    proportional_fill,
    spread_evenly,
    water_fill,
)


def ref_water_fill(priority, keys, budget, lo, hi):
    """Alg. 1 steps 1-2 one prompt at a time with exact rationals (the spec, not the code)."""
    p = [Fraction(x) for x in priority]
    n = [lo] * len(p)
    rem = budget - lo * len(p)
    while rem > 0 and any(v < hi for v in n):
        e = [i for i in range(len(p)) if n[i] < hi]
        total = sum(p[i] for i in e)
        if total == 0:
            delta = {i: min(rem // len(e), hi - n[i]) for i in e}
        else:
            delta = {i: min(int(rem * p[i] / total), hi - n[i]) for i in e}  # int() = ⌊⌋ (≥ 0)
        if sum(delta.values()) == 0:
            for i in sorted(e, key=lambda i: (-p[i], keys[i]))[:rem]:
                n[i] += 1
            return n
        for i, d in delta.items():
            n[i] += d
        rem -= sum(delta.values())
    return n


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
