"""Per-prompt scores the allocators split the budget by (docs/algorithm.md#water-level-allocation, docs/algorithm.md#allocation-variants, docs/algorithm.md#e3-allocation).

- `unbiased_priority`: DynaMO's P_i, the unbiased Bernoulli variance estimate (paper Eq. 6).
- `posterior_priority`: the Beta-posterior mean of p(1 − p) (docs/algorithm.md#allocation-variants, never 0 before a success).
- `entropy_factor`: f(H̄) = sqrt(1 − exp(−H̄)), the paper's entropy proxy for σ_i (Eq. 42).
- `as_run_priority`: the priority the authors' released script computes (docs/algorithm.md#dynamo-as-the-authors-run-it).
- `released_priority`: the recipe's other heuristic (biased, floored, per epoch; never run).
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


def posterior_priority(
    generated: np.ndarray, correct: np.ndarray, a: float = 1.0, b: float = 1.0
) -> np.ndarray:
    """E[p(1 − p)] under the Beta(a + k, b + G − k) posterior of a Beta(a, b) prior.

    With α = a + k, β = b + G − k: E[p] − E[p²] = α/(α+β) − α(α+1)/((α+β)(α+β+1))
    = αβ / ((α+β)(α+β+1)) = (k+a)(G−k+b) / ((G+a+b)(G+a+b+1)). Positive for every prompt
    (unlike Eq. 6, which is 0 until a prompt has both a success and a failure), the prior's
    ab/((a+b)(a+b+1)) = 1/6 at G = 0 for a = b = 1, and k(G−k)/G² + O(1/G) as G grows.
    Decayed (fractional) counts are used as they are.
    """
    g = np.asarray(generated, dtype=np.float64)
    k = np.clip(np.asarray(correct, dtype=np.float64), 0.0, g)
    total = g + a + b
    return (k + a) * (g - k + b) / (total * (total + 1.0))


def entropy_factor(entropy_mean: np.ndarray) -> np.ndarray:
    """f(H̄) = sqrt(1 − exp(−H̄)) (paper Eq. 42): 0 for a collapsed policy, → 1 as H̄ grows.

    NaN (no entropy recorded) stays NaN: what an unknown prompt gets is the caller's choice.
    """
    h = np.asarray(entropy_mean, dtype=np.float64)
    return np.sqrt(-np.expm1(-h))


def as_run_priority(
    generated: np.ndarray,
    correct: np.ndarray,
    min_history: int = 4,
    floor: float = 0.01,
    mastered_acc: float = 0.85,
    tie_break: float = 1e-6,
) -> np.ndarray:
    """The priority the authors' released script trains with (docs/algorithm.md#dynamo-as-the-authors-run-it).

    verl's `RLHFDataset.update_rank` at GithubX-F/DynaMO-RL 63e5ec9, from cumulative,
    never-decayed counts (G rollouts, k with reward > 0):
      −1                                          while G < min_history (left out of the pour)
      floor                                       when k/G >= mastered_acc ("mastered")
      max(k(G−k)/(G(G−1)) + (1 − k/G)·tie_break, floor)   otherwise
    The tie-break puts the less accurate of two prompts with equal Eq. 6 variance first.
    Their trainer refreshes it once per epoch, from the counts of the epoch just ended; each
    prompt is drawn at most once per epoch, so at every draw those are the prompt's current
    counts and computing it at allocation time, as here, gives the same value.
    """
    g = np.asarray(generated, dtype=np.float64)
    k = np.asarray(correct, dtype=np.float64)
    seen = g >= min_history
    safe_g = np.where(seen, g, 2.0)
    acc = np.where(seen, k / safe_g, 0.0)
    variance = k * (safe_g - k) / (safe_g * (safe_g - 1.0))
    p = np.maximum(variance + (1.0 - acc) * tie_break, floor)
    p = np.where(acc >= mastered_acc, floor, p)
    return np.where(seen, p, -1.0)


def released_priority(
    epoch_generated: np.ndarray,
    epoch_above_mean: np.ndarray,
    previous: np.ndarray,
    floor: float,
    mastered_acc: float,
) -> np.ndarray:
    """The recipe dataset class's per-epoch priority max(4·acc·(1-acc), floor), mastered -> floor.

    acc = this epoch's share of a prompt's rollouts whose reward beat the batch mean. Prompts
    not seen this epoch keep `previous`. (`recipe/dynamo/rl_dataset.py`; the authors' script
    trains with verl's default dataset class instead, see `as_run_priority`.)
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
    means harder. |D| counts the prompts with any rollout; unseen prompts get k = 0 (they
    receive G_min). Tied mean rewards share their average rank (**Choice**: equally hard
    prompts get equal k).

    **Code differs** (E3's `RLHFDataset.update_rank`, LiaoMengqi/E3-RL4LLMs at 7e90b8e):
    - ranks count from 0, k = position / |D| in [0, 1): the easiest prompt gets k = 0 and
      so only G_min, and no prompt reaches k = 1;
    - |D| is the whole dataset: a prompt never rolled out sorts as mean reward 0 among the
      hardest (only before the first re-rank does its −100 sentinel make it k = 0);
    - ties keep the dataset order (Python's stable sort), so equally hard prompts get
      different k by their row number.
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
