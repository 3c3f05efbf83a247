"""Batches requested ahead of the step that trains on them, and their weight versions (docs/algorithm.md#asynchronous-rollouts).

Versions. Weight version v is the policy after v RL steps (0: the initial weights). The trainer
pushes version t to the engine at the end of step t, so during step t it trains π_θ from version
t−1 and the engine serves t−1. With `train.max_staleness` = k, step t requests the batch of step
t + k before its own update, and everything that shapes that batch is fixed then:
  - its prompts (the data iterator's next rows) and rollout counts n_i, from the allocator on
    the history as of the last finished step, t−1: the allocation for step t+k is made before
    the rewards of steps t..t+k−1 are in;
  - its temperature τ (the scheduler as of step t−1) and its sampling seed (seed, t+k);
  - its behaviour version v = t−1, the weights the engine holds.
Step t+k trains on it with π_θ starting from version t+k−1: the batch is k versions old (fewer
in the first k steps, whose batches all come from version 0). k = 0 is the synchronous loop:
the batch is requested and taken in the same step, v = t−1, and nothing is kept.

Off-policy arithmetic (docs/algorithm.md#asynchronous-rollouts). The clipped surrogate's ratio is

    r_t = π_θ(a_t) / π_old(a_t),   π_old = π_v, the behaviour policy that sampled the batch,

both at the batch's τ, with log π_v of the sampled tokens either
  (a) "trainer": the trainer's forward with version v's parameters. The pipeline keeps a copy of
      the parameters of each version a batch in flight was sampled by (at most k copies of the
      parameters alone, i.e. k/3 of an AdamW train state, on the trainer's devices), dropped
      when the last batch of that version is taken; or
  (b) "engine": the engine's own log-probs of the sampled tokens (vLLM's processed log-probs:
      the tempered distribution, so top-k/top-p must be off; docs/vllm_sidecar.md). No copies,
      but the engine's numerics (bf16 on GPU: ~1e-2 per token) enter every ratio.
Per step the trainer reports the batch's staleness (t−1−v, `rollout/staleness`), the mean
|log π_{t−1} − log π_engine| over the trained tokens (`rollout/engine_logp_abs_diff`: staleness
plus engine numerics, ~0 in float32 when synchronous), the mean |log π_old − log π_engine|
(`rollout/behaviour_logp_abs_diff`: numerics alone) and the shares of clipped tokens
(`loss/clip_frac_low`, `loss/clip_frac_high`). The entropy the scheduler and metrics read is
that of π_{t−1} at τ, the trainer's current policy.

Checks: every completion must carry the version recorded when its batch was requested, and a
batch more than k versions behind the trainer is never trained on (`StaleBatchError`). Both
`take` and `generate_now` (a batch generated on the spot: dynamic sampling's further rounds)
check before they hand a batch out, so the loop gets only checked batches.

Generation: a `BackgroundEngine` (the vLLM sidecar, rollout/background.py) generates the
requested batches on its worker while the trainer trains, so a step waits only for its own
batch; any other engine (the embedded JAX engine, which shares the trainer's devices) generates
a batch when it is requested, before the update: the same batches and arithmetic, no overlap.

Resume: the batches in flight at a checkpoint go into its host payload (`state_dict`): each
batch's plan and completions (waited for), and under (a) the behaviour log-probs computed then
from the kept copy (the copies themselves are not saved). A resumed run takes exactly the
batches the uninterrupted run takes. Every process calls `fill`, `take` and `state_dict` at the
same points of the loop, so the collectives inside them come in the same order everywhere.
The pipeline calls nothing of the loop's but `BehaviourSource.behaviour`, at a checkpoint.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from dynamo_jax.allocation import AllocationResult
from dynamo_jax.rollout.background import BackgroundEngine
from dynamo_jax.rollout.protocol import Completion, Request, RolloutEngine, SamplingParams

_FINISH = ("stop", "length")


class StaleBatchError(RuntimeError):
    """A batch sampled by other weights than recorded, or older than `train.max_staleness`."""


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """One batch as fixed when it is requested."""

    step: int  # the step that trains on it
    rows: np.ndarray  # int64 [I] dataset rows of its prompts
    epoch_end: bool  # the data iterator finished a pass over the dataset with these rows
    allocation: AllocationResult  # n_i per prompt (aligned with `rows`)
    requests: tuple[Request, ...]  # what the engine is asked for (prompts with n_i > 0)
    sampling: SamplingParams  # temperature and seed included
    version: int  # the weight version the engine holds when it is requested

    @property
    def temperature(self) -> float:
        return self.sampling.temperature


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """log π_v of a batch computed ahead (at a checkpoint), on the layout `layout` names."""

    logp: np.ndarray  # float32, the training batch's per-token shape
    layout: str  # fingerprint of the batch's tokens and loss mask


@dataclasses.dataclass(frozen=True)
class TakenBatch:
    """What the step that trains on a batch gets from the pipeline."""

    plan: BatchPlan
    completions: list[Completion]
    behaviour_params: Any  # version plan.version's parameters, when kept (else None)
    behaviour: Behaviour | None  # its log-probs computed ahead (restored from a checkpoint)
    generate_s: float | None  # seconds the background worker spent generating it


class BehaviourSource(Protocol):
    """What the pipeline asks the loop at a checkpoint (`state_dict`): log π_v of a batch in
    flight, from version v's kept parameters, on the layout the batch will be trained on
    (loop/behaviour_pass.py `BehaviourAhead`)."""

    def behaviour(self, plan: BatchPlan, completions: list[Completion], params: Any) -> Behaviour:
        """log π_v of `completions` (the batch `plan` fixed) under `params`."""
        ...


class _Done:
    """A batch generated when requested (or restored): already has its completions."""

    generate_s = None

    def __init__(self, completions: list[Completion]):
        self._completions = completions

    def result(self) -> list[Completion]:
        return self._completions


@dataclasses.dataclass
class _InFlight:
    plan: BatchPlan
    handle: Any  # _Done or background.Pending
    behaviour: Behaviour | None = None


def _check_versions(step: int, plan: BatchPlan, completions: Sequence[Completion], k: int) -> None:
    """Refuse completions of another version than `plan.version`, or a batch older than `k`."""
    got = sorted({int(c.weight_version) for c in completions} - {plan.version})
    if got:
        raise StaleBatchError(
            f"step {step}: the engine returned completions of weight version(s) {got} for a "
            f"batch requested when it held version {plan.version}; refusing to train on them"
        )
    lag = (step - 1) - plan.version
    if not 0 <= lag <= k:
        raise StaleBatchError(
            f"step {step}: its batch was generated by weight version {plan.version}, {lag} "
            f"versions behind the trainer's {step - 1}; train.max_staleness is {k}"
        )


class RolloutPipeline:
    """The batches in flight, oldest first (see the module docstring).

        Each step calls `fill(step, plans, params)` (request the batches `due(step)`: every batch up
    to step + k) then `take(step)`.
        `source` is `train.old_logp_source`: "trainer" keeps a copy of the parameters of each
        version that sampled a batch trained later; "engine" keeps none.
    """

    def __init__(self, engine: RolloutEngine, *, max_staleness: int, last_step: int, source: str):
        self.engine = engine
        self.max_staleness = int(max_staleness)
        self.last_step = int(last_step)
        self.from_engine = source == "engine"  # π_old from the engine's log-probs
        self.keep_params = not self.from_engine and self.max_staleness > 0
        # Staleness and behaviour-policy metrics: whenever π_old may not be the trainer's own.
        self.report_behaviour = self.from_engine or self.max_staleness > 0
        self._background = isinstance(engine, BackgroundEngine)
        self._queue: collections.deque[_InFlight] = collections.deque()
        self._params: dict[int, Any] = {}  # version -> copy of its parameters

    @property
    def in_flight(self) -> list[BatchPlan]:
        return [item.plan for item in self._queue]

    @property
    def kept_versions(self) -> list[int]:
        return sorted(self._params)

    def due(self, step: int) -> range:
        """The steps whose batches step `step` requests: those not yet requested up to `step` +
        k, not past the last step (the loop plans them; `fill` requests them)."""
        first = self._queue[-1].plan.step + 1 if self._queue else step
        return range(first, min(step + self.max_staleness, self.last_step) + 1)

    def fill(self, step: int, plans: Sequence[BatchPlan], params: Any) -> None:
        """Request the batches `due(step)`, as `plans` fixed them (rows, n_i, τ, seed);
        `params` are the trainer's current parameters, version step − 1, which the engine must
        hold."""
        version = step - 1
        if int(self.engine.weight_version) != version:
            raise StaleBatchError(
                f"step {step}: the engine holds weight version {self.engine.weight_version}, "
                f"the trainer pushed {version}"
            )
        if [p.step for p in plans] != list(self.due(step)):
            raise RuntimeError(
                f"step {step}: plans for steps {[p.step for p in plans]}, but steps "
                f"{list(self.due(step))} are due"
            )
        for batch in plans:
            if self.keep_params and batch.step > step and version not in self._params:
                # The update of this step donates `params`: the copy is the behaviour policy.
                self._params[version] = jax.tree.map(jnp.copy, params)
            if self._background:
                handle = self.engine.submit(batch.requests, batch.sampling)
            else:
                handle = _Done(self.engine.generate(batch.requests, batch.sampling))
            self._queue.append(_InFlight(batch, handle))

    def take(self, step: int) -> TakenBatch:
        """Step `step`'s batch (waiting for it if it is still being generated), checked."""
        if not self._queue or self._queue[0].plan.step != step:
            raise RuntimeError(
                f"step {step}: no batch requested for it (in flight: steps "
                f"{[p.step for p in self.in_flight]})"
            )
        item = self._queue.popleft()
        completions = item.handle.result()
        _check_versions(step, item.plan, completions, self.max_staleness)
        version = item.plan.version
        params = self._params.get(version)
        if all(other.plan.version != version for other in self._queue):
            self._params.pop(version, None)
        return TakenBatch(item.plan, completions, params, item.behaviour, item.handle.generate_s)

    def generate_now(self, step: int, plan: BatchPlan) -> TakenBatch:
        """A batch `plan` fixed during step `step`, generated now by the weights the engine
        holds (dynamic sampling's further rounds, loop/generate.py), checked as `take` checks
        (staleness 0): not queued, no parameters kept."""
        completions = self.engine.generate(plan.requests, plan.sampling)
        _check_versions(step, plan, completions, 0)
        return TakenBatch(plan, completions, None, None, None)

    # -- checkpoint payload -------------------------------------------------------------
    def state_dict(self, source: BehaviourSource | None) -> dict:
        """The batches in flight as NumPy trees (waits for their generation). Under
        `keep_params`, `source.behaviour(plan, completions, params)` computes each one's log π_v
        now, from the kept copy, so the checkpoint needs no parameters but the current ones."""
        out: dict[str, Any] = {"count": np.asarray(len(self._queue), np.int64)}
        for i, item in enumerate(self._queue):
            completions = item.handle.result()
            if self.keep_params and item.behaviour is None:
                params = self._params[item.plan.version]
                item.behaviour = source.behaviour(item.plan, completions, params)
            out[f"batch{i}"] = _pack(item.plan, completions, item.behaviour)
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore the batches in flight (already generated); no parameter copies are kept."""
        self._queue.clear()
        self._params.clear()
        count = int(np.asarray(state["count"]))
        items = [_unpack(state[f"batch{i}"]) for i in range(count)]
        steps = [item.plan.step for item in items]
        if steps and steps != list(range(steps[0], steps[0] + count)):
            raise ValueError(f"checkpoint: batches in flight for steps {steps} are not consecutive")
        self._queue.extend(items)


# ----------------------------------------------------------------------------- serialisation


def _json_array(obj: Any) -> np.ndarray:
    """JSON as a uint8 array: the host payload holds arrays only (floats round-trip exactly)."""
    return np.frombuffer(json.dumps(obj).encode(), np.uint8).copy()


def _from_json_array(arr: np.ndarray) -> Any:
    return json.loads(np.asarray(arr, np.uint8).tobytes().decode())


def _concat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate([np.asarray(p, dtype) for p in parts]) if parts else np.zeros(0, dtype)


def _pack(plan: BatchPlan, completions: list[Completion], behaviour: Behaviour | None) -> dict:
    meta = {
        "step": plan.step,
        "version": plan.version,
        "rows": [int(r) for r in plan.rows],
        "epoch_end": plan.epoch_end,
        "n": [int(n) for n in plan.allocation.n],
        "shortfall": int(plan.allocation.shortfall),
        "diagnostics": {k: float(v) for k, v in plan.allocation.diagnostics.items()},
        "sampling": dataclasses.asdict(plan.sampling),
        "requests": [[int(r.prompt_id), int(r.n), len(r.prompt_token_ids)] for r in plan.requests],
        "layout": behaviour.layout if behaviour is not None else None,
    }
    out = {
        "meta": _json_array(meta),
        "request_tokens": _concat([r.prompt_token_ids for r in plan.requests], np.int32),
        # per completion: prompt id, sample index, finish code, weight version, length
        "completions": np.asarray(
            [
                (
                    c.prompt_id,
                    c.sample_index,
                    _FINISH.index(c.finish_reason),
                    c.weight_version,
                    len(c.token_ids),
                )
                for c in completions
            ],
            np.int64,
        ).reshape(-1, 5),  # fmt: skip
        "tokens": _concat([c.token_ids for c in completions], np.int32),
        "logprobs": _concat([c.logprobs for c in completions], np.float32),
    }
    if behaviour is not None:
        out["behaviour_logp"] = np.asarray(behaviour.logp, np.float32)
    return out


def _unpack(state: dict) -> _InFlight:
    meta = _from_json_array(state["meta"])
    tokens = np.asarray(state["request_tokens"], np.int32)
    requests, offset = [], 0
    for prompt_id, n, length in meta["requests"]:
        requests.append(Request(prompt_id, tuple(tokens[offset : offset + length]), n))
        offset += length
    sampling = meta["sampling"]
    sampling["stop_token_ids"] = tuple(sampling["stop_token_ids"])
    plan = BatchPlan(
        step=int(meta["step"]),
        rows=np.asarray(meta["rows"], np.int64),
        epoch_end=bool(meta["epoch_end"]),
        allocation=AllocationResult(
            np.asarray(meta["n"], np.int64), int(meta["shortfall"]), meta["diagnostics"]
        ),
        requests=tuple(requests),
        sampling=SamplingParams(**sampling),
        version=int(meta["version"]),
    )
    all_tokens = np.asarray(state["tokens"], np.int32)
    all_logprobs = np.asarray(state["logprobs"], np.float32)
    completions, offset = [], 0
    for prompt_id, index, finish, version, length in np.asarray(state["completions"]).tolist():
        completions.append(
            Completion(
                prompt_id=int(prompt_id),
                sample_index=int(index),
                token_ids=all_tokens[offset : offset + length].copy(),
                logprobs=all_logprobs[offset : offset + length].copy(),
                finish_reason=_FINISH[finish],
                weight_version=int(version),
            )
        )
        offset += length
    behaviour = None
    if "behaviour_logp" in state:
        behaviour = Behaviour(np.asarray(state["behaviour_logp"], np.float32), meta["layout"])
    return _InFlight(plan, _Done(completions), behaviour)
