"""The gradient capture of benchmarks/gradient_variance.py (gradient_variance_pipeline.py).

Oracle: the same train step with SGD at learning rate 1, whose parameter change is the gradient.
"""

import jax
import numpy as np
import optax
import pytest

from benchmarks import gradient_variance_pipeline as gv
from dynamo_jax.losses import LossConfig
from dynamo_jax.models.presets import get_preset
from dynamo_jax.models.qwen import init_params
from dynamo_jax.sharding.mesh import MeshConfig, build_mesh
from dynamo_jax.sharding.rules import DEFAULT_RULES
from dynamo_jax.step.state import train_state_from_params
from dynamo_jax.step.train_step import PROMPT_FIELDS, make_train_step

# XLA's backend optimisation level 0 halves CPU compile time; it does not change the program.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def test_capture_gradient_holds_the_steps_gradient_and_leaves_params_unchanged():
    cfg = get_preset("tiny-qwen3", vocab_size=32)
    mesh = build_mesh(MeshConfig(shape=(1, 1, 1)), jax.devices()[:1])
    params = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(3)))
    rows, length = 8, 12

    def batch(seed):
        r = np.random.default_rng(seed)
        loss_mask = np.zeros((rows, length), np.float32)
        loss_mask[:, 6:] = 1.0
        return {
            "tokens": r.integers(1, 32, (rows, length)).astype(np.int32),
            "positions": np.tile(np.arange(length, dtype=np.int32), (rows, 1)),
            "segment_ids": np.ones((rows, length), np.int32),  # one sequence per row
            "loss_mask": loss_mask,
            "advantages": r.normal(size=rows).astype(np.float32),
            "old_logp": np.full((rows, length), -3.4, np.float32),
            "temperature": np.float32(1.0),
            "on_policy": np.float32(0.0),
        }

    def step_with(optimizer):
        step = make_train_step(
            cfg, LossConfig.preset("grpo"), optimizer, mesh, DEFAULT_RULES, batch_size=rows
        )
        make_state = lambda: train_state_from_params(params, optimizer, step.state_shardings)
        compiled = step.fn.lower(make_state(), batch(0)).compile(FAST_COMPILE)
        return compiled, make_state

    sgd_step, sgd_state = step_with(optax.sgd(1.0))
    capture_step, capture_state = step_with(gv.capture_gradient())
    state = capture_state()
    for seed in (0, 1):  # the second call replaces the captured gradient, it does not add to it
        new_sgd, _ = sgd_step(sgd_state(), batch(seed))
        sgd_grad = jax.tree.map(lambda p, n: p - np.asarray(n), params, new_sgd.params)
        state, metrics = capture_step(state, batch(seed))
        captured = jax.device_get(state.opt_state)
        for a, b in zip(jax.tree.leaves(captured), jax.tree.leaves(sgd_grad)):
            np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-4)
        leaves = jax.tree.leaves(captured)
        norm = np.sqrt(sum(np.sum(np.square(x, dtype=np.float64)) for x in leaves))
        assert norm == pytest.approx(float(metrics["grad_norm"]), rel=1e-5)
        assert norm > 1e-3  # a real gradient, not the zero update
        for a, b in zip(jax.tree.leaves(jax.device_get(state.params)), jax.tree.leaves(params)):
            np.testing.assert_array_equal(a, b)


def test_gradient_without_the_log_prob_pass_is_the_same_when_the_update_is_on_policy(tmp_path):
    """With train.skip_on_policy_logprob_pass the one update takes stop_gradient of its own
    forward, so leaving the pass out (NaN old log-probs) gives the very same gradient; only the
    group stats lose their entropy."""
    import dataclasses

    from benchmarks import gradient_variance as gvm

    cfg = gvm.tiny_config("max", "grpo", 0)
    cfg = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, skip_on_policy_logprob_pass=True)
    )
    assert cfg.first_update_on_policy
    params = init_params(cfg.model, jax.random.key(0))
    pipe = gv.Pipeline(cfg, params, str(tmp_path))
    try:
        rows = np.arange(4)
        pool = pipe.sample(rows, np.full(4, 8), seed=5)
        completions = [c for r in rows for c in pool[int(r)]]
        with_pass, groups = pipe.gradient(completions, 4, 8)
        without, no_stats = pipe.gradient(completions, 4, 8, stats=False)
    finally:
        pipe.close()
    assert np.linalg.norm(with_pass) > 1e-4
    np.testing.assert_array_equal(with_pass, without)
    assert np.all(np.isfinite(groups["entropy_mean"]))
    assert np.all(np.isnan(no_stats["entropy_mean"]))
    assert pipe.clock.compiled == [True, False] and pipe.clock.rows == [32, 32]


def test_gradient_clock_leaves_out_each_shapes_first_gradient():
    clock = gv.GradientClock()
    assert np.isnan(clock.seconds_per_row()) and clock.sampling_per_row() == 0.0
    clock.tick((1, 8), 8, 10.0)  # compiles
    clock.tick((1, 8), 8, 2.0)
    clock.tick((4, 8), 32, 20.0)  # compiles
    clock.tick((4, 8), 32, 4.0)
    clock.tick((4, 8), 32, 6.0)
    clock.sampled(8.0)
    assert clock.compiled == [True, False, True, False, False]
    # (2 + 4 + 6) s over 8 + 32 + 32 timed completions; sampling 8 s over all 112
    assert clock.seconds_per_row() == pytest.approx(12 / 72)
    assert clock.seconds_per_gradient((4, 8)) == pytest.approx(5.0)
    assert clock.seconds_per_gradient((1, 8)) == pytest.approx(2.0)
    assert np.isnan(clock.seconds_per_gradient((4, 64)))
    assert clock.sampling_per_row() == pytest.approx(8 / 112)


def test_shared_prompts_give_the_same_gradient(tmp_path):
    """train.share_prompts (each group's prompt run once in the update; a --config override
    that makes a real model's gradients cheaper) gives the unshared layout's gradient up to
    float32 summation order."""
    import dataclasses

    from benchmarks import gradient_variance as gvm

    cfg = gvm.tiny_config("max", "grpo", 0)
    shared = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, share_prompts=True, packing=False)
    )
    pipe = gv.Pipeline(cfg, init_params(cfg.model, jax.random.key(1)), str(tmp_path))
    try:
        rows = np.arange(4)
        pool = pipe.sample(rows, np.full(4, 8), seed=6)
        completions = [c for r in rows for c in pool[int(r)]]
        plain = pipe.gradient(completions, 4, 8)[0]
        pipe.set_config(shared)
        assert pipe._layouts(pipe._shape(4, 8, True).cfg).update.shared_prompts is not None
        once = pipe.gradient(completions, 4, 8)[0]
        # the step reads the prompt table, as the Trainer's does (build.build_trainer)
        assert set(PROMPT_FIELDS) <= set(pipe._shape(4, 8, True).step.batch_shardings)
    finally:
        pipe.close()
    assert np.linalg.norm(plain) > 1e-4
    np.testing.assert_allclose(once, plain, rtol=1e-4, atol=1e-6)
