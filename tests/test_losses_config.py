"""LossConfig validation names the field; presets carry the published hyperparameters."""

import dataclasses

import pytest

from dynamo_jax.losses import BASELINES, LossConfig


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(variant="ppo"), "variant"),
        (dict(loss_agg_mode="sum"), "loss_agg_mode"),
        (dict(loss_agg_mode="seq-mean-token-sum-norm"), "max_len_norm"),
        (dict(dual_clip=0.5), "dual_clip"),
        (dict(clip_low=1.0), "clip_low"),
        (dict(entropy_change="approx"), "entropy_change"),
        (dict(stats_scope="device"), "stats_scope"),
        (dict(alpha_stab=1.5), "alpha_stab"),
        (dict(alpha=1.5), "alpha"),
        (dict(kl="k2"), "kl"),
        (dict(kl="k3", kl_coef=0.0), "kl_coef"),
        (dict(variant="clip_cov", clip_cov_lb=5.0, clip_cov_ub=1.0), "clip_cov_ub"),
        (dict(variant="fork_tokens", fork_top_ratio=0.0), "fork_top_ratio"),
        (dict(logits_residual="store"), "logits_residual"),
    ],
)
def test_bad_values_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"LossConfig.{field} "):
        LossConfig(**kwargs)


def test_presets_and_derived_values():
    for name in BASELINES:
        assert LossConfig.preset(name).variant == name
    g, d = LossConfig.preset("grpo"), LossConfig.preset("clip_higher")
    assert (g.clip_low, g.clip_high, g.dual_clip) == (0.2, 0.2, None)
    assert (d.clip_low, d.clip_high) == (0.2, 0.28)
    dyn = LossConfig.preset("dynamo", alpha_comp=0.2, alpha_stab=0.4, ums_tau=0.99)
    assert (*dyn.settings.alphas(), dyn.needs_k) == (0.2, 0.4, True)
    assert LossConfig.preset("dynamo", alpha=0.3).settings.alphas() == (0.3, 0.3)  # tied
    assert not LossConfig.preset("dynamo", entropy_change="sequence_mean").needs_k
    assert not g.needs_k
    assert LossConfig.preset("entropy_adv").settings.ent_adv_kappa1 == 0.4
    assert LossConfig.preset("w_reinforce").settings.w_reinforce_lambda == 0.1
    with pytest.raises(ValueError, match="LossConfig.variant"):
        LossConfig.preset("dapo")


def test_logits_residual_choices_match_the_kernel():
    from dynamo_jax.losses import config, logprobs

    assert config.LOGITS_RESIDUALS == logprobs.LOGITS_RESIDUALS
    assert LossConfig().logits_residual == "recompute"  # no [N, V] residual unless asked for
    assert LossConfig.preset("grpo", logits_residual="store_bf16").logits_residual == "store_bf16"


def test_a_variant_owns_its_keys():
    """A variant's own keys become its settings record; another variant's key may only keep its
    default (set, it would be silently ignored), and a key of no variant is unknown."""
    cfg = LossConfig.preset("kl_cov", kl_cov_ratio=0.1)
    assert cfg.settings.kl_cov_ratio == 0.1 and not hasattr(cfg.settings, "alpha")
    assert LossConfig(variant="grpo", alpha=0.4).variant == "grpo"  # dynamo's default: allowed
    with pytest.raises(ValueError, match="LossConfig.alpha: a setting of loss variant 'dynamo'"):
        LossConfig(variant="grpo", alpha=0.3)
    with pytest.raises(TypeError, match="unknown field"):
        LossConfig(comp_alpha=0.2)
    # dataclasses.replace keeps the record and applies the change to it
    assert dataclasses.replace(LossConfig(alpha=0.3), gamma=10.0).settings.alphas() == (0.3, 0.3)
    flat = LossConfig.preset("kl_cov", kl_cov_ratio=0.1).flat()
    assert flat["kl_cov_ratio"] == 0.1 and flat["alpha"] == 0.4  # every key, as a file holds it
