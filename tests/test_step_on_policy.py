"""On-policy updates without the log-prob pass: π_old = stop_gradient(π) gives the same step.

The reference is the loop's path with the pass: log π_old from `behaviour_pass.old_logprobs` (the
trainer's own forward over the batch in the log-prob layout), then the update. The on-policy
step ignores the batch's `old_logp` (garbage here) and must give the same gradient, loss and
metrics, for the plain clipped surrogate and for DynaMO's modulated loss, in one micro-batch
and with gradient accumulation over packed rows.
"""

import dataclasses

import numpy as np
import pytest
from helpers.step_setups import (
    FAST_COMPILE,
    N_SEQ,
    PACKED,
    PADDED,
    grad_recorder,
    make_rollouts,
    sub_mesh,
)

from dynamo_jax.config import from_config_dict
from dynamo_jax.loop import assemble, behaviour_pass
from dynamo_jax.losses import LossConfig
from dynamo_jax.sharding.rules import DEFAULT_RULES
from dynamo_jax.step.forward import make_logprob_fn
from dynamo_jax.step.state import train_state_from_params
from dynamo_jax.step.train_step import make_train_step


@pytest.fixture
def tiny3(step_setups):
    """tiny-qwen3 with its tied embedding scaled up (the train-step tests' model, built once per
    session): a policy far from uniform, so GC/UMS statistics are not fp32 noise."""
    return step_setups["tiny-qwen3"][:2]


def _step(cfg, params, rollouts, layout, loss_cfg, on_policy):
    mesh = sub_mesh((1, 1, 1))
    opt = grad_recorder()
    step, state_sh, batch_sh = make_train_step(
        cfg,
        loss_cfg,
        opt,
        mesh,
        DEFAULT_RULES,
        batch_size=layout.max_rows,
        micro_batches=layout.max_micro_batches,
        on_policy=on_policy,
    )
    rows, _ = assemble.layout_rows(rollouts, np.arange(N_SEQ), layout, tuple(batch_sh))
    state = train_state_from_params(params, opt, state_sh)
    new_state, metrics = step.lower(state, rows).compile(FAST_COMPILE)(state, rows)
    return {k: float(v) for k, v in metrics.items()}, new_state.opt_state


@pytest.mark.parametrize("loss", ["grpo", "dynamo"])
@pytest.mark.parametrize("layout", [PADDED, PACKED], ids=["padded", "packed-accumulated"])
def test_on_policy_step_equals_step_after_the_logprob_pass(tiny3, loss, layout):
    cfg, params = tiny3
    rollouts, _, _ = make_rollouts(cfg, params)
    loss_cfg = LossConfig.preset(loss)
    # With the pass: π_old from the trainer's forward over the batch (what loop/rl_step.py does).
    logprob = make_logprob_fn(cfg, sub_mesh((1, 1, 1)), DEFAULT_RULES, PACKED)
    with_pass = behaviour_pass.old_logprobs(rollouts, logprob, params, None, {})
    ref_m, ref_g = _step(cfg, params, with_pass, layout, loss_cfg, on_policy=False)
    # Without: old_logp is garbage and must not matter.
    garbage = dataclasses.replace(
        rollouts, old_logp=np.full_like(rollouts.loss_mask, -7.0), entropy=None
    )
    m, g = _step(cfg, params, garbage, layout, loss_cfg, on_policy=True)
    scale = max(float(np.abs(x).max()) for x in _leaves(ref_g))
    assert scale > 1e-3
    for a, b in zip(_leaves(ref_g), _leaves(g)):
        np.testing.assert_allclose(b, a, atol=1e-5 * scale, rtol=1e-4)
    assert set(m) == set(ref_m)
    for k in ref_m:
        np.testing.assert_allclose(m[k], ref_m[k], rtol=1e-4, atol=1e-6, err_msg=k)
    assert m["approx_kl"] == 0.0 if "approx_kl" in m else True
    # The control: the same garbage old_logp WITHOUT on_policy changes the gradient.
    _, bad = _step(cfg, params, garbage, layout, loss_cfg, on_policy=False)
    assert max(float(np.abs(a - b).max()) for a, b in zip(_leaves(ref_g), _leaves(bad))) > (
        1e-3 * scale
    )


def _leaves(tree):
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _run_config(**train):
    from configs import tiny

    c = tiny.get_config("method=grpo")
    for k, v in train.items():
        setattr(c.train, k, v)
    return c


@pytest.mark.parametrize(
    "changes, skips",
    [
        (dict(skip_on_policy_logprob_pass=True, mini_batch_size=128), True),
        (dict(skip_on_policy_logprob_pass=False, mini_batch_size=128), False),
        (dict(skip_on_policy_logprob_pass=True, mini_batch_size=64), False),  # 2 updates
        (dict(skip_on_policy_logprob_pass=True, mini_batch_size=128, ppo_epochs=2), False),
        (dict(skip_on_policy_logprob_pass=True, mini_batch_size=128, max_staleness=1), False),
    ],
)
def test_when_the_pass_is_skipped(changes, skips):
    assert from_config_dict(_run_config(**changes)).skips_logprob_pass is skips


def test_not_skipped_when_its_entropy_or_reference_is_used():
    from configs import tiny

    for method in ("e3", "dynamo_entropy"):
        c = tiny.get_config(f"method={method}")
        c.train.skip_on_policy_logprob_pass, c.train.mini_batch_size = True, 128
        assert not from_config_dict(c).skips_logprob_pass, method
    c = _run_config(skip_on_policy_logprob_pass=True, mini_batch_size=128)
    c.loss.kl = "k3"
    c.loss.kl_coef = 0.01
    assert not from_config_dict(c).skips_logprob_pass
