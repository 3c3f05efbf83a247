"""The rollout side of a step: request a batch, take it from the pipeline, score it, and the
extra rounds of dynamic sampling, as one stage (`generate`, returning `Generated`).

`Planner.request` fixes a batch (prompts, n_i, temperature, seed, behaviour version) as a
`BatchPlan`; `generate` plans the batches rollout/pipeline.py says are due (it requests ahead
when `train.max_staleness` ≥ 1), takes this step's (checked by the pipeline) and scores it; with
dynamic sampling it draws further rounds, generated now and scored the same way, until the batch
is full (dynamic_sampling.py). Every round is scored in one place (`generate`'s `draw`).
`Drawn` is every group the step generated, which the allocator history records whether or not it
was trained on. The stage's result carries its own timings (timings.py).
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
from dynamo_jax.rollout.pipeline import BatchPlan, RolloutPipeline, TakenBatch
from dynamo_jax.rollout.protocol import Completion, Request, SamplingParams
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
class Generated:
    """The generate stage's result: the step's rollouts (with dynamic sampling, the selected
    groups' completions), their rewards, every group drawn, and the batch as the pipeline gave it
    (its behaviour parameters or log-probs)."""

    rollouts: Rollouts
    rewards: np.ndarray  # float32 [budget] of `rollouts.completions` (0 on padding rows)
    drawn: Drawn  # every round
    taken: TakenBatch  # round 0, the step's batch from the pipeline
    metrics: dict  # dynamic/* (dynamic_sampling.metrics; empty without dynamic sampling)
    # time/generate: how long the step waited for generation (every round); time/score; and
    # time/generate_background: how long the background worker took to generate round 0
    timings: Mapping[str, float]


def generate(pipeline: RolloutPipeline, step: int, planner: Planner, params: Any) -> Generated:
    """The step's scored rollouts. Round 0: request the batches the pipeline says are due (up to
    step + max_staleness, each fixed by `planner` now, from version step − 1), then take this
    step's. With train.dynamic_sampling, further rounds (`planner.request(step, step − 1,
    round)`, generated now by the engine's current weights) until N groups with a reward signal
    fill the batch (dynamic_sampling.py). The pipeline checks every round's versions; `draw`
    scores it."""
    cfg, task = planner.cfg, planner.task
    with Stopwatch() as clock:
        plans = [planner.request(s, step - 1) for s in pipeline.due(step)]
        pipeline.fill(step, plans, params)
        taken = pipeline.take(step)
    round_timings: list[Mapping[str, float]] = [{"time/generate": clock.seconds}]
    if taken.generate_s is not None:
        round_timings.append({"time/generate_background": taken.generate_s})

    def draw(round_: int) -> dynamic_sampling.Round:
        """Round `round_`, checked and scored: 0 is the step's batch (`taken`), a further one is
        generated now."""
        round_batch = taken
        with Stopwatch() as clock:
            if round_ > 0:
                round_plan = planner.request(step, step - 1, round_)
                round_batch = pipeline.generate_now(step, round_plan)
        with Stopwatch() as score_clock:
            rewards, verdict_shares = tasks.score_completions(task, round_batch.completions)
        round_timings.append({"time/generate": clock.seconds, "time/score": score_clock.seconds})
        return dynamic_sampling.Round(
            round_batch.plan, round_batch.completions, rewards, verdict_shares
        )

    first = draw(0)
    rounds, completions, kept_rewards = [first], first.completions, first.rewards
    verdict_shares, metrics = first.verdict_shares, {}
    if cfg.train.dynamic_sampling:
        sizes = dict(
            max_groups=cfg.train.prompts_per_step,
            rows=cfg.budget,
            max_rounds=cfg.train.max_sampling_rounds,
        )
        rounds, selection = dynamic_sampling.sample_rounds(first, draw, **sizes)
        completions, kept_rewards = dynamic_sampling.trained(rounds, selection)
        verdict_shares = dynamic_sampling.verdict_shares(rounds)
        metrics = dynamic_sampling.metrics(rounds, selection, **sizes)
    rewards = np.zeros(cfg.budget, np.float32)
    rewards[: len(kept_rewards)] = kept_rewards
    parts = []
    for r in rounds:
        ids = np.asarray([c.prompt_id for c in r.completions], np.int64)
        groups = assemble.group_stats(ids, r.rewards, np.ones(len(ids), bool))
        parts.append((r.plan.rows, r.plan.epoch_end, groups))
    drawn = Drawn(parts, np.concatenate([r.rewards for r in rounds]), verdict_shares)
    plan = first.plan
    rollouts = Rollouts(
        plan.rows, plan.epoch_end, plan.allocation, completions, plan.temperature, plan.version
    )
    return Generated(rollouts, rewards, drawn, taken, metrics, add_timings(*round_timings))
