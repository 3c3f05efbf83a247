"""logging.wandb_*: a tiny run logged to Weights & Biases in offline mode, read back from the run
files wandb writes (tests/helpers/wandb_records.py), against metrics.jsonl and the resolved
config; a resumed run continues the same W&B run; no package or a failing init is one line."""

import json
import re
import sys

import pytest
from helpers.train_runs import _short_config
from helpers.wandb_records import config, history, read_records, run_files, run_ids, summary

from dynamo_jax.config import from_config_dict, to_json_dict
from dynamo_jax.errors import ConfigError
from dynamo_jax.loop import train
from dynamo_jax.reporting.metrics import LoggingConfig, MetricsWriter, read_metrics
from dynamo_jax.reporting.wandb_log import RUN_ID_FILE, WandbLogger, numeric_scalars

pytest.importorskip("wandb", reason="the [wandb] extra is not installed")


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def _config(steps):
    config = _short_config(method="grpo", steps=steps, every=3)
    config.eval.every_steps = 3
    config.logging.wandb_project = "dynamo-tests"
    config.logging.wandb_tags = ("tiny", "offline")
    config.logging.wandb_mode = "offline"
    return config


@pytest.mark.slow
def test_offline_run_is_logged_and_read_back_then_resume_continues_it(tmp_path, offline, capsys):
    workdir = tmp_path / "run"
    cfg = from_config_dict(_config(steps=3))
    assert train.run(cfg, workdir).exit_code == 0
    assert "W&B: offline run" in capsys.readouterr().out
    (first,) = run_files(workdir)
    records = read_records(first)
    (run_id,) = run_ids(records)
    assert run_id == (workdir / RUN_ID_FILE).read_text().strip()
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name, list(run.tags)) == (
        "dynamo-tests",
        cfg.name,
        ["tiny", "offline"],
    )

    # The same scalars as metrics.jsonl (and TensorBoard), at the same steps.
    logged = history(records)
    metrics = read_metrics(workdir)
    assert sorted(logged) == [1, 2, 3] == [r["step"] for r in metrics]
    for record in metrics:
        expected = numeric_scalars(record)
        assert len(expected) > 20
        got = {k: v for k, v in logged[record["step"]].items() if not k.startswith("_")}
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=1e-12, abs=0), key

    # The resolved config, as config.json holds it.
    written = {k: v for k, v in config(records).items() if k != "_wandb"}
    assert written == json.loads(json.dumps(to_json_dict(cfg)))

    # The end-of-run summary: how it ended and the last evaluation's pass@1.
    ended = summary(records)
    assert ended["run/status"] == "finished" and ended["run/exit_code"] == 0
    assert (ended["run/last_step"], ended["run/checkpoint_step"]) == (3, 3)
    eval_keys = [k for k in metrics[-1] if re.fullmatch(r"eval/[^/]+/pass@\d+", k)]
    assert eval_keys and ended["final_eval/step"] == 3
    for key in eval_keys:
        assert ended["final_" + key] == pytest.approx(metrics[-1][key])

    # Resume (two more steps): the same W&B run id, the new steps only.
    assert train.run(from_config_dict(_config(steps=5)), workdir).exit_code == 0
    files = run_files(workdir)
    assert len(files) == 2 and files[0] == first
    resumed = read_records(files[1])
    assert run_ids(resumed) == {run_id}
    assert sorted(history(resumed)) == [4, 5]
    assert summary(resumed)["run/last_step"] == 5


def test_missing_package_is_one_line_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    lines = []
    logger = WandbLogger(tmp_path, project="p", say=lines.append)
    assert logger.run is None
    assert lines == [
        "W&B: logging.wandb_project is set but wandb is not installed "
        "(pip install 'dynamo_jax[wandb]'); not logging to W&B"
    ]
    logger.log(1, {"a": 1.0})
    logger.finish({"run/status": "finished"}, 0)


def test_failing_init_is_one_line_and_the_run_goes_on(tmp_path, monkeypatch):
    # Online with no API key: wandb.init refuses (UsageError) before any network.
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    lines = []
    writer_cfg = LoggingConfig(
        tensorboard=False, progress_bar=False, wandb_project="p", wandb_mode="online"
    )
    writer = MetricsWriter(tmp_path, writer_cfg, total_steps=1, start_step=0)
    writer._wandb._say = lines.append  # the logger is already off; nothing more is said
    assert writer._wandb.run is None
    writer.write(1, {"a": 1.0})
    writer.close()
    writer.end({"run/status": "finished"}, 0)
    assert read_metrics(tmp_path) == [{"step": 1, "a": 1.0}]
    logger = WandbLogger(tmp_path, project="p", mode="online", say=lines.append)
    assert logger.run is None
    assert len(lines) == 1 and lines[0].startswith("W&B: wandb.init failed (")
    assert "\n" not in lines[0]


def test_logging_config_checks_the_wandb_fields():
    assert LoggingConfig(wandb_tags="one").wandb_tags == ("one",)
    with pytest.raises(ValueError, match="logging.wandb_mode must be one of"):
        LoggingConfig(wandb_mode="sometimes")
    with pytest.raises(ValueError, match="logging.wandb_tags"):
        LoggingConfig(wandb_tags=("ok", ""))
    config = _short_config(method="grpo", steps=2)
    config.logging.wandb_mode = "loud"
    with pytest.raises(ConfigError, match="config.logging"):
        from_config_dict(config)
