"""One RL step, top to bottom (`rl_step`), as in docs/design.md#one-step-as-data.

1. the data iterator hands out N dataset rows; the allocator splits the budget B = N · n_avg into
   n_i per prompt; the temperature scheduler gives τ (`Planner.request`: a `BatchPlan`; generate.py);
2. the rollout engine samples n_i completions per prompt at τ (seed derived from (seed, step));
3. the task scores them (binary verdicts); with dynamic sampling, more rounds of prompts until
   N groups with a reward signal are in (generate.py `resample`, dynamic_sampling.py);
4. GRPO advantages per prompt-id group (variable group sizes) on the fixed-shape batch
   (assemble.py `build_batch`);
5. the trainer computes log-probs (and entropy) at τ with its own forward: π_old when the batch
   is on-policy, else π_old is the behaviour policy (behaviour_pass.py `behaviour_logprobs`);
   with rollout correction, π_old against the engine's log-probs gives the update's IS weights
   and rejected tokens (behaviour_pass.py `corrected`);
   with train.skip_on_policy_logprob_pass, not for the first update's sequences, whose update
   starts from the sampling parameters (RunConfig.first_update_on_policy), and not at all when
   π_old is the engine's own log-probs (RunConfig.old_logp_from_engine_only);
6. `ppo_epochs` passes of jitted optimizer steps over shuffled mini-batches (`update`);
   (5 and 6 lay the sequences into rows of train.pack_len tokens, several per row when
   train.packing, in micro-batches of a token budget: the Trainer's `layouts`, data/packing.py)
7. allocator history and temperature scheduler are updated (`record`), weights pushed to the
   engine; the step's metrics line is assembled (loop/report.py `step_metrics`).
With `train.max_staleness` = k ≥ 1, step t requests the batch of step t+k (steps 1-2 for it)
before its own update and trains on the batch step t−k requested: rollout/pipeline.py states the
versions, the off-policy arithmetic and what is checked; rollout/background.py how the vLLM
sidecar generates while the trainer trains. k = 0 is the synchronous loop above.
The run around the steps (checkpoints, evaluation, the failure policy) is train.py.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from dynamo_jax.config import RunConfig
from dynamo_jax.loop import assemble
from dynamo_jax.loop.assemble import RolloutBatch, build_batch
from dynamo_jax.loop.behaviour_pass import (
    LogprobPass,
    TrainerForward,
    behaviour_logprobs,
    corrected,
    without_logprob_pass,
)
from dynamo_jax.loop.build import Trainer
from dynamo_jax.loop.generate import Drawn, Planner, generate, resample, score
from dynamo_jax.loop.report import RunCounts, UpdateResult, step_metrics
from dynamo_jax.loop.timings import Stopwatch, add_timings
from dynamo_jax.rollout.pipeline import TakenBatch
from dynamo_jax.seeds import MINI_BATCH, step_seed
from dynamo_jax.sharding import multihost
from dynamo_jax.step.state import TrainState

SKIP_KEY = "update_skipped"  # the train step's metric flagging a skipped non-finite update


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    """What one step hands the run (train.py takes it in: `Trainer.advance`)."""

    state: TrainState  # after the step's updates
    metrics: dict  # the step's metrics line (loop/report.py `step_metrics`)
    consecutive_nonfinite: int  # skipped updates in a row, this step's included
    skipped_updates: int  # skipped updates in the run so far


def rl_step(tr: Trainer, step: int) -> StepOutcome:
    """One RL step (module docstring): the trainer's state after it, and its metrics. The
    `Trainer` itself is left as it was, but for the stages that keep their own state (data
    order, allocator history, temperature scheduler, the pipeline's batches, the engine's
    weights)."""
    cfg = tr.cfg
    t0 = time.perf_counter()
    planner = Planner(cfg, tr.task, tr.data_iter, tr.allocator, tr.history, tr.scheduler)
    generated = generate(tr.pipeline, step, planner, tr.state.params)
    scored = score(tr.task, generated.rollouts.completions, cfg.budget)
    rollouts, rewards = generated.rollouts, scored.rewards
    resampled = None
    if cfg.train.dynamic_sampling:
        resampled = resample(cfg, step, tr.task, tr.engine, planner, (generated, scored))
        rollouts, rewards = resampled.rollouts, resampled.rewards
    batch = build_batch(cfg, tr.task, rollouts.completions, rollouts.temperature, rewards)
    scored_rows = None  # the rows the log-prob pass scores: all of them
    if cfg.first_update_on_policy:
        # The first update's sequences: π_old = π, the update takes stop_gradient of its own
        # forward (the batch's on_policy flag), so the pass leaves them out (NaN placeholders,
        # never read; their per-token entropy is unknown).
        first = mini_batch_order(cfg, step, batch.rows)[0]
        scored_rows = np.setdiff1d(np.arange(batch.rows), first)
    taken = generated.taken
    logp = logprob_pass(tr, batch, taken, scored_rows)
    batch, logp_metrics = logp.batch, dict(logp.metrics)
    trained = batch
    if cfg.train.rollout_correction.enabled:
        trained, corr_metrics = corrected(batch, cfg.train.rollout_correction)
        logp_metrics.update(corr_metrics)
    state, result = update(tr, step, trained)
    consecutive_nonfinite = tr.consecutive_nonfinite
    for skipped in result.skipped:
        consecutive_nonfinite = consecutive_nonfinite + 1 if skipped else 0
    skipped_updates = tr.skipped_updates + sum(result.skipped)

    # The trained groups (with the pass's entropy), for the history and the metrics line.
    groups = assemble.group_stats(
        batch.prompt_id, batch.rewards, batch.valid, batch.entropy, batch.loss_mask
    )
    if resampled is None:
        part = (rollouts.rows, rollouts.epoch_end, groups)
        drawn = Drawn([part], batch.rewards[batch.valid], scored.verdict_shares)
    else:
        drawn = resampled.drawn
    record(tr, drawn, groups, batch.entropy_mean, step)
    with Stopwatch() as push:
        tr.engine.update_weights(state.params, step)
    timings = add_timings(
        generated.timings,
        scored.timings,
        resampled.timings if resampled is not None else {},
        logp.timings,
        result.timings,
        {"time/weight_push": push.seconds},
    )
    timings["time/step"] = time.perf_counter() - t0
    counts = RunCounts(
        consecutive_nonfinite,
        applied_updates=int(jax.device_get(state.step)),
        epochs_completed=int(tr.history.epochs_completed),
    )
    metrics = step_metrics(
        cfg.allocation.g_max, rollouts, drawn, batch, logp_metrics, result, timings, counts
    )
    if resampled is not None:
        metrics.update(resampled.metrics)
        metrics["dynamic/trained_zero_var_groups"] = int(groups["zero_variance"].sum())
    return StepOutcome(state, metrics, consecutive_nonfinite, skipped_updates)


def logprob_pass(
    tr: Trainer, batch: RolloutBatch, taken: TakenBatch, scored_rows: np.ndarray | None
) -> LogprobPass:
    """π_old of the batch: the trainer's pass (behaviour_pass.py), or none
    (RunConfig.skips_logprob_pass)."""
    if tr.cfg.skips_logprob_pass:
        return without_logprob_pass(tr.pipeline, batch, taken, tr.cfg.old_logp_from_engine_only)
    forward = TrainerForward(tr.logprob, tr.state.params, tr.ref_params)
    return behaviour_logprobs(tr.pipeline, batch, taken, forward, scored_rows)


def mini_batch_order(cfg: RunConfig, step: int, rows: int) -> list[np.ndarray]:
    """The batch rows each of the step's updates trains on, in order: `ppo_epochs` passes over
    the rows, each a permutation seeded by (train.seed, step) (or in order, without
    train.shuffle_mini_batches), cut into mini_batch_size pieces."""
    size = cfg.train.mini_batch_size
    rng = np.random.default_rng(step_seed(cfg.train.seed, step, MINI_BATCH))
    order = []
    for _ in range(cfg.train.ppo_epochs):
        perm = rng.permutation(rows) if cfg.train.shuffle_mini_batches else np.arange(rows)
        order += [perm[start : start + size] for start in range(0, rows, size)]
    return order


def update(tr: Trainer, step: int, batch: RolloutBatch) -> tuple[TrainState, UpdateResult]:
    """`ppo_epochs` passes of jitted optimizer steps over shuffled mini-batches
    (`mini_batch_order`), each laid into rows (packed or not) by the update's row layout, from
    the trainer's state; per update, the metrics also report the share of the fed token slots
    that held no token and the micro-batch count. The first update takes π_old =
    stop_gradient(π) of its own forward (the batch's `on_policy` flag), not `batch.old_logp`,
    when RunConfig.first_update_on_policy.

    When the step's updates could reach `train.max_consecutive_nonfinite` (counting the skipped
    updates in a row before this step), each update's skip flag is read as it comes (one host
    sync per update) and the step stops at the update that reaches the limit, so a run stops
    after exactly that many; otherwise the flags are read once, after the step."""
    cfg, train_step, state = tr.cfg, tr.train_step, tr.state
    on_policy_updates = int(cfg.first_update_on_policy)
    fields = tuple(train_step.batch_shardings)
    order = mini_batch_order(cfg, step, batch.rows)
    per_update, layout_stats = [], []
    limit = cfg.train.max_consecutive_nonfinite
    watch = tr.consecutive_nonfinite + len(order) >= limit
    run = tr.consecutive_nonfinite
    with Stopwatch() as clock:
        for i, seqs in enumerate(order):
            rows, placement = assemble.lay_out(batch, seqs, tr.layouts.update, fields)
            rows["on_policy"] = np.float32(i < on_policy_updates)
            mb = multihost.global_batch_from_host(rows, train_step.batch_shardings, placement.rows)
            state, metrics = train_step.fn(state, mb)
            per_update.append(metrics)
            layout_stats.append(
                {
                    "pack/padding_share": placement.padding_share,
                    "pack/micro_batches": placement.micro_batches,
                }
            )
            if watch:
                run = run + 1 if bool(jax.device_get(metrics[SKIP_KEY])) else 0
                if run >= limit:
                    break
        fetched = jax.device_get(per_update)  # one host sync per step, not per update
    skipped = [bool(m.pop(SKIP_KEY)) for m in fetched]
    for m, extra in zip(fetched, layout_stats):
        m.update(extra)
    return state, UpdateResult(fetched, skipped, {"time/update": clock.seconds})


def record(tr: Trainer, drawn: Drawn, trained: dict, entropy: float, step: int) -> None:
    """What the step taught the allocator (history, epoch end) and the temperature scheduler:
    every generated group, draw by draw, trained on or not; a group's mean token entropy is the
    old-log-prob pass's (`trained`: the trained groups' stats; NaN, the history's previous
    value kept, for groups not trained on); `entropy`: the trained tokens' mean."""
    entropy_of = dict(zip(trained["prompt_id"].tolist(), trained["entropy_mean"]))
    for rows, epoch_end, groups in drawn.parts:
        # History is keyed by dataset row; groups by stable prompt id: map ids back to rows.
        row_of_id = {int(tr.task.prompt_ids[r]): int(r) for r in rows}
        group_rows = np.asarray([row_of_id[int(i)] for i in groups["prompt_id"]], np.int64)
        group_entropy = np.asarray([entropy_of.get(int(i), np.nan) for i in groups["prompt_id"]])
        tr.history.update(
            group_rows,
            groups["count"],
            groups["correct"],
            groups["reward_sum"],
            entropy_mean=group_entropy,
        )
        if epoch_end:
            # A pass over the dataset just ended: E3 re-ranks difficulty and widens its bounds,
            # the released heuristic refreshes its priorities (allocation/policies.py).
            tr.allocator.on_epoch_end(tr.history)
    if np.isfinite(entropy) and entropy > 0:
        tr.scheduler.update(entropy, step)
