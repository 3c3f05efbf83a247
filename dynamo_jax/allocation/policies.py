"""Rollout allocation policies behind one interface (docs/algorithm.md#water-level-allocation, docs/algorithm.md#e3-allocation).

    allocator = make_allocator(cfg)
    result = allocator.allocate(indices, history, budget)   # result.n aligned with indices
    ... generate result.n[i] rollouts for prompt indices[i], score them ...
    history.update(indices, result.n, n_correct, reward_sum, entropy_mean=mean_entropy)
    at the end of each pass over the dataset: allocator.on_epoch_end(history)

Postconditions, for every policy: Σ n_i = budget exactly unless N·G_max < budget (then every
n_i = G_max and `shortfall` says by how much); G_min <= n_i <= G_max unless the budget
cannot cover N·G_min (then the floor drops to ⌊budget/N⌋); equal inputs give equal outputs;
permuting `indices` permutes `n` with it (ties are broken by the dense prompt index).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol

import numpy as np

from dynamo_jax.allocation.history import PromptHistory, check_indices
from dynamo_jax.allocation.priorities import (
    as_run_priority,
    e3_bounds,
    e3_difficulty_rank,
    entropy_factor,
    posterior_priority,
    released_priority,
    unbiased_priority,
)
from dynamo_jax.allocation.water_level import (
    as_run_fill,
    bounded_split,
    order_desc,
    proportional_fill,
    water_fill,
)

# The allocators take the `AllocationConfig` (allocation/config.py), which imports the registry,
# which imports this module: typed `Any` here so the import graph has no cycle.
AllocationConfig = Any


@dataclasses.dataclass(frozen=True)
class AllocationResult:
    """n[i] rollouts for prompt indices[i]; shortfall = budget − Σn (> 0 only when N·G_max < B)."""

    n: np.ndarray  # int64 [I]
    shortfall: int
    diagnostics: dict[str, float]


class Allocator(Protocol):
    def allocate(
        self, indices: np.ndarray, history: PromptHistory, budget: int
    ) -> AllocationResult: ...

    def on_epoch_end(self, history: PromptHistory) -> None: ...


def _check_budget(budget) -> int:
    try:
        ok = not isinstance(budget, bool) and int(budget) == budget and budget >= 0
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"allocate: budget must be a non-negative integer, got {budget!r}")
    return int(budget)


def _result(n, shortfall, lowered, extra: dict[str, float]) -> AllocationResult:
    diagnostics = {
        "alloc/n_min": float(n.min()) if n.size else 0.0,
        "alloc/n_max": float(n.max()) if n.size else 0.0,
        "alloc/n_mean": float(n.mean()) if n.size else 0.0,
        "alloc/shortfall": float(shortfall),
        "alloc/floor_lowered": float(lowered),
    }
    diagnostics.update(extra)
    return AllocationResult(n=n, shortfall=int(shortfall), diagnostics=diagnostics)


def _priority_stats(priority: np.ndarray, with_history: np.ndarray) -> dict[str, float]:
    p = priority[with_history]
    return {
        "alloc/priority_mean": float(p.mean()) if p.size else 0.0,
        "alloc/num_zero_priority": float(np.sum(p == 0)),
    }


class UniformAllocator:
    """n_avg for every prompt (GRPO; DynaMO's "DRA off" ablation)."""

    def __init__(self, cfg: AllocationConfig):
        self.cfg = cfg

    def allocate(
        self, indices: np.ndarray, history: PromptHistory, budget: int
    ) -> AllocationResult:
        idx = check_indices(indices, history.num_prompts, "allocate: indices")
        budget = _check_budget(budget)
        zero = np.zeros(idx.size)

        def fill(pos, sub_budget):
            return water_fill(zero[pos], idx[pos], sub_budget, self.cfg.g_min, self.cfg.g_max)

        n, short, lowered = bounded_split(
            budget, idx, self.cfg.g_min, self.cfg.g_max, fill, np.argsort(idx, kind="stable")
        )
        return _result(n, short, lowered, {})

    def on_epoch_end(self, history: PromptHistory) -> None:
        history.end_epoch()


class _PriorityWaterLevel:
    """Shared shape of "dynamo" and "dynamo_released": a fixed group + water-level fill."""

    def __init__(self, cfg: AllocationConfig):
        self.cfg = cfg

    def _fixed_and_priority(self, idx, history) -> tuple[np.ndarray, np.ndarray, int, dict]:
        """(fixed group, fill weight, the fixed group's target, extra diagnostics)."""
        raise NotImplementedError

    def allocate(
        self, indices: np.ndarray, history: PromptHistory, budget: int
    ) -> AllocationResult:
        cfg = self.cfg
        idx = check_indices(indices, history.num_prompts, "allocate: indices")
        budget = _check_budget(budget)
        fixed, priority, target, diagnostics = self._fixed_and_priority(idx, history)

        def fill(pos, sub_budget):
            return water_fill(priority[pos], idx[pos], sub_budget, cfg.g_min, cfg.g_max)

        # If even the floor is unaffordable, the few spare units go to the fixed group first
        # (they have no estimate yet), then by priority.
        floor_order = order_desc(priority + 2.0 * fixed, idx)
        n, short, lowered = bounded_split(
            budget, idx, cfg.g_min, cfg.g_max, fill, floor_order, fixed, target
        )
        extra = {"alloc/num_fixed": float(fixed.sum()), **diagnostics}
        extra.update(_priority_stats(priority, ~fixed))
        return _result(n, short, lowered, extra)


# σ_i² estimates by `DynamoSettings.priority`, and the water-fill weight as a function of
# the σ_i² estimate by `DynamoSettings.allocate_by` (docs/algorithm.md#allocation-variants).
_SIGMA2 = {
    "unbiased": lambda g, k, s: unbiased_priority(g, k),
    "posterior": lambda g, k, s: posterior_priority(g, k, s.prior_a, s.prior_b),
}
_WEIGHT = {"variance": lambda sigma2: sigma2, "std": np.sqrt}


def entropy_factors(entropy_mean: np.ndarray) -> tuple[np.ndarray, float]:
    """f(H̄_i) per prompt of a batch, and the share of prompts with a recorded entropy.

    **Choice**: a prompt with no entropy yet (NaN) gets the batch's mean f over the prompts
    that have one, or 1 when none has; it is then neither favoured (f = 1 would outrank every
    measured prompt, f < 1 always) nor starved (f = 0) against the batch it competes with.
    Only the ratios of the weights matter to the fill, so a common factor changes nothing.
    The mean is an exactly rounded sum (fsum), so it does not depend on the batch's order.
    """
    f = entropy_factor(entropy_mean)
    known = np.isfinite(f)
    fill = math.fsum(f[known]) / int(known.sum()) if known.any() else 1.0
    return np.where(known, f, fill), float(known.mean()) if f.size else 0.0


class DynamoAllocator(_PriorityWaterLevel):
    """DynaMO paper Alg. 1, and the options of docs/algorithm.md#allocation-variants; data-scarce prompts get n_avg.

    The fill's weight for prompt i is w_i = (σ̂_i²)^e with e = 1 (`allocate_by="variance"`,
    Alg. 1, n_i ∝ P_i) or e = ½ (`"std"`, Appendix C Eq. 36, n_i ∝ σ_i), where σ̂_i² = P_i
    (`priority`: the unbiased Eq. 6 estimate or the Beta posterior mean of p(1 − p)), times
    f(H̄_i)² when `entropy_factor` (Eq. 42 scales σ_i by f: the variance weight gains f², the
    std weight f). The default options are the paper's rule exactly.
    """

    def __init__(self, cfg: AllocationConfig):
        super().__init__(cfg)
        self.settings = cfg.settings  # DynamoSettings
        self._sigma2 = _SIGMA2[self.settings.priority]
        self._weight = _WEIGHT[self.settings.allocate_by]

    def _fixed_and_priority(self, idx, history):
        cfg, s = self.cfg, self.settings
        scarce = history.generated[idx] < s.min_history
        sigma2 = self._sigma2(history.generated[idx], history.correct[idx], s)
        diagnostics = {}
        if s.entropy_factor:
            f, known = entropy_factors(history.entropy_mean[idx])
            sigma2 = sigma2 * f**2
            diagnostics["alloc/entropy_known_share"] = known
        weight = self._weight(sigma2)
        return scarce, np.where(scarce, 0.0, weight), cfg.n_avg, diagnostics

    def on_epoch_end(self, history: PromptHistory) -> None:
        history.end_epoch()


class AsRunDynamoAllocator:
    """What the DynaMO authors' released script runs (docs/algorithm.md#dynamo-as-the-authors-run-it).

    GithubX-F/DynaMO-RL at 63e5ec9, `run_qwen2.5-math-7b.sh` (rollout_allocation=True,
    n_low=8, n_high=24): the priority of verl's default dataset class (`as_run_priority`:
    Eq. 6 + tie-break, floored, mastered prompts at the floor, −1 while G < 4) from
    cumulative counts, split by `get_rollout_n_per_prompt` (`as_run_fill`: exploration up to
    b = max(g_min, 4) rollouts in total, the raise to g_min, the proportional pour with
    largest-fractional-part rounding, the leftover round-robin). With g_min = 8 every prompt
    with G < 8 is topped up to 8 first; in the first epoch every priority is −1, so the
    allocation is uniform.
    Not copied: their trainer repeats the prompt metadata n times while generating n_i per
    prompt, so their counts land on the wrong prompts (docs/algorithm.md#grpo-advantages); here the history is
    grouped by prompt id. Their budget n·N is raised to N·n_low when smaller; here the budget
    is a hard constraint (the shared framework lowers the floor instead).
    """

    def __init__(self, cfg: AllocationConfig):
        self.cfg = cfg
        self.settings = cfg.settings  # AsRunSettings

    def allocate(
        self, indices: np.ndarray, history: PromptHistory, budget: int
    ) -> AllocationResult:
        cfg, s = self.cfg, self.settings
        idx = check_indices(indices, history.num_prompts, "allocate: indices")
        budget = _check_budget(budget)
        # decay is 1 for this policy (config check), so `correct` is the cumulative k.
        g = history.total_generated[idx]
        priority = as_run_priority(
            g,
            history.correct[idx],
            s.as_run_min_history,
            s.as_run_priority_floor,
            s.as_run_mastered_acc,
            s.as_run_tie_break,
        )
        explore_to = max(cfg.g_min, s.as_run_explore_to)
        exploring = g < explore_to

        def fill(pos, sub_budget):
            return as_run_fill(
                g[pos], priority[pos], idx[pos], sub_budget, cfg.g_min, cfg.g_max, explore_to
            )

        # If even the floor is unaffordable, the spare units go to exploring prompts first.
        floor_order = np.lexsort((idx, -priority, ~exploring))
        n, short, lowered = bounded_split(budget, idx, cfg.g_min, cfg.g_max, fill, floor_order)
        extra = {"alloc/num_exploring": float(exploring.sum())}
        extra.update(_priority_stats(priority, priority >= 0))
        return _result(n, short, lowered, extra)

    def on_epoch_end(self, history: PromptHistory) -> None:
        history.end_epoch()


class ReleasedDynamoAllocator(_PriorityWaterLevel):
    """The heuristic of the DynaMO recipe's own dataset class, for comparison.

    The authors' script never runs it: it trains with verl's default dataset class (see
    `AsRunDynamoAllocator`), and `recipe/dynamo/rl_dataset.py` never emits the `sample_count`
    their trainer reads, so it cannot run with allocation on (docs/algorithm.md#dynamo-as-the-authors-run-it).
    Priority max(4·acc·(1−acc), floor) with acc = share of rewards above the batch mean,
    mastered prompts (acc >= 0.85) at the floor, recomputed once per epoch; prompts with
    fewer than `released_explore_below` rollouts so far get `released_explore_rollouts`.
    **Choice**: the rest of the budget is split by the same water-level fill as "dynamo", so
    both variants meet the same budget and bounds contract and differ only in their priority.
    """

    def _fixed_and_priority(self, idx, history):
        cfg, s = self.cfg, self.cfg.settings  # ReleasedSettings
        explore = history.total_generated[idx] < s.released_explore_below
        target = int(np.clip(s.released_explore_rollouts, cfg.g_min, cfg.g_max))
        return explore, np.where(explore, 0.0, history.released_priority[idx]), target, {}

    def on_epoch_end(self, history: PromptHistory) -> None:
        history.released_priority = released_priority(
            history.epoch_generated,
            history.epoch_above_mean,
            history.released_priority,
            self.cfg.settings.released_priority_floor,
            self.cfg.settings.released_mastered_acc,
        )
        history.end_epoch()


class E3Allocator:
    """E3 rank allocation: harder prompts (larger k_i) get more, within the epoch's bounds.

    The paper's rule (docs/algorithm.md#e3-allocation): ranks re-computed at each epoch end
    (`e3_difficulty_rank`), the split by `proportional_fill`, the bounds widening from [G, G]
    by `e3_curriculum_step` per epoch (`e3_bounds`; the authors' `n_update = 2`).
    **Code differs** (LiaoMengqi/E3-RL4LLMs at 7e90b8e, `get_rollout_n_per_prompt` and
    `RLHFDataset.update_rank`), not reproduced here (no parity mode):
    - ranks from 0 over the whole dataset, unseen prompts as mean reward 0, ties in dataset
      order (see `e3_difficulty_rank`);
    - the proportional part divides by Σk + 1e-8, so an exactly integral share floors one low,
      and it is not capped at G_max (a prompt can exceed the epoch's G_max);
    - the leftover goes greedily, min(left, G_max − n_i) to the hardest prompt, then the next,
      rather than one unit per prompt per pass; when every prompt is at G_max the rest is
      silently dropped (Σ n_i < B), where here the shortfall is reported;
    - the curriculum is the same: G_min = G_max = G in the first epoch, then −2 / +2 per epoch
      up to the configured limits.
    """

    def __init__(self, cfg: AllocationConfig):
        self.cfg = cfg

    def bounds(self, history: PromptHistory) -> tuple[int, int]:
        cfg = self.cfg
        step = cfg.settings.e3_curriculum_step  # E3Settings
        return e3_bounds(history.epochs_completed, cfg.n_avg, cfg.g_min, cfg.g_max, step)

    def allocate(
        self, indices: np.ndarray, history: PromptHistory, budget: int
    ) -> AllocationResult:
        idx = check_indices(indices, history.num_prompts, "allocate: indices")
        budget = _check_budget(budget)
        lo, hi = self.bounds(history)
        rank = history.e3_rank[idx]

        def fill(pos, sub_budget):
            return proportional_fill(rank[pos], idx[pos], sub_budget, lo, hi)

        n, short, lowered = bounded_split(budget, idx, lo, hi, fill, order_desc(rank, idx))
        extra = {
            "alloc/e3_g_min": float(lo),
            "alloc/e3_g_max": float(hi),
            "alloc/e3_rank_mean": float(rank.mean()) if rank.size else 0.0,
        }
        return _result(n, short, lowered, extra)

    def on_epoch_end(self, history: PromptHistory) -> None:
        history.e3_rank = e3_difficulty_rank(history.total_generated, history.total_reward)
        history.end_epoch()


def make_history(cfg: AllocationConfig, num_prompts: int) -> PromptHistory:
    """An empty history for a dataset of `num_prompts` rows, with the config's decay."""
    return PromptHistory(num_prompts, decay=cfg.decay)
