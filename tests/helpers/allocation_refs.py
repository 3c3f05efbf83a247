"""Scalar references of the allocation formulas, one prompt at a time, shared by the allocation
tests (docs/algorithm.md#water-level-allocation, docs/algorithm.md#dynamo-as-the-authors-run-it).
Written from the text, not the code, in exact rationals where the formula allows."""

from __future__ import annotations

import math
from fractions import Fraction


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


def ref_as_run_priority(g, k):
    """verl `RLHFDataset.update_rank` (DynaMO-RL 63e5ec9) for one prompt, exact arithmetic."""
    if g < 4:
        return Fraction(-1)
    acc = Fraction(k, g)
    if acc >= Fraction(85, 100):
        return Fraction(1, 100)
    return max(
        Fraction(k * (g - k), g * (g - 1)) + (1 - acc) * Fraction(1, 10**6), Fraction(1, 100)
    )


def ref_as_run_fill(gen, prio, keys, budget, lo, hi, explore_to):
    """`get_rollout_n_per_prompt` (GithubX-F/DynaMO-RL 63e5ec9) one prompt at a time, in float64
    as theirs, with the two documented choices: ties by key, and the bounds kept (the scaled
    branch also when the raise to lo does not fit; the leftover cycle skips full prompts)."""
    size = len(prio)
    by_key = sorted(range(size), key=lambda i: keys[i])
    b = max(lo, explore_to)
    need = [min(max(0, b - g), hi) for g in gen]
    n = [max(e, lo) for e in need]
    if sum(n) > budget:
        scale = min(1.0, budget / sum(need))
        n = [max(int(e * scale), lo) for e in need]
        while sum(n) > budget:  # one unit off the largest (first by key among equals)
            n[max((i for i in by_key if n[i] > lo), key=lambda i: n[i])] -= 1
    rem = budget - sum(n)
    while rem > 0:
        e = [i for i in range(size) if n[i] < hi and prio[i] > 1e-8]
        if not e:
            break
        total = math.fsum(prio[i] for i in e)
        ideal = {i: rem * (prio[i] / total) for i in e}
        add = {i: math.floor(ideal[i]) for i in e}
        extra = round(rem - sum(add.values()))
        for i in sorted(e, key=lambda i: (-(ideal[i] - add[i]), keys[i]))[:extra]:
            add[i] += 1
        for i in e:
            give = min(add[i], hi - n[i])
            n[i] += give
            rem -= give
    while rem > 0:
        for i in by_key:
            if rem > 0 and n[i] < hi:
                n[i] += 1
                rem -= 1
    return n
