"""init.checkpoint = "org/name[@revision]": resolved offline from a Hugging Face Hub cache.

The cache is laid out as huggingface_hub lays it out (models--org--name/{blobs, refs, snapshots},
snapshot files linked to blobs named by their sha256) and checked with the library's own cache
reader (`scan_cache_dir`) before anything of ours reads it; resolution then goes through
`huggingface_hub.snapshot_download` with HF_HUB_OFFLINE=1, as a user's offline run would.
"""

import json
import os
from pathlib import Path

import huggingface_hub
import jax
import numpy as np
import pytest
from helpers.hub_cache import put_in_hub_cache
from hf_fixtures import make_tiny_hf_checkpoint

from dynamo_jax.errors import MissingFileError
from dynamo_jax.models import fetch, hf_io, hub

REPO = "tiny-org/tiny-qwen3"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """HF_HOME with tiny-org/tiny-qwen3 cached at COMMIT (branch main); offline."""
    model_dir = make_tiny_hf_checkpoint(tmp_path / "src", "qwen3", seed=3)
    home = tmp_path / "hf_home"
    snapshot = put_in_hub_cache(home / "hub", REPO, model_dir, COMMIT)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # no local directory named like the repo
    return home / "hub", snapshot, model_dir


def test_the_cache_is_the_librarys_layout(hub_cache):
    cache, _, model_dir = hub_cache
    info = huggingface_hub.scan_cache_dir(cache)
    assert not info.warnings
    (repo,) = info.repos
    assert (repo.repo_id, repo.repo_type) == (REPO, "model")
    (revision,) = repo.revisions
    assert revision.commit_hash == COMMIT and revision.refs == frozenset({"main"})
    assert {f.file_name for f in revision.files} == {p.name for p in model_dir.iterdir()}


@pytest.mark.parametrize("spec", [REPO, f"{REPO}@main", f"{REPO}@{COMMIT}"])
def test_hub_id_resolves_offline_to_the_snapshot_and_loads(hub_cache, spec):
    _, snapshot, model_dir = hub_cache
    path = fetch.resolve_checkpoint(spec)
    assert Path(path) == snapshot
    cfg_hub, params_hub = hf_io.load_hf_checkpoint(path)
    cfg_src, params_src = hf_io.load_hf_checkpoint(model_dir)
    assert cfg_hub == cfg_src
    for a, b in zip(jax.tree.leaves(params_hub), jax.tree.leaves(params_src), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_resolve_init_makes_checkpoint_and_tokenizer_local(hub_cache):
    from configs import tiny
    from dynamo_jax.config import from_config_dict

    _, snapshot, _ = hub_cache
    config = tiny.get_config()
    config.init.checkpoint = REPO
    config.init.tokenizer = REPO
    cfg = fetch.resolve_init(from_config_dict(config))
    assert (cfg.init.checkpoint, cfg.init.tokenizer) == (str(snapshot), str(snapshot))


def test_missing_model_offline_is_one_line_saying_how_to_fetch(hub_cache):
    with pytest.raises(MissingFileError) as err:
        fetch.resolve_checkpoint("tiny-org/not-cached@v2")
    message = str(err.value)
    assert "\n" not in message
    assert "HF_HUB_OFFLINE" in message
    assert "hf download tiny-org/not-cached --revision v2" in message


def test_unknown_revision_offline_is_missing(hub_cache):
    with pytest.raises(MissingFileError, match="hf download tiny-org/tiny-qwen3 --revision v9"):
        fetch.resolve_checkpoint(f"{REPO}@v9")


def test_local_directories_win_over_hub_ids(hub_cache, tmp_path):
    local = tmp_path / "tiny-org" / "tiny-qwen3"
    local.mkdir(parents=True)
    assert hub.parse_hub_id(REPO) is None
    assert fetch.resolve_checkpoint(REPO) == REPO
    assert fetch.resolve_checkpoint("some/local/dir") == "some/local/dir"  # two slashes: a path
    assert fetch.resolve_checkpoint("") == ""


def test_parse_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.parse_hub_id("Qwen/Qwen2.5-Math-7B") == ("Qwen/Qwen2.5-Math-7B", None)
    assert hub.parse_hub_id("Qwen/Qwen2.5-Math-7B@refs/pr/1") == (
        "Qwen/Qwen2.5-Math-7B",
        "refs/pr/1",
    )
    for not_hub in ("qwen", "/abs/model", "./rel/model", "a/b/c", "org/na me", "pypi:x==1#y"):
        assert hub.parse_hub_id(not_hub) is None, not_hub


def test_cache_dir_follows_the_librarys_variables(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "h"))
    assert hub.hub_cache_dir() == tmp_path / "h" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert hub.hub_cache_dir() == tmp_path / "c"


def test_launch_trains_from_a_hub_model_id_offline(tmp_path):
    """`launch.py --config.init.checkpoint=org/name` with HF_HUB_OFFLINE=1: the run starts from the
    cached snapshot (config.json records it); a model not in the cache is refused in one line."""
    from helpers.scripts import ROOT, launch
    from hf_fixtures import random_flax_params

    from configs import tiny
    from dynamo_jax.config import from_config_dict
    from dynamo_jax.reporting.metrics import read_metrics

    model = from_config_dict(tiny.get_config("method=grpo")).model
    source = hf_io.save_hf_checkpoint(random_flax_params(model, seed=2), model, tmp_path / "src")
    snapshot = put_in_hub_cache(tmp_path / "hf" / "hub", "tiny-org/tiny-dynamo", source, COMMIT)
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    env.pop("HF_HUB_CACHE", None)
    args = (
        f"--config={ROOT / 'configs' / 'tiny.py'}:method=grpo",
        "--config.train.steps=2",
        "--config.logging.progress_bar=False",
        "--config.logging.tensorboard=False",
        "--config.logging.plots_at_end=False",
        "--config.eval.every_steps=0",
    )
    proc = launch(
        *args, f"--workdir={tmp_path / 'w'}", "--config.init.checkpoint=tiny-org/tiny-dynamo",
        env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = json.loads((tmp_path / "w" / "config.json").read_text())
    assert saved["init"]["checkpoint"] == str(snapshot)
    assert [r["step"] for r in read_metrics(tmp_path / "w")] == [1, 2]

    missing = tmp_path / "missing"
    proc = launch(
        *args, f"--workdir={missing}", "--config.init.checkpoint=tiny-org/absent", env=env
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: init.checkpoint 'tiny-org/absent': not in the Hub cache")
    assert "hf download tiny-org/absent" in line
    assert not missing.exists()
