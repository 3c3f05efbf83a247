"""`LossConfig`: every hyperparameter of the policy loss, validated once (docs/algorithm.md#policy-loss, docs/algorithm.md#advantage-modulation, docs/algorithm.md#baselines).

Use `LossConfig.preset(name, **overrides)` to get a loss variant with its published
hyperparameters (the variants and their sources are in `losses/variants.py`); the plain
constructor gives the DynaMO defaults.
"""

from __future__ import annotations

import dataclasses
import math

from dynamo_jax import validate
from dynamo_jax.losses import registry

# prompt-mean: each sequence's token mean, averaged within its prompt group, groups averaged with
# equal weight (the estimator DynaMO's allocation is derived for; docs/estimators.md).
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "prompt-mean")
ENTROPY_CHANGE_MODES = ("exact", "sequence_mean")
STATS_SCOPES = ("global", "micro_batch")
KL_ESTIMATORS = ("none", "k1", "k3")
# Must equal logprobs.LOGITS_RESIDUALS (a test checks; config stays import-light).
LOGITS_RESIDUALS = ("recompute", "store_bf16", "store_fp32")


def _choice(name: str, value, allowed) -> None:
    validate.one_of("LossConfig", name, value, allowed)


def _check(name: str, ok: bool, what: str, value) -> None:
    validate.must(ok, "LossConfig", name, what, value)


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Policy-loss hyperparameters. Defaults are the DynaMO preset."""

    variant: str = "dynamo"  # the method: a registered loss variant (losses/variants.py)
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = 10.0  # c > 1, applies to Â < 0; None disables
    loss_agg_mode: str = "token-mean"
    # GRPO advantages (R − mean) / (std + ε); False = Dr.GRPO's R − mean (docs/algorithm.md#grpo-advantages).
    norm_adv_by_std: bool = True
    max_len_norm: int | None = None  # constant divisor of seq-mean-token-sum-norm (Dr.GRPO)
    # DynaMO modulation (docs/algorithm.md#advantage-modulation); only read by the "dynamo" variant.
    enable_gc: bool = True
    enable_ums: bool = True
    alpha: float = 0.4
    comp_alpha: float | None = None  # None: tied to alpha
    stab_alpha: float | None = None  # None: tied to alpha
    gamma: float = 50.0
    ums_tau: float = 0.9  # UMS threshold on the normalised |ΔH| (not a temperature)
    entropy_change: str = "exact"
    stats_scope: str = "global"
    # Baseline hyperparameters (docs/algorithm.md#baselines); each is only read by its own variant.
    entropy_coef: float = 1e-3
    fork_top_ratio: float = 0.2
    ent_adv_kappa1: float = 0.4
    ent_adv_kappa2: float = 2.0
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-3
    kl_cov_coef: float = 1.0
    w_reinforce_lambda: float = 0.1
    # Optional KL penalty to a frozen reference policy (off in both papers).
    kl: str = "none"
    kl_coef: float = 1e-3
    # Where the backward of the log-prob pass gets the [tokens, V] logits: "recompute" (default:
    # no [N, V] residual, one extra unembedding matmul) or kept from the forward, costing V·2
    # ("store_bf16") or V·4 ("store_fp32") bytes per token per vocab shard (Qwen2.5: 0.3 / 0.6 MB).
    logits_residual: str = "recompute"

    def __post_init__(self):
        _choice("variant", self.variant, registry.names())
        _choice("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        _choice("entropy_change", self.entropy_change, ENTROPY_CHANGE_MODES)
        _choice("stats_scope", self.stats_scope, STATS_SCOPES)
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
        for name in ("alpha", "comp_alpha"):
            v = getattr(self, name)
            _check(name, v is None or v >= 0.0, ">= 0", v)
        for name in ("stab_alpha",):
            v = getattr(self, name)
            _check(name, v is None or 0.0 <= v <= 1.0, "in [0, 1] (λ_min = 1 − α_s)", v)
        _check("alpha", self.stab_alpha is not None or self.alpha <= 1.0,
               "<= 1 when stab_alpha is tied to it (λ_min = 1 − α)", self.alpha)  # fmt: skip
        _check("gamma", self.gamma >= 0.0 and math.isfinite(self.gamma), "finite, >= 0", self.gamma)
        _check("ums_tau", math.isfinite(self.ums_tau), "finite", self.ums_tau)
        _check("entropy_coef", self.entropy_coef >= 0.0, ">= 0", self.entropy_coef)
        _check("fork_top_ratio", 0.0 < self.fork_top_ratio <= 1.0, "in (0, 1]", self.fork_top_ratio)
        _check("ent_adv_kappa1", self.ent_adv_kappa1 >= 0.0, ">= 0", self.ent_adv_kappa1)
        _check("ent_adv_kappa2", self.ent_adv_kappa2 > 0.0, "> 0", self.ent_adv_kappa2)
        _check("clip_cov_ratio", 0.0 < self.clip_cov_ratio <= 1.0, "in (0, 1]", self.clip_cov_ratio)
        _check(
            "clip_cov_ub", self.clip_cov_ub > self.clip_cov_lb, "> clip_cov_lb", self.clip_cov_ub
        )
        _check("kl_cov_ratio", 0.0 < self.kl_cov_ratio <= 1.0, "in (0, 1]", self.kl_cov_ratio)
        _check("kl_cov_coef", self.kl_cov_coef >= 0.0, ">= 0", self.kl_cov_coef)
        _check("w_reinforce_lambda", self.w_reinforce_lambda >= 0.0, ">= 0",
               self.w_reinforce_lambda)  # fmt: skip
        if self.kl != "none":
            _check("kl_coef", self.kl_coef > 0.0, "> 0 when kl is enabled", self.kl_coef)

    @property
    def alpha_comp(self) -> float:
        """α_c of gradient compensation (tied to `alpha` unless `comp_alpha` is set)."""
        return self.alpha if self.comp_alpha is None else self.comp_alpha

    @property
    def alpha_stab(self) -> float:
        """α_s of update-magnitude stabilisation; λ_min = 1 − α_s."""
        return self.alpha if self.stab_alpha is None else self.stab_alpha

    @property
    def needs_k(self) -> bool:
        """Whether the step must ask the log-prob pass for K (exact ΔH, docs/algorithm.md#update-magnitude-stabilisation)."""
        return bool(registry.get(self.variant).needs_k(self))

    @classmethod
    def preset(cls, variant: str, **overrides) -> LossConfig:
        """The variant's published hyperparameters, then `overrides` on top."""
        _choice("variant", variant, registry.names())
        return cls(variant=variant, **{**registry.get(variant).preset, **overrides})
