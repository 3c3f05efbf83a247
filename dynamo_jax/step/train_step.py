"""The one jitted, sharded optimizer step: forward → log π/H/K → DynaMO loss → grads → optax.

    train_step, state_shardings, batch_shardings = make_train_step(
        model_cfg, loss_cfg, optimizer, mesh, rules, batch_size=B, micro_batches=M, seed=seed)
    state = init_train_state(model_cfg, optimizer, mesh, rules, rng)      # state.py
    state, metrics = train_step(state, batch)      # batch: forward.py's convention

`train_step` is a single `jax.jit` with explicit in/out shardings (state from the rules, batch rows
over the `act_batch` axes, metrics replicated) and the state donated (argument 0): the caller
must not reuse the `state` it passed in.

Micro-batches hold B / M rows ("micro_rows"). A batch of any multiple k of micro_rows rows runs as
k micro-batches, and one of at most micro_rows rows as one (jax.jit compiles once per distinct
row count): with packed rows the row count of a mini-batch varies, and the loop rounds it to a
few values (data/packing.py); a micro-batch with no token is skipped. Micro-batch m takes rows m, m + k, m + 2k, ... (`forward.split_micro`):
each device's contiguous rows then contribute equally to every micro-batch, so splitting moves
no data.

Whole-mini-batch semantics under gradient accumulation (docs/algorithm.md#aggregation-modes, docs/algorithm.md#scope-of-the-statistics): the loss
normaliser and the modulation statistics (H_min, H_max, max Ξ, baseline thresholds) are those of
the WHOLE mini-batch on all devices. With k > 1 micro-batches the step therefore first runs a
forward-only pass over all micro-batches (`lax.scan`) to get the per-token log π/H/K of the
mini-batch, computes `minibatch_stats` once, then scans again accumulating gradients (float32)
of each micro-batch's loss, which the losses already divide by the mini-batch normaliser. So the
update does not depend on the split, at the cost of one extra forward pass (~1/3 more compute)
when k > 1; with one micro-batch the statistics come from the same forward, under stop-gradient.
Rows may hold several sequences (segment ids): every per-sequence quantity is per segment
(losses/batch.py), so packed and padded batches give the same update.

The loss variant (losses/registry.py) is looked up once here: it decides whether the log-prob
pass also returns K, and whether the step draws per-token U[0, 1) noise (Clip-Cov's random pick).
A token's noise is a function of the step's key (`seed` folded with the state's update counter)
and of (its sequence's index in the mini-batch, its position in that sequence) alone
(`token_noise`), so the pick does not depend on how the mini-batch is packed, split or sharded.

A non-finite loss or gradient norm (a non-finite gradient, or a norm past float32's range, which
verl's actor skips as well): the update is not applied (params, optimizer state and `step` are
kept: a `lax.cond` on a finite flag) and `metrics["update_skipped"]` is 1; the training loop
counts consecutive skips.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dynamo_jax.losses import (
    LossConfig,
    TokenBatch,
    build_loss_fn,
    combine_metrics,
    finalize_metrics,
    minibatch_stats,
    registry,
)
from dynamo_jax.losses.logprobs import DEFAULT_BLOCK_SIZE
from dynamo_jax.models.config import ModelConfig
from dynamo_jax.sharding.rules import LogicalRules, batch_sharding, replicated, rule_axes
from dynamo_jax.step.forward import (
    PROMPT_FIELDS,
    SCALAR_FIELDS,
    TRAIN_FIELDS,
    activation_rules,
    batch_shardings,
    has_tokens,
    micro_batch_count,
    split_micro,
    token_stats,
    unsplit_micro,
)
from dynamo_jax.step.state import TrainState, train_state_shardings
from dynamo_jax.step.xla_options import trainer_compiler_options

Array = jax.Array


class TrainStep(NamedTuple):
    """What `make_train_step` builds: the jitted step and the shardings it takes and returns."""

    fn: Callable  # (state, batch) -> (state, metrics); the state is donated
    state_shardings: TrainState  # of NamedSharding
    batch_shardings: dict[str, NamedSharding]  # field -> sharding of the mini-batch it takes


NOISE_STREAM = 1  # folded into the step key for Clip-Cov's token pick


def train_fields(
    loss_cfg: LossConfig, shared_prompts: bool = False, is_weights: bool = False
) -> tuple[str, ...]:
    """The batch fields the step reads for this loss (forward.py documents each).

    `ref_logp` is needed when the loss has a KL penalty, `sequence_index` when the variant draws
    per-token noise, `seq_weight` under loss_agg_mode "prompt-mean", the prompt table with
    `shared_prompts`, `rollout_is_weight` with `is_weights` (rollout correction's IS weights);
    a variant may ask for more.
    """
    variant = registry.get(loss_cfg.variant)
    fields = TRAIN_FIELDS + variant.batch_fields
    if loss_cfg.kl != "none":
        fields += ("ref_logp",)
    if variant.needs_noise:
        fields += ("sequence_index",)
    if loss_cfg.loss_agg_mode == "prompt-mean":
        fields += ("seq_weight",)
    if shared_prompts:
        fields += PROMPT_FIELDS
    if is_weights:
        fields += ("rollout_is_weight",)
    return fields


def token_noise(key: Array, sequence_index_BxL: Array, position_BxL: Array) -> Array:
    """float32 U[0, 1) per token: uniform(fold_in(fold_in(key, sequence index), position)).

    A function of the token's identity alone, never of where it sits in the batch's rows.
    """
    draw = lambda s, p: jax.random.uniform(jax.random.fold_in(jax.random.fold_in(key, s), p))
    return jax.vmap(jax.vmap(draw))(sequence_index_BxL, position_BxL)


def _token_batch(
    rows: Mapping[str, Array], logp: Array, ent: Array, k: Array | None, on_policy: Array
) -> TokenBatch:
    adv = rows["advantages"]
    if adv.ndim == 1:  # one advantage per sequence: broadcast over its tokens
        adv = jnp.broadcast_to(adv[:, None], logp.shape)
    # When this update starts from the very parameters that sampled the mini-batch, π_old IS
    # the current π: stop_gradient(log π) gives the ratio 1 and the same gradient as log-probs
    # from a separate pass, without that pass (whose placeholder `old_logp` is not read). A
    # traced flag, not a static one: one compiled step serves the on-policy first update and
    # the later ones of a step.
    old_logp = jnp.where(on_policy > 0, lax.stop_gradient(logp), rows["old_logp"])
    return TokenBatch(
        logp=logp,
        old_logp=old_logp,
        ent=ent,
        adv=adv,
        mask=rows["loss_mask"],
        k=k,
        ref_logp=rows.get("ref_logp"),
        noise=rows.get("noise"),
        segment_ids=rows["segment_ids"],
        seq_weight=rows.get("seq_weight"),
        is_weight=rows.get("rollout_is_weight"),
    )


def _apply_update(
    state: TrainState, grads: Any, finite: Array, optimizer, grad_norm: Array | None = None
) -> TrainState:
    """The optimizer's update when `finite`, else `state` as it was.

    A conditional, not a `jnp.where` per leaf: the selects were three fusions per parameter
    (params and both moments), and XLA:CPU compiled the tiny update 2.3 CPU s (a quarter)
    faster without them, to the same bits (benchmarks/README.md#work-per-parameter)."""

    def apply(state: TrainState) -> TrainState:
        extra = {} if grad_norm is None else {"grad_norm": grad_norm}  # optimizer.py's clip
        update = optax.with_extra_args_support(optimizer).update  # any optax transformation
        updates, opt_state = update(grads, state.opt_state, state.params, **extra)
        params = optax.apply_updates(state.params, updates)
        return TrainState(params=params, opt_state=opt_state, step=state.step + 1)

    return lax.cond(finite, apply, lambda state: state, state)


def _make_compute_grads(forward, loss_cfg: LossConfig, micro_rows: int, row_sh, params_sh):
    """`compute(params, rows, temperature, on_policy) -> (loss, metrics, grads)` for the whole
    mini-batch.

    `forward(params, batch) -> (logp, ent, k)` is `token_stats` bound to the model and mesh.
    `on_policy` (0-d): when > 0, π_old = stop_gradient(π) (`_token_batch`) and
    rows["old_logp"] is not read.
    """
    loss_fn = build_loss_fn(loss_cfg)

    def objective(params, rows, temperature, on_policy, stats):
        logp, ent, k = forward(params, {**rows, "temperature": temperature})
        tokens = _token_batch(rows, logp, ent, k, on_policy)
        if stats is None:  # single micro-batch: the mini-batch statistics of this very forward
            stats = minibatch_stats(tokens, loss_cfg)
        return loss_fn(tokens, stats)

    grad_fn = jax.value_and_grad(objective, has_aux=True)

    def single(params, rows, temperature, on_policy):
        (loss, metrics), grads = grad_fn(params, rows, temperature, on_policy, None)
        return loss, metrics, grads

    def accumulated(params, rows, temperature, on_policy, m):
        micro = split_micro(rows, m, row_sh)
        run = lambda mb: forward(params, {**mb, "temperature": temperature})
        first = jax.tree.map(lambda x: x[0], micro)
        empty_stats = jax.tree.map(jnp.zeros_like, jax.eval_shape(run, first))

        # Pass 1, forward only: the mini-batch statistics every micro-batch's loss needs.
        def forward_only(_, mb):
            return None, lax.cond(has_tokens(mb), run, lambda mb: empty_stats, mb)

        _, (logp, ent, k) = lax.scan(forward_only, None, micro)
        k = None if k is None else unsplit_micro(k)
        stats = minibatch_stats(
            _token_batch(rows, unsplit_micro(logp), unsplit_micro(ent), k, on_policy), loss_cfg
        )
        aux_shape = jax.eval_shape(
            lambda mb: grad_fn(params, mb, temperature, on_policy, stats)[0], first
        )
        no_aux = jax.tree.map(jnp.zeros_like, aux_shape)

        # Pass 2: float32 gradient sums; each micro-batch loss is already over the whole batch.
        def accumulate(acc, mb):
            def real(acc, mb):
                aux, g = grad_fn(params, mb, temperature, on_policy, stats)
                return jax.tree.map(lambda a, x: a + x.astype(jnp.float32), acc, g), aux

            return lax.cond(has_tokens(mb), real, lambda acc, mb: (acc, no_aux), acc, mb)

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        acc, (losses, metrics) = lax.scan(
            accumulate, lax.with_sharding_constraint(zeros, params_sh), micro
        )
        grads = jax.tree.map(lambda a, p: a.astype(p.dtype), acc, params)
        per_micro = [jax.tree.map(lambda x, i=i: x[i], metrics) for i in range(m)]
        return jnp.sum(losses), functools.reduce(combine_metrics, per_micro), grads

    def compute(params, rows, temperature, on_policy):
        m = micro_batch_count(rows["tokens"].shape[0], micro_rows)
        if m == 1:
            return single(params, rows, temperature, on_policy)
        return accumulated(params, rows, temperature, on_policy, m)

    return compute


def make_train_step(
    model_cfg: ModelConfig,
    loss_cfg: LossConfig,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    rules: LogicalRules,
    *,
    batch_size: int,
    micro_batches: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    seed: int = 0,
    shared_prompts: tuple[int, int] | None = None,
    is_weights: bool = False,
) -> TrainStep:
    """Build `train_step(state, batch) -> (state, metrics)`; see the module docstring.

    Returns a `TrainStep` (fn, state_shardings, batch_shardings; it unpacks like a tuple).
    `seed` keys the variant's on-device randomness. `batch_size` is the mini-batch's row count the
    step is built for, run as `micro_batches` micro-batches of batch_size / micro_batches rows
    (which must split evenly over the `act_batch` axes); the step also takes any other multiple
    of that micro-batch size (module docstring).
    Metrics: `finalize_metrics` of the losses (loss, pg_loss, clip fractions, β means, entropy
    mean/min/max, tokens, ...) plus `grad_norm` (before clipping) and `update_skipped`.
    `loss_cfg.logits_residual` picks what the log-prob backward keeps (losses/logprobs.py):
    the default recomputes logits; "store_bf16"/"store_fp32" keep V·2 / V·4 bytes per token.
    The batch's `on_policy` flag (forward.py) says the mini-batch was sampled by the very
    parameters this update starts from: π_old = stop_gradient(π) of the update's own forward and
    its `old_logp` is ignored (the caller skipped the log-prob pass for it; same gradient, tested).
    `shared_prompts` = (P prompt slots, G prompts per micro-batch): the batch's rows hold their
    prompts in slots [0, P) and carry the prompt table (forward.py); the forward runs each
    distinct prompt once (`forward.token_stats`). The layout's `RowLayout.shared_prompts`.
    `is_weights`: the batch carries `rollout_is_weight`, rollout correction's truncated IS weight
    per token (losses/rollout_correction.py), multiplying its policy-gradient loss.
    """
    if micro_batches < 1 or batch_size % micro_batches:
        raise ValueError(
            f"micro_batches must be >= 1 and divide batch_size {batch_size}, got {micro_batches}"
        )
    act_rules = activation_rules(rules, mesh, model_cfg)
    micro_rows = batch_size // micro_batches
    batch_sharding(mesh, act_rules, micro_rows, ndim=1)  # clear error if uneven
    state_sh = train_state_shardings(model_cfg, optimizer, mesh, rules)
    fields = train_fields(loss_cfg, shared_prompts is not None, is_weights)
    batch_sh = batch_shardings(mesh, act_rules, batch_size, fields)
    forward = functools.partial(
        token_stats,
        model_cfg=model_cfg,
        mesh=mesh,
        rules=act_rules,
        return_k=loss_cfg.needs_k,
        block_size=block_size,
        logits_residual=loss_cfg.logits_residual,
        shared_prompts=shared_prompts,
    )
    row_sh = NamedSharding(mesh, P(rule_axes(act_rules, "act_batch")))
    compute_grads = _make_compute_grads(forward, loss_cfg, micro_rows, row_sh, state_sh.params)

    variant = registry.get(loss_cfg.variant)
    # The stream's key, made eagerly and only for a variant that draws noise: made inside the
    # step on a multi-device mesh, XLA:CPU aborted at run time (clip_cov on 2x2x2).
    noise_key = (
        jax.random.fold_in(jax.random.key(seed), NOISE_STREAM) if variant.needs_noise else None
    )

    def step(state: TrainState, batch: dict[str, Array]):
        rows = {k: v for k, v in batch.items() if k not in SCALAR_FIELDS}
        if variant.needs_noise:  # one key per update; each token's draw is its own
            key = jax.random.fold_in(noise_key, state.step)
            noise = token_noise(key, rows.pop("sequence_index"), rows["positions"])
            rows["noise"] = lax.with_sharding_constraint(noise, batch_sh["tokens"])
        loss, metrics, grads = compute_grads(
            state.params, rows, batch["temperature"], batch["on_policy"]
        )
        grads = lax.with_sharding_constraint(grads, state_sh.params)
        grad_norm = optax.tree.norm(grads)
        # A non-finite gradient makes the norm non-finite; so does a norm past float's range,
        # which is skipped too, as verl's actor skips it. One scalar check where a check of each
        # leaf was two fusions per parameter (a third of the tiny update's compile-time savings).
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        metrics = finalize_metrics(metrics)
        metrics["grad_norm"] = grad_norm
        metrics["update_skipped"] = 1.0 - finite.astype(jnp.float32)
        return _apply_update(state, grads, finite, optimizer, grad_norm), metrics

    train_step = jax.jit(
        step,
        in_shardings=(state_sh, batch_sh),
        out_shardings=(state_sh, replicated(mesh)),
        donate_argnums=0,
        compiler_options=trainer_compiler_options(mesh),
    )
    return TrainStep(train_step, state_sh, batch_sh)
