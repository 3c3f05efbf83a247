"""One RL step, top to bottom (`rl_step`), as in docs/design.md#one-step-as-data.

1. the data iterator hands out N dataset rows; the allocator splits the budget B = N · n_avg into
   n_i per prompt; the temperature scheduler gives τ (`Planner.request`: a `BatchPlan`; generate.py);
2. the rollout engine samples n_i completions per prompt at τ (seed derived from (seed, step)),
   and the pipeline hands the batch over with its weight versions checked;
3. the task scores them (binary verdicts); with dynamic sampling, more rounds of prompts until
   N groups with a reward signal are in (2 and 3: generate.py `generate`, dynamic_sampling.py);
4. GRPO advantages per prompt-id group (variable group sizes) on the fixed-shape batch
   (assemble.py `build_batch`), and the rows each update trains on (`mini_batch_order`);
5. the trainer computes log-probs (and entropy) at τ with its own forward: π_old when the batch
   is on-policy, else π_old is the behaviour policy (behaviour_pass.py `behaviour_logprobs`);
   with rollout correction, π_old against the engine's log-probs gives the update's IS weights
   and rejected tokens (behaviour_pass.py `corrected`);
   with train.skip_on_policy_logprob_pass, not for the first update's sequences, whose update
   starts from the sampling parameters (RunConfig.first_update_on_policy), and not at all when
   π_old is the engine's own log-probs (RunConfig.old_logp_from_engine_only);
6. `ppo_epochs` passes of jitted optimizer steps over shuffled mini-batches (`update`);
   (5 and 6 lay the sequences into rows of train.pack_len tokens, several per row when
   train.packing, in micro-batches of a token budget, and feed them to the devices:
   assemble.py `device_rows`, the Trainer's `layouts`, data/packing.py; the pass's rows are laid
   out once, for the current and the behaviour version's forward alike)
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

from dynamo_jax.loop.assemble import (
    RolloutBatch,
    build_batch,
    device_rows,
    group_stats,
    mini_batch_order,
)
from dynamo_jax.loop.behaviour_pass import (
    TrainerForward,
    behaviour_logprobs,
    corrected,
    without_logprob_pass,
)
from dynamo_jax.loop.build import Trainer
from dynamo_jax.loop.generate import Drawn, Planner, generate
from dynamo_jax.loop.report import RunCounts, UpdateResult, step_metrics
from dynamo_jax.loop.timings import Stopwatch, add_timings
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
    rollouts, taken = generated.rollouts, generated.taken
    batch = build_batch(cfg, tr.task, rollouts.completions, rollouts.temperature, generated.rewards)
    order = mini_batch_order(cfg, step, batch.rows)
    if not cfg.skips_logprob_pass:
        scored_rows = np.arange(batch.rows)  # the rows the log-prob pass scores: all of them
        if cfg.first_update_on_policy:
            # The first update's sequences: π_old = π, the update takes stop_gradient of its own
            # forward (the batch's on_policy flag), so the pass leaves them out (NaN
            # placeholders, never read; their per-token entropy is unknown).
            scored_rows = np.setdiff1d(scored_rows, order[0])
        rows = device_rows(batch, scored_rows, tr.logprob.layout, tr.logprob.batch_shardings)
        forward = TrainerForward(tr.logprob, tr.state.params, tr.ref_params)
        logp = behaviour_logprobs(tr.pipeline, batch, taken, forward, rows)
    else:
        logp = without_logprob_pass(tr.pipeline, batch, taken, cfg.old_logp_from_engine_only)
    batch, logp_metrics = logp.batch, dict(logp.metrics)
    trained = batch
    if cfg.train.rollout_correction.enabled:
        trained, corr_metrics = corrected(batch, cfg.train.rollout_correction)
        logp_metrics.update(corr_metrics)
    state, result = update(tr, trained, order)
    consecutive_nonfinite = tr.consecutive_nonfinite
    for skipped in result.skipped:
        consecutive_nonfinite = consecutive_nonfinite + 1 if skipped else 0
    skipped_updates = tr.skipped_updates + sum(result.skipped)

    # The trained groups (with the pass's entropy), for the history and the metrics line.
    groups = group_stats(
        batch.prompt_id, batch.rewards, batch.valid, batch.entropy, batch.loss_mask
    )
    record(tr, generated.drawn, groups, batch.entropy_mean, step)
    with Stopwatch() as push:
        tr.engine.update_weights(state.params, step)
    timings = add_timings(
        generated.timings, logp.timings, result.timings, {"time/weight_push": push.seconds}
    )
    timings["time/step"] = time.perf_counter() - t0
    counts = RunCounts(
        consecutive_nonfinite,
        applied_updates=int(jax.device_get(state.step)),
        epochs_completed=int(tr.history.epochs_completed),
    )
    metrics = step_metrics(
        cfg.allocation.g_max,
        rollouts,
        generated.drawn,
        batch,
        logp_metrics,
        result,
        timings,
        counts,
    )
    if cfg.train.dynamic_sampling:
        metrics.update(generated.metrics)
        metrics["dynamic/trained_zero_var_groups"] = int(groups["zero_variance"].sum())
    return StepOutcome(state, metrics, consecutive_nonfinite, skipped_updates)


def update(
    tr: Trainer, batch: RolloutBatch, order: list[np.ndarray]
) -> tuple[TrainState, UpdateResult]:
    """`ppo_epochs` passes of jitted optimizer steps over the mini-batches `order` gives
    (assemble.mini_batch_order), each laid into rows (packed or not) by the update's row layout,
    from the trainer's state; per update, the metrics also report the share of the fed token
    slots that held no token and the micro-batch count. The first update takes π_old =
    stop_gradient(π) of its own forward (the batch's `on_policy` flag), not `batch.old_logp`,
    when RunConfig.first_update_on_policy.

    When the step's updates could reach `train.max_consecutive_nonfinite` (counting the skipped
    updates in a row before this step), each update's skip flag is read as it comes (one host
    sync per update) and the step stops at the update that reaches the limit, so a run stops
    after exactly that many; otherwise the flags are read once, after the step."""
    cfg, train_step, state = tr.cfg, tr.train_step, tr.state
    on_policy_updates = int(cfg.first_update_on_policy)
    per_update, layout_stats = [], []
    limit = cfg.train.max_consecutive_nonfinite
    watch = tr.consecutive_nonfinite + len(order) >= limit
    run = tr.consecutive_nonfinite
    with Stopwatch() as clock:
        for i, seqs in enumerate(order):
            mb = device_rows(
                batch, seqs, tr.layouts.update, train_step.batch_shardings, i < on_policy_updates
            )
            state, metrics = train_step.fn(state, mb.arrays)
            per_update.append(metrics)
            layout_stats.append(
                {
                    "pack/padding_share": mb.placement.padding_share,
                    "pack/micro_batches": mb.placement.micro_batches,
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
