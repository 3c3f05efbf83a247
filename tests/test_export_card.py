"""`python -m dynamo_jax.export W OUT [--push org/name]`: the model card of the export, and the
push up to the upload.

No local stand-in for the Hub's HTTP API is available, so the upload itself is not exercised:
the arguments are bound to the real `HfApi.create_repo` / `HfApi.upload_folder` signatures, and
a push with HF_HUB_OFFLINE=1 goes through the real library up to its first request, which the
library refuses; that refusal must be one line, after a complete export.
"""

import inspect
import json
import os
import re
import subprocess
import sys

import pytest
from helpers.train_runs import ROOT, _short_config

from dynamo_jax.config import from_config_dict, to_json_dict
from dynamo_jax.errors import ConfigError
from dynamo_jax.export import export
from dynamo_jax.export_card import base_model, check_repo_id, upload_arguments
from dynamo_jax.loop import train
from dynamo_jax.reporting.metrics import read_metrics

huggingface_hub = pytest.importorskip("huggingface_hub")


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    """(cfg, workdir) of a 4-step grpo run evaluated at steps 2 and 4, checkpointed at 2 and 4."""
    config = _short_config(method="grpo", steps=4, every=2)
    config.eval.every_steps = 2
    cfg = from_config_dict(config)
    workdir = tmp_path_factory.mktemp("card") / "run"
    train.run(cfg, workdir)
    return cfg, workdir


def _eval_values(record):
    return {k: v for k, v in record.items() if re.fullmatch(r"eval/[^/]+/pass@\d+", k)}


@pytest.mark.parametrize("step", [None, 2])
def test_card_names_config_method_and_held_out_figures(evaluated_run, tmp_path, step):
    cfg, workdir = evaluated_run
    out = export(workdir, tmp_path / "hf", step=step, dtype="float32")
    card = huggingface_hub.ModelCard.load(out / "README.md")
    assert card.data.library_name == "transformers"
    assert {"dynamo_jax", "rlvr", "grpo"} <= set(card.data.tags)
    text = card.text
    assert f"# {cfg.name}" in text
    assert "| method (`loss.variant`) | grpo |" in text
    exported = step or 4
    assert f"step {exported} of 4" in text
    # The held-out figures are the evaluation of the exported step, not a later one.
    (record,) = [r for r in read_metrics(workdir) if r["step"] == exported]
    figures = _eval_values(record)
    assert figures and f"pass@k at step {exported}," in text
    for key, value in figures.items():
        _, group, metric = key.split("/")
        assert f"| {group} | {metric} | {value:.4f} |" in text
    config_block = text.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(config_block) == json.loads(json.dumps(to_json_dict(cfg)))


def test_push_offline_is_one_line_after_the_export(evaluated_run, tmp_path):
    _, workdir = evaluated_run
    out = tmp_path / "hf"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_TOKEN="hf_not_a_real_token")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "dynamo_jax.export", str(workdir), str(out)]
    proc = subprocess.run(
        [*cmd, "--push", "someone/tiny-grpo"], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 1, proc.stderr
    error_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert error_lines == [proc.stderr.strip().splitlines()[-1]]
    assert error_lines[0].startswith(
        "error: --push someone/tiny-grpo: the upload failed (OfflineModeIsEnabled"
    )
    assert f"push it later with `hf upload someone/tiny-grpo {out}`" in error_lines[0]
    assert {"config.json", "model.safetensors", "README.md"} <= {p.name for p in out.iterdir()}


def test_bad_repo_id_is_refused_before_exporting(evaluated_run, tmp_path):
    _, workdir = evaluated_run
    from dynamo_jax.export import main

    with pytest.raises(SystemExit, match="error: --push 'not a repo'"):
        main([str(workdir), str(tmp_path / "hf"), "--push", "not a repo"])
    assert not (tmp_path / "hf").exists()
    with pytest.raises(ConfigError):
        check_repo_id("org/name/extra")


def test_push_arguments_fit_the_librarys_signatures(tmp_path):
    api = huggingface_hub.HfApi()
    inspect.signature(huggingface_hub.HfApi.create_repo).bind(
        api, "someone/tiny", repo_type="model", private=False, exist_ok=True
    )
    arguments = upload_arguments(tmp_path, "someone/tiny")
    bound = inspect.signature(huggingface_hub.HfApi.upload_folder).bind(api, **arguments)
    assert bound.arguments["folder_path"] == str(tmp_path)
    assert bound.arguments["repo_type"] == "model"


def test_base_model_from_a_hub_snapshot():
    path = "/c/hub/models--Qwen--Qwen2.5-Math-7B/snapshots/0123456789abcdef"
    assert base_model(path) == "Qwen/Qwen2.5-Math-7B"
    assert base_model("/some/local/model") is None
    assert base_model("") is None
