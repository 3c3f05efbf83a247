"""Rollout correction in the loop (behaviour_pass.corrected) on the tiny config: the update
trains on the weights and mask of the trainer's π_old against the engine's log-probs, with
staleness 1 and with the vLLM sidecar (bf16 against the float32 trainer), and with the engine's
log-probs made the trainer's exactly it is the plain run."""

import dataclasses
import os
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers.train_runs import ROOT, _final_state, _short_config

from dynamo_jax.config import ConfigError, from_config_dict
from dynamo_jax.loop import rl_step, train
from dynamo_jax.reporting.metrics import read_metrics

CORRECTION = dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token",
                  rollout_rs_threshold=1.0005)  # fmt: skip
METRICS = ("is_weight_mean", "is_weight_max", "is_truncated_frac", "rs_masked_frac",
           "rs_seq_masked_frac", "kl", "k3_kl")  # fmt: skip


def _config(steps, **train_fields):
    config = _short_config(method="grpo", steps=steps, every=steps)
    for name, value in train_fields.items():
        setattr(config.train, name, value)
    return config


def _capture(monkeypatch, engine_is_trainer=False):
    """The batch before and after the correction, and the one each update trains on, by step; with `engine_is_trainer`, the
    engine's log-probs replaced by the trainer's π_old before the correction sees them."""
    seen, updates = {}, {}
    real = rl_step.corrected

    def corrected(batch, correction):
        if engine_is_trainer:
            batch = dataclasses.replace(batch, engine_logp=batch.old_logp.copy())
        out, metrics = real(batch, correction)
        seen[len(seen) + 1] = (batch, out)
        return out, metrics

    monkeypatch.setattr(rl_step, "corrected", corrected)
    real_update = rl_step.update

    def update(tr, batch, order):  # once a step: keyed by step
        updates[len(updates) + 1] = batch
        return real_update(tr, batch, order)

    monkeypatch.setattr(rl_step, "update", update)
    return seen, updates


def test_correction_with_staleness_one_uses_the_behaviour_versions_logprobs(tmp_path, monkeypatch):
    """Step 2 trains on version 0's batch while the trainer holds version 1. The weights must be
    π_old (version 0's trainer log-probs) over the engine's (version 0's sampler): ~1 in float32,
    while the current policy is > 1e-3 away in log-prob (lr 1e-3)."""
    seen, updates = _capture(monkeypatch)
    train.run(from_config_dict(_config(3, max_staleness=1, **CORRECTION)), tmp_path)
    records = read_metrics(tmp_path)
    assert [r["rollout/staleness"] for r in records] == [0, 1, 1]
    for step, record in enumerate(records, 1):
        for name in METRICS:
            assert np.isfinite(record[f"rollout_corr/{name}"]), (step, name)
        before, after = seen[step]
        assert updates[step] is after  # the update trains on the corrected batch
        mask = before.loss_mask > 0
        log_rho = before.old_logp - before.engine_logp
        expected = np.where(mask, np.minimum(np.exp(log_rho), 2.0), 0.0)
        np.testing.assert_allclose(after.rollout_is_weight, expected, rtol=1e-6)
        np.testing.assert_array_equal(
            after.loss_mask > 0, mask & (np.abs(log_rho) <= np.log(1.0005))
        )
        assert np.abs(after.rollout_is_weight[mask] - 1.0).max() < 1e-3
        assert record["rollout_corr/is_weight_max"] < 1.001
        assert abs(record["rollout_corr/kl"]) < 1e-4
    assert min(r["rollout/engine_logp_abs_diff"] for r in records[1:]) > 1e-3


def test_engine_equal_to_trainer_trains_as_without_correction(tmp_path, monkeypatch):
    seen, _ = _capture(monkeypatch, engine_is_trainer=True)
    config = _config(2, **CORRECTION)
    train.run(from_config_dict(config), tmp_path / "corrected")
    records = read_metrics(tmp_path / "corrected")
    for step, record in enumerate(records, 1):
        before, after = seen[step]
        np.testing.assert_array_equal(after.loss_mask, before.loss_mask)
        np.testing.assert_array_equal(after.rollout_is_weight, before.loss_mask)
        assert record["rollout_corr/is_weight_max"] == 1.0
        assert record["rollout_corr/rs_masked_frac"] == 0.0
    plain = _config(2)
    train.run(from_config_dict(plain), tmp_path / "plain")
    _, params, _ = _final_state(tmp_path / "corrected", config)
    _, plain_params, _ = _final_state(tmp_path / "plain", plain)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(plain_params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "fields", [dict(old_logp_source="engine"), dict(skip_on_policy_logprob_pass=True)], ids=str
)
def test_correction_refuses_to_run_without_the_trainers_logprob_pass(fields):
    with pytest.raises(ConfigError, match="need train.old_logp_source='trainer'"):
        from_config_dict(_config(2, rollout_is="token", **fields))


VLLM_PYTHON = os.environ.get("DYNAMO_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))


@pytest.mark.vllm
@pytest.mark.skipif(
    not Path(VLLM_PYTHON).is_file(),
    reason=f"no vLLM venv at {VLLM_PYTHON}: run `bash scripts/make_vllm_venv.sh .venv-vllm`",
)
def test_correction_with_the_vllm_sidecar(tmp_path, monkeypatch):
    """The sidecar in bfloat16 (its default; on CPU too) against the trainer's float32 π_old: a
    real mismatch (|Δ log π| up to ~5e-2 measured), so the weights and the rejection, computed
    from the sidecar's own log-probs, are what the update trains on, and the step's metrics
    are the batch's."""
    from hf_fixtures import random_flax_params

    from dynamo_jax.models import hf_io

    seen, updates = _capture(monkeypatch)
    config = _config(2, **CORRECTION)
    model = from_config_dict(config).model
    init = hf_io.save_hf_checkpoint(random_flax_params(model, seed=1), model, tmp_path / "hf")
    config.rollout.engine = "vllm"
    config.rollout.sidecar_python = VLLM_PYTHON
    config.init.checkpoint = str(init)
    train.run(from_config_dict(config), tmp_path / "run")
    records = read_metrics(tmp_path / "run")
    assert (tmp_path / "run" / "vllm_sidecar.log").is_file()
    for step, record in enumerate(records, 1):
        before, after = seen[step]
        assert updates[step] is after
        mask = before.loss_mask > 0
        log_rho = (before.old_logp - before.engine_logp)[mask].astype(np.float64)
        assert np.abs(log_rho).max() > 1e-3  # bf16 sampler, float32 trainer
        expected = np.minimum(np.exp(log_rho), 2.0)
        np.testing.assert_allclose(after.rollout_is_weight[mask], expected, rtol=1e-5)
        rejected = np.abs(log_rho) > np.log(1.0005)
        assert 0 < rejected.mean() < 1
        np.testing.assert_allclose(
            record["rollout_corr/rs_masked_frac"], rejected.mean(), rtol=1e-5
        )
        np.testing.assert_allclose(
            record["rollout_corr/is_weight_max"], np.exp(log_rho).max(), rtol=1e-5
        )
        np.testing.assert_allclose(record["rollout_corr/kl"], -log_rho.mean(), rtol=1e-3, atol=1e-7)
