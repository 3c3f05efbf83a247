"""Allocation policies: hand-worked cases from the papers' rules (ALGORITHM.md §5-6) and
hypothesis properties (exact budget, bounds, determinism, permutation invariance, DynaMO
monotonicity) for every policy, plus DynaMO against an exact-arithmetic scalar reference."""

import copy
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_allocation_water_level import ref_water_fill

from dynamo_jax.allocation import AllocationConfig, PromptHistory, make_allocator, make_history
from dynamo_jax.allocation.priorities import e3_bounds, e3_difficulty_rank

POLICIES = ["uniform", "dynamo", "dynamo_released", "e3"]


def _cfg(policy, **kw):
    return AllocationConfig(policy=policy, **{"n_avg": 4, "g_min": 2, "g_max": 8, **kw})


def _history(num, indices, gen, cor, cfg=None):
    h = PromptHistory(num) if cfg is None else make_history(cfg, num)
    h.update(np.array(indices), gen, cor, np.asarray(cor, dtype=float))
    return h


def _alloc(policy, h, indices, budget, **kw):
    return make_allocator(_cfg(policy, **kw)).allocate(np.array(indices), h, budget)


# ---------------------------------------------------------------- hand-worked: uniform


def test_uniform_remainder_goes_by_prompt_index():
    # B=14 over 4 prompts: ⌊14/4⌋ = 3 each, 2 left for the two smallest indices (2 and 5).
    r = _alloc("uniform", PromptHistory(12), [10, 2, 7, 5], 14)
    assert r.n.tolist() == [3, 4, 3, 4] and r.shortfall == 0


# ---------------------------------------------------------------- hand-worked: dynamo


def test_dynamo_water_level():
    # G=4 each, k=(2,1,0,4): P = k(G−k)/(G(G−1)) = (4/12, 3/12, 0, 0) = (1/3, 1/4, 0, 0).
    # B = 4·4 = 16, [2, 8]: floor 2 each (8), B_rem = 8, ΣP = 7/12.
    # Δ0 = ⌊8·(1/3)/(7/12)⌋ = ⌊4.57⌋ = 4, Δ1 = ⌊8·(1/4)/(7/12)⌋ = ⌊3.43⌋ = 3 -> (6,5,2,2), B_rem = 1;
    # next round every ⌊·⌋ is 0: the unit goes to the largest P (prompt 0) -> (7,5,2,2).
    h = _history(4, [0, 1, 2, 3], [4, 4, 4, 4], [2, 1, 0, 4])
    r = _alloc("dynamo", h, [0, 1, 2, 3], 16)
    assert r.n.tolist() == [7, 5, 2, 2] and r.shortfall == 0
    assert r.diagnostics["alloc/num_zero_priority"] == 2.0


def test_dynamo_data_scarce_prompts_get_n_avg_outside_the_fill():
    # Prompts 0 (G=0) and 1 (G=1) have G < min_history=2: n_avg = 4 each, B_rest = 16 − 8 = 8.
    # Prompts 2 (G=4,k=1: P=3/12=1/4) and 3 (G=4,k=0: P=0): floor 2 each, B_rem = 4,
    # Δ2 = ⌊4·(1/4)/(1/4)⌋ = 4 -> 6, Δ3 = 0 -> 2.
    h = _history(4, [1, 2, 3], [1, 4, 4], [1, 1, 0])
    r = _alloc("dynamo", h, [0, 1, 2, 3], 16)
    assert r.n.tolist() == [4, 4, 6, 2]
    assert r.diagnostics["alloc/num_fixed"] == 2.0


def test_dynamo_all_zero_priorities_spread_uniformly():
    # P = 0 for all (k ∈ {0, G}); B = 18, [2, 8]: floor 2 each, B_rem = 10 -> ⌊10/4⌋ = 2 each
    # -> 4 each, B_rem = 2 -> one each to the lowest prompt indices 3 and 5.
    h = _history(10, [7, 3, 9, 5], [4, 4, 4, 4], [0, 4, 0, 4])
    r = _alloc("dynamo", h, [7, 3, 9, 5], 18)
    assert r.n.tolist() == [4, 5, 4, 5]


def test_dynamo_all_data_scarce():
    # No history: everyone gets n_avg = 4; with B = 13 the extra unit goes to index 2.
    assert _alloc("dynamo", PromptHistory(9), [5, 2, 8], 12).n.tolist() == [4, 4, 4]
    assert _alloc("dynamo", PromptHistory(9), [5, 2, 8], 13).n.tolist() == [4, 5, 4]


def test_dynamo_infeasible_floor_drops_to_zero():
    # P = (1/3, 1/4, 0, 0) as above plus prompt 4 without history. B = 3 < 5·G_min = 10:
    # floor ⌊3/5⌋ = 0, the 3 units go one each: data-scarce prompt 4 first, then by P: 0, 1.
    h = _history(5, [0, 1, 2, 3], [4, 4, 4, 4], [2, 1, 0, 4])
    r = _alloc("dynamo", h, [0, 1, 2, 3, 4], 3)
    assert r.n.tolist() == [1, 1, 0, 0, 1] and r.diagnostics["alloc/floor_lowered"] == 1.0
    # B = 6 over prompts 0..3: floor ⌊6/4⌋ = 1, the 2 spare units to the largest P: 0 and 1.
    assert _alloc("dynamo", h, [0, 1, 2, 3], 6).n.tolist() == [2, 2, 1, 1]


def test_dynamo_shortfall_when_budget_exceeds_n_g_max():
    r = _alloc("dynamo", PromptHistory(3), [0, 1], 20)
    assert r.n.tolist() == [8, 8] and r.shortfall == 4


# ---------------------------------------------------------------- hand-worked: released


def test_released_heuristic_per_epoch_priorities():
    # Epoch 1 results (batch mean 8/18 < 1, so "above the batch mean" = correct):
    #   prompt 0: 2/4 -> 4·.5·.5 = 1.0;  prompt 1: 1/4 -> 4·.25·.75 = .75;
    #   prompt 2: 0/4 -> floor .01;      prompt 3: 4/4 >= .85 -> mastered .01;
    #   prompt 4: only 2 rollouts so far (< 4) -> explored with 4 rollouts.
    cfg = _cfg("dynamo_released")
    alloc = make_allocator(cfg)
    h = _history(5, [0, 1, 2, 3, 4], [4, 4, 4, 4, 2], [2, 1, 0, 4, 1], cfg)
    alloc.on_epoch_end(h)
    np.testing.assert_allclose(h.released_priority[:4], [1.0, 0.75, 0.01, 0.01])
    # B = 20: prompt 4 takes 4; the other 16 water-fill: floor 2 each (8), B_rem = 8, ΣP = 1.77:
    # Δ = (⌊8/1.77⌋, ⌊6/1.77⌋, ⌊.08/1.77⌋, ⌊.08/1.77⌋) = (4, 3, 0, 0) -> (6,5,2,2), then the
    # last unit to the largest priority (prompt 0).
    r = alloc.allocate(np.arange(5), h, 20)
    assert r.n.tolist() == [7, 5, 2, 2, 4]
    # Priorities only move at epoch ends: a step that makes prompt 2 look ideal changes nothing.
    h.update(np.array([2]), [8], [4], [4.0])
    assert alloc.allocate(np.arange(5), h, 20).n.tolist() == [7, 5, 2, 2, 4]
    # The paper's unbiased P for the same history differs: P0 = 1/3, P1 = 1/4 (not 1, .75).


# ---------------------------------------------------------------- hand-worked: e3


def _e3_history():
    # Cumulative mean rewards .8, .2, .5, .5, 0 -> k = (1, 4, 2.5, 2.5, 5)/5 = (.2, .8, .5, .5, 1).
    cfg = _cfg("e3")
    h = _history(6, [0, 1, 2, 3, 4], [10] * 5, [8, 2, 5, 5, 0], cfg)
    return cfg, h


def test_e3_first_epoch_is_uniform_then_rank_allocation():
    cfg, h = _e3_history()
    alloc = make_allocator(cfg)
    assert alloc.allocate(np.arange(5), h, 20).n.tolist() == [4] * 5  # epoch 0: [G, G] = [4, 4]
    alloc.on_epoch_end(h)
    np.testing.assert_allclose(h.e3_rank[:5], [0.2, 0.8, 0.5, 0.5, 1.0])
    # Epoch 1: bounds [4−2, 4+2] = [2, 6]. B = 20: B − N·G_min = 10, Σk = 3,
    # ⌊10k/3⌋ = (⌊.67⌋, ⌊2.67⌋, ⌊1.67⌋, ⌊1.67⌋, ⌊3.33⌋) = (0,2,1,1,3) -> (2,4,3,3,5) = 17;
    # leftover 3 one by one in descending k: prompt 4, prompt 1, prompt 2 (tie with 3, lower index).
    r = alloc.allocate(np.arange(5), h, 20)
    assert r.n.tolist() == [2, 5, 4, 3, 6]
    assert (r.diagnostics["alloc/e3_g_min"], r.diagnostics["alloc/e3_g_max"]) == (2.0, 6.0)


def test_e3_respects_curriculum_g_max():
    # Epoch 1, B = 26: B − 10 = 16, ⌊16k/3⌋ = (1, 4, 2, 2, 5); prompt 4 is capped at 6 − 2 = 4
    # -> (3,6,4,4,6) = 23; leftover 3 in descending k skipping full prompts 4 and 1: 2, 3, 0.
    cfg, h = _e3_history()
    alloc = make_allocator(cfg)
    alloc.on_epoch_end(h)
    assert alloc.allocate(np.arange(5), h, 26).n.tolist() == [4, 6, 5, 5, 6]


def test_e3_unseen_prompt_gets_g_min():
    # Prompt 5 was never rolled out: k = 0, so it keeps G_min = 2 at epoch 1. Batch (5, 0):
    # B = 8, B − 2·2 = 4, Σk = .2: prompt 0 gets ⌊4·.2/.2⌋ = 4 -> 6, prompt 5 stays at 2.
    cfg, h = _e3_history()
    alloc = make_allocator(cfg)
    alloc.on_epoch_end(h)
    assert alloc.allocate(np.array([5, 0]), h, 8).n.tolist() == [2, 6]


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("policy", POLICIES)
def test_bad_budget_and_indices_are_rejected(policy):
    h = PromptHistory(4)
    with pytest.raises(ValueError, match="budget must be a non-negative integer"):
        _alloc(policy, h, [0, 1], -1)
    for bad in (7.5, float("inf"), "8", None):
        with pytest.raises(ValueError, match="budget must be a non-negative integer"):
            _alloc(policy, h, [0, 1], bad)
    with pytest.raises(ValueError, match="prompt index 1 appears 2 times"):
        _alloc(policy, h, [1, 1], 8)
    with pytest.raises(ValueError, match=r"indices\[0\] = 4 is not a dense prompt index"):
        _alloc(policy, h, [4], 8)


# ---------------------------------------------------------------- properties

NUM_PROMPTS = 40


@st.composite
def scenarios(draw, policy):
    g_min = draw(st.integers(1, 4))
    n_avg = draw(st.integers(g_min, g_min + 4))
    g_max = draw(st.integers(n_avg, n_avg + 8))
    cfg = AllocationConfig(
        policy=policy, n_avg=n_avg, g_min=g_min, g_max=g_max, min_history=draw(st.integers(2, 4))
    )
    h = make_history(cfg, NUM_PROMPTS)
    gen = np.array(draw(st.lists(st.integers(0, 12), min_size=NUM_PROMPTS, max_size=NUM_PROMPTS)))
    frac = np.array(draw(st.lists(st.floats(0, 1), min_size=NUM_PROMPTS, max_size=NUM_PROMPTS)))
    cor = np.round(gen * frac)
    h.generated[:], h.correct[:] = gen, cor
    h.total_generated[:], h.total_reward[:] = gen, cor
    h.epoch_generated[:], h.epoch_above_mean[:] = gen, cor
    h.released_priority[:] = draw(st.sampled_from([0.01, 0.5, 1.0]))
    h.released_priority[::3] = 0.01 + frac[::3]
    h.e3_rank[:] = e3_difficulty_rank(gen, cor)
    h.epochs_completed = draw(st.integers(0, 4))
    size = draw(st.integers(1, 25))
    indices = np.array(
        draw(st.lists(st.integers(0, NUM_PROMPTS - 1), min_size=size, max_size=size, unique=True))
    )
    budget = draw(st.one_of(st.just(size * n_avg), st.integers(0, size * g_max + 10)))
    perm = np.array(draw(st.permutations(range(size))))
    return cfg, h, indices, budget, perm


def _bounds(cfg, h):
    if cfg.policy == "e3":
        return e3_bounds(
            h.epochs_completed, cfg.n_avg, cfg.g_min, cfg.g_max, cfg.e3_curriculum_step
        )
    return cfg.g_min, cfg.g_max


@pytest.mark.parametrize("policy", POLICIES)
@settings(deadline=None, max_examples=150)
@given(data=st.data())
def test_budget_bounds_determinism_permutation(policy, data):
    cfg, h, indices, budget, perm = data.draw(scenarios(policy))
    alloc = make_allocator(cfg)
    r = alloc.allocate(indices, h, budget)
    lo, hi = _bounds(cfg, h)
    size = indices.size
    assert r.n.dtype == np.int64 and r.n.shape == (size,)
    assert r.shortfall == max(0, budget - size * hi)
    assert r.n.sum() == budget - r.shortfall
    if budget >= size * lo:
        assert r.n.min() >= lo and r.n.max() <= hi
    else:  # infeasible floor: ⌊B/N⌋ for all, the remainder one each
        assert set(r.n.tolist()) <= {budget // size, budget // size + 1}
    again = make_allocator(cfg).allocate(indices.copy(), copy.deepcopy(h), budget)
    np.testing.assert_array_equal(again.n, r.n)
    permuted = alloc.allocate(indices[perm], h, budget)
    np.testing.assert_array_equal(permuted.n, r.n[perm])


def ref_dynamo(gen, cor, keys, budget, cfg):
    """ALGORITHM.md §5 with exact rationals, one prompt at a time."""
    size, lo, hi = len(keys), cfg.g_min, cfg.g_max
    scarce = [g < cfg.min_history for g in gen]
    p = [
        Fraction(0) if s else Fraction(int(k) * int(g - k), int(g) * int(g - 1))
        for s, g, k in zip(scarce, gen, cor)
    ]
    if budget > size * hi:
        return [hi] * size
    if budget < size * lo:
        n = [budget // size] * size
        for i in sorted(range(size), key=lambda i: (not scarce[i], -p[i], keys[i]))[
            : budget % size
        ]:
            n[i] += 1
        return n
    fixed = [i for i in range(size) if scarce[i]]
    rest = [i for i in range(size) if not scarce[i]]
    low = max(len(fixed) * lo, budget - len(rest) * hi)
    high = min(len(fixed) * hi, budget - len(rest) * lo)
    fixed_total = min(max(len(fixed) * cfg.n_avg, low), high) if fixed else 0
    n = [0] * size
    for rank, i in enumerate(sorted(fixed, key=lambda i: keys[i])):
        n[i] = fixed_total // len(fixed) + (rank < fixed_total % len(fixed))
    filled = ref_water_fill(
        [p[i] for i in rest], [keys[i] for i in rest], budget - fixed_total, lo, hi
    )
    for i, v in zip(rest, filled):
        n[i] = v
    return n


@settings(deadline=None, max_examples=200)
@given(data=st.data())
def test_dynamo_matches_reference_and_is_monotone_in_priority(data):
    cfg, h, indices, budget, _ = data.draw(scenarios("dynamo"))
    r = make_allocator(cfg).allocate(indices, h, budget)
    gen, cor = h.generated[indices], h.correct[indices]
    assert r.n.tolist() == ref_dynamo(gen.tolist(), cor.tolist(), indices.tolist(), budget, cfg)
    size = indices.size
    if size * cfg.g_min <= budget <= size * cfg.g_max:
        with_history = gen >= cfg.min_history
        p = (cor * (gen - cor) / np.maximum(gen * (gen - 1), 1))[with_history]
        n = r.n[with_history]
        # P_a > P_b must imply n_a >= n_b for every pair of prompts with history.
        violated = (p[:, None] > p[None, :]) & (n[:, None] < n[None, :])
        assert not violated.any()


@settings(deadline=None, max_examples=100)
@given(st.integers(1, 30), st.integers(2, 12), st.floats(0, 1), st.integers(0, 3), st.data())
def test_dynamo_equal_priorities_give_uniform(size, g, frac, slack, data):
    cfg = AllocationConfig(policy="dynamo", n_avg=4, g_min=2, g_max=8)
    k = int(round(g * frac))
    h = _history(size, list(range(size)), [g] * size, [k] * size, cfg)
    r = make_allocator(cfg).allocate(np.arange(size), h, size * cfg.n_avg)
    assert r.n.tolist() == [cfg.n_avg] * size
    budget = data.draw(st.integers(size * cfg.g_min, size * cfg.g_max))
    n = make_allocator(cfg).allocate(np.arange(size), h, budget).n
    assert n.max() - n.min() <= 1 and n.sum() == budget
