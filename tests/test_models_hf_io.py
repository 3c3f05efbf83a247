"""HF checkpoint import/export: round trips through transformers, sharded placement, errors."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
import transformers
from hf_fixtures import hf_logits, make_tiny_hf_checkpoint, make_tiny_hf_model, random_flax_params
from jax.sharding import Mesh
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from dynamo_jax.errors import ConfigError, DataError, UserError
from dynamo_jax.models import hf_io, qwen
from dynamo_jax.models.config import ModelConfig
from dynamo_jax.models.presets import get_preset

TOKENS = np.array([[0, 0, 5, 6, 7, 9], [1, 2, 3, 4, 5, 200]])
MASK = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])


def _logits(params, cfg):
    return np.asarray(qwen.forward_jit(params, cfg, TOKENS, qwen.positions_from_mask(MASK), MASK))


def _read_all(path):
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "np") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {
        (fam, tie): make_tiny_hf_checkpoint(root, fam, tie=tie, seed=2)
        for fam in ("qwen2", "qwen3", "llama")
        for tie in (True, False)
    }


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("tie", [True, False])
def test_import_export_is_value_stable(ckpts, tmp_path, family, tie):
    src = ckpts[(family, tie)]
    cfg, params = hf_io.load_hf_checkpoint(src)
    assert cfg.family == family and cfg.tie_word_embeddings == tie
    out = hf_io.save_hf_checkpoint(params, cfg, tmp_path / "out")
    before, after = _read_all(src), _read_all(out)
    assert sorted(before) == sorted(after)
    assert ("lm_head.weight" in after) == (not tie)
    for name, value in before.items():
        assert after[name].dtype == value.dtype and np.array_equal(after[name], value), name
    # to_hf_tensors (the weight push) yields exactly the same names, shapes and values.
    pushed = hf_io.to_hf_tensors(params, cfg)
    assert sorted(pushed) == sorted(before)
    assert all(np.array_equal(pushed[k], before[k]) for k in before)


def test_export_loads_in_transformers_with_identical_logits(tmp_path):
    arch = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
    for name in ("tiny-qwen3", "tiny-qwen2", "tiny-llama"):
        cfg = get_preset(name)
        params = random_flax_params(cfg, seed=1)
        path = hf_io.save_hf_checkpoint(params, cfg, tmp_path / name)
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        assert type(model).__name__ == arch[cfg.family]
        ours = _logits(params, cfg)
        theirs = hf_logits(model, TOKENS, MASK)
        real = MASK > 0
        assert np.abs(theirs[real]).max() > 1.0
        np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4, rtol=0)
        # And back: the exported directory re-imports to the very same parameters.
        cfg2, params2 = hf_io.load_hf_checkpoint(path)
        assert cfg2 == cfg
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), params, params2)


def test_export_writes_tokenizer_files(tmp_path):
    from dynamo_jax.models.tokenizer import load_tokenizer, make_tiny_tokenizer

    cfg = get_preset("tiny-qwen2")
    tok = make_tiny_tokenizer(vocab_tokens=list("0123456789+="))
    path = hf_io.save_hf_checkpoint(random_flax_params(cfg), cfg, tmp_path / "m", tokenizer=tok)
    assert load_tokenizer(path).encode("12+3=15") == tok.encode("12+3=15")


def test_bf16_checkpoint_round_trip(tmp_path):
    model = make_tiny_hf_model("qwen3", tie=False, seed=4).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    cfg, params = hf_io.load_hf_checkpoint(tmp_path / "bf16")  # fp32 params by default
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(params))
    out = hf_io.save_hf_checkpoint(params, cfg, tmp_path / "out", dtype="bfloat16")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    before, after = _read_all(tmp_path / "bf16"), _read_all(out)
    assert sorted(before) == sorted(after)
    for name in before:
        assert after[name].dtype == before[name].dtype and np.array_equal(after[name], before[name])


def test_sharded_index_checkpoint_loads_same(ckpts, tmp_path):
    model = make_tiny_hf_model("qwen2", tie=False, seed=2)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 2
    _, a = hf_io.load_hf_checkpoint(tmp_path / "sharded")
    _, b = hf_io.load_hf_checkpoint(ckpts[("qwen2", False)])
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, y), a, b)


def test_load_places_each_parameter_with_its_sharding(ckpts):
    cfg, ref = hf_io.load_hf_checkpoint(ckpts[("qwen3", False)])
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tensor"))
    rules = (
        ("vocab", "tensor"),
        ("embed", "fsdp"),
        ("heads", "tensor"),
        ("kv_heads", None),
        ("mlp", "tensor"),
        ("head_dim", None),
        ("layers", None),
    )
    shardings = nn.logical_to_mesh_sharding(qwen.param_logical_axes(cfg), mesh, rules)
    _, params = hf_io.load_hf_checkpoint(ckpts[("qwen3", False)], shardings=shardings)
    q = params["layers"]["attn"]["q_proj"]["kernel"]
    assert q.sharding == shardings["layers"]["attn"]["q_proj"]["kernel"]
    assert q.addressable_shards[0].data.shape == (
        cfg.num_layers,
        cfg.hidden_size // 2,
        cfg.num_heads // 4,
        cfg.head_dim,
    )
    for leaf, sharding, expected in zip(
        jax.tree.leaves(params), jax.tree.leaves(shardings), jax.tree.leaves(ref)
    ):
        assert leaf.sharding == sharding
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(expected))
    np.testing.assert_allclose(_logits(params, cfg), _logits(ref, cfg), atol=1e-5)


def test_unrolled_layout_imports_and_exports(ckpts, tmp_path):
    src = ckpts[("qwen2", True)]
    cfg, scanned = hf_io.load_hf_checkpoint(src)
    cfg_u, unrolled = hf_io.load_hf_checkpoint(src, cfg=cfg.replace(scan_layers=False))
    assert "layers_1" in unrolled and "layers" not in unrolled
    np.testing.assert_allclose(_logits(unrolled, cfg_u), _logits(scanned, cfg), atol=1e-5)
    out = hf_io.save_hf_checkpoint(unrolled, cfg_u, tmp_path / "u")
    before, after = _read_all(src), _read_all(out)
    assert sorted(before) == sorted(after) and all(
        np.array_equal(before[k], after[k]) for k in before
    )


# ----------------------------------------------------------------------------- errors


def test_error_no_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        hf_io.load_hf_checkpoint(tmp_path)


def test_error_unsupported_model_type(ckpts, tmp_path):
    bad = tmp_path / "mistral"
    bad.mkdir()
    cfg = json.loads((ckpts[("qwen3", True)] / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral"}))
    with pytest.raises(ValueError, match="unsupported model_type 'mistral'"):
        hf_io.load_hf_checkpoint(bad)


def _copy_with_tensors(src, dst, tensors):
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_error_missing_tensor_is_named(ckpts, tmp_path):
    src = ckpts[("qwen3", True)]
    tensors = load_file(str(src / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    bad = _copy_with_tensors(src, tmp_path / "missing", tensors)
    with pytest.raises(
        ValueError, match=r"missing tensor 'model\.layers\.1\.self_attn\.k_norm\.weight'"
    ):
        hf_io.load_hf_checkpoint(bad)


def test_error_misshaped_tensor_is_named(ckpts, tmp_path):
    src = ckpts[("qwen2", False)]
    tensors = load_file(str(src / "model.safetensors"))
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"][:-1]
    bad = _copy_with_tensors(src, tmp_path / "shape", tensors)
    with pytest.raises(
        ValueError,
        match=r"'model\.layers\.0\.mlp\.up_proj\.weight' has shape \(127, 64\), expected \(128, 64\)",
    ):
        hf_io.load_hf_checkpoint(bad)


def test_error_no_safetensors(ckpts, tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    (d / "config.json").write_text((ckpts[("qwen2", True)] / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        hf_io.load_hf_checkpoint(d)


def test_hf_param_table_shapes_are_hf_shapes():
    model = make_tiny_hf_model("qwen3", tie=False, head_dim=24, seed=0)
    cfg = ModelConfig.from_hf_config(model.config.to_dict())
    table = hf_io.hf_param_table(cfg)
    sd = model.state_dict()
    assert sorted(e.hf_name for e in table) == sorted(sd)
    for e in table:
        assert e.hf_shape == tuple(sd[e.hf_name].shape), e.hf_name


@pytest.mark.parametrize("scan", [True, False])
def test_write_hf_safetensors_matches_per_tensor_mapping(tmp_path, monkeypatch, scan):
    # The fast export (device-side or blocked host transposes, chunks of layers, one file
    # write per chunk) must equal HFTensor.to_hf applied tensor by tensor on the host.
    cfg = get_preset("tiny-qwen2", scan_layers=scan, tie_word_embeddings=False)
    params = random_flax_params(cfg, seed=3)
    monkeypatch.setattr(hf_io, "_CHUNK_BYTES", 3000)  # force several chunks per stacked param
    monkeypatch.setattr(hf_io, "_BLOCK_ROWS", 5)  # blocks that do not divide the rows
    for dtype in ("float32", "bfloat16"):
        want = {}
        for e in hf_io.hf_param_table(cfg):
            leaf = np.asarray(hf_io._leaf(params, e.path))
            piece = leaf if e.layer is None else leaf[e.layer]
            want[e.hf_name] = e.to_hf(piece.astype(jax.numpy.dtype(dtype)))
        for on_device in (True, False):
            file = tmp_path / f"{dtype}-{on_device}.safetensors"
            size = hf_io.write_hf_safetensors(file, params, cfg, dtype, on_device=on_device)
            assert size == file.stat().st_size
            with safe_open(str(file), "np") as f:  # numpy has no bfloat16: compare raw bits
                assert sorted(f.keys()) == sorted(want)
            got = load_file(str(file)) if dtype == "float32" else None
            raw = file.read_bytes()
            (n,) = np.frombuffer(raw[:8], "<u8")
            header = json.loads(raw[8 : 8 + n])
            for name, value in want.items():
                lo, hi = header[name]["data_offsets"]
                assert header[name]["shape"] == list(value.shape), name
                assert raw[8 + n + lo : 8 + n + hi] == value.tobytes(), (name, on_device)
                if got is not None:
                    assert np.array_equal(got[name], value), name
            chunks = list(hf_io.iter_hf_chunks(params, cfg, dtype=dtype, on_device=on_device))
            assert sum(len(entries) for entries, _ in chunks) == len(want)


def _copy_checkpoint(src, dst):
    dst.mkdir()
    for name in ("config.json", "model.safetensors"):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


@pytest.mark.parametrize(
    "keep_bytes",
    [lambda n: n - 1, lambda n: n // 2, lambda n: 100, lambda n: 5, lambda n: 0],
    ids=["last-byte", "half", "mid-header", "5-bytes", "empty"],
)
def test_truncated_safetensors_names_the_file(ckpts, tmp_path, keep_bytes):
    # A cut file raised safetensors' bare SafetensorError ("incomplete metadata, file not
    # fully covered"), which names no file.
    bad = _copy_checkpoint(ckpts[("qwen3", True)], tmp_path / "cut")
    weights = bad / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: keep_bytes(len(data))])
    with pytest.raises(DataError, match=rf"^{weights}: not a readable safetensors file \("):
        hf_io.load_hf_checkpoint(bad)


def test_unreadable_weights_index_names_the_file(ckpts, tmp_path):
    bad = _copy_checkpoint(ckpts[("qwen3", True)], tmp_path / "index")
    index = bad / "model.safetensors.index.json"
    index.write_text("{oops")
    with pytest.raises(DataError, match=rf"^{index}: invalid JSON \("):
        hf_io.load_hf_checkpoint(bad)
    index.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(DataError, match=rf"^{index}: needs a 'weight_map' object"):
        hf_io.load_hf_checkpoint(bad)


def _with_config(src, dst, text: str | bytes):
    bad = _copy_checkpoint(src, dst)
    config = bad / "config.json"
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    return bad, config


def _edited(src, **changes) -> str:
    hf = json.loads((src / "config.json").read_text())
    hf.update(changes)
    return json.dumps({k: v for k, v in hf.items() if v is not None})


@pytest.mark.parametrize(
    "make_text, words",
    [
        (lambda src: "{not json", "invalid JSON (Expecting property name"),
        (lambda src: "", "invalid JSON (Expecting value: line 1 column 1)"),
        (lambda src: (src / "config.json").read_text()[:-40], "invalid JSON ("),
        (lambda src: '{"model_type": "qwen3\xff"}'.encode("latin-1"), "invalid JSON ("),
        (lambda src: "[1, 2]", "must be a JSON object, got list"),
        (lambda src: "[" * 100_000, "invalid JSON (nested too deeply)"),
        (lambda src: _edited(src, hidden_size=None), "is missing 'hidden_size'"),
        (lambda src: _edited(src, num_attention_heads=None), "missing 'num_attention_heads'"),
        (lambda src: _edited(src, hidden_size="64"), "hidden_size must be a positive int"),
        (lambda src: _edited(src, num_hidden_layers=-1), "num_layers must be a positive int"),
        (lambda src: _edited(src, rms_norm_eps="small"), "could not convert string to float"),
        (lambda src: _edited(src, model_type="mistral"), "unsupported model_type 'mistral'"),
    ],
    ids=[
        "syntax",
        "empty",
        "truncated",
        "not-utf8",
        "list",
        "deep",
        "no-hidden-size",
        "no-heads",
        "str-size",
        "negative-layers",
        "str-eps",
        "mistral",
    ],
)
def test_invalid_config_json_names_the_file(ckpts, tmp_path, make_text, words):
    # These raised a bare JSONDecodeError / AttributeError / KeyError, or a ValueError naming
    # "config.json" but not which one.
    src = ckpts[("qwen3", True)]
    bad, config = _with_config(src, tmp_path / "bad", make_text(src))
    with pytest.raises(ConfigError) as info:
        hf_io.load_hf_checkpoint(bad)
    message = str(info.value)
    assert message.startswith(f"{config}: ") and words in message, message


def test_config_json_of_another_family_names_the_file(ckpts, tmp_path):
    src = ckpts[("qwen3", True)]
    bad, config = _with_config(src, tmp_path / "fam", _edited(src, model_type="qwen2"))
    cfg = ModelConfig.from_hf_config(json.loads((src / "config.json").read_text()))
    with pytest.raises(ConfigError, match=rf"^{config}: model_type 'qwen2' != model.family"):
        hf_io.load_hf_checkpoint(bad, cfg=cfg)


def test_model_file_errors_keep_their_old_base_classes(ckpts, tmp_path):
    # Callers that caught ValueError (config.json, tensors) still do; missing files stay
    # FileNotFoundError.
    src = ckpts[("qwen3", True)]
    bad, _ = _with_config(src, tmp_path / "v", "{")
    with pytest.raises(ValueError):
        hf_io.load_hf_checkpoint(bad)
    tensors = load_file(str(src / "model.safetensors"))
    del tensors["model.norm.weight"]
    with pytest.raises(ValueError):
        hf_io.load_hf_checkpoint(_copy_with_tensors(src, tmp_path / "t", tensors))
    assert issubclass(ConfigError, UserError) and issubclass(DataError, UserError)
