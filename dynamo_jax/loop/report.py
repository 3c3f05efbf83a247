"""The step's metrics line (metrics.jsonl, TensorBoard, the progress bar).

`step_metrics` gathers what every stage of the step (loop/rl_step.py) produced into one flat dict
of host scalars: the update's loss metrics (averaged over its optimizer updates), timings, verdict
shares, the allocation, rewards over every generated group, the trained batch's responses and
the log-prob comparison of trainer and engine (rollout/pipeline.py explains the staleness ones).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from dynamo_jax.allocation import AllocationResult

if TYPE_CHECKING:  # annotations only: the stages build these values, this module reads them
    from dynamo_jax.loop.assemble import RolloutBatch
    from dynamo_jax.loop.generate import Drawn, Rollouts


@dataclasses.dataclass(frozen=True)
class UpdateResult:
    """The update stage's outcome: per-update loss metrics (host) and which updates were skipped."""

    metrics: list[dict]  # one dict of host scalars per optimizer update
    skipped: list[bool]  # per update: a non-finite loss or gradient, not applied
    timings: Mapping[str, float] = dataclasses.field(default_factory=dict)  # time/update


def _mean(x: np.ndarray) -> float:
    """The mean, 0 for no values (a dynamic-sampling step that kept no group)."""
    return float(x.mean()) if x.size else 0.0


def _update_metrics(result: UpdateResult) -> dict:
    """Mean of each loss metric over the step's updates (loss metrics under `loss/`)."""
    out: dict[str, Any] = {}
    for key in result.metrics[0] if result.metrics else ():
        values = np.asarray([np.asarray(m[key], np.float64) for m in result.metrics])
        out[f"loss/{key}" if "/" not in key else key] = float(values.mean())
    return out


def moved_share(n: np.ndarray) -> float:
    """The share of the step's rollouts the allocation moved away from uniform at the same total:
    Σ max(0, n_i − n̄) / Σ n_i (0 for GRPO; 0.5 when half the prompts get all the rollouts)."""
    total = float(n.sum())
    return float(np.maximum(n - total / n.size, 0.0).sum() / total) if total else 0.0


def _allocation_metrics(n: np.ndarray, g_max: int, result: AllocationResult) -> dict:
    return {
        "alloc/moved_share": moved_share(n),
        "alloc/n_mean": float(n.mean()),
        "alloc/n_std": float(n.std()),
        "alloc/n_min": int(n.min()),
        "alloc/n_max": int(n.max()),
        "alloc/n_hist": np.bincount(n, minlength=g_max + 1).tolist(),
        "alloc/shortfall": int(result.shortfall),
        **{k: float(v) for k, v in result.diagnostics.items()},
    }


@dataclasses.dataclass(frozen=True)
class RunCounts:
    """The run's counters after the step, as its metrics line reports them."""

    consecutive_nonfinite: int  # skipped updates in a row
    applied_updates: int  # the train state's step
    epochs_completed: int  # passes over the dataset


def step_metrics(
    g_max: int,
    rollouts: Rollouts,
    drawn: Drawn,
    batch: RolloutBatch,
    logp_metrics: dict,
    result: UpdateResult,
    timings: Mapping[str, float],
    counts: RunCounts,
) -> dict:
    """The step's metrics line. Allocation and temperature are the step's `rollouts`'; rewards
    and verdict shares cover every generated group (`drawn`: the batch's, or every
    dynamic-sampling round's); responses and tokens are the trained batch's; `logp_metrics`
    come from the old-log-prob stage (and the rollout correction)."""
    groups, rewards, allocation = drawn.groups, drawn.rewards, rollouts.allocation
    valid = batch.valid
    n_resp_tokens = int(batch.response_len[valid].sum())
    metrics = _update_metrics(result)
    metrics["nonfinite/skipped_in_step"] = int(sum(result.skipped))
    metrics["nonfinite/consecutive"] = counts.consecutive_nonfinite
    metrics.update(timings)
    metrics.update(drawn.verdict_shares)
    metrics.update(_allocation_metrics(np.asarray(allocation.n), g_max, allocation))
    metrics.update(
        {
            "reward/mean": float(rewards.mean()),
            # Uniform over the step's prompts: unlike reward/mean it is not weighted by n_i,
            # so it compares allocation policies fairly (DynaMO gives uncertain prompts more).
            "reward/prompt_mean": float((groups["reward_sum"] / groups["count"]).mean()),
            "reward/zero_var_groups": float(groups["zero_variance"].mean()),
            "reward/prompts_with_signal": int((~groups["zero_variance"]).sum()),
            "temperature": float(rollouts.temperature),
            "entropy/mean": batch.entropy_mean,
            "response/len_mean": _mean(batch.response_len[valid]),
            "response/stop_share": _mean(batch.stopped[valid]),
            "perf/tokens_per_s": n_resp_tokens / timings["time/step"],
            "perf/response_tokens": n_resp_tokens,
            "train/applied_updates": counts.applied_updates,
            "data/epoch": counts.epochs_completed,
        }
    )
    # Current trainer vs engine log-probs of the sampled tokens (rollout/engine_logp_abs_diff:
    # ~0 unless the engine ran other weights or numerics), the staleness and behaviour-policy
    # figures under lag; no diff when the log-prob pass was skipped (RunConfig.skips_logprob_pass),
    # over the rows it scored when it left the first update's out (first_update_on_policy).
    metrics.update(logp_metrics)
    if not np.isfinite(metrics["entropy/mean"]) and "loss/entropy_mean" in metrics:
        # No pass, or none over the first update's rows: the updates' own forwards ran the
        # current policy (or one update later) on the same tokens.
        metrics["entropy/mean"] = metrics["loss/entropy_mean"]
    return metrics
