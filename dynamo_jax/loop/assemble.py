"""Rollouts → the trainer's typed batch (`RolloutBatch`), and the rows the jitted functions take.

`RolloutBatch` (one row per completion, prompt then response, left-aligned, padded on the right
to `seq_len`; every per-token array indexed by the token it scores) is what the stages of a step
hand each other (rl_step.py): built once from the scored completions (`build_batch`), completed
with the old-log-prob pass's outputs (`dataclasses.replace`), then read by the update. It is
immutable and host-side (NumPy), and always has `rows` rows (the step's budget B): when the
allocator reports a shortfall the missing rows are padding (`valid` False, loss_mask 0,
advantage 0).

The jitted functions take rows of a `RowLayout` (data/packing.py) instead, one for the update's
mini-batches and one for the log-prob pass (`StepLayouts`, fixed once per run by `step_layouts`
and kept by the `Trainer`, loop/build.py): `lay_out` lays a
set of the batch's sequences (the whole batch for the old-log-prob pass, one shuffled mini-batch
for an update) into rows, packed several to a row or one per row, with the per-token fields of
step/forward.py's convention, and returns the `Placement`: where each sequence went, whose `gather`
brings per-token outputs back to the batch's rows. `device_rows` does that and feeds the rows to
the devices, one typed `DeviceRows` per jitted call: the pass's (laid out once, for every forward
of the pass) and each update's (the sequences `mini_batch_order` gives it).
Every process of a multi-process run holds the whole batch and builds the same rows.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from dynamo_jax import tasks
from dynamo_jax.config import RunConfig
from dynamo_jax.data.packing import Placement, RowLayout
from dynamo_jax.losses.advantages import sequence_advantages
from dynamo_jax.rollout.protocol import Completion
from dynamo_jax.seeds import MINI_BATCH, step_seed
from dynamo_jax.sharding import multihost


@dataclasses.dataclass(frozen=True)
class StepLayouts:
    """The two row layouts of a run's steps (built once: loop/build.py `Trainer.layouts`)."""

    update: RowLayout  # a mini-batch of the update: mini_batch_size sequences
    logprob_pass: RowLayout  # the old-log-prob pass: the whole budget


def step_layouts(cfg: RunConfig, row_shards: int) -> StepLayouts:
    """The update's and the old-log-prob pass's row layouts for `row_shards` ways of splitting a
    batch's rows (sharding/rules.py `row_shards`): rows of train.pack_len tokens (default the
    run's max_seq_len), packed or one sequence per row, in micro-batches of the token budget's
    rows (max_tokens_per_micro_batch // row length per device) or of mini_batch_size /
    micro_batches rows. A layout the mesh cannot split is a ValueError (RowLayout)."""
    train = cfg.train
    row_len = train.pack_len or cfg.max_seq_len
    if train.max_tokens_per_micro_batch:
        micro_rows = row_shards * (train.max_tokens_per_micro_batch // row_len)
    else:
        micro_rows = train.mini_batch_size // train.micro_batches
    shared = {}
    if train.share_prompts:
        # A micro-batch holds at most the step's prompts. Dynamic sampling draws more rounds,
        # so there the table has room for a prompt per row and the prompts' stream is as long
        # as the rows' prompt slots: correct, but it saves nothing (docs/algorithm.md).
        groups = micro_rows if train.dynamic_sampling else min(micro_rows, train.prompts_per_step)
        shared = dict(prompt_slots=cfg.data.max_prompt_tokens, prompt_groups=groups)
    layout = functools.partial(
        RowLayout, row_len, train.packing, micro_rows, row_shards=row_shards, **shared
    )
    return StepLayouts(
        layout(max_sequences=train.mini_batch_size), layout(max_sequences=cfg.budget)
    )


@dataclasses.dataclass(frozen=True)
class RolloutBatch:
    """One step's rollouts as fixed-shape host arrays ([B, L] per token, [B] per row)."""

    tokens: np.ndarray  # int32 [B, L] prompt + response ids
    positions: np.ndarray  # int32 [B, L] RoPE positions
    attention_mask: np.ndarray  # int32 [B, L] 1 for real tokens
    loss_mask: np.ndarray  # float32 [B, L] 1 on response tokens (the trained ones)
    engine_logp: np.ndarray  # float32 [B, L] the engine's log-prob of each sampled token
    valid: np.ndarray  # bool [B] False on padding rows
    prompt_id: np.ndarray  # int64 [B] stable prompt id (-1 on padding rows)
    response_len: np.ndarray  # int32 [B]
    stopped: np.ndarray  # bool [B] ended on a stop token (not the length limit)
    rewards: np.ndarray  # float32 [B]
    advantages: np.ndarray  # float32 [B] sequence advantage of each row
    temperature: float  # the sampling temperature of every row
    old_logp: np.ndarray | None = None  # float32 [B, L] log π_old at `temperature`
    ref_logp: np.ndarray | None = None  # float32 [B, L] reference policy (KL term only)
    entropy: np.ndarray | None = None  # float32 [B, L] H_t of π_old at `temperature`
    # float32 [B, L] rollout correction's truncated IS weight (train.rollout_is only)
    rollout_is_weight: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return len(self.valid)

    @property
    def entropy_mean(self) -> float:
        """Mean token entropy over the trained tokens (NaN if there are none)."""
        mask = self.loss_mask > 0
        return float(self.entropy[mask].mean()) if mask.any() else float("nan")


def pack_rollouts(
    prompt_tokens: dict[int, Sequence[int]],
    completions: Sequence[Completion],
    *,
    rows: int,
    seq_len: int,
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """Fixed-shape arrays for `completions` (prompt tokens looked up by prompt id).

    Returns tokens/positions/attention_mask int32 [B, L], loss_mask and engine_logp (the engine's
    sampled-token log-probs, for diagnostics) float32 [B, L], and per row:
    valid bool [B], prompt_id int64 [B], response_len int32 [B], stopped bool [B].
    """
    if len(completions) > rows:
        raise ValueError(f"pack_rollouts: {len(completions)} completions exceed the {rows} rows")
    tokens_BxL = np.full((rows, seq_len), pad_id, np.int32)
    mask_BxL = np.zeros((rows, seq_len), np.int32)
    loss_BxL = np.zeros((rows, seq_len), np.float32)
    engine_logp_BxL = np.zeros((rows, seq_len), np.float32)
    valid_B = np.zeros(rows, bool)
    prompt_id_B = np.full(rows, -1, np.int64)
    resp_len_B = np.zeros(rows, np.int32)
    stopped_B = np.zeros(rows, bool)
    for b, c in enumerate(completions):
        prompt = np.asarray(prompt_tokens[c.prompt_id], np.int32)
        resp = np.asarray(c.token_ids, np.int32)
        p, r = len(prompt), len(resp)
        if p + r > seq_len:
            raise ValueError(
                f"pack_rollouts: prompt {c.prompt_id} ({p} tokens) + response ({r} tokens) "
                f"exceeds seq_len {seq_len}; raise the length limits consistently"
            )
        tokens_BxL[b, :p] = prompt
        tokens_BxL[b, p : p + r] = resp
        mask_BxL[b, : p + r] = 1
        loss_BxL[b, p : p + r] = 1.0  # every response token, the stop token included
        engine_logp_BxL[b, p : p + r] = c.logprobs
        valid_B[b] = True
        prompt_id_B[b] = c.prompt_id
        resp_len_B[b] = r
        stopped_B[b] = c.finish_reason == "stop"
    # Right padding: positions of real tokens count from 0; padding positions are irrelevant.
    positions_BxL = np.maximum(np.cumsum(mask_BxL, axis=1) - 1, 0).astype(np.int32)
    return {
        "tokens": tokens_BxL,
        "positions": positions_BxL,
        "attention_mask": mask_BxL,
        "loss_mask": loss_BxL,
        "engine_logp": engine_logp_BxL,
        "valid": valid_B,
        "prompt_id": prompt_id_B,
        "response_len": resp_len_B,
        "stopped": stopped_B,
    }


def group_stats(
    prompt_id_B: np.ndarray,
    rewards_B: np.ndarray,
    valid_B: np.ndarray,
    entropy_BxL: np.ndarray | None = None,
    mask_BxL: np.ndarray | None = None,
) -> dict:
    """Per prompt-id group: count, correct count (reward > 0), reward sum, zero-variance flag,
    and with `entropy_BxL` the mean token entropy over the group's `mask_BxL` tokens (NaN if
    it has none)."""
    ids = prompt_id_B[valid_B]
    rewards = rewards_B[valid_B]
    uniq, inverse = np.unique(ids, return_inverse=True)
    count = np.bincount(inverse, minlength=len(uniq))
    correct = np.bincount(inverse, weights=(rewards > 0).astype(np.float64), minlength=len(uniq))
    rsum = np.bincount(inverse, weights=rewards.astype(np.float64), minlength=len(uniq))
    rsq = np.bincount(inverse, weights=rewards.astype(np.float64) ** 2, minlength=len(uniq))
    var = rsq / np.maximum(count, 1) - (rsum / np.maximum(count, 1)) ** 2
    out = {
        "prompt_id": uniq,
        "count": count.astype(np.int64),
        "correct": np.rint(correct).astype(np.int64),
        "reward_sum": rsum,
        "zero_variance": var <= 1e-12,
    }
    if entropy_BxL is not None:
        mask = np.asarray(mask_BxL, bool)[valid_B]
        ent = np.where(mask, np.asarray(entropy_BxL, np.float64)[valid_B], 0.0)
        tokens = np.bincount(inverse, weights=mask.sum(axis=1), minlength=len(uniq))
        ent_sum = np.bincount(inverse, weights=ent.sum(axis=1), minlength=len(uniq))
        with np.errstate(invalid="ignore", divide="ignore"):
            out["entropy_mean"] = np.where(tokens > 0, ent_sum / tokens, np.nan)
    return out


def prompt_weights(
    prompt_id_B: np.ndarray, valid_B: np.ndarray, loss_mask_BxL: np.ndarray
) -> np.ndarray:
    """float32 [B]: prompt-mean's weight 1/n_i of each row, n_i the number of rows of its prompt id
    in the WHOLE step's batch that have a trained token (0 for the other rows).

    Taken from the step's batch, never from a mini-batch, so every split of it (mini-batches,
    micro-batches, rows, devices, processes: each process holds the whole batch) sees the same
    weights; the loss renormalises them over the mini-batch it trains on (docs/estimators.md).
    """
    trained = np.asarray(valid_B, bool) & (np.asarray(loss_mask_BxL) > 0).any(axis=1)
    ids = np.asarray(prompt_id_B)
    out = np.zeros(len(ids), np.float32)
    if trained.any():
        uniq, inverse = np.unique(ids[trained], return_inverse=True)
        count = np.bincount(inverse, minlength=len(uniq))
        out[trained] = 1.0 / count[inverse]
    return out


# Row fields that are not a RolloutBatch array laid out token by token.
_DERIVED_FIELDS = {
    "positions": lambda placement, batch, seqs: placement.positions(),
    "segment_ids": lambda placement, batch, seqs: placement.segment_ids(),
    "advantages": lambda placement, batch, seqs: placement.broadcast(batch.advantages[seqs], 0.0),
    "seq_weight": lambda placement, batch, seqs: placement.broadcast(
        prompt_weights(batch.prompt_id, batch.valid, batch.loss_mask)[seqs], 0.0
    ),
    "sequence_index": lambda placement, batch, seqs: placement.broadcast(
        np.arange(len(seqs), dtype=np.int32)
    ),
    "temperature": lambda placement, batch, seqs: np.float32(batch.temperature),
    # 0: the update reads `old_logp`; `device_rows` sets 1 for the on-policy first update.
    "on_policy": lambda placement, batch, seqs: np.float32(0.0),
}


def lay_out(
    batch: RolloutBatch, seqs: np.ndarray, layout: RowLayout, fields: Sequence[str]
) -> tuple[dict[str, np.ndarray], Placement]:
    """The sequences `seqs` (rows of `batch`, in mini-batch order) as `layout`'s rows.

    Returns the named fields ([R, L] per token, `temperature` and `on_policy` 0-d float32) and
    the placement, whose `rows` is R. Positions restart at 0 for every sequence; `advantages` puts
    each sequence's advantage on its tokens; `sequence_index` is the sequence's index in `seqs`.
    Packed, the sequences with no trained token are left out: nothing reads them.
    """
    seqs = np.asarray(seqs, np.int64)
    lengths = batch.attention_mask[seqs].sum(axis=1)
    trained = batch.loss_mask[seqs] > 0
    if layout.packing:
        lengths = np.where(trained.any(axis=1), lengths, 0)
    # A sequence's first token is scored by the slot before it, another sequence's when packed:
    # it must be a prompt token (never trained), as it always is when the prompt is not empty.
    first_trained = np.flatnonzero(trained[:, 0] & (lengths > 0))
    if len(first_trained):
        b = int(seqs[first_trained[0]])
        raise ValueError(
            f"rollout row {b} (prompt id {int(batch.prompt_id[b])}) trains on its first token; "
            "every sequence must start with a prompt token"
        )
    prompt_lengths = None
    if layout.prompt_slots:
        prompt_lengths = lengths - batch.response_len[seqs]
    placement = layout.place(lengths, prompt_lengths)
    out = {}
    for name in fields:
        if name in _DERIVED_FIELDS:
            out[name] = _DERIVED_FIELDS[name](placement, batch, seqs)
            continue
        if name in ("prompt_table", "prompt_source"):
            if name not in out:
                out["prompt_table"], out["prompt_source"] = placement.shared_prompt_tables(
                    batch.prompt_id[seqs],
                    batch.tokens[seqs],
                    batch.attention_mask[seqs],
                    layout.prompt_slots,
                    layout.prompt_groups,
                )
            continue
        value = getattr(batch, name, None)
        if value is None:
            raise ValueError(f"RolloutBatch.{name} is not set at this stage of the step")
        out[name] = placement.scatter(np.asarray(value)[seqs])
    return out, placement


@dataclasses.dataclass(frozen=True)
class DeviceRows:
    """A set of the batch's sequences as one jitted call takes them (`device_rows`)."""

    arrays: dict[str, jax.Array]  # the named fields, global arrays on the call's shardings
    placement: Placement  # where each of `seqs` sits in the rows (`gather` brings outputs back)
    seqs: np.ndarray  # int64 [S] the batch rows laid out, in order


def device_rows(
    batch: RolloutBatch,
    seqs: np.ndarray,
    layout: RowLayout,
    shardings: Mapping[str, jax.sharding.Sharding],
    on_policy: bool = False,
) -> DeviceRows:
    """The sequences `seqs` laid into `layout`'s rows (`lay_out`, the fields `shardings` names)
    and fed to the devices: each process feeds its own rows of the batch every process holds.
    `on_policy`: the update takes π_old = stop_gradient(π) of its own forward (the on-policy
    first update: RunConfig.first_update_on_policy)."""
    rows, placement = lay_out(batch, seqs, layout, tuple(shardings))
    if "on_policy" in rows:
        rows["on_policy"] = np.float32(on_policy)
    arrays = multihost.global_batch_from_host(rows, shardings, placement.rows)
    return DeviceRows(arrays, placement, np.asarray(seqs, np.int64))


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


# One compiled program per (loss config, group count): run eagerly, the advantages' few dozen
# small ops were a dispatch each, a few ms a step (at the tiny shape a tenth of the step).
_sequence_advantages = jax.jit(sequence_advantages, static_argnames=("cfg", "num_groups"))


def build_batch(
    cfg: RunConfig,
    task: tasks.Task,
    completions: Sequence[Completion],
    temperature: float,
    rewards_B: np.ndarray,
) -> RolloutBatch:
    """The fixed-shape batch of the scored completions (sampled at `temperature`), with the loss
    variant's advantages."""
    arrays = pack_rollouts(
        task.tokens_by_id,
        completions,
        rows=cfg.budget,
        seq_len=task.seq_len,
        pad_id=task.pad_id,
    )
    adv_B = _sequence_advantages(
        cfg.loss,
        rewards_B,
        arrays["prompt_id"],
        num_groups=cfg.train.prompts_per_step,
        valid_B=arrays["valid"],
    )
    return RolloutBatch(
        **arrays,
        rewards=rewards_B,
        advantages=np.asarray(adv_B, np.float32),
        temperature=float(temperature),
    )
