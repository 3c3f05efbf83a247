"""The loss-variant record and the table it is registered in (chosen once, by name).

A variant (GRPO, DynaMO, or one of the Table 1 baselines of docs/algorithm.md#baselines) is one
`LossVariant`: its published hyperparameters and the pure functions the loss is assembled from.
`losses/variants.py` registers the built-in ones; a new baseline is one more `register(...)` call
(in that file, or in a test). `LossConfig.variant` names a registered variant, and the train
step, the advantages and the statistics look it up once, where they are built; no module compares
a baseline's name as a string.

Every function is pure and jittable (they run inside the jitted train step); `None` means the
plain GRPO behaviour (`losses/policy.py` supplies it):

    sequence_advantages(cfg, rewards_B, group_ids_B, num_groups, valid_B) -> A_B
    token_advantages(batch, stats, cfg) -> (Â, β_comp, β_stab)            each [B, L]
    token_loss(batch, stats, Â, r, log_r, cfg) -> ℓ_t                      [B, L]
    statistics(batch, n_tokens, cfg) -> {ModStats field: scalar}           mini-batch-global
    extra_loss(batch, mask, stats, cfg, aggregate) -> (name, value, coef)  loss += coef · value

(`aggregate(x, mask, stats, cfg)` is the configured `loss_agg_mode` over the batch's sequences:
per (row, segment) when rows are packed.)

`needs_k(cfg)` says whether the log-prob pass must also return K_t (docs/algorithm.md#log-probabilities-and-entropy); `needs_noise` asks the
step for U[0, 1) per token (drawn on the device from the step's key); `batch_fields` names extra
per-token arrays of the rollout batch the variant reads.

This module imports nothing of the package, so `LossConfig` can validate names against it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

_REGISTRY: dict[str, LossVariant] = {}


@dataclasses.dataclass(frozen=True)
class LossVariant:
    """One loss variant: published hyperparameters and the pieces of its loss (module docstring)."""

    name: str
    source: str  # where the published defaults come from
    preset: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # LossConfig values
    sequence_advantages: Callable | None = None
    token_advantages: Callable | None = None
    token_loss: Callable | None = None
    statistics: Callable | None = None
    extra_loss: Callable | None = None
    needs_k: Callable[[Any], bool] = lambda cfg: False
    needs_noise: bool = False
    batch_fields: tuple[str, ...] = ()


def register(variant: LossVariant, *, replace: bool = False) -> LossVariant:
    """Add `variant` to the table; a second variant under the same name is an error."""
    if variant.name in _REGISTRY and not replace:
        raise ValueError(f"loss variant {variant.name!r} is already registered")
    _REGISTRY[variant.name] = variant
    return variant


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get(name: str) -> LossVariant:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown loss variant {name!r}; registered: {names()}") from None
