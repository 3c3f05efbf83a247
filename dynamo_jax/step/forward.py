"""The sharded forward pass of the trainer: per-token log π, entropy and K at a temperature.

Batch convention (shared by the train step, `make_logprob_fn` and the training loop): every
per-token array is [B, L], B rows of L token slots, and indexed by the token it SCORES. A row
holds one sequence (prompt then response) or, packed, several laid end to end
(data/packing.py); real tokens and empty slots may sit anywhere, since the model decides
causality by slot and segment and takes explicit positions:

    tokens          int32 [B, L]  prompt + response token ids (empty slots: any id, e.g. 0)
    positions       int32 [B, L]  RoPE positions: 0, 1, ... within each sequence
    segment_ids     int32 [B, L]  k >= 1 on the row's k-th sequence, 0 on empty slots (a 0/1
                                  attention mask is the one-sequence-per-row case)
    loss_mask       f32   [B, L]  1 where tokens[b, t] is a response token to train on
    advantages      f32   [B, L] or [B] (per sequence: its advantage on each of its tokens;
                                  [B] only when every row is one sequence)
    old_logp        f32   [B, L]  log π_old(tokens[b, t] | its sequence before t) at the batch temperature
    ref_logp        f32   [B, L]  same under the reference policy (only when the loss has a KL term)
    seq_weight      f32   [B, L]  the sequence's 1/n_i (n_i: its prompt group's size in the step's
                                  batch) on each of its tokens (only for loss_agg_mode
                                  "prompt-mean"; assemble.prompt_weights)
    rollout_is_weight f32 [B, L]  rollout correction's truncated IS weight π_old / π_engine of each
                                  trained token (only with train.rollout_is; a constant factor of
                                  its policy-gradient loss, losses/rollout_correction.py)
    sequence_index  int32 [B, L]  the token's sequence's index in the mini-batch (only for variants
                                  that draw per-token noise: it keys the noise, step/train_step.py)
    temperature     f32   []      the sampling temperature of this batch (a traced scalar: changing
                                  it every step never recompiles)
    prompt_table    int32 [B]     with shared prompts only (`SharedPrompts`, train.share_prompts):
                                  entry g < G of a micro-batch = the row (within it) that holds its
                                  g-th distinct prompt; the entries from G on are not read
    prompt_source   int32 [B]     with shared prompts only: which of those G prompts the row's is
    on_policy       f32   []      train step only: 1 when the mini-batch was sampled by the very
                                  parameters this update starts from, so π_old = stop_gradient(π)
                                  of the update's own forward and `old_logp` is not read (the
                                  log-prob pass skipped it); 0 reads `old_logp`

So logp[b, t] = log softmax(logits[b, t - 1] / T)[tokens[b, t]]: position t − 1 of the same row,
which is the same sequence wherever token t is trained (a sequence's first token is a prompt
token: loss_mask is 0 there, and on column 0). Outputs are 0 where nothing is scored.

The vocabulary projection never materialises [B·L, V] logits: hidden states go to the losses'
blockwise, vocab-sharded `sharded_token_logprobs_entropy` (tokens split over the `act_batch`
axes, vocabulary over the `act_vocab` axis).

Micro-batches: a batch of B = M · micro_rows rows runs as M micro-batches of `micro_rows` rows,
micro-batch m = rows m, m + M, m + 2M, ... (`split_micro`), and a batch of at most `micro_rows`
rows as one micro-batch; M follows from the batch's shape, so one built function takes every
row count (data/packing.py rounds them to few), and a micro-batch with no token at all (segment
ids all 0: layout padding) is skipped (`lax.cond`) at no cost.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dynamo_jax.data.packing import RowLayout
from dynamo_jax.losses.logprobs import DEFAULT_BLOCK_SIZE, sharded_token_logprobs_entropy
from dynamo_jax.models.config import ModelConfig
from dynamo_jax.models.qwen import (
    SharedPrompts,
    Transformer,
    param_logical_axes,
    param_shapes,
    unembedding,
)
from dynamo_jax.sharding.rules import (
    LogicalRules,
    _as_axes_tuple,
    batch_sharding,
    fit_rules,
    param_shardings,
    replicated,
    rule_axes,
)
from dynamo_jax.step.xla_options import trainer_compiler_options

Array = jax.Array
# Fields present in every batch; `ref_logp` is added when the loss has a KL term.
SCALAR_FIELDS = ("temperature", "on_policy")  # 0-d, the same on every device (replicated)
MODEL_INPUT_FIELDS = ("tokens", "positions", "segment_ids")
TRAIN_FIELDS = MODEL_INPUT_FIELDS + (
    "loss_mask",
    "advantages",
    "old_logp",
    "temperature",
    "on_policy",
)
LOGPROB_FIELDS = MODEL_INPUT_FIELDS + ("loss_mask", "temperature")  # make_logprob_fn's batch
# Per-row int32 [B] fields of the shared-prompt layout (added where it is on).
PROMPT_FIELDS = ("prompt_table", "prompt_source")


def activation_rules(rules: LogicalRules, mesh: Mesh, model_cfg: ModelConfig) -> LogicalRules:
    """The rules with activation axes cut to what the model's dimensions allow (see rules.py)."""
    dims = {
        "act_heads": model_cfg.num_heads,
        "act_kv_heads": model_cfg.num_kv_heads,
        "act_mlp": model_cfg.intermediate_size,
        "act_vocab": model_cfg.vocab_size,
        "act_embed": model_cfg.hidden_size,
    }
    return fit_rules(rules, mesh, dims)


def model_param_shardings(model_cfg: ModelConfig, mesh: Mesh, rules: LogicalRules) -> Any:
    """NamedShardings of the model's parameters (no allocation)."""
    return param_shardings(param_shapes(model_cfg), param_logical_axes(model_cfg), mesh, rules)


def batch_shardings(
    mesh: Mesh, rules: LogicalRules, batch_size: int, fields: tuple[str, ...]
) -> dict[str, NamedSharding]:
    """Shardings for a batch dict: rows over the `act_batch` axes, the scalars replicated.

    The spec names only dimension 0, so it fits both [B] and [B, L] arrays.
    """
    row = batch_sharding(mesh, rules, batch_size, ndim=1)
    return {f: (replicated(mesh) if f in SCALAR_FIELDS else row) for f in fields}


def _shift_right(x_BxL: Array) -> Array:
    """Move per-prediction values (index t predicts token t+1) to the token they score."""
    return jnp.pad(x_BxL[:, :-1], ((0, 0), (1, 0)))


def token_stats(
    params: Any,
    batch: Mapping[str, Array],
    *,
    model_cfg: ModelConfig,
    mesh: Mesh,
    rules: LogicalRules,
    return_k: bool,
    block_size: int = DEFAULT_BLOCK_SIZE,
    logits_residual: str = "recompute",
    shared_prompts: tuple[int, int] | None = None,
) -> tuple[Array, Array, Array | None]:
    """(logp_BxL, entropy_BxL, K_BxL or None), float32, per the module's batch convention.

    Call inside a jit over `mesh`; `rules` should already be `activation_rules(...)`.
    Gradients flow through logp and entropy; K is stop-gradient. `logits_residual` is
    `LossConfig.logits_residual` (what the backward of the log-prob pass keeps; logprobs.py).
    With `loss_mask` in `batch`, only the tokens it selects are scored: the others (prompt,
    padding) are 0 in all three outputs and cost no vocabulary projection, forward or backward.
    `shared_prompts` = (P prompt slots, G prompts), static: the rows' prompts sit in slots
    [0, P) and the model runs each of the batch's G `prompt_table` rows' prompts once
    (`SharedPrompts`; the same outputs).
    """
    tokens_BxL = batch["tokens"]
    b, length = tokens_BxL.shape
    prompts = None
    if shared_prompts is not None:
        slots, groups = shared_prompts
        table = batch["prompt_table"][:groups]
        prompts = SharedPrompts(slots, table, batch["prompt_source"])
    # The abstract mesh makes the model's `with_logical_constraint`s real inside this jit
    # (`jax.set_mesh` is not allowed under a trace).
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
        hidden_BxLxD = Transformer(model_cfg).apply(
            {"params": params},
            tokens_BxL,
            batch["positions"],
            batch["segment_ids"],
            prompts,
            method=Transformer.hidden,
        )
    w_DxV = unembedding(params, model_cfg)
    # Position t predicts token t + 1; the last position predicts nothing (target 0, dropped).
    targets_BxL = jnp.pad(tokens_BxL[:, 1:], ((0, 0), (0, 1)))
    scored_N = None
    if "loss_mask" in batch:  # position t is needed iff token t + 1 is trained on
        scored_N = jnp.pad(batch["loss_mask"][:, 1:] > 0, ((0, 0), (0, 1))).reshape(-1)
    token_axes = tuple(a for a in _as_axes_tuple(rule_axes(rules, "act_batch")) if a)
    vocab_axes = _as_axes_tuple(rule_axes(rules, "act_vocab"))
    if len(vocab_axes) > 1:
        raise ValueError(f"rule act_vocab must name at most one mesh axis, got {vocab_axes}")
    logp, ent, k = sharded_token_logprobs_entropy(
        hidden_BxLxD.reshape(b * length, -1),
        w_DxV,
        targets_BxL.reshape(-1),
        batch["temperature"],
        mesh=mesh,
        tensor_axis=vocab_axes[0] if vocab_axes else None,
        token_axes=token_axes,
        block_size=block_size,
        return_k=return_k,
        logits_residual=logits_residual,
        token_mask_N=scored_N,
    )
    shift = lambda x: _shift_right(x.reshape(b, length))
    return shift(logp), shift(ent), (shift(k) if return_k else None)


def micro_batch_count(rows: int, micro_rows: int) -> int:
    """M for a batch of `rows` rows (trace time: shapes are static): up to `micro_rows` rows are
    one micro-batch, more must be a whole number of micro-batches."""
    if rows > micro_rows and rows % micro_rows:
        raise ValueError(
            f"a batch of {rows} rows does not split into micro-batches of {micro_rows} rows"
        )
    return max(rows // micro_rows, 1)


def has_tokens(micro_batch: Mapping[str, Array]) -> Array:
    """Whether a micro-batch holds any token (else it is layout padding, skipped)."""
    return jnp.any(micro_batch["segment_ids"] > 0)


def split_micro(rows: Mapping[str, Array], m: int, row_sharding: NamedSharding) -> dict:
    """[B, ...] → [M, B/M, ...] with micro-batch i = rows i, i + M, i + 2M, ...

    Strided, so each device's contiguous block of rows contributes equally to every
    micro-batch and the split moves no data between devices.
    """
    spec = P(None, *row_sharding.spec)
    out = {}
    for key, x in rows.items():
        x = x.reshape((x.shape[0] // m, m) + x.shape[1:]).swapaxes(0, 1)
        out[key] = jax.lax.with_sharding_constraint(x, NamedSharding(row_sharding.mesh, spec))
    return out


def unsplit_micro(x_MxBx: Array) -> Array:
    """Inverse of `split_micro` for one array: back to [B, ...] in the original row order."""
    return x_MxBx.swapaxes(0, 1).reshape((-1,) + x_MxBx.shape[2:])


class LogprobFn(NamedTuple):
    """What `make_logprob_fn` builds: the jitted forward, the shardings of the batch it takes, and
    the row layout the training loop packs its sequences with (data/packing.py).

    Calling it calls `fn` with only the fields it reads (`batch_shardings`' keys).
    """

    fn: Callable  # (params, batch) -> (logp_BxL, entropy_BxL)
    batch_shardings: dict[str, NamedSharding]  # field -> sharding of the batch rows
    layout: RowLayout  # rows of layout.row_len slots, micro-batches of layout.micro_rows rows

    def __call__(self, params, batch):
        return self.fn(params, {f: batch[f] for f in self.batch_shardings})


def make_logprob_fn(
    model_cfg: ModelConfig,
    mesh: Mesh,
    rules: LogicalRules,
    layout: RowLayout,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> LogprobFn:
    """A jitted `fn(params, batch) -> (logp_BxL, entropy_BxL)` for old/reference log-probs.

    `batch` needs `tokens`, `positions`, `segment_ids`, `loss_mask` and `temperature` (module
    convention) in rows of `layout.row_len` slots, a multiple of `layout.micro_rows` rows; the
    outputs are sharded like the batch rows and are zero wherever no token is scored (only the
    trained tokens are: no loss reads the others). The forward runs one micro-batch of
    `layout.micro_rows` rows at a time (`lax.scan`), which bounds activation memory (attention
    scores grow with rows × L²) whatever the rollout batch's size; empty micro-batches are skipped.
    """
    act_rules = activation_rules(rules, mesh, model_cfg)
    micro_rows = layout.micro_rows
    batch_sharding(mesh, act_rules, micro_rows, ndim=1)  # clear error if uneven
    shared = layout.shared_prompts
    fields = LOGPROB_FIELDS + (PROMPT_FIELDS if shared else ())
    in_batch = batch_shardings(mesh, act_rules, micro_rows, fields)
    out = batch_sharding(mesh, act_rules, micro_rows, ndim=2)
    row_sh = NamedSharding(mesh, P(rule_axes(act_rules, "act_batch")))
    forward = functools.partial(
        token_stats,
        model_cfg=model_cfg,
        mesh=mesh,
        rules=act_rules,
        return_k=False,
        block_size=block_size,
        shared_prompts=shared,
    )

    def fn(params, batch):
        temperature = batch["temperature"]
        rows = {f: batch[f] for f in fields if f != "temperature"}
        m = micro_batch_count(rows["tokens"].shape[0], micro_rows)
        run = lambda mb: forward(params, {**mb, "temperature": temperature})[:2]
        if m == 1:
            return run(rows)

        def body(_, mb):
            zeros = lambda mb: (jnp.zeros(mb["tokens"].shape, jnp.float32),) * 2
            return None, jax.lax.cond(has_tokens(mb), run, zeros, mb)

        _, (logp, ent) = jax.lax.scan(body, None, split_micro(rows, m, row_sh))
        return unsplit_micro(logp), unsplit_micro(ent)

    jitted = jax.jit(
        fn,
        in_shardings=(model_param_shardings(model_cfg, mesh, rules), in_batch),
        out_shardings=(out, out),
        compiler_options=trainer_compiler_options(mesh),
    )
    return LogprobFn(jitted, dict(in_batch), layout)
