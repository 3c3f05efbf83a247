"""LossConfig validation names the field; presets carry the published hyperparameters."""

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
        (dict(stab_alpha=1.5), "stab_alpha"),
        (dict(alpha=1.5), "alpha"),
        (dict(kl="k2"), "kl"),
        (dict(kl="k3", kl_coef=0.0), "kl_coef"),
        (dict(clip_cov_lb=5.0, clip_cov_ub=1.0), "clip_cov_ub"),
        (dict(fork_top_ratio=0.0), "fork_top_ratio"),
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
    dyn = LossConfig.preset("dynamo", comp_alpha=0.2, stab_alpha=0.4, ums_tau=0.99)
    assert (dyn.alpha_comp, dyn.alpha_stab, dyn.needs_k) == (0.2, 0.4, True)
    assert not LossConfig.preset("dynamo", entropy_change="sequence_mean").needs_k
    assert not g.needs_k
    assert LossConfig.preset("entropy_adv").ent_adv_kappa1 == 0.4
    assert LossConfig.preset("w_reinforce").w_reinforce_lambda == 0.1
    with pytest.raises(ValueError, match="LossConfig.variant"):
        LossConfig.preset("dapo")


def test_logits_residual_choices_match_the_kernel():
    from dynamo_jax.losses import config, logprobs

    assert config.LOGITS_RESIDUALS == logprobs.LOGITS_RESIDUALS
    assert LossConfig().logits_residual == "recompute"  # no [N, V] residual unless asked for
    assert LossConfig.preset("grpo", logits_residual="store_bf16").logits_residual == "store_bf16"
