"""`LossConfig`: every hyperparameter of the policy loss, validated once (docs/algorithm.md#policy-loss, docs/algorithm.md#advantage-modulation, docs/algorithm.md#baselines).

Use `LossConfig.preset(name, **overrides)` to get a loss variant with its published
hyperparameters (the variants and their sources are in `losses/variants.py`); the plain
constructor gives the DynaMO defaults. The section is flat: `LossConfig(**keys)` takes the shared
keys (its fields) and the running variant's own keys, which become its settings record
(`LossConfig.settings`, the variant's `LossVariant.settings`); a key of another variant may only
hold its default (set, it would be silently ignored).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dynamo_jax import validate
from dynamo_jax.losses import registry
from dynamo_jax.registry import flat_fields, flat_values, init_flat

# prompt-mean: each sequence's token mean, averaged within its prompt group, groups averaged with
# equal weight (the estimator DynaMO's allocation is derived for; docs/estimators.md).
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "prompt-mean")
KL_ESTIMATORS = ("none", "k1", "k3")
# Must equal logprobs.LOGITS_RESIDUALS (a test checks; config stays import-light).
LOGITS_RESIDUALS = ("recompute", "store_bf16", "store_fp32")


def _choice(name: str, value, allowed) -> None:
    validate.one_of("LossConfig", name, value, allowed)


def _check(name: str, ok: bool, what: str, value) -> None:
    validate.must(ok, "LossConfig", name, what, value)


@dataclasses.dataclass(frozen=True, init=False)
class LossConfig:
    """Policy-loss hyperparameters shared by every variant, plus the running variant's own
    settings (`settings`). Defaults are the DynaMO preset."""

    variant: str = "dynamo"  # the method: a registered loss variant (losses/variants.py)
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = 10.0  # c > 1, applies to Â < 0; None disables
    loss_agg_mode: str = "token-mean"
    # GRPO advantages (R − mean) / (std + ε); False = Dr.GRPO's R − mean (docs/algorithm.md#grpo-advantages).
    norm_adv_by_std: bool = True
    max_len_norm: int | None = None  # constant divisor of seq-mean-token-sum-norm (Dr.GRPO)
    # Optional KL penalty to a frozen reference policy (off in both papers).
    kl: str = "none"
    kl_coef: float = 1e-3
    # Where the backward of the log-prob pass gets the [tokens, V] logits: "recompute" (default:
    # no [N, V] residual, one extra unembedding matmul) or kept from the forward, costing V·2
    # ("store_bf16") or V·4 ("store_fp32") bytes per token per vocab shard (Qwen2.5: 0.3 / 0.6 MB).
    logits_residual: str = "recompute"
    # The variant's own keys (e.g. DynaMO's alpha, gamma, ums_tau), as its settings record;
    # built by __init__ from the flat keys (a record given here, as `dataclasses.replace`
    # passes it, is the base the flat keys override).
    settings: Any = None

    def __init__(self, **values: Any):
        init_flat(self, registry.VARIANTS, "variant", values, "LossConfig")
        self.__post_init__()

    def __post_init__(self):
        _choice("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        _choice("kl", self.kl, KL_ESTIMATORS)
        _choice("logits_residual", self.logits_residual, LOGITS_RESIDUALS)
        _check("clip_low", 0.0 <= self.clip_low < 1.0, "in [0, 1)", self.clip_low)
        _check("clip_high", self.clip_high >= 0.0, ">= 0", self.clip_high)
        if self.dual_clip is not None:
            _check("dual_clip", self.dual_clip > 1.0, "None or > 1", self.dual_clip)
        if self.loss_agg_mode == "seq-mean-token-sum-norm":
            _check(
                "max_len_norm",
                self.max_len_norm is not None and self.max_len_norm >= 1,
                "a positive int for loss_agg_mode 'seq-mean-token-sum-norm'",
                self.max_len_norm,
            )
        if self.kl != "none":
            _check("kl_coef", self.kl_coef > 0.0, "> 0 when kl is enabled", self.kl_coef)

    def flat(self) -> dict[str, Any]:
        """The section's flat keys as a config file holds them (`registry.flat_values`)."""
        return flat_values(self, registry.VARIANTS)

    @property
    def needs_k(self) -> bool:
        """Whether the step must ask the log-prob pass for K (exact ΔH, docs/algorithm.md#update-magnitude-stabilisation)."""
        return bool(registry.get(self.variant).needs_k(self))

    @classmethod
    def flat_fields(cls) -> dict[str, tuple[Any, Any]]:
        """Every flat key of the section: key → (default, type hint) (config.py builds the
        section from these): the shared fields and each registered variant's own keys."""
        return flat_fields(cls, registry.VARIANTS)

    @classmethod
    def preset(cls, variant: str, **overrides) -> LossConfig:
        """The variant's published hyperparameters, then `overrides` on top."""
        _choice("variant", variant, registry.names())
        return cls(variant=variant, **{**registry.get(variant).preset, **overrides})
