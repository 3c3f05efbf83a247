"""ConfigDict → dataclass mapping: field validation, unknown keys, cross-section checks."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import ml_collections as mlc
import pytest

from configs import tiny
from dynamo_jax import config as C
from dynamo_jax.errors import ConfigError, UserError


def test_every_section_maps_to_a_frozen_dataclass():
    for name in C.SECTIONS:
        cls = C.section_class(name)
        assert dataclasses.is_dataclass(cls), name
        assert cls.__dataclass_params__.frozen, name
    assert set(C.SECTIONS) == {f.name for f in dataclasses.fields(C.RunConfig)} - {"name"}


@pytest.mark.parametrize(
    "cls,kwargs,message",
    [
        (C.TrainConfig, dict(steps=0), "train.steps"),
        (C.TrainConfig, dict(seed=-1), "train.seed"),  # failed only at step 1 before
        (C.TrainConfig, dict(seed=2**32), "train.seed"),  # np.random.seed (vLLM) refuses it
        (C.TrainConfig, dict(mini_batch_size=6, micro_batches=4), "train.micro_batches"),
        (C.TrainConfig, dict(pack_len=-1), "train.pack_len"),
        (C.TrainConfig, dict(max_tokens_per_micro_batch=1.5), "train.max_tokens_per_micro_batch"),
        (C.TrainConfig, dict(micro_batches=2, max_tokens_per_micro_batch=64), "not both"),
        (C.TrainConfig, dict(max_staleness=-1), "train.max_staleness"),
        (C.TrainConfig, dict(old_logp_source="vllm"), "train.old_logp_source"),
        (C.TrainConfig, dict(max_sampling_rounds=0), "train.max_sampling_rounds"),
        (C.TrainConfig, dict(dynamic_sampling=True, max_staleness=1), "train.dynamic_sampling"),
        (C.OptimConfig, dict(schedule="linear"), "optim.schedule"),
        (C.OptimConfig, dict(b2=1.0), "optim.b2"),
        (C.OptimConfig, dict(learning_rate=0.0), "optim.learning_rate"),
        (C.RolloutConfig, dict(engine="sglang"), "rollout.engine"),
        (C.RolloutConfig, dict(top_p=1.5), "rollout.top_p"),
        (C.EvalConfig, dict(n_samples=4, ks=(1, 8)), "eval.ks"),
        (C.DryRunConfig, dict(num_devices=0), "dry_run.num_devices"),
    ],
)
def test_bad_values_name_the_field(cls, kwargs, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        cls(**kwargs)


def test_build_section_rejects_unknown_fields_and_converts_lists():
    with pytest.raises(ValueError, match=r"config\.train has unknown field\(s\) \['stpes'\]"):
        C.build_section("train", {"stpes": 3})
    ev = C.build_section("eval", mlc.ConfigDict({"ks": [1, 2], "n_samples": 2}))
    assert ev.ks == (1, 2)
    with pytest.raises(ValueError, match=r"config\.optim \(OptimConfig\): optim\.eps"):
        C.build_section("optim", {"eps": -1.0})


def test_parse_arg_of_config_files():
    from configs.base import parse_arg

    assert parse_arg("baseline=grpo", baseline="dynamo", ablation="none") == {
        "baseline": "grpo",
        "ablation": "none",
    }
    with pytest.raises(ValueError, match="basline"):
        parse_arg("basline=grpo", baseline="dynamo")


def test_sequences_longer_than_the_model_context_are_refused():
    from configs import tiny

    config = tiny.get_config()
    config.rollout.max_new_tokens = config.model.max_position_embeddings
    with pytest.raises(ValueError, match="exceeds the model's context"):
        C.from_config_dict(config)


def test_validation_errors_are_config_errors_naming_the_field():
    """launch.py prints a ConfigError as one line; it is still a ValueError for older callers."""
    with pytest.raises(ConfigError, match=r"config\.train \(TrainConfig\): train\.seed"):
        C.build_section("train", {"seed": -1})
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['stpes'\]"):
        C.build_section("train", {"stpes": 3})
    config = tiny.get_config()
    del config["eval"]
    with pytest.raises(ConfigError, match=r"missing \['eval'\]"):
        C.from_config_dict(config)
    config = tiny.get_config()
    config.train.mini_batch_size = 48  # does not divide 16 prompts x 8 rollouts
    with pytest.raises(ConfigError, match=r"train\.mini_batch_size \(48\) must divide"):
        C.from_config_dict(config)
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, UserError)
    C.build_section("train", {"seed": 2**32 - 1})  # the largest seed


def test_pack_len_and_token_budget_are_checked_against_the_run():
    """A row must hold the run's longest sequence (max prompt + max new tokens) and a token
    budget at least one row: both fail while the config is read, before anything compiles."""
    from configs import tiny

    config = tiny.get_config()
    longest = config.data.max_prompt_tokens + config.rollout.max_new_tokens  # 16 + 4
    config.train.pack_len = longest - 1
    with pytest.raises(
        ValueError, match=r"train\.pack_len \(19\) must be >= the run's max_seq_len"
    ):
        C.from_config_dict(config)
    config.train.pack_len = 0  # = max_seq_len
    config.train.max_tokens_per_micro_batch = longest - 1
    with pytest.raises(ValueError, match=r"must hold at least one row of train\.pack_len = 20"):
        C.from_config_dict(config)
    config.train.pack_len = 32
    config.train.max_tokens_per_micro_batch = 64
    run = C.from_config_dict(config)
    assert run.train.packing and run.train.pack_len == 32


def test_engine_log_probs_need_the_full_tempered_distribution():
    """vLLM's processed log-probs are of the top-k/top-p restricted distribution, the trainer's
    of the full softmax: as π_old they would compare two distributions."""
    from configs import tiny

    config = tiny.get_config()
    config.train.old_logp_source = "engine"
    C.from_config_dict(config)  # top_p 1, top_k off: accepted
    config.rollout.top_p = 0.9
    with pytest.raises(ValueError, match=r"train\.old_logp_source='engine' needs rollout\.top_p"):
        C.from_config_dict(config)


def test_reading_a_config_loads_no_orbax():
    """config.py takes the checkpoint section from checkpoint_config.py, not from the orbax
    module: a fresh interpreter that imports only the config has no orbax module loaded."""
    code = "import sys, dynamo_jax.config; print(sorted(m for m in sys.modules if 'orbax' in m))"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout[:300]
