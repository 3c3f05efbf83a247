"""ConfigDict → dataclass mapping: field validation, unknown keys, cross-section checks."""

import dataclasses

import ml_collections as mlc
import pytest

from dynamo_jax import config as C


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
        (C.TrainConfig, dict(mini_batch_size=6, micro_batches=4), "train.micro_batches"),
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
