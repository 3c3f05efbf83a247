"""ModelConfig validation, HF config translation and preset parameter counts."""

import dataclasses

import jax
import pytest
import transformers

from dynamo_jax.models import families
from dynamo_jax.models.config import ModelConfig
from dynamo_jax.models.presets import PUBLISHED_NUM_PARAMS, get_preset
from dynamo_jax.models.qwen import param_shapes


@pytest.mark.parametrize("name", sorted(PUBLISHED_NUM_PARAMS))
def test_preset_param_counts_match_published(name):
    cfg = get_preset(name)
    expected = PUBLISHED_NUM_PARAMS[name]
    if name == "qwen3-1.7b":
        # Qwen3-1.7B's config.json ties embeddings, but its safetensors also store lm_head.weight
        # (a copy of the embedding); the published 2,031,739,904 counts that stored copy.
        assert cfg.tie_word_embeddings
        assert cfg.num_params == 1_720_574_976
        assert cfg.num_params + cfg.vocab_size * cfg.hidden_size == expected
    else:
        assert cfg.num_params == expected


def test_r1_distill_shapes():
    # DeepSeek-R1-Distill-Qwen-1.5B = Qwen2.5-Math-1.5B shapes with an untied lm_head.
    base, distill = get_preset("qwen2.5-math-1.5b"), get_preset("r1-distill-qwen-1.5b")
    assert (
        distill.num_params == base.num_params + base.vocab_size * base.hidden_size == 1_777_088_000
    )
    assert get_preset("r1-distill-qwen-7b").num_params == 7_615_616_512


@pytest.mark.parametrize(
    "name",
    ["tiny-qwen3", "tiny-qwen2", "tiny-llama", "qwen3-0.6b", "qwen2.5-math-7b", "smollm2-135m"],
)
def test_num_params_equals_sum_of_shapes(name):
    cfg = get_preset(name)
    shapes = param_shapes(cfg)  # eval_shape: no allocation, so 7B is fine here
    assert sum(x.size for x in jax.tree.leaves(shapes)) == cfg.num_params


def test_family_sets_defaults_and_explicit_head_dim():
    q2 = ModelConfig("qwen2", 100, 64, 128, 2, 4, 2)
    assert (q2.qkv_bias, q2.qk_norm, q2.head_dim) == (True, False, 16)
    q3 = ModelConfig("qwen3", 100, 64, 128, 2, 4, 2, head_dim=32)
    assert (q3.qkv_bias, q3.qk_norm, q3.head_dim) == (False, True, 32)
    ll = ModelConfig("llama", 100, 64, 128, 2, 4, 2)
    assert (ll.qkv_bias, ll.qk_norm, ll.head_dim) == (False, False, 16)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(family="mistral"), "family"),
        (dict(num_kv_heads=3), "num_kv_heads"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(dtype="float16"), "dtype"),
        (dict(remat_policy="sometimes"), "remat_policy"),
        (dict(head_dim=33), "head_dim"),
        (dict(rope_theta=0.0), "rope_theta"),
    ],
)
def test_invalid_fields_are_named(changes, field):
    with pytest.raises(ValueError, match=field):
        get_preset("tiny-qwen3", **changes)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown model preset 'qwen9'"):
        get_preset("qwen9")


@pytest.mark.parametrize("name", ["qwen3-8b", "qwen2.5-math-1.5b", "tiny-qwen2", "smollm2-135m"])
def test_hf_config_round_trip_through_transformers(name):
    cfg = get_preset(name)
    hf = transformers.AutoConfig.for_model(**cfg.to_hf_config())
    names = {"qwen3": "Qwen3Config", "qwen2": "Qwen2Config", "llama": "LlamaConfig"}
    assert type(hf).__name__ == names[cfg.family]
    back = ModelConfig.from_hf_config(hf.to_dict())
    assert back == cfg.replace(scan_layers=True, remat_policy="none")


def test_from_hf_config_accepts_old_and_new_rope_spelling():
    base = get_preset("tiny-qwen3").to_hf_config()
    new = {k: v for k, v in base.items() if k != "rope_theta"}
    new["rope_parameters"] = {"rope_theta": 12345.0, "rope_type": "default"}
    old = {k: v for k, v in base.items() if k != "rope_parameters"}
    old["rope_theta"] = 54321.0
    assert ModelConfig.from_hf_config(new).rope_theta == 12345.0
    assert ModelConfig.from_hf_config(old).rope_theta == 54321.0


def test_from_hf_config_errors():
    base = get_preset("tiny-qwen2").to_hf_config()
    with pytest.raises(ValueError, match="unsupported model_type 'mistral'"):
        ModelConfig.from_hf_config({**base, "model_type": "mistral"})
    llama = get_preset("tiny-llama").to_hf_config()
    for key in ("attention_bias", "mlp_bias"):
        with pytest.raises(ValueError, match=key):
            ModelConfig.from_hf_config({**llama, key: True})
    with pytest.raises(ValueError, match="rope_type 'llama3'"):
        ModelConfig.from_hf_config(
            {**llama, "rope_parameters": {"rope_type": "llama3", "factor": 8.0}}
        )
    with pytest.raises(ValueError, match="qkv_bias=True"):
        get_preset("tiny-llama", qkv_bias=True).to_hf_config()
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        ModelConfig.from_hf_config(
            {**base, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}
        )
    with pytest.raises(ValueError, match="use_sliding_window"):
        ModelConfig.from_hf_config({**base, "use_sliding_window": True})
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig.from_hf_config({k: v for k, v in base.items() if k != "hidden_size"})


@pytest.mark.parametrize("name", families.names())
def test_every_family_record_round_trips_its_config_json(name):
    """One record per family (models/families.py): its HF names and switches reach config.json
    and come back; transformers knows its architecture."""
    family = families.get(name)
    cfg = get_preset("tiny-qwen3").replace(family=name, qkv_bias=None, qk_norm=None)
    assert (cfg.qkv_bias, cfg.qk_norm) == (family.qkv_bias, family.qk_norm)
    hf = cfg.to_hf_config()
    assert hf["architectures"] == [family.architecture] and hf["model_type"] == name
    assert hasattr(transformers, family.architecture)
    back = ModelConfig.from_hf_config(hf)
    for field in ("family", "qkv_bias", "qk_norm", "head_dim", "num_kv_heads", "rope_theta"):
        assert getattr(back, field) == getattr(cfg, field), field


def test_a_toy_family_registered_from_outside_round_trips(tmp_path):
    """docs/design.md#adding-a-model-family: a family is one registered record. A toy one (Qwen3's
    layout with q/k/v biases on by default and a config.json key of its own) registered from this
    test builds configs, and its checkpoint goes to safetensors and back unchanged."""
    import numpy as np

    from dynamo_jax.models import hf_io
    from dynamo_jax.models.qwen import init_params

    def read(hf):
        if hf.get("toy_marker") is not True:
            raise ValueError("config.json lacks toy_marker")
        return {"qkv_bias": bool(hf["attention_bias"])}

    def write(cfg, hf):
        hf.update(toy_marker=True, attention_bias=bool(cfg.qkv_bias))

    families.register(
        families.ModelFamily("toyfam", "Qwen3ForCausalLM", qkv_bias=True, qk_norm=True,
                             read_hf=read, write_hf=write)
    )  # fmt: skip
    try:
        cfg = get_preset("tiny-qwen3").replace(family="toyfam", qkv_bias=None, qk_norm=None)
        assert (cfg.qkv_bias, cfg.qk_norm) == (True, True)  # the family's defaults
        hf = cfg.to_hf_config()
        assert (hf["model_type"], hf["toy_marker"]) == ("toyfam", True)
        assert ModelConfig.from_hf_config(hf) == cfg
        unbiased = cfg.replace(qkv_bias=False)  # read back by the family's own read_hf
        assert ModelConfig.from_hf_config(unbiased.to_hf_config()) == unbiased
        with pytest.raises(ValueError, match="lacks toy_marker"):
            ModelConfig.from_hf_config({**hf, "toy_marker": False})
        params = init_params(cfg, jax.random.key(0))
        path = hf_io.save_hf_checkpoint(params, cfg, tmp_path / "toy")
        cfg2, params2 = hf_io.load_hf_checkpoint(path)
        assert cfg2 == cfg
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), params, params2)
    finally:
        families.unregister("toyfam")
    with pytest.raises(ValueError, match="ModelConfig.family must be one of"):
        ModelConfig(**{**dataclasses.asdict(cfg), "family": "toyfam"})
