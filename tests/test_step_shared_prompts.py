"""Shared prompts (train.share_prompts): each distinct prompt of a micro-batch runs once.

The oracle is the same batch laid out without sharing (one padded row per sequence): the
update's gradient and metrics, the log-prob pass's outputs and a two-step tiny run must agree up
to float32 summation order. The model-level check (hidden states and parameter gradients) is in
tests/test_models_qwen.py, the layout's tables in tests/test_data_packing.py.
"""

import dataclasses

import jax
import numpy as np
import pytest
from helpers.step_setups import FAST_COMPILE, grad_recorder, rollouts_from_tokens, sub_mesh

from dynamo_jax.config import from_config_dict
from dynamo_jax.data.packing import RowLayout
from dynamo_jax.loop import assemble, behaviour_pass
from dynamo_jax.losses import LossConfig
from dynamo_jax.sharding.rules import DEFAULT_RULES
from dynamo_jax.step.forward import make_logprob_fn
from dynamo_jax.step.state import train_state_from_params
from dynamo_jax.step.train_step import make_train_step

ROWS, WIDTH, PROMPT_SLOTS, GROUP = 16, 16, 6, 4
UNSHARED = RowLayout(row_len=WIDTH, packing=False, micro_rows=ROWS, max_sequences=ROWS)
SHARED = dataclasses.replace(UNSHARED, prompt_slots=PROMPT_SLOTS, prompt_groups=ROWS // GROUP)
# Two micro-batches of 8 rows (sequences 0-7, then 8-15: two groups each), gradient accumulation.
SHARED_ACCUMULATED = RowLayout(WIDTH, False, 8, ROWS, prompt_slots=PROMPT_SLOTS, prompt_groups=2)


@pytest.fixture
def tiny3(step_setups):
    return step_setups["tiny-qwen3"][:2]


def group_rollouts(cfg, params, seed=3):
    """A RolloutBatch of 4 groups of 4 rows (prompt ids 0..3, each group's prompt of 2-5 tokens
    on all its rows), responses of 1..10 tokens, row 5 an empty (invalid) row, random
    advantages, old log-probs near the policy's own."""
    rng = np.random.default_rng(seed)
    group = np.arange(ROWS) // GROUP
    prompt_len = rng.integers(2, PROMPT_SLOTS, ROWS // GROUP)[group]
    prompts = rng.integers(1, cfg.vocab_size, (ROWS // GROUP, WIDTH))[group]
    response = rng.integers(1, WIDTH - PROMPT_SLOTS + 1, ROWS)
    length = prompt_len + response
    length[5] = 0
    tokens = rng.integers(1, cfg.vocab_size, (ROWS, WIDTH))
    tokens = np.where(np.arange(WIDTH)[None] < prompt_len[:, None], prompts, tokens)
    return rollouts_from_tokens(cfg, params, tokens, prompt_len, length, group, rng)[0]


def _step(cfg, params, rollouts, layout, loss_cfg):
    opt = grad_recorder()
    step, state_sh, batch_sh = make_train_step(
        cfg,
        loss_cfg,
        opt,
        sub_mesh((1, 1, 1)),
        DEFAULT_RULES,
        batch_size=layout.max_rows,
        micro_batches=layout.max_micro_batches,
        shared_prompts=layout.shared_prompts,
    )
    rows, _ = assemble.lay_out(rollouts, np.arange(ROWS), layout, tuple(batch_sh))
    state = train_state_from_params(params, opt, state_sh)
    new_state, metrics = step.lower(state, rows).compile(FAST_COMPILE)(state, rows)
    return {k: float(v) for k, v in metrics.items()}, jax.tree.leaves(new_state.opt_state), rows


@pytest.mark.parametrize("loss", ["grpo", "dynamo"])
@pytest.mark.parametrize("layout", [SHARED, SHARED_ACCUMULATED], ids=["one-micro", "accumulated"])
def test_the_update_with_shared_prompts_equals_the_unshared_one(tiny3, loss, layout):
    cfg, params = tiny3
    rollouts = group_rollouts(cfg, params)
    loss_cfg = LossConfig.preset(loss)
    ref_m, ref_g, _ = _step(cfg, params, rollouts, UNSHARED, loss_cfg)
    m, g, rows = _step(cfg, params, rollouts, layout, loss_cfg)
    # The prompts sit right-aligned in the first 6 slots; each micro-batch's table names its
    # distinct prompts (all 4 in one micro-batch; 2 in each of two).
    assert (rows["tokens"][:, PROMPT_SLOTS - 1] > 0).sum() == ROWS - 1
    source = np.arange(ROWS) // GROUP
    source[5] = 0  # the empty row reads any prompt (the first)
    if layout is SHARED:
        np.testing.assert_array_equal(rows["prompt_table"][:4], [0, 4, 8, 12])
        np.testing.assert_array_equal(rows["prompt_source"], source)
    else:  # sequence j in row (j % 8)·2 + j // 8: micro-batch m holds sequences 8m .. 8m + 7
        np.testing.assert_array_equal(rows["prompt_table"].reshape(8, 2)[:2], [[0, 0], [4, 4]])
        np.testing.assert_array_equal(rows["prompt_source"].reshape(8, 2).T.ravel(), source % 2)
    scale = max(float(np.abs(x).max()) for x in ref_g)
    assert scale > 1e-3
    for a, b in zip(ref_g, g, strict=True):
        np.testing.assert_allclose(b, a, atol=2e-5 * scale, rtol=1e-4)
    assert set(m) == set(ref_m)
    for key in ref_m:
        np.testing.assert_allclose(m[key], ref_m[key], rtol=1e-4, atol=1e-6, err_msg=key)


def test_the_logprob_pass_with_shared_prompts_equals_the_unshared_one(tiny3):
    cfg, params = tiny3
    rollouts = group_rollouts(cfg, params)
    mesh = sub_mesh((1, 1, 1))
    runs = {}
    for name, layout in (("unshared", UNSHARED), ("shared", SHARED_ACCUMULATED)):
        logprob = make_logprob_fn(cfg, mesh, DEFAULT_RULES, layout)
        assert ("prompt_table" in logprob.batch_shardings) == (layout.prompt_slots > 0)
        rows = assemble.device_rows(
            rollouts, np.arange(ROWS), logprob.layout, logprob.batch_shardings
        )
        runs[name] = behaviour_pass.old_logprobs(rollouts, rows, logprob, params, None)
    trained = rollouts.loss_mask > 0
    assert trained.sum() > 60
    for field in ("old_logp", "entropy"):
        want, got = getattr(runs["unshared"], field), getattr(runs["shared"], field)
        np.testing.assert_allclose(got[trained], want[trained], atol=2e-5, rtol=1e-5)
        assert np.all(got[~trained] == 0.0)


def test_rows_said_to_share_a_prompt_must_hold_the_same_one(tiny3):
    cfg, params = tiny3
    rollouts = group_rollouts(cfg, params)
    tokens = rollouts.tokens.copy()
    tokens[6, 0] = tokens[6, 0] % (cfg.vocab_size - 1) + 1  # row 6 (group 1) differs from row 4
    bad = dataclasses.replace(rollouts, tokens=tokens)
    fields = ("tokens", "prompt_table", "prompt_source")
    with pytest.raises(ValueError, match="rows 6 and 4 .* same prompt id but different prompt"):
        assemble.lay_out(bad, np.arange(ROWS), SHARED, fields)


def _run_config(**train):
    from configs import tiny

    c = tiny.get_config("method=grpo")
    for k, v in {"packing": False, "mini_batch_size": 64, "steps": 2, **train}.items():
        setattr(c.train, k, v)
    c.logging.progress_bar = c.logging.tensorboard = False
    c.checkpoint.every_steps = 2
    c.eval.every_steps = 0
    return c


def test_share_prompts_needs_unpacked_rows():
    with pytest.raises(ValueError, match="share_prompts needs train.packing = False"):
        from_config_dict(_run_config(packing=True, share_prompts=True))
    cfg = from_config_dict(_run_config(share_prompts=True))
    layouts = assemble.step_layouts(cfg, 1)
    assert layouts.update.shared_prompts == layouts.logprob_pass.shared_prompts == (16, 16)


@pytest.mark.slow
def test_a_run_with_shared_prompts_trains_like_one_without(tmp_path):
    """The tiny GRPO config (16 prompts x 8 samples, 2 updates a step), 2 steps each way: the
    same losses, gradient norms and rewards, and final parameters within float32 noise."""
    from helpers.train_runs import _final_state

    from dynamo_jax.loop import train
    from dynamo_jax.reporting.metrics import read_metrics

    runs = {}
    for share in (False, True):
        config = _run_config(share_prompts=share)
        workdir = tmp_path / str(share)
        assert train.run(from_config_dict(config), workdir).exit_code == 0
        runs[share] = read_metrics(workdir), _final_state(workdir, config)[1]
    for a, b in zip(runs[False][0], runs[True][0], strict=True):
        for key in ("loss/loss", "loss/grad_norm", "loss/entropy_mean", "reward/mean"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-7, err_msg=key)
    lr = config.optim.learning_rate
    for a, b in zip(jax.tree.leaves(runs[False][1]), jax.tree.leaves(runs[True][1]), strict=True):
        assert np.abs(np.asarray(a) - np.asarray(b)).max() <= 0.1 * lr
