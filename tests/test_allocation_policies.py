"""Allocation policies: hand-worked cases from the papers' rules and the DynaMO authors' code
(docs/algorithm.md#water-level-allocation, docs/algorithm.md#allocation-variants,
docs/algorithm.md#e3-allocation) and hypothesis properties (exact budget, bounds, determinism,
permutation invariance, DynaMO monotonicity) for every policy and option, plus DynaMO (with its
allocation options) and DynaMO-as-run against scalar references."""

import copy
import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest
from helpers.allocation_refs import ref_as_run_fill, ref_as_run_priority, ref_water_fill
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamo_jax.allocation import AllocationConfig, PromptHistory, make_allocator, make_history
from dynamo_jax.allocation.policies import AllocationResult
from dynamo_jax.allocation.priorities import e3_bounds, e3_difficulty_rank
from dynamo_jax.allocation.registry import AllocationPolicy, register, unregister
from dynamo_jax.allocation.settings import PolicySettings
from dynamo_jax.allocation.water_level import bounded_split, water_fill

POLICIES = ["uniform", "dynamo", "dynamo_as_run", "dynamo_released", "e3"]
# Every policy, plus DynaMO's allocation options together, for the property test (each option alone
# is drawn by test_dynamo_options_match_reference_and_are_monotone_in_weight).
CASES = [(policy, {}) for policy in POLICIES] + [
    ("dynamo", {"allocate_by": "std", "priority": "posterior", "entropy_factor": True}),
]


def _cfg(policy, **kw):
    return AllocationConfig(policy=policy, **{"n_avg": 4, "g_min": 2, "g_max": 8, **kw})


def _history(num, indices, gen, cor, cfg=None, entropy=None):
    h = PromptHistory(num) if cfg is None else make_history(cfg, num)
    h.update(np.array(indices), gen, cor, np.asarray(cor, dtype=float), entropy_mean=entropy)
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


# ---------------------------------------------------------------- hand-worked: allocation options


def test_dynamo_posterior_priority_feeds_unsolved_prompts():
    # G = 4 each, k = (2, 1, 0, 4). Posterior, a = b = 1: (k+1)(G−k+1)/((G+2)(G+3)) =
    # (3·3, 2·4, 1·5, 5·1)/42 = (9, 8, 5, 5)/42 (Eq. 6 gives (1/3, 1/4, 0, 0)).
    # B = 16, [2, 8]: 2 each, B_rem = 8, ΣP = 27/42: Δ = (⌊8·9/27⌋, ⌊8·8/27⌋, ⌊8·5/27⌋, ⌊8·5/27⌋)
    # = (⌊2.67⌋, ⌊2.37⌋, ⌊1.48⌋, ⌊1.48⌋) = (2, 2, 1, 1) -> (4, 4, 3, 3), B_rem = 2; every next ⌊⌋
    # is 0: the units go to the largest P, prompts 0 and 1 -> (5, 5, 3, 3). The paper's rule
    # gives (7, 5, 2, 2): the never-solved prompt 2 stays at G_min there.
    h = _history(4, [0, 1, 2, 3], [4, 4, 4, 4], [2, 1, 0, 4])
    assert _alloc("dynamo", h, [0, 1, 2, 3], 16, priority="posterior").n.tolist() == [5, 5, 3, 3]
    assert _alloc("dynamo", h, [0, 1, 2, 3], 16).n.tolist() == [7, 5, 2, 2]
    # a = 2, b = 0.5: ((2+2)(2+.5), (1+2)(3+.5), (0+2)(4+.5), (4+2)(0+.5)) / ((6.5)(7.5))
    # ∝ (10, 10.5, 9, 3), Σ = 32.5: Δ = (⌊80/32.5⌋, ⌊84/32.5⌋, ⌊72/32.5⌋, ⌊24/32.5⌋) = (2, 2, 2, 0)
    # -> (4, 4, 4, 2), B_rem = 2: all ⌊⌋ 0 -> the largest P: prompts 1 (10.5) and 0 (10).
    r = _alloc("dynamo", h, [0, 1, 2, 3], 16, priority="posterior", prior_a=2.0, prior_b=0.5)
    assert r.n.tolist() == [5, 5, 4, 2]


def test_dynamo_std_allocates_by_sqrt_of_the_priority():
    # G = 10, k = (5, 1, 1): P = (25, 9, 9)/90, so sqrt(P) ∝ (5, 3, 3). B = 12, [2, 10]: B_rem = 6.
    # "std": Δ = (⌊6·5/11⌋, ⌊6·3/11⌋, ⌊6·3/11⌋) = (⌊2.73⌋, ⌊1.64⌋, ⌊1.64⌋) = (2, 1, 1) -> (4, 3, 3),
    #   B_rem = 2: ⌊2·5/11⌋ = ⌊2·3/11⌋ = 0 -> the largest weights: prompt 0, then 1 (index) -> (5, 4, 3).
    # "variance": Δ = (⌊6·25/43⌋, ⌊6·9/43⌋, ⌊6·9/43⌋) = (⌊3.49⌋, ⌊1.26⌋, ⌊1.26⌋) = (3, 1, 1)
    #   -> (5, 3, 3), B_rem = 1 -> prompt 0 -> (6, 3, 3).
    h = _history(3, [0, 1, 2], [10, 10, 10], [5, 1, 1])
    kw = {"g_max": 10}
    assert _alloc("dynamo", h, [0, 1, 2], 12, allocate_by="std", **kw).n.tolist() == [5, 4, 3]
    assert _alloc("dynamo", h, [0, 1, 2], 12, **kw).n.tolist() == [6, 3, 3]


def test_dynamo_entropy_factor_and_the_unknown_prompt():
    # Equal P (G = 4, k = 2 each), entropies (ln(10/9), ln 2, none): f² = 1 − e^{−H} = (.1, .5, ·),
    # f = (.31623, .70711); the unknown prompt gets the batch mean f = .51167, f² = .26180.
    # "variance" weights P·f² ∝ (.1, .5, .2618), Σ = .8618; B = 12, [2, 8], B_rem = 6:
    #   Δ = (⌊6·.1/.8618⌋, ⌊6·.5/.8618⌋, ⌊6·.2618/.8618⌋) = (⌊.70⌋, ⌊3.48⌋, ⌊1.82⌋) = (0, 3, 1)
    #   -> (2, 5, 3), B_rem = 2: (⌊.23⌋, ⌊1.16⌋, ⌊.61⌋) = (0, 1, 0) -> (2, 6, 3), B_rem = 1: all
    #   ⌊⌋ 0 -> the largest weight, prompt 1 -> (2, 7, 3).
    h = _history(
        3, [0, 1, 2], [4, 4, 4], [2, 2, 2], entropy=[math.log(10 / 9), math.log(2), np.nan]
    )
    r = _alloc("dynamo", h, [0, 1, 2], 12, entropy_factor=True)
    assert r.n.tolist() == [2, 7, 3]
    assert r.diagnostics["alloc/entropy_known_share"] == pytest.approx(2 / 3)
    assert _alloc("dynamo", h, [0, 1, 2], 12).n.tolist() == [4, 4, 4]  # without: uniform
    # "std" weights sqrt(P)·f ∝ (.31623, .70711, .51167), Σ = 1.53500 (= 3 × the mean, so the
    # third share is exactly 6/3 = 2): Δ = (⌊1.24⌋, ⌊2.76⌋, 2) = (1, 2, 2) -> (3, 4, 4),
    # B_rem = 1: all ⌊⌋ 0 -> the largest weight, prompt 1 -> (3, 5, 4).
    r = _alloc("dynamo", h, [0, 1, 2], 12, entropy_factor=True, allocate_by="std")
    assert r.n.tolist() == [3, 5, 4]
    # No entropy anywhere: f = 1 for all, the paper's rule.
    h0 = _history(3, [0, 1, 2], [4, 4, 4], [2, 1, 0])
    assert (
        _alloc("dynamo", h0, [0, 1, 2], 12, entropy_factor=True).n.tolist()
        == _alloc("dynamo", h0, [0, 1, 2], 12).n.tolist()
    )


# ---------------------------------------------------------------- hand-worked: as run


def test_dynamo_as_run_from_the_history():
    # The script's bounds: n = 16, [n_low, n_high] = [8, 24], so b = max(8, 4) = 8.
    # History (G, k): (16, 8), (16, 2), (16, 15), (20, 1), never seen, (5, 1). Priorities
    # (update_rank): .2666672, .1166675, .01 (15/16 mastered), .05000095, −1 (G < 4), .2000008.
    # Budget 96: exploration 8 for prompt 4, 8 − 5 = 3 for prompt 5, everyone raised to 8, then
    # the pour of test_as_run_fill_pours_over_rounds_with_largest_fractions -> as below.
    cfg = AllocationConfig(policy="dynamo_as_run", n_avg=16, g_min=8, g_max=24)
    h = _history(6, [0, 1, 2, 3, 5], [16, 16, 16, 20, 5], [8, 2, 15, 1, 1], cfg)
    r = make_allocator(cfg).allocate(np.arange(6), h, 96)
    assert r.n.tolist() == [24, 18, 9, 13, 8, 24]
    assert r.diagnostics["alloc/num_exploring"] == 2.0
    # First epoch: no history, all −1: exploration 8 each, then the leftover round-robin: 16 each.
    assert (
        make_allocator(cfg).allocate(np.arange(6), make_history(cfg, 6), 96).n.tolist() == [16] * 6
    )


def test_dynamo_as_run_counts_are_cumulative():
    # k counts reward > 0 over the whole run, never reset at epoch ends: after two steps of
    # (4 rollouts, 2 correct) and (4, 0) prompt 0 has G = 8, k = 2: P = 2·6/(8·7) + .75e-6 = .2142865.
    # Prompt 1: G = 8, k = 4: 4·4/56 + .5e-6 = .2857148. [2, 8], b = 4, B = 8: both G >= 4, raise to
    # 2 each, B_rem = 4: a = 4·(.2143, .2857)/.5 = (1.714, 2.286) -> (1, 2), remainder 1 to .714
    # (prompt 0) -> (2, 2) -> n = (4, 4).
    cfg = _cfg("dynamo_as_run")
    h = _history(2, [0, 1], [4, 4], [2, 2], cfg)
    alloc = make_allocator(cfg)
    alloc.on_epoch_end(h)
    h.update(np.array([0, 1]), [4, 4], [0, 2], [0.0, 2.0])
    assert alloc.allocate(np.arange(2), h, 8).n.tolist() == [4, 4]
    # B = 10, B_rem = 6: a = 6·(3/7, 4/7) = (2.571, 3.429) -> (2, 3), remainder 1 to .571 -> (5, 5).
    assert alloc.allocate(np.arange(2), h, 10).n.tolist() == [5, 5]
    # B = 11: a = 7·(3/7, 4/7) = (3, 4) exactly -> (5, 6).
    assert alloc.allocate(np.arange(2), h, 11).n.tolist() == [5, 6]


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
def scenarios(draw, policy, options=None):
    """A random history, batch, budget and permutation; `options`: AllocationConfig fields
    (None: the defaults, "draw": random allocation options)."""
    options = {} if options is None else options
    g_min = draw(st.integers(1, 4))
    n_avg = draw(st.integers(g_min, g_min + 4))
    g_max = draw(st.integers(n_avg, n_avg + 8))
    if options == "draw":  # DynaMO's allocation options (dyadic priors: exact float arithmetic)
        options = {
            "allocate_by": draw(st.sampled_from(["variance", "std"])),
            "priority": draw(st.sampled_from(["unbiased", "posterior"])),
            "prior_a": draw(st.sampled_from([0.5, 1.0, 1.5, 2.0])),
            "prior_b": draw(st.sampled_from([0.5, 1.0, 1.5, 2.0])),
            "entropy_factor": draw(st.booleans()),
        }
    cfg = AllocationConfig(
        policy=policy,
        n_avg=n_avg,
        g_min=g_min,
        g_max=g_max,
        **({"min_history": draw(st.integers(2, 4))} if policy == "dynamo" else {}),
        **options,
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
    # a few distinct entropies (ties included), NaN = none recorded
    entropies = st.sampled_from([np.nan, 0.0, 0.05, 0.7, 2.0, 9.0])
    h.entropy_mean[:] = draw(st.lists(entropies, min_size=NUM_PROMPTS, max_size=NUM_PROMPTS))
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
            h.epochs_completed, cfg.n_avg, cfg.g_min, cfg.g_max, cfg.settings.e3_curriculum_step
        )
    return cfg.g_min, cfg.g_max


@pytest.mark.parametrize(
    "policy, options",
    CASES,
    ids=[policy + "".join(f"-{v}" for v in opts.values()) for policy, opts in CASES],
)
@settings(deadline=None, max_examples=150)
@given(data=st.data())
def test_budget_bounds_determinism_permutation(policy, options, data):
    cfg, h, indices, budget, perm = data.draw(scenarios(policy, options))
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


def ref_weights(gen, cor, entropy, cfg):
    """The fill weights of docs/algorithm.md#water-level-allocation and its variants, one prompt at a time.

    Exact rationals for the paper's rule (and the posterior, whose dyadic priors keep float
    arithmetic exact); float64 once a square root or the entropy factor enters, with the same
    elementary operations as any float64 code would use (so the same rounding)."""
    if cfg.settings.priority == "unbiased":
        p = [
            Fraction(int(k) * int(g - k), int(g) * int(g - 1)) if g > 1 else Fraction(0)
            for g, k in zip(gen, cor)
        ]
    else:
        a, b = Fraction(cfg.settings.prior_a), Fraction(cfg.settings.prior_b)
        p = [
            (k + a) * (g - k + b) / ((g + a + b) * (g + a + b + 1))
            for g, k in ((Fraction(g), Fraction(k)) for g, k in zip(gen, cor))
        ]
    if not cfg.settings.entropy_factor and cfg.settings.allocate_by == "variance":
        return p
    sigma2 = [float(x) for x in p]
    if cfg.settings.entropy_factor:
        f = [math.sqrt(-np.expm1(-h)) if not math.isnan(h) else None for h in entropy]
        known = [x for x in f if x is not None]
        mean = math.fsum(known) / len(known) if known else 1.0
        sigma2 = [s * ((mean if x is None else x) ** 2) for s, x in zip(sigma2, f)]
    return sigma2 if cfg.settings.allocate_by == "variance" else [math.sqrt(s) for s in sigma2]


def ref_dynamo(gen, cor, keys, budget, cfg, entropy=None):
    """docs/algorithm.md#water-level-allocation (and the variants' weights) with exact rationals, one prompt at a time."""
    size, lo, hi = len(keys), cfg.g_min, cfg.g_max
    scarce = [g < cfg.settings.min_history for g in gen]
    w = ref_weights(gen, cor, entropy or [math.nan] * size, cfg)
    p = [Fraction(0) if s else Fraction(x) for s, x in zip(scarce, w)]
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
        with_history = gen >= cfg.settings.min_history
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


@settings(deadline=None, max_examples=150)
@given(data=st.data())
def test_dynamo_options_match_reference_and_are_monotone_in_weight(data):
    cfg, h, indices, budget, _ = data.draw(scenarios("dynamo", options="draw"))
    r = make_allocator(cfg).allocate(indices, h, budget)
    gen, cor = h.generated[indices].tolist(), h.correct[indices].tolist()
    ent = h.entropy_mean[indices].tolist()
    assert r.n.tolist() == ref_dynamo(gen, cor, indices.tolist(), budget, cfg, ent)
    size = indices.size
    if size * cfg.g_min <= budget <= size * cfg.g_max:
        w = np.array([float(x) for x in ref_weights(gen, cor, ent, cfg)])
        keep = np.asarray(gen) >= cfg.settings.min_history
        w, n = w[keep], r.n[keep]
        assert not ((w[:, None] > w[None, :]) & (n[:, None] < n[None, :])).any()


def ref_as_run(gen, cor, keys, budget, cfg):
    """docs/algorithm.md#dynamo-as-the-authors-run-it one prompt at a time: the priority of `update_rank`, the
    split of `get_rollout_n_per_prompt`, inside the shared budget contract."""
    size, lo, hi = len(keys), cfg.g_min, cfg.g_max
    prio = [float(ref_as_run_priority(int(g), int(k))) for g, k in zip(gen, cor)]
    b = max(lo, cfg.settings.as_run_explore_to)
    if budget > size * hi:
        return [hi] * size
    if budget < size * lo:
        n = [budget // size] * size
        first = sorted(range(size), key=lambda i: (gen[i] >= b, -prio[i], keys[i]))
        for i in first[: budget % size]:
            n[i] += 1
        return n
    return ref_as_run_fill(
        list(gen), prio, list(keys), budget, lo, hi, cfg.settings.as_run_explore_to
    )


@settings(deadline=None, max_examples=150)
@given(data=st.data())
def test_dynamo_as_run_matches_reference(data):
    cfg, h, indices, budget, _ = data.draw(scenarios("dynamo_as_run", options={}))
    r = make_allocator(cfg).allocate(indices, h, budget)
    gen, cor = h.total_generated[indices].tolist(), h.correct[indices].tolist()
    assert r.n.tolist() == ref_as_run(gen, cor, indices.tolist(), budget, cfg)


# ---------------------------------------------------------------- a toy policy from outside
# docs/design.md#adding-an-allocation-policy: a settings record with its own key, an allocator
# class that reuses `bounded_split`, and one `register(...)`; nothing in the package changes.


@dataclasses.dataclass(frozen=True)
class ToyEvenSettings(PolicySettings):
    """Even prompt indices weigh `toy_even_weight`, odd ones 1."""

    toy_even_weight: float = 2.0

    def __post_init__(self):
        self._require(self.toy_even_weight > 0, "toy_even_weight", "must be > 0")


class ToyEvenAllocator:
    def __init__(self, cfg):
        self.cfg = cfg

    def allocate(self, indices, history, budget):
        cfg, idx = self.cfg, np.asarray(indices)
        weight = np.where(idx % 2 == 0, cfg.settings.toy_even_weight, 1.0)

        def fill(pos, sub_budget):
            return water_fill(weight[pos], idx[pos], sub_budget, cfg.g_min, cfg.g_max)

        order = np.argsort(idx, kind="stable")
        n, short, _ = bounded_split(budget, idx, cfg.g_min, cfg.g_max, fill, order)
        return AllocationResult(n=n, shortfall=int(short), diagnostics={})

    def on_epoch_end(self, history):
        history.end_epoch()


@pytest.fixture
def toy_policy():
    policy = register(
        AllocationPolicy("toy_even", "a test-only toy", ToyEvenSettings, ToyEvenAllocator)
    )
    yield policy
    unregister("toy_even")


def test_a_toy_policy_registered_from_outside_runs_from_a_run_config(toy_policy):
    from configs import tiny
    from dynamo_jax.config import from_config_dict
    from dynamo_jax.errors import ConfigError

    config = tiny.get_config("method=grpo").to_dict()
    config["allocation"].update(policy="toy_even", toy_even_weight=3.0, g_min=2, g_max=8)
    run = from_config_dict(config)
    assert run.allocation.settings == ToyEvenSettings(3.0)
    # By hand: 4 prompts start at g_min = 2 (8 of 24); the other 16 are poured by weight 3:1:3:1
    # (Σ 8): ⌊16·3/8⌋ = 6 and ⌊16·1/8⌋ = 2, so n = [8, 4, 8, 4].
    allocator = make_allocator(run.allocation)
    result = allocator.allocate(np.arange(4), PromptHistory(4), 24)
    assert result.n.tolist() == [8, 4, 8, 4] and result.shortfall == 0
    config["allocation"]["toy_even_weight"] = 0.0
    with pytest.raises(ConfigError, match="AllocationConfig.toy_even_weight: must be > 0"):
        from_config_dict(config)
    with pytest.raises(ValueError, match="a setting of allocation policy 'toy_even' only"):
        AllocationConfig(policy="uniform", toy_even_weight=3.0)
