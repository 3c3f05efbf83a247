"""Rollout allocation policies behind one interface (ALGORITHM.md §5-6).

    allocator = make_allocator(cfg)
    result = allocator.allocate(indices, history, budget)   # result.n aligned with indices
    ... generate result.n[i] rollouts for prompt indices[i], score them ...
    history.update(indices, result.n, n_correct, reward_sum)
    at the end of each pass over the dataset: allocator.on_epoch_end(history)

Postconditions, for every policy: Σ n_i = budget exactly unless N·G_max < budget (then every
n_i = G_max and `shortfall` says by how much); G_min <= n_i <= G_max unless the budget
cannot cover N·G_min (then the floor drops to ⌊budget/N⌋); equal inputs give equal outputs;
permuting `indices` permutes `n` with it (ties are broken by the dense prompt index).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from dynamo_jax.allocation.config import AllocationConfig
from dynamo_jax.allocation.history import PromptHistory, check_indices
from dynamo_jax.allocation.priorities import (
    e3_bounds,
    e3_difficulty_rank,
    released_priority,
    unbiased_priority,
)
from dynamo_jax.allocation.water_level import (
    bounded_split,
    order_desc,
    proportional_fill,
    water_fill,
)


@dataclasses.dataclass(frozen=True)
class AllocationResult:
    """n[i] rollouts for prompt indices[i]; shortfall = budget − Σn (> 0 only when N·G_max < B)."""

    n: np.ndarray  # int64 [N]
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

    def _fixed_and_priority(self, idx, history) -> tuple[np.ndarray, np.ndarray, int]:
        raise NotImplementedError

    def allocate(
        self, indices: np.ndarray, history: PromptHistory, budget: int
    ) -> AllocationResult:
        cfg = self.cfg
        idx = check_indices(indices, history.num_prompts, "allocate: indices")
        budget = _check_budget(budget)
        fixed, priority, target = self._fixed_and_priority(idx, history)

        def fill(pos, sub_budget):
            return water_fill(priority[pos], idx[pos], sub_budget, cfg.g_min, cfg.g_max)

        # If even the floor is unaffordable, the few spare units go to the fixed group first
        # (they have no estimate yet), then by priority.
        floor_order = order_desc(priority + 2.0 * fixed, idx)
        n, short, lowered = bounded_split(
            budget, idx, cfg.g_min, cfg.g_max, fill, floor_order, fixed, target
        )
        extra = {"alloc/num_fixed": float(fixed.sum())}
        extra.update(_priority_stats(priority, ~fixed))
        return _result(n, short, lowered, extra)


class DynamoAllocator(_PriorityWaterLevel):
    """DynaMO paper Alg. 1 with the unbiased priority; data-scarce prompts get n_avg."""

    def _fixed_and_priority(self, idx, history):
        scarce = history.generated[idx] < self.cfg.min_history
        priority = unbiased_priority(history.generated[idx], history.correct[idx])
        return scarce, np.where(scarce, 0.0, priority), self.cfg.n_avg

    def on_epoch_end(self, history: PromptHistory) -> None:
        history.end_epoch()


class ReleasedDynamoAllocator(_PriorityWaterLevel):
    """The authors' released heuristic (ALGORITHM.md §5 "Code differs"), for comparison.

    Priority max(4·acc·(1−acc), floor) with acc = share of rewards above the batch mean,
    mastered prompts (acc >= 0.85) at the floor, recomputed once per epoch; prompts with
    fewer than `released_explore_below` rollouts so far get `released_explore_rollouts`.
    **Choice**: the rest of the budget is split by the same water-level fill as "dynamo", so
    both variants meet the same budget and bounds contract and differ only in their priority.
    """

    def _fixed_and_priority(self, idx, history):
        cfg = self.cfg
        explore = history.total_generated[idx] < cfg.released_explore_below
        target = int(np.clip(cfg.released_explore_rollouts, cfg.g_min, cfg.g_max))
        return explore, np.where(explore, 0.0, history.released_priority[idx]), target

    def on_epoch_end(self, history: PromptHistory) -> None:
        history.released_priority = released_priority(
            history.epoch_generated,
            history.epoch_above_mean,
            history.released_priority,
            self.cfg.released_priority_floor,
            self.cfg.released_mastered_acc,
        )
        history.end_epoch()


class E3Allocator:
    """E3 rank allocation: harder prompts (larger k_i) get more, within the epoch's bounds."""

    def __init__(self, cfg: AllocationConfig):
        self.cfg = cfg

    def bounds(self, history: PromptHistory) -> tuple[int, int]:
        cfg = self.cfg
        return e3_bounds(
            history.epochs_completed, cfg.n_avg, cfg.g_min, cfg.g_max, cfg.e3_curriculum_step
        )

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


_POLICIES = {
    "uniform": UniformAllocator,
    "dynamo": DynamoAllocator,
    "dynamo_released": ReleasedDynamoAllocator,
    "e3": E3Allocator,
}


def make_allocator(cfg: AllocationConfig) -> Allocator:
    """The allocator named by `cfg.policy`."""
    return _POLICIES[cfg.policy](cfg)


def make_history(cfg: AllocationConfig, num_prompts: int) -> PromptHistory:
    """An empty history for a dataset of `num_prompts` rows, with the config's decay."""
    return PromptHistory(num_prompts, decay=cfg.decay)
