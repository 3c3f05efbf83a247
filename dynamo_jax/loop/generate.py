"""The rollout side of a step: request a batch, take it from the pipeline, score it, and the
extra rounds of dynamic sampling.

`request` fixes a batch (prompts, n_i, temperature, seed, behaviour version) as a `BatchPlan`;
`generate` hands the plans to rollout/pipeline.py (which requests ahead when
`train.max_staleness` ≥ 1) and returns this step's `Rollouts`; `score` gives the rewards;
`resample` draws dynamic sampling's further rounds (dynamic_sampling.py). `Drawn` is every group
the step generated, which the allocator history records whether or not it was trained on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dynamo_jax import tasks
from dynamo_jax.allocation import AllocationResult, PromptHistory
from dynamo_jax.config import RunConfig
from dynamo_jax.loop import assemble, dynamic_sampling
from dynamo_jax.loop.report import timed
from dynamo_jax.rollout.pipeline import BatchPlan, RolloutPipeline, TakenBatch, check_versions
from dynamo_jax.rollout.protocol import Completion, Request, RolloutEngine, SamplingParams
from dynamo_jax.seeds import ROLLOUT, step_seed
from dynamo_jax.temperature import TemperatureScheduler


@dataclasses.dataclass(frozen=True)
class Rollouts:
    """What the generate stage produced: the step's prompts, their allocation, the completions."""

    rows: np.ndarray  # int64 [I] dataset rows of the step's prompts
    epoch_end: bool  # the data iterator finished a pass over the dataset with this batch
    allocation: AllocationResult  # n_i per prompt (aligned with `rows`)
    completions: list[Completion]  # grouped by prompt in `rows` order, then by sample
    temperature: float  # the sampling temperature of every completion
    weight_version: int = 0  # the version of the weights that sampled them


def rollouts_of(plan: BatchPlan, completions: list[Completion]) -> Rollouts:
    return Rollouts(
        plan.rows, plan.epoch_end, plan.allocation, completions, plan.temperature, plan.version
    )


def request(
    cfg: RunConfig,
    task: tasks.Task,
    data_iter: Any,
    allocator: Any,
    history: PromptHistory,
    scheduler: TemperatureScheduler,
    step: int,
    version: int,
    round_: int = 0,
) -> BatchPlan:
    """Step `step`'s batch (dynamic sampling's round `round_`) as fixed now: the next prompts,
    their rollout counts (from the history as it is now), the temperature and the seed."""
    data_batch = next(data_iter)
    rows = data_batch.indices
    allocation = allocator.allocate(rows, history, cfg.budget)
    requests = tuple(
        Request(int(task.prompt_ids[r]), task.prompt_tokens[r], int(n))
        for r, n in zip(rows, allocation.n)
        if n > 0
    )
    sampling = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=scheduler.current(),
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        stop_token_ids=task.stop_token_ids,
        seed=step_seed(cfg.train.seed, step, ROLLOUT, *([round_] if round_ else [])),
    )
    epoch_end = bool(data_batch.epoch_end)
    return BatchPlan(step, rows, epoch_end, allocation, requests, sampling, version)


def generate(
    pipeline: RolloutPipeline, step: int, plan: Any, params: Any, timings: dict
) -> tuple[Rollouts, TakenBatch]:
    """Request the batches up to step + max_staleness (`plan(s, version)` fixes each), then
    take this step's. `time/generate` is how long the step waited for generation;
    `time/generate_background` how long the background worker took to generate it."""
    with timed(timings, "generate"):
        pipeline.fill(step, plan, params)
        taken = pipeline.take(step)
    if taken.generate_s is not None:
        timings["time/generate_background"] = taken.generate_s
    return rollouts_of(taken.plan, taken.completions), taken


def score(task: tasks.Task, completions: list[Completion], budget: int, timings: dict):
    """Rewards float32 [budget] (0 on padding rows) and the share of each verdict status."""
    with timed(timings, "score"):
        rewards = np.zeros(budget, np.float32)
        rewards[: len(completions)], verdict_shares = tasks.score_completions(task, completions)
    return rewards, verdict_shares


@dataclasses.dataclass(frozen=True)
class Drawn:
    """Every group a step generated, by draw from the data iterator (its batch, or each
    dynamic-sampling round): what the history records and the reward metrics describe."""

    parts: list[tuple[np.ndarray, bool, dict]]  # (rows, epoch_end, group_stats) per draw
    rewards: np.ndarray  # float32, the reward of every generated completion

    @property
    def groups(self) -> dict:
        """The group statistics of every draw, concatenated."""
        keys = ("count", "reward_sum", "zero_variance")
        return {k: np.concatenate([g[k] for _, _, g in self.parts]) for k in keys}


@dataclasses.dataclass(frozen=True)
class Resampled:
    """Dynamic sampling's outcome: the trained groups, and every round drawn."""

    rollouts: Rollouts  # the step's rollouts with the selected groups' completions
    rewards: np.ndarray  # float32 [budget] of the selected completions (0 on padding rows)
    verdict_shares: dict  # over every generated completion
    drawn: Drawn
    metrics: dict  # dynamic/* (dynamic_sampling.metrics)


def _group_stats(completions: list[Completion], rewards: np.ndarray) -> dict:
    ids = np.asarray([c.prompt_id for c in completions], np.int64)
    return assemble.group_stats(ids, rewards, np.ones(len(ids), bool))


def resample(
    cfg: RunConfig,
    step: int,
    task: tasks.Task,
    engine: RolloutEngine,
    plan: Any,
    first: tuple[Rollouts, BatchPlan, np.ndarray, dict],
    timings: dict,
) -> Resampled:
    """Dynamic sampling: further rounds (`plan(step, version, round)`, generated by the engine's
    current weights, scored) until N groups with a reward signal fill the batch. `first` is
    (rollouts, plan, rewards [budget], verdict shares) of the step's requested batch."""
    rollouts, first_plan, first_rewards, first_shares = first

    def draw(round_: int) -> dynamic_sampling.Round:
        batch_plan = plan(step, step - 1, round_)
        t: dict[str, float] = {}
        with timed(t, "generate"):
            completions = engine.generate(batch_plan.requests, batch_plan.sampling)
        check_versions(step, batch_plan, completions, 0)
        rewards, shares = score(task, completions, len(completions), t)
        for key, seconds in t.items():
            timings[key] = timings.get(key, 0.0) + seconds
        return dynamic_sampling.Round(batch_plan, completions, rewards, shares)

    n = len(rollouts.completions)
    round0 = dynamic_sampling.Round(
        first_plan, rollouts.completions, first_rewards[:n], first_shares
    )
    rounds, selection = dynamic_sampling.sample_rounds(
        round0,
        draw,
        max_groups=cfg.train.prompts_per_step,
        rows=cfg.budget,
        max_rounds=cfg.train.max_sampling_rounds,
    )
    completions, kept_rewards = dynamic_sampling.trained(rounds, selection)
    rewards = np.zeros(cfg.budget, np.float32)
    rewards[: len(kept_rewards)] = kept_rewards
    drawn = Drawn(
        [(r.plan.rows, r.plan.epoch_end, _group_stats(r.completions, r.rewards)) for r in rounds],
        np.concatenate([r.rewards for r in rounds]),
    )
    metrics = dynamic_sampling.metrics(
        rounds,
        selection,
        max_groups=cfg.train.prompts_per_step,
        rows=cfg.budget,
        max_rounds=cfg.train.max_sampling_rounds,
    )
    return Resampled(
        dataclasses.replace(rollouts, completions=completions),
        rewards,
        dynamic_sampling.verdict_shares(rounds),
        drawn,
        metrics,
    )
