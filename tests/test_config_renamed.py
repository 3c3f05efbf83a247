"""Renamed config keys (dynamo_jax/config.py `RENAMED`): an old key from a config file or a
`--config` override is refused with one line naming the new key and exit status 2; a checkpoint
saved under the old names still resumes (its fields are compared under the new names)."""

import json
from pathlib import Path

import pytest
from helpers.scripts import launch

from configs import base, tiny
from dynamo_jax import workdir as run_dir
from dynamo_jax.config import RENAMED, build_section, from_config_dict, to_json_dict
from dynamo_jax.errors import ConfigError, ExitCode

ROOT = Path(__file__).resolve().parents[1]


def test_the_renames():
    assert RENAMED == {
        "loss.baseline": "loss.variant",
        "loss.tau": "loss.ums_tau",
        "loss.comp_alpha": "loss.alpha_comp",
        "loss.stab_alpha": "loss.alpha_stab",
    }


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_an_old_key_in_a_section_names_the_new_one(old, new):
    section, field = old.split(".")
    with pytest.raises(ConfigError) as err:
        build_section(section, {field: 0.5})
    assert str(err.value) == f"config.{old} was renamed; use config.{new}"
    with pytest.raises(ConfigError, match=f"use config.{new}$"):
        base.section(section, **{field: 0.5})  # the config files' builder


@pytest.mark.parametrize(
    "override, line",
    [
        ("--config.loss.baseline=grpo",
         "error: --config.loss.baseline: this key was renamed; use --config.loss.variant"),
        ("--config.loss.tau=0.5",
         "error: --config.loss.tau: this key was renamed; use --config.loss.ums_tau"),
        ("--config.loss.comp_alpha=0.2",
         "error: --config.loss.comp_alpha: this key was renamed; use --config.loss.alpha_comp"),
        ("--config.temperature.total_steps=6",
         "error: --config.temperature.total_steps: this key is derived from --config.train.steps; "
         "remove it"),
    ],
)  # fmt: skip
def test_launch_refuses_an_old_override_in_one_line(tmp_path, override, line):
    proc = launch("--config=configs/tiny.py", f"--workdir={tmp_path / 'w'}", override)
    assert proc.returncode == ExitCode.REFUSED, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [line]
    assert not (tmp_path / "w").exists()


def test_launch_refuses_an_old_key_set_in_a_config_file(tmp_path):
    config = tmp_path / "old_keys.py"
    config.write_text(
        "from configs import tiny\n\n\ndef get_config():\n"
        "    config = tiny.get_config()\n"
        "    config.loss.baseline = 'grpo'\n"
        "    return config\n"
    )
    proc = launch(f"--config={config}", f"--workdir={tmp_path / 'w'}")
    assert proc.returncode == ExitCode.REFUSED, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "loss.baseline" in lines[0] and lines[0].endswith("use config.loss.variant"), lines


def test_a_checkpoint_saved_under_the_old_names_resumes_unchanged():
    cfg = from_config_dict(tiny.get_config())
    saved = json.loads(json.dumps(to_json_dict(cfg)))
    saved["loss"]["baseline"] = saved["loss"].pop("variant")
    saved["loss"]["tau"] = saved["loss"].pop("ums_tau")
    saved["loss"]["comp_alpha"] = saved["loss"].pop("alpha_comp")
    assert run_dir.config_differences(saved, to_json_dict(cfg)) == ([], [])
    saved["loss"]["tau"] = 0.5  # a real change is still reported, under the new name
    blocking, other = run_dir.config_differences(saved, to_json_dict(cfg))
    assert blocking == [] and other == [f"loss.ums_tau 0.5 → {cfg.loss.settings.ums_tau}"]
