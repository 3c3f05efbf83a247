"""Per-prompt scores the allocators split the budget by (ALGORITHM.md §5-6).

- `unbiased_priority`: DynaMO's P_i, the unbiased Bernoulli variance estimate (paper Eq. 6).
- `released_priority`: the authors' released heuristic (biased, floored, per epoch).
- `e3_difficulty_rank`: E3's k_i = rank / |D| from the cumulative mean reward.
- `e3_bounds`: E3's per-epoch [G_min, G_max] curriculum.
All are pure NumPy functions of the history arrays.
"""

from __future__ import annotations

import numpy as np


def unbiased_priority(generated: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """P_i = k_i (G_i - k_i) / (G_i (G_i - 1)) for G_i > 1, else 0.

    Unbiased for p(1-p) of a Bernoulli(p) from k successes in G draws. With decayed
    (fractional) counts the same formula is applied to the effective counts.
    """
    g = np.asarray(generated, dtype=np.float64)
    k = np.asarray(correct, dtype=np.float64)
    ok = g > 1.0
    denom = np.where(ok, g * (g - 1.0), 1.0)
    # k > G cannot come from a valid history; clip so rounding in decayed counts never
    # produces a negative priority.
    p = np.where(ok, k * (g - k) / denom, 0.0)
    return np.maximum(p, 0.0)


def released_priority(
    epoch_generated: np.ndarray,
    epoch_above_mean: np.ndarray,
    previous: np.ndarray,
    floor: float,
    mastered_acc: float,
) -> np.ndarray:
    """The released trainer's per-epoch priority max(4·acc·(1-acc), floor), mastered -> floor.

    acc = this epoch's share of a prompt's rollouts whose reward beat the batch mean. Prompts
    not seen this epoch keep `previous`.
    """
    gen = np.asarray(epoch_generated, dtype=np.float64)
    seen = gen > 0
    acc = np.where(seen, np.asarray(epoch_above_mean, np.float64) / np.where(seen, gen, 1.0), 0.0)
    p = np.maximum(4.0 * acc * (1.0 - acc), floor)
    p = np.where(acc >= mastered_acc, floor, p)
    return np.where(seen, p, np.asarray(previous, dtype=np.float64))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of `values` in descending order; tied values share their mean rank."""
    order = np.argsort(-values, kind="stable")
    sorted_vals = values[order]
    # Boundaries of runs of equal values in sorted order.
    starts = np.flatnonzero(np.r_[True, sorted_vals[1:] != sorted_vals[:-1]])
    ends = np.r_[starts[1:], values.size]  # exclusive
    mean_rank = (starts + 1 + ends) / 2.0  # mean of positions start+1 .. end
    run_of_pos = np.repeat(np.arange(starts.size), ends - starts)
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = mean_rank[run_of_pos]
    return ranks


def e3_difficulty_rank(total_generated: np.ndarray, total_reward: np.ndarray) -> np.ndarray:
    """k_i = rank / |D| in (0, 1], ranking by cumulative mean reward, descending.

    The easiest prompt (highest mean reward) gets rank 1, the hardest rank |D|, so larger k
    means harder. |D| counts the prompts with any rollout; unseen prompts get k = 0 (as the
    authors' code does with its -100 sentinel: they receive G_min). Tied mean rewards share
    their average rank (**Choice**: equally hard prompts get equal k; the authors' sort
    breaks ties arbitrarily).
    """
    gen = np.asarray(total_generated, dtype=np.float64)
    seen = gen > 0
    k = np.zeros(gen.shape, dtype=np.float64)
    if not np.any(seen):
        return k
    mean_reward = np.asarray(total_reward, dtype=np.float64)[seen] / gen[seen]
    k[seen] = _average_ranks(mean_reward) / mean_reward.size
    return k


def e3_bounds(
    epochs_completed: int, n_avg: int, g_min: int, g_max: int, step: int
) -> tuple[int, int]:
    """E3's curriculum: [G, G] in the first epoch, widening by `step` each epoch to the limits."""
    widen = step * int(epochs_completed)
    return max(g_min, n_avg - widen), min(g_max, n_avg + widen)
