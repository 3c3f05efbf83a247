"""The loss-variant record and the table it is registered in (chosen once, by name).

A variant (GRPO, DynaMO, or one of the Table 1 baselines of docs/algorithm.md#baselines) is one
`LossVariant` in `VARIANTS` (a `dynamo_jax.registry.Registry`, the shape every extension point
shares): its published hyperparameters, its own settings (`settings`: a frozen dataclass whose
fields are its config keys, e.g. `loss.alpha` for DynaMO, with their defaults and validation;
`LossConfig.settings` holds the running variant's), and the pure functions the loss is assembled
from. `losses/variants.py` registers the built-in ones; a new baseline is one more
`register(...)` call (in that file, or in a test). `LossConfig.variant` names a registered
variant, and the train step, the advantages and the statistics look it up once, where they are
built; no module compares a baseline's name as a string.

Every function is pure and jittable (they run inside the jitted train step); `None` means the
plain GRPO behaviour (`losses/policy.py` supplies it):

    sequence_advantages(cfg, rewards_B, group_ids_B, num_groups, valid_B) -> A_B
    token_advantages(batch, stats, cfg) -> (Â, β_comp, β_stab)            each [B, L]
    token_loss(batch, stats, Â, r, log_r, cfg) -> ℓ_t                      [B, L]
    statistics(batch, n_tokens, cfg) -> {name: scalar}  mini-batch-global, read as `stats.<name>`
    extra_loss(batch, mask, stats, cfg, aggregate) -> (name, value, coef)  loss += coef · value

(`aggregate(x, mask, stats, cfg)` is the configured `loss_agg_mode` over the batch's sequences:
per (row, segment) when rows are packed.)

The variant's settings are `cfg.settings`; its statistics are `ModStats.own` (`losses/batch.py`).
`needs_k(cfg)` says whether the log-prob pass must also return K_t (docs/algorithm.md#log-probabilities-and-entropy); `needs_noise` asks the
step for U[0, 1) per token (drawn on the device from the step's key); `batch_fields` names extra
per-token arrays of the rollout batch the variant reads.

This module imports nothing of the package but the generic registry, so `LossConfig` can
validate names against it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from dynamo_jax.registry import NoSettings, Registry

# The config keys every variant shares (LossConfig's own fields): no variant's settings reuse them.
SHARED_KEYS = (
    "variant", "clip_low", "clip_high", "dual_clip", "loss_agg_mode", "norm_adv_by_std",
    "max_len_norm", "kl", "kl_coef", "logits_residual",
)  # fmt: skip
VARIANTS: Registry[LossVariant] = Registry("loss variant", shared=SHARED_KEYS)


@dataclasses.dataclass(frozen=True)
class LossVariant:
    """One loss variant: published hyperparameters and the pieces of its loss (module docstring)."""

    name: str
    source: str  # where the published defaults come from
    preset: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # LossConfig values
    settings: type = NoSettings  # frozen dataclass: the variant's own config keys (module doc)
    sequence_advantages: Callable | None = None
    token_advantages: Callable | None = None
    token_loss: Callable | None = None
    statistics: Callable | None = None
    extra_loss: Callable | None = None
    needs_k: Callable[[Any], bool] = lambda cfg: False
    needs_noise: bool = False
    batch_fields: tuple[str, ...] = ()


# The table's own functions under the names every extension point's module exposes
# (register refuses a second entry under one name unless replace=True).
register, unregister, names, get = (
    VARIANTS.register,
    VARIANTS.unregister,
    VARIANTS.names,
    VARIANTS.get,
)
