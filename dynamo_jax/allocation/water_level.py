"""Integer budget splitting: DynaMO's water-level fill (Alg. 1), E3's proportional fill, and the
bounds/budget framework every policy shares (ALGORITHM.md §5-6).

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


def proportional_fill(
    score: np.ndarray, tie_key: np.ndarray, budget: int, lo: int, hi: int
) -> np.ndarray:
    """E3: n_i = lo + ⌊(B − N·lo) k_i / Σk⌋ (capped at hi), leftover one by one in descending k.

    The leftover cycles through the prompts (one unit each per pass) in descending k,
    skipping those at hi. Needs N·lo <= budget <= N·hi.
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
