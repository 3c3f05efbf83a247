"""The rollout side of a step: request a batch, take it from the pipeline, score it, and the
extra rounds of dynamic sampling.

`Planner.request` fixes a batch (prompts, n_i, temperature, seed, behaviour version) as a
`BatchPlan`; `generate` plans the batches rollout/pipeline.py says are due (it requests ahead
when `train.max_staleness` ≥ 1) and returns this step's `Rollouts` (`Generated`); `score` gives
the rewards (`Scored`); `resample` draws dynamic sampling's further rounds (dynamic_sampling.py).
`Drawn` is every group the step generated, which the allocator history records whether or not it
was trained on. Each stage's result carries its own timings (timings.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from dynamo_jax import tasks
from dynamo_jax.allocation import AllocationResult, PromptHistory
from dynamo_jax.config import RunConfig
from dynamo_jax.loop import assemble, dynamic_sampling
from dynamo_jax.loop.timings import Stopwatch, add_timings
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


@dataclasses.dataclass(frozen=True)
class Planner:
    """What fixes a batch when it is requested: the data order, the allocator on the history as
    it is now, the temperature scheduler; rl_step.py makes one a step."""

    cfg: RunConfig
    task: tasks.Task
    data_iter: Any  # data.EpochIterator
    allocator: Any  # allocation.Allocator
    history: PromptHistory
    scheduler: TemperatureScheduler

    def request(self, step: int, version: int, round_: int = 0) -> BatchPlan:
        """Step `step`'s batch (dynamic sampling's round `round_`) as fixed now: the next
        prompts, their rollout counts (from the history as it is now), the temperature and the
        seed."""
        cfg, task = self.cfg, self.task
        data_batch = next(self.data_iter)
        rows = data_batch.indices
        allocation = self.allocator.allocate(rows, self.history, cfg.budget)
        requests = tuple(
            Request(int(task.prompt_ids[r]), task.prompt_tokens[r], int(n))
            for r, n in zip(rows, allocation.n)
            if n > 0
        )
        sampling = SamplingParams(
            max_new_tokens=cfg.rollout.max_new_tokens,
            temperature=self.scheduler.current(),
            top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k,
            stop_token_ids=task.stop_token_ids,
            seed=step_seed(cfg.train.seed, step, ROLLOUT, *([round_] if round_ else [])),
        )
        epoch_end = bool(data_batch.epoch_end)
        return BatchPlan(step, rows, epoch_end, allocation, requests, sampling, version)


@dataclasses.dataclass(frozen=True)
class Generated:
    """The generate stage's result: this step's rollouts and the batch as the pipeline gave it."""

    rollouts: Rollouts
    taken: TakenBatch
    # time/generate: how long the step waited for generation; time/generate_background: how
    # long the background worker took to generate it
    timings: Mapping[str, float]


def generate(pipeline: RolloutPipeline, step: int, planner: Planner, params: Any) -> Generated:
    """Request the batches the pipeline says are due (up to step + max_staleness, each fixed by
    `planner` now, from version step − 1), then take this step's."""
    with Stopwatch() as clock:
        plans = [planner.request(s, step - 1) for s in pipeline.due(step)]
        pipeline.fill(step, plans, params)
        taken = pipeline.take(step)
    timings = {"time/generate": clock.seconds}
    if taken.generate_s is not None:
        timings["time/generate_background"] = taken.generate_s
    return Generated(rollouts_of(taken.plan, taken.completions), taken, timings)


@dataclasses.dataclass(frozen=True)
class Scored:
    """The score stage's result."""

    rewards: np.ndarray  # float32 [budget] (0 on padding rows)
    verdict_shares: dict  # the share of each verdict status
    timings: Mapping[str, float]  # time/score


def score(task: tasks.Task, completions: list[Completion], budget: int) -> Scored:
    """Rewards float32 [budget] (0 on padding rows) and the share of each verdict status."""
    with Stopwatch() as clock:
        rewards = np.zeros(budget, np.float32)
        rewards[: len(completions)], verdict_shares = tasks.score_completions(task, completions)
    return Scored(rewards, verdict_shares, {"time/score": clock.seconds})


@dataclasses.dataclass(frozen=True)
class Drawn:
    """Every group a step generated, by draw from the data iterator (its batch, or each
    dynamic-sampling round): what the history records and the reward metrics describe."""

    parts: list[tuple[np.ndarray, bool, dict]]  # (rows, epoch_end, group_stats) per draw
    rewards: np.ndarray  # float32, the reward of every generated completion
    verdict_shares: dict  # the share of each verdict status over every generated completion

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
    drawn: Drawn  # every round
    metrics: dict  # dynamic/* (dynamic_sampling.metrics)
    timings: Mapping[str, float]  # the further rounds' time/generate and time/score, summed


def _group_stats(completions: list[Completion], rewards: np.ndarray) -> dict:
    ids = np.asarray([c.prompt_id for c in completions], np.int64)
    return assemble.group_stats(ids, rewards, np.ones(len(ids), bool))


def resample(
    cfg: RunConfig,
    step: int,
    task: tasks.Task,
    engine: RolloutEngine,
    planner: Planner,
    first: tuple[Generated, Scored],
) -> Resampled:
    """Dynamic sampling: further rounds (`planner.request(step, version, round)`, generated by
    the engine's current weights, scored) until N groups with a reward signal fill the batch.
    `first` is the step's requested batch, generated and scored."""
    generated, first_scored = first
    rollouts = generated.rollouts
    round_timings: list[Mapping[str, float]] = []

    def draw(round_: int) -> dynamic_sampling.Round:
        batch_plan = planner.request(step, step - 1, round_)
        with Stopwatch() as clock:
            completions = engine.generate(batch_plan.requests, batch_plan.sampling)
        check_versions(step, batch_plan, completions, 0)
        scored = score(task, completions, len(completions))
        round_timings.extend([{"time/generate": clock.seconds}, scored.timings])
        return dynamic_sampling.Round(
            batch_plan, completions, scored.rewards, scored.verdict_shares
        )

    n = len(rollouts.completions)
    round0 = dynamic_sampling.Round(
        generated.taken.plan,
        rollouts.completions,
        first_scored.rewards[:n],
        first_scored.verdict_shares,
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
        dynamic_sampling.verdict_shares(rounds),
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
        drawn,
        metrics,
        add_timings(*round_timings),
    )
