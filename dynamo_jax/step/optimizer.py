"""The optimizer: AdamW with linear warm-up, then constant or cosine decay, and global-norm clip."""

from __future__ import annotations

import optax

from dynamo_jax.config import OptimConfig


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
        return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw)
    return adamw
