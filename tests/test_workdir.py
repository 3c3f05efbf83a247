"""The run directory before training: input files, the resume rule on saved configs, start over."""

import json

import pytest

from configs import tiny
from dynamo_jax import workdir as run_dir
from dynamo_jax.config import from_config_dict, to_json_dict
from dynamo_jax.errors import CheckpointError, ConfigError


def _cfg(**overrides):
    config = tiny.get_config()
    for dotted, value in overrides.items():
        section, field = dotted.split("__")
        config[section][field] = value
    return from_config_dict(config)


def _saved(cfg):
    return json.loads(json.dumps(to_json_dict(cfg)))  # as the checkpoint's meta holds it


# ----------------------------------------------------------------------------- the rule


def test_model_shape_blocks_a_resume_and_steps_only_warn():
    saved = _saved(_cfg())
    blocking, other = run_dir.config_differences(
        saved, to_json_dict(_cfg(model__num_layers=3, train__steps=200, eval__every_steps=7))
    )
    assert blocking == ["model.num_layers 2 → 3"]
    assert other == ["eval.every_steps 50 → 7", "train.steps 100 → 200"]


@pytest.mark.parametrize(
    "override,blocks",
    [
        ({"model__num_layers": 3}, True),
        ({"model__param_dtype": "bfloat16"}, True),
        ({"model__dtype": "bfloat16"}, False),  # compute dtype: same parameters
        ({"model__remat_policy": "full"}, False),
        ({"data__seed": 1}, True),  # the data order the saved iterator position counts in
        ({"data__synthetic_op": "mixed"}, True),
        ({"data__system_prompt": "x"}, False),
        ({"train__prompts_per_step": 8, "train__mini_batch_size": 32}, True),
        ({"allocation__policy": "uniform"}, True),
        ({"allocation__g_max": 12}, False),
        ({"optim__learning_rate": 5e-4}, False),
        ({"train__seed": 7}, False),
        ({"mesh__shape": (1, 1, -1)}, False),
        ({"checkpoint__every_steps": 5}, False),
        ({"logging__tensorboard": False}, False),
    ],
)
def test_which_differences_block(override, blocks):
    blocking, other = run_dir.config_differences(_saved(_cfg()), to_json_dict(_cfg(**override)))
    assert bool(blocking) == blocks, (blocking, other)
    assert blocking or other  # a difference is never dropped


def test_a_field_the_saved_config_lacks_counts_as_its_default():
    defaults = _cfg(model__scan_layers=True, model__remat_policy="none")  # ModelConfig's own
    saved = _saved(defaults)
    del saved["model"]["remat_policy"], saved["model"]["scan_layers"]  # added to the code later
    blocking, other = run_dir.config_differences(saved, to_json_dict(defaults))
    assert blocking == other == []
    # configs/tiny.py unrolls its layers: a checkpoint from before the field existed was scanned.
    blocking, _ = run_dir.config_differences(saved, to_json_dict(_cfg()))
    assert blocking == ["model.scan_layers true → false"]


def test_check_fits_names_the_field_and_the_way_out(tmp_path):
    meta = {"config": _saved(_cfg())}
    run_dir.check_fits(tmp_path, _cfg(train__steps=300), 10, meta)  # only a warning
    with pytest.raises(CheckpointError) as err:
        run_dir.check_fits(tmp_path, _cfg(model__num_layers=3), 10, meta)
    first, second = str(err.value).splitlines()
    assert first == (
        f"{tmp_path}: its checkpoint (step 10) was saved with a config this run cannot continue: "
        "model.num_layers 2 → 3"
    )
    assert "--start_over" in second and f"{tmp_path}/config.json" in second


# ----------------------------------------------------------------------------- inputs


def test_missing_input_files_name_the_field(tmp_path):
    config = tiny.get_config()
    config.data.paths = (str(tmp_path / "train.parquet"),)
    with pytest.raises(ConfigError, match=r"config\.data\.paths\[0\]: no such file: .*train"):
        run_dir.check_inputs(from_config_dict(config))
    config = tiny.get_config()
    config.init.checkpoint = str(tmp_path)
    with pytest.raises(ConfigError, match="config.init.checkpoint: .* has no config.json"):
        run_dir.check_inputs(from_config_dict(config))
    config.init.checkpoint = str(tmp_path / "nope")
    with pytest.raises(ConfigError, match="config.init.checkpoint: no such directory"):
        run_dir.check_inputs(from_config_dict(config))
    run_dir.check_inputs(_cfg())  # the synthetic task names no file


# ----------------------------------------------------------------------------- start over


def test_start_over_moves_the_previous_run_and_deletes_nothing(tmp_path):
    assert run_dir.move_previous_run(tmp_path) is None  # nothing to move
    for name in ("metrics.jsonl", "config.json", "notes.txt"):
        (tmp_path / name).write_text(name)
    (tmp_path / "checkpoints" / "5").mkdir(parents=True)
    first = run_dir.move_previous_run(tmp_path)
    assert first == tmp_path / "previous-1"
    assert sorted(p.name for p in first.iterdir()) == [
        "checkpoints",
        "config.json",
        "metrics.jsonl",
    ]
    assert (tmp_path / "notes.txt").read_text() == "notes.txt"  # not a run output: left alone
    (tmp_path / "metrics.jsonl").write_text("second")
    assert run_dir.move_previous_run(tmp_path) == tmp_path / "previous-2"
    assert (tmp_path / "previous-2" / "metrics.jsonl").read_text() == "second"
    assert (first / "metrics.jsonl").read_text() == "metrics.jsonl"
