"""The trainer's log-prob passes over a rollout batch.

`old_logprobs` runs the trainer's forward (step/forward.py) over a batch's sequences laid into
rows (packed or one per row, data/packing.py), on the devices once (assemble.py `device_rows`): log π, the entropy H and, with a KL term, log π_ref
per token at the batch's temperature. `behaviour_logprobs` turns that into the ratio's
denominator: π_old is the policy that generated the batch (docs/algorithm.md#asynchronous-rollouts), which is the
trainer's current policy when the batch is on-policy, else the generating version's kept
parameters, its log-probs saved in a checkpoint, or the engine's own log-probs
(rollout/pipeline.py says which). `without_logprob_pass` is the batch of a step that needs no pass.
Both return a `LogprobPass`, which carries the stage's timings. `BehaviourAhead` answers the
pipeline's one question to the loop (rollout/pipeline.py `BehaviourSource`): log π_v of a batch
still in flight at a checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from dynamo_jax import tasks
from dynamo_jax.config import RunConfig
from dynamo_jax.loop import assemble
from dynamo_jax.loop.assemble import DeviceRows, RolloutBatch, build_batch
from dynamo_jax.loop.timings import Stopwatch
from dynamo_jax.losses import rollout_correction
from dynamo_jax.rollout.pipeline import BatchPlan, Behaviour, RolloutPipeline, TakenBatch
from dynamo_jax.rollout.protocol import Completion
from dynamo_jax.sharding import multihost
from dynamo_jax.step.forward import LogprobFn


def old_logprobs(
    batch: RolloutBatch, rows: DeviceRows, logprob: LogprobFn, params: Any, ref_params: Any
) -> RolloutBatch:
    """The batch with π_old's (and π_ref's) log-probs and π_old's entropy at its temperature,
    from the trainer's own forward over `rows`: the batch's sequences `rows.seqs` laid into
    `logprob.layout`'s rows (assemble.device_rows). The rows not laid out (the on-policy first
    update's) get NaN, so that a reader that should not have read them shows it."""
    width = batch.tokens.shape[1]

    def back(x):
        # Outputs come back whole to every process.
        values = rows.placement.gather(multihost.host_copy(x), width, 0.0)
        out = np.full((batch.rows, width), np.nan, values.dtype)
        out[rows.seqs] = values
        return out

    logp, ent = logprob(params, rows.arrays)
    ref_logp = None
    if ref_params is not None:
        ref_logp = back(logprob(ref_params, rows.arrays)[0])
    old_logp, entropy = back(logp), back(ent)
    return dataclasses.replace(batch, old_logp=old_logp, ref_logp=ref_logp, entropy=entropy)


def layout_key(batch: RolloutBatch) -> str:
    """Fingerprint of a batch's layout (tokens and trained positions)."""
    return hashlib.sha256(batch.tokens.tobytes() + batch.loss_mask.tobytes()).hexdigest()


def _masked_abs_diff(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    diff = np.abs(a - b)[mask > 0]
    return float(diff.mean()) if diff.size else 0.0


def _masked_abs_diff_max(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    diff = np.abs(a - b)[mask > 0]
    return float(diff.max()) if diff.size else 0.0


@dataclasses.dataclass(frozen=True)
class TrainerForward:
    """The trainer's log-prob function and the parameters it scores a batch with: its current
    ones (version step − 1) and, with a KL term, the frozen reference's."""

    logprob: LogprobFn
    params: Any
    ref_params: Any = None


@dataclasses.dataclass(frozen=True)
class LogprobPass:
    """The log-prob stage's result: the batch with π_old (entropy, π_ref) and its metrics."""

    batch: RolloutBatch
    metrics: dict  # rollout/* (engine-vs-trainer diff, staleness, behaviour-vs-engine diff)
    timings: Mapping[str, float]  # time/old_logprobs, time/behaviour_logprobs (those that ran)


def behaviour_logprobs(
    pipeline: RolloutPipeline,
    batch: RolloutBatch,
    taken: TakenBatch,
    forward: TrainerForward,
    rows: DeviceRows,
) -> LogprobPass:
    """The batch with π_old = the behaviour policy that sampled it (rollout/pipeline.py), the
    current policy's entropy (and π_ref), and the log-prob metrics.

    The trainer's forward with its current parameters (version step − 1) always runs over `rows`:
    it is π_old when the batch is on-policy, and the entropy and the reported staleness otherwise.
    `rows` may leave rows of the batch out (their values NaN: RunConfig.first_update_on_policy),
    which only an on-policy batch allows.
    """
    step = taken.plan.step
    partial = len(rows.seqs) < batch.rows
    if partial and pipeline.report_behaviour:
        raise ValueError("only an on-policy batch can leave rows out of the log-prob pass")
    with Stopwatch() as clock:
        batch = old_logprobs(batch, rows, forward.logprob, forward.params, forward.ref_params)
    timings = {"time/old_logprobs": clock.seconds}
    mask = batch.loss_mask
    if partial:
        mask = np.zeros_like(mask)
        mask[rows.seqs] = batch.loss_mask[rows.seqs]
    # Current trainer vs engine on the sampled tokens: ~0 when on-policy in float32; grows with
    # staleness (the engine sampled with older weights) and with the engine's numerics.
    metrics = {
        "rollout/engine_logp_abs_diff": _masked_abs_diff(batch.old_logp, batch.engine_logp, mask),
        "rollout/engine_logp_abs_diff_max": _masked_abs_diff_max(
            batch.old_logp, batch.engine_logp, mask
        ),
    }
    version = taken.plan.version
    if not pipeline.report_behaviour:
        return LogprobPass(batch, metrics, timings)  # synchronous, π_old from the trainer
    if pipeline.from_engine:
        # Off the trained tokens the engine has no log-probs; the values there are never read.
        behaviour = np.where(mask > 0, batch.engine_logp, batch.old_logp)
    elif version == step - 1:
        behaviour = batch.old_logp
    elif taken.behaviour is not None:
        if taken.behaviour.layout != layout_key(batch):
            raise RuntimeError(
                f"step {step}: the behaviour log-probs saved for this batch were computed on "
                "another batch layout than build_batch gives now"
            )
        behaviour = taken.behaviour.logp
    elif taken.behaviour_params is not None:
        with Stopwatch() as clock:
            # The same rows on the devices: the version's parameters score the same sequences.
            behaviour = old_logprobs(
                batch, rows, forward.logprob, taken.behaviour_params, None
            ).old_logp
        timings["time/behaviour_logprobs"] = clock.seconds
    else:
        raise RuntimeError(
            f"step {step}: π_old of weight version {version} cannot be recomputed: neither its "
            "parameters nor its log-probs were kept (a checkpoint written with "
            "train.old_logp_source='engine' resumed with 'trainer'?)"
        )
    metrics["rollout/staleness"] = (step - 1) - version
    metrics["rollout/behaviour_logp_abs_diff"] = _masked_abs_diff(
        behaviour, batch.engine_logp, mask
    )
    return LogprobPass(dataclasses.replace(batch, old_logp=behaviour), metrics, timings)


# One compiled program per correction config and batch shape.
_correct = jax.jit(rollout_correction.correct, static_argnames=("cfg",))


def corrected(
    batch: RolloutBatch, correction: rollout_correction.RolloutCorrection
) -> tuple[RolloutBatch, dict]:
    """The batch the update trains on under train.rollout_is / train.rollout_rs, and the
    correction's metrics (`rollout_corr/...`): `batch.old_logp` (the trainer's π_old, as
    `behaviour_logprobs` left it) against `batch.engine_logp`, the rejected tokens out of its
    loss mask, the truncated IS weights in `rollout_is_weight` (losses/rollout_correction.py)."""
    result = _correct(batch.old_logp, batch.engine_logp, batch.loss_mask, cfg=correction)
    mask, is_weight, metrics = jax.device_get((result.mask, result.is_weight, result.metrics))
    out = dataclasses.replace(batch, loss_mask=np.asarray(mask, np.float32))
    if correction.weights:
        out = dataclasses.replace(out, rollout_is_weight=np.asarray(is_weight, np.float32))
    return out, {f"rollout_corr/{k}": float(v) for k, v in metrics.items()}


def without_logprob_pass(
    pipeline: RolloutPipeline, batch: RolloutBatch, taken: TakenBatch, from_engine: bool
) -> LogprobPass:
    """The batch and log-prob metrics of a step that runs no log-prob pass
    (RunConfig.skips_logprob_pass): π_old is the engine's log-probs (`from_engine`:
    RunConfig.old_logp_from_engine_only; 0 off the trained tokens, where it is never read), or
    NaN placeholders that no update reads (the one update of the step takes
    stop_gradient(π): RunConfig.first_update_on_policy). The entropy is unknown (NaN), as is
    the engine-vs-trainer diff; the staleness is still reported where π_old may not be the
    trainer's own."""
    unknown = np.full_like(batch.loss_mask, np.nan)
    old_logp = batch.engine_logp if from_engine else unknown
    metrics = {}
    if pipeline.report_behaviour:
        metrics["rollout/staleness"] = (taken.plan.step - 1) - taken.plan.version
    return LogprobPass(dataclasses.replace(batch, old_logp=old_logp, entropy=unknown), metrics, {})


@dataclasses.dataclass(frozen=True)
class BehaviourAhead:
    """rollout/pipeline.py's `BehaviourSource`: log π_v of a batch in flight at a checkpoint,
    from its version's kept parameters, on the layout `build_batch` will give it."""

    cfg: RunConfig
    task: tasks.Task
    logprob: LogprobFn

    def behaviour(self, plan: BatchPlan, completions: list[Completion], params: Any) -> Behaviour:
        zeros = np.zeros(self.cfg.budget, np.float32)  # the layout does not depend on rewards
        batch = build_batch(self.cfg, self.task, completions, plan.temperature, zeros)
        rows = assemble.device_rows(
            batch, np.arange(batch.rows), self.logprob.layout, self.logprob.batch_shardings
        )
        return Behaviour(
            old_logprobs(batch, rows, self.logprob, params, None).old_logp, layout_key(batch)
        )
