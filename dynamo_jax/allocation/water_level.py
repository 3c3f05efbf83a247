"""Integer budget splitting: DynaMO's water-level fill (Alg. 1), the split the DynaMO authors'
script runs, E3's proportional fill, and the bounds/budget framework every policy shares
(docs/algorithm.md#water-level-allocation, docs/algorithm.md#e3-allocation).

All functions work on positions 0..N-1 of one batch. Ties are broken by a per-prompt
`tie_key` (the dense prompt index), never by position, so permuting a batch permutes the
result and nothing else. Every loop is over allocation rounds, each round vectorised.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Fill = Callable[[np.ndarray, int], np.ndarray]  # (positions, budget) -> n for those positions

# ⌊x⌋ of a float share whose exact value is an integer can land one below it (e.g. 3·(1/3)/1
# evaluates to 0.999…); this slack restores it. Overshooting the budget would take more than
# 1/_FLOOR_SLACK shares each just below an integer, and `_floor_shares` checks anyway.
_FLOOR_SLACK = 1e-7


def _floor_shares(units: int, weight: np.ndarray, total: float) -> np.ndarray:
    """⌊units · weight / total⌋ elementwise, robust to float rounding at integer values."""
    exact = units * weight / total
    share = np.floor(exact + _FLOOR_SLACK)
    if share.sum() > units:  # only reachable with absurdly many prompts; stay exact-safe
        share = np.floor(exact)
    return share


def order_desc(score: np.ndarray, tie_key: np.ndarray) -> np.ndarray:
    """Positions sorted by score descending, then tie_key ascending."""
    return np.lexsort((tie_key, -np.asarray(score, dtype=np.float64)))


def give_round_robin(n: np.ndarray, order: np.ndarray, units: int, cap: int) -> np.ndarray:
    """Hand out `units` one at a time along `order`, skipping prompts at `cap`, cycling if needed."""
    n = n.copy()
    while units > 0:
        open_ = order[n[order] < cap]
        if open_.size == 0:
            raise ValueError(f"cannot place {units} more rollouts: every prompt is at {cap}")
        take = open_[:units]
        n[take] += 1
        units -= take.size
    return n


def water_fill(
    priority: np.ndarray, tie_key: np.ndarray, budget: int, lo: int, hi: int
) -> np.ndarray:
    """Alg. 1 steps 1-2: start everyone at `lo`, pour the rest in proportion to priority.

    Each round gives every eligible prompt (n < hi) Δ_i = min(⌊B_rem P_i / Σ_E P⌋, hi − n_i)
    (or ⌊B_rem / |E|⌋ when Σ_E P = 0). When every Δ is 0, the remaining units (then fewer
    than |E|) go one each to the eligible prompts with the largest P_i, i.e. the largest
    remainders. Needs N·lo <= budget <= N·hi.
    """
    p = np.asarray(priority, dtype=np.float64)
    n = np.full(p.size, lo, dtype=np.int64)
    rem = int(budget) - p.size * lo
    if rem < 0 or rem > p.size * (hi - lo):
        raise ValueError(f"water_fill: budget {budget} outside [{p.size * lo}, {p.size * hi}]")
    order = order_desc(p, tie_key)
    while rem > 0:
        eligible = n < hi
        total = p[eligible].sum()
        if total > 0:
            share = _floor_shares(rem, np.where(eligible, p, 0.0), total)
        else:
            share = np.full(p.size, float(rem // int(eligible.sum())))
        delta = np.where(eligible, np.minimum(share, hi - n), 0).astype(np.int64)
        if delta.sum() == 0:
            return give_round_robin(n, order, rem, hi)
        n += delta
        rem -= int(delta.sum())
    return n


# The authors' pour takes only prompts whose priority exceeds this (it zeroes smaller ones).
AS_RUN_MIN_PRIORITY = 1e-8


def _cut_from_top(n: np.ndarray, tie_key: np.ndarray, excess: int, lo: int) -> np.ndarray:
    """Take `excess` units one at a time from the largest n_i above `lo`, ties by tie_key."""
    n = n.copy()
    while excess > 0:
        top = n.max()
        if top <= lo:
            raise ValueError(f"cannot take {excess} more rollouts: every prompt is at {lo}")
        at_top = np.flatnonzero(n == top)
        take = at_top[np.argsort(tie_key[at_top], kind="stable")][:excess]
        n[take] -= 1
        excess -= take.size
    return n


def as_run_fill(
    generated: np.ndarray,
    priority: np.ndarray,
    tie_key: np.ndarray,
    budget: int,
    lo: int,
    hi: int,
    explore_to: int,
) -> np.ndarray:
    """The DynaMO authors' split, `dynamo_ray_trainer.get_rollout_n_per_prompt` (63e5ec9).

    With b = max(lo, explore_to) (their `initial_budget = max(n_low, 4)`):
    1. exploration: a prompt with G_i < b gets e_i = min(b − G_i, hi); the others 0;
    2. raise: everyone to at least lo, n_i = max(e_i, lo). If that exceeds the budget, their
       scaled branch: n_i = max(⌊e_i · B / Σe⌋, lo), then one unit at a time off the largest
       n_i (> lo) until Σn = B;
    3. pour: while units are left, over E = {n_i < hi, P_i > 1e-8}: a_i = B_rem · P_i / Σ_E P,
       ⌊a_i⌋ each, and the round's remainder B_rem − Σ⌊a⌋ one each to the largest fractional
       parts; each capped at hi − n_i;
    4. leftover (E empty, e.g. every priority is −1 in the first epoch): one each, cycling,
       over the prompts below hi.
    Needs N·lo <= budget <= N·hi.

    **Choice**, where their code gives the same result whenever it keeps its own bounds:
    - step 2's scaled branch also runs when Σe fits the budget but Σ max(e_i, lo) does not
      (their code then raises the others only partly, leaving some below n_low; it cannot
      happen with their b = n_low = 8, only with lo < explore_to and n_avg < explore_to);
    - ties (equal fractional parts, equal n_i in the cut) go to the smaller tie_key, and the
      leftover cycles in tie_key order skipping prompts at hi (theirs follow batch position,
      and their fixed cycle could pass hi when the open prompts' room differs).
    """
    g = np.asarray(generated, dtype=np.float64)
    p = np.asarray(priority, dtype=np.float64)
    key = np.asarray(tie_key)
    size = p.size
    budget = int(budget)
    if budget < size * lo or budget > size * hi:
        raise ValueError(f"as_run_fill: budget {budget} outside [{size * lo}, {size * hi}]")
    b = max(lo, explore_to)
    explore = np.minimum(np.maximum(b - g, 0.0), hi).astype(np.int64)
    n = np.maximum(explore, lo)
    if n.sum() > budget:
        scale = min(1.0, budget / explore.sum())  # their float scale, floored by astype
        n = np.maximum((explore * scale).astype(np.int64), lo)
        n = _cut_from_top(n, key, int(n.sum()) - budget, lo)
    rem = budget - int(n.sum())
    weight = np.where(p > AS_RUN_MIN_PRIORITY, p, 0.0)
    while rem > 0:
        e = np.flatnonzero((n < hi) & (weight > AS_RUN_MIN_PRIORITY))
        if e.size == 0:
            break
        ideal = rem * (weight[e] / weight[e].sum())
        add = np.floor(ideal)
        extra = int(np.round(rem - add.sum()))
        if extra > 0:
            add[np.lexsort((key[e], -(ideal - add)))[:extra]] += 1
        add = np.minimum(add, hi - n[e]).astype(np.int64)
        n[e] += add
        rem -= int(add.sum())
    return give_round_robin(n, np.argsort(key, kind="stable"), rem, hi)


def proportional_fill(
    score: np.ndarray, tie_key: np.ndarray, budget: int, lo: int, hi: int
) -> np.ndarray:
    """E3: n_i = lo + ⌊(B − N·lo) k_i / Σk⌋ (capped at hi), leftover one by one in descending k.

    The leftover cycles through the prompts (one unit each per pass) in descending k,
    skipping those at hi. Needs N·lo <= budget <= N·hi. (The E3 authors' code divides by
    Σk + 1e-8, does not cap at hi, and gives the leftover greedily to the hardest prompt up to
    hi; see `E3Allocator`.)
    """
    k = np.asarray(score, dtype=np.float64)
    rem = int(budget) - k.size * lo
    if rem < 0 or rem > k.size * (hi - lo):
        raise ValueError(
            f"proportional_fill: budget {budget} outside [{k.size * lo}, {k.size * hi}]"
        )
    total = k.sum()
    extra = _floor_shares(rem, k, total) if total > 0 else np.zeros(k.size)
    n = lo + np.minimum(extra, hi - lo).astype(np.int64)
    return give_round_robin(n, order_desc(k, tie_key), int(budget - n.sum()), hi)


def spread_evenly(tie_key: np.ndarray, total: int) -> np.ndarray:
    """`total` over len(tie_key) prompts: ⌊total/N⌋ each, the remainder one each by tie_key."""
    size = tie_key.size
    n = np.full(size, total // size, dtype=np.int64)
    n[np.argsort(tie_key, kind="stable")[: total - size * (total // size)]] += 1
    return n


def bounded_split(
    budget: int,
    tie_key: np.ndarray,
    lo: int,
    hi: int,
    fill: Fill,
    floor_order: np.ndarray,
    fixed_mask: np.ndarray | None = None,
    fixed_target: int = 0,
) -> tuple[np.ndarray, int, bool]:
    """The budget framework shared by every policy; returns (n, shortfall, floor_lowered).

    - N·hi < budget: everyone gets hi and the shortfall budget − N·hi is reported.
    - budget < N·lo: the floor drops uniformly to ⌊budget/N⌋ and the remainder goes one each
      along `floor_order` (the budget is a hard constraint; bounds give way).
    - otherwise prompts in `fixed_mask` (data-scarce / exploring) share as close to
      `fixed_target` each as the bounds of everyone allow, evenly, and `fill` splits the rest
      over the others within [lo, hi].
    """
    size = tie_key.size
    if size == 0:
        return np.zeros(0, dtype=np.int64), int(budget), False
    if budget > size * hi:
        return np.full(size, hi, dtype=np.int64), int(budget - size * hi), False
    if budget < size * lo:
        floor = budget // size
        n = np.full(size, floor, dtype=np.int64)
        return give_round_robin(n, floor_order, budget - size * floor, floor + 1), 0, True
    fixed = np.zeros(size, bool) if fixed_mask is None else np.asarray(fixed_mask, bool)
    n_fixed, n_rest = int(fixed.sum()), int(size - fixed.sum())
    n = np.zeros(size, dtype=np.int64)
    fixed_total = 0
    if n_fixed:
        # Keep the rest feasible: it must absorb between n_rest·lo and n_rest·hi.
        low = max(n_fixed * lo, budget - n_rest * hi)
        high = min(n_fixed * hi, budget - n_rest * lo)
        fixed_total = int(np.clip(n_fixed * fixed_target, low, high))
        n[fixed] = spread_evenly(tie_key[fixed], fixed_total)
    if n_rest:
        rest = np.flatnonzero(~fixed)
        n[rest] = fill(rest, budget - fixed_total)
    return n, 0, False
