"""On-policy updates without the log-prob pass: π_old = stop_gradient(π) gives the same step.

The reference is the loop's path with the pass: log π_old from `behaviour_pass.old_logprobs` (the
trainer's own forward over the batch in the log-prob layout), then the update. The on-policy
step (the batch's `on_policy` flag) ignores the batch's `old_logp` (garbage here) and must give
the same gradient, loss and metrics, for the plain clipped surrogate and for DynaMO's modulated
loss, in one micro-batch and with gradient accumulation over packed rows. With several updates a
step, only the first mini-batch is left out of the pass (`RunConfig.first_update_on_policy`):
the pass over the other rows equals the whole pass on them, and a run with the skip trains like
one without it.
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
    )
    rows, _ = assemble.lay_out(rollouts, np.arange(N_SEQ), layout, tuple(batch_sh))
    assert rows["on_policy"] == 0.0  # lay_out's default: the update reads old_logp
    rows["on_policy"] = np.float32(on_policy)
    state = train_state_from_params(params, opt, state_sh)
    new_state, metrics = step.lower(state, rows).compile(FAST_COMPILE)(state, rows)
    return {k: float(v) for k, v in metrics.items()}, new_state.opt_state


def _old_logprobs(rollouts, logprob, params, seqs=None):
    """The loop's log-prob pass over `seqs` (default every row), laid out as the loop does."""
    seqs = np.arange(rollouts.rows) if seqs is None else seqs
    rows = assemble.device_rows(rollouts, seqs, logprob.layout, logprob.batch_shardings)
    return behaviour_pass.old_logprobs(rollouts, rows, logprob, params, None)


@pytest.mark.parametrize("loss", ["grpo", "dynamo"])
@pytest.mark.parametrize("layout", [PADDED, PACKED], ids=["padded", "packed-accumulated"])
def test_on_policy_step_equals_step_after_the_logprob_pass(tiny3, loss, layout):
    cfg, params = tiny3
    rollouts, _, _ = make_rollouts(cfg, params)
    loss_cfg = LossConfig.preset(loss)
    # With the pass: π_old from the trainer's forward over the batch (what loop/rl_step.py does).
    logprob = make_logprob_fn(cfg, sub_mesh((1, 1, 1)), DEFAULT_RULES, PACKED)
    with_pass = _old_logprobs(rollouts, logprob, params)
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
    "changes, skips, first",
    [
        (dict(skip_on_policy_logprob_pass=True, mini_batch_size=128), True, True),
        (dict(skip_on_policy_logprob_pass=False, mini_batch_size=128), False, False),
        (dict(skip_on_policy_logprob_pass=True, mini_batch_size=64), False, True),  # 2 updates
        (dict(skip_on_policy_logprob_pass=False, mini_batch_size=64), False, False),
        (dict(skip_on_policy_logprob_pass=True, mini_batch_size=128, ppo_epochs=2), False, False),
        (dict(skip_on_policy_logprob_pass=True, mini_batch_size=64, ppo_epochs=2), False, False),
        (
            dict(skip_on_policy_logprob_pass=True, mini_batch_size=128, max_staleness=1),
            False,
            False,
        ),
        (dict(skip_on_policy_logprob_pass=True, mini_batch_size=64, max_staleness=1), False, False),
    ],
)
def test_when_the_pass_is_skipped(changes, skips, first):
    """No pass with one update a step; with several (one epoch), none for the first one's rows."""
    cfg = from_config_dict(_run_config(**changes))
    assert (cfg.skips_logprob_pass, cfg.first_update_on_policy) == (skips, first)


@pytest.mark.parametrize(
    "changes, skips",
    [
        (dict(skip_on_policy_logprob_pass=True, mini_batch_size=64), True),
        (dict(skip_on_policy_logprob_pass=True, mini_batch_size=128, ppo_epochs=2), True),
        (dict(skip_on_policy_logprob_pass=True, mini_batch_size=64, max_staleness=1), True),
        (dict(skip_on_policy_logprob_pass=True, mini_batch_size=64, dynamic_sampling=True), True),
        (dict(skip_on_policy_logprob_pass=False, mini_batch_size=64), False),
    ],
)
def test_no_pass_when_the_engine_gives_old_logp(changes, skips):
    """With π_old from the engine, the skip drops the whole pass at any staleness or epochs."""
    cfg = from_config_dict(_run_config(old_logp_source="engine", **changes))
    assert (cfg.skips_logprob_pass, cfg.old_logp_from_engine_only) == (skips, skips)
    assert not cfg.first_update_on_policy


def test_not_skipped_when_its_entropy_or_reference_is_used():
    from configs import tiny

    for size in (128, 64):
        for method in ("e3", "dynamo_entropy"):
            c = tiny.get_config(f"method={method}")
            c.train.skip_on_policy_logprob_pass, c.train.mini_batch_size = True, size
            assert not from_config_dict(c).first_update_on_policy, method
        c = _run_config(skip_on_policy_logprob_pass=True, mini_batch_size=size)
        c.loss.kl = "k3"
        c.loss.kl_coef = 0.01
        assert not from_config_dict(c).first_update_on_policy
    for method in ("e3", "dynamo_entropy"):
        c = tiny.get_config(f"method={method}")
        c.train.skip_on_policy_logprob_pass, c.train.old_logp_source = True, "engine"
        assert not from_config_dict(c).skips_logprob_pass, method
    c = _run_config(skip_on_policy_logprob_pass=True, old_logp_source="engine")
    c.loss.kl, c.loss.kl_coef = "k3", 0.01
    assert not from_config_dict(c).skips_logprob_pass


def test_the_pass_over_some_rows_is_the_whole_pass_on_them(tiny3):
    """`old_logprobs` over some rows: the rows it scores hold what the pass over every row gives them
    (other rows share their packed rows there), the rows it leaves out hold NaN."""
    cfg, params = tiny3
    rollouts, _, _ = make_rollouts(cfg, params)
    logprob = make_logprob_fn(cfg, sub_mesh((1, 1, 1)), DEFAULT_RULES, PACKED)
    whole = _old_logprobs(rollouts, logprob, params)
    seqs = np.array([0, 3, 4, 5, 9, 10, 14])  # 5: the empty row
    part = _old_logprobs(rollouts, logprob, params, seqs)
    left_out = np.setdiff1d(np.arange(N_SEQ), seqs)
    trained = rollouts.loss_mask[seqs] > 0
    assert trained.sum() > 20
    for name in ("old_logp", "entropy"):
        got, want = getattr(part, name), getattr(whole, name)
        np.testing.assert_allclose(got[seqs][trained], want[seqs][trained], atol=2e-6, rtol=1e-6)
        assert np.isnan(got[left_out]).all(), name
    assert part.ref_logp is None


@pytest.mark.slow
def test_a_run_without_the_first_updates_pass_trains_like_one_with_it(tmp_path, monkeypatch):
    """The tiny GRPO config, 2 updates a step, 2 steps, with and without the skip: the pass
    scores exactly the rows of the updates after the first (the rows `mini_batch_order` gives
    them) and the two runs' losses, gradient norms and final parameters agree."""
    from dynamo_jax.loop import train
    from dynamo_jax.reporting.metrics import read_metrics

    scored_rows = []
    whole_pass = behaviour_pass.old_logprobs

    def spy(batch, rows, *args):
        scored_rows.append(rows.seqs)
        return whole_pass(batch, rows, *args)

    monkeypatch.setattr(behaviour_pass, "old_logprobs", spy)
    runs = {}
    for skip in (False, True):
        config = _run_config(skip_on_policy_logprob_pass=skip, mini_batch_size=64, steps=2)
        config.logging.progress_bar = config.logging.tensorboard = False
        config.checkpoint.every_steps = 2
        config.eval.every_steps = 0
        cfg = from_config_dict(config)
        assert cfg.updates_per_step == 2 and cfg.first_update_on_policy is skip
        workdir = tmp_path / str(skip)
        scored_rows.clear()
        summary = train.run(cfg, workdir)
        assert summary.exit_code == 0
        runs[skip] = (read_metrics(workdir), list(scored_rows), _final_params(workdir, config))
    assert len(runs[False][1]) == 2  # every row, every step
    for seqs in runs[False][1]:
        np.testing.assert_array_equal(seqs, np.arange(cfg.budget))
    assert len(runs[True][1]) == 2
    for step, seqs in enumerate(runs[True][1], start=1):
        order = assemble.mini_batch_order(from_config_dict(config), step, cfg.budget)
        np.testing.assert_array_equal(seqs, np.sort(order[1]))  # the second update's rows
    with_pass, without = runs[False][0], runs[True][0]
    for a, b in zip(with_pass, without):
        for key in ("loss/loss", "loss/grad_norm", "loss/entropy_mean", "reward/mean"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-3, err_msg=key)
    lr = config.optim.learning_rate
    for a, b in zip(_leaves(runs[False][2]), _leaves(runs[True][2])):
        assert np.abs(a - b).max() <= 2 * lr
        assert np.mean(np.abs(a - b) > 0.1 * lr) < 1e-3


def _final_params(workdir, config):
    from helpers.train_runs import _final_state

    return _final_state(workdir, config)[1]


@pytest.mark.slow
def test_a_run_with_the_engines_old_logp_and_no_pass(tmp_path, monkeypatch):
    """The tiny GRPO config, 2 updates a step, 2 steps, π_old from the engine: with the skip no
    pass runs and the run is the one with the pass (whose π_old on the trained tokens is the
    engine's too) to the last bit; against π_old from the trainer's pass, the engine's float32
    log-probs of the same policy give the same training within the tolerance above."""
    from dynamo_jax.loop import train
    from dynamo_jax.reporting.metrics import read_metrics

    passes = []
    whole_pass = behaviour_pass.old_logprobs

    def spy(batch, logprob, params, ref_params, seqs=None):
        passes.append(seqs)
        return whole_pass(batch, logprob, params, ref_params, seqs)

    monkeypatch.setattr(behaviour_pass, "old_logprobs", spy)
    runs = {}
    for source, skip in (("trainer", False), ("engine", False), ("engine", True)):
        config = _run_config(
            skip_on_policy_logprob_pass=skip, old_logp_source=source, mini_batch_size=64, steps=2
        )
        config.logging.progress_bar = config.logging.tensorboard = False
        config.checkpoint.every_steps = 2
        config.eval.every_steps = 0
        cfg = from_config_dict(config)
        assert cfg.updates_per_step == 2 and cfg.skips_logprob_pass is skip
        workdir = tmp_path / f"{source}-{skip}"
        passes.clear()
        assert train.run(cfg, workdir).exit_code == 0
        runs[source, skip] = (read_metrics(workdir), len(passes), _final_params(workdir, config))
    assert [runs[k][1] for k in runs] == [2, 2, 0]  # one pass a step, none with the skip
    with_pass, without = runs["engine", False], runs["engine", True]
    for a, b in zip(with_pass[0], without[0]):
        assert "time/old_logprobs" in a and "time/old_logprobs" not in b
        for key in ("loss/loss", "loss/grad_norm", "loss/approx_kl_mean", "reward/mean"):
            assert b[key] == a[key], key
    for a, b in zip(_leaves(with_pass[2]), _leaves(without[2])):
        np.testing.assert_array_equal(b, a)
    trainer = runs["trainer", False]
    for a, b in zip(trainer[0], without[0]):
        for key in ("loss/loss", "loss/grad_norm", "reward/mean"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-3, err_msg=key)
    lr = config.optim.learning_rate
    for a, b in zip(_leaves(trainer[2]), _leaves(without[2])):
        assert np.abs(a - b).max() <= 2 * lr
        assert np.mean(np.abs(a - b) > 0.1 * lr) < 1e-3
