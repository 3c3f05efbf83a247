"""The optimizer: AdamW with linear warm-up, then constant or cosine decay, and global-norm clip."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from dynamo_jax.config import OptimConfig


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
    """`optax.clip_by_global_norm`, the same ops and state, that takes the norm as `grad_norm=`
    when the caller has it: the train step computes it before the update, for its metric and
    its finite check, and its update is a `lax.cond` branch, where XLA cannot reuse a value
    computed outside it (the norm was computed twice, 38 fusions of the tiny update)."""

    def update_fn(updates, state, params=None, *, grad_norm=None, **extra_args):
        del params, extra_args
        g_norm = optax.tree.norm(updates) if grad_norm is None else grad_norm
        trigger = jnp.squeeze(g_norm < max_norm)

        def clip_fn(t):
            return jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm)

        return jax.tree.map(clip_fn, updates), state

    return optax.GradientTransformationExtraArgs(optax.init_empty_state, update_fn)


def make_optimizer(cfg: OptimConfig, total_updates: int) -> optax.GradientTransformation:
    """AdamW over `total_updates` optimizer updates (`RunConfig.total_updates`)."""
    warmup = min(cfg.warmup_steps, max(total_updates - 1, 0))
    if cfg.schedule == "cosine":
        lr = optax.warmup_cosine_decay_schedule(
            0.0, cfg.learning_rate, warmup, max(total_updates, warmup + 1)
        )
    elif warmup:
        lr = optax.join_schedules(
            [
                optax.linear_schedule(0.0, cfg.learning_rate, warmup),
                optax.constant_schedule(cfg.learning_rate),
            ],
            [warmup],
        )
    else:
        lr = cfg.learning_rate
    adamw = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.max_grad_norm > 0:
        return optax.chain(clip_by_global_norm(cfg.max_grad_norm), adamw)
    return adamw
