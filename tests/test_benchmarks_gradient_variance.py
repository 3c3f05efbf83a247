"""benchmarks/gradient_variance.py: the real-model mode end to end on a checkpointed run of a
small configs/tiny.py (`--config FILE:ARGS --policy W`), its config loading and checkpoint
restore, and the arguments.

Oracles: orbax's own reading of the checkpoint's params item, the config file's sections as
configs/tiny.py builds them, and exact allocation counts (uniform's n_i, every n summing to the
budget N x n_avg).
"""

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from benchmarks import gradient_variance as gv
from dynamo_jax.errors import CheckpointError, ConfigError

# configs/tiny.py at 4 prompts a step (budget 4 x 8), 1 step, checkpointed; the one
# update is on-policy (no log-prob pass in the draws, as in configs/smollm2_arith.py)
SMALL_CONFIG = """
from configs import tiny


def get_config(arg=None):
    config = tiny.get_config(arg)
    config.train.steps = 1
    config.train.prompts_per_step = 4
    config.train.mini_batch_size = 32
    config.train.skip_on_policy_logprob_pass = True
    config.checkpoint.every_steps = 1
    return config
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(config spec, workdir) of a 1-step GRPO run of the small config."""
    from dynamo_jax.loop import train

    root = tmp_path_factory.mktemp("gradient_variance")
    (root / "small.py").write_text(SMALL_CONFIG)
    spec = f"{root / 'small.py'}:method=grpo,task=max"
    train.run(gv.config_file(spec), root / "run")
    return spec, root / "run"


def test_loss_agg_mode_override():
    cfg = gv.tiny_config("max", "grpo", 0)
    assert gv.with_loss_agg_mode(cfg, "") is cfg
    assert gv.with_loss_agg_mode(cfg, "prompt-mean").loss.loss_agg_mode == "prompt-mean"
    norm = gv.with_loss_agg_mode(cfg, "seq-mean-token-sum-norm").loss
    assert norm.max_len_norm == cfg.rollout.max_new_tokens


def test_config_file_is_the_files_config_with_the_method_added_or_replaced(run):
    spec, _ = run
    cfg = gv.config_file(spec)
    assert cfg.train.prompts_per_step == 4 and cfg.first_update_on_policy
    assert cfg.loss == gv.tiny_config("max", "grpo", 0).loss
    for method in ("dynamo", "e3", "grpo"):  # method=grpo in the spec is replaced
        assert (
            gv.config_file(spec, method).allocation == gv.tiny_config("max", method, 0).allocation
        )
    assert (
        gv.config_file("configs/tiny.py", "dynamo").loss == gv.tiny_config("max", "dynamo", 0).loss
    )


# orbax read directly, with no target shardings, warns that it takes the saved ones
@pytest.mark.filterwarnings("ignore:Sharding info not provided")
def test_checkpoint_policy_restores_the_checkpoints_params(run):
    spec, workdir = run
    cfg = gv.config_file(spec)
    step, params = gv.checkpoint_policy(cfg, workdir, None)
    assert step == 1  # the latest
    raw = ocp.PyTreeCheckpointer().restore(str(workdir / "checkpoints" / "1" / "params"))
    assert jax.tree.structure(raw) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(raw), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert gv.checkpoint_policy(cfg, workdir, 1)[0] == 1
    with pytest.raises(CheckpointError, match="no step 7"):
        gv.checkpoint_policy(cfg, workdir, 7)
    with pytest.raises(ConfigError, match="not --config's model"):
        gv.checkpoint_policy(gv.config_file("configs/smollm2_arith.py"), workdir, None)


def test_real_mode_measures_the_checkpoint_under_both_modes_at_the_configs_budget(run, capsys):
    spec, workdir = run
    argv = ["--config", spec, "--policy", str(workdir), "--draws", "2", "--sigma_draws", "2"]
    argv += ["--reference", "0", "--warmup", "4", "--bootstrap", "20"]
    argv += ["--allocations", "uniform,dynamo,oracle_sigma"]
    measured = gv.main(argv)
    out = capsys.readouterr().out
    assert [m["task"] for m in measured] == ["token-mean", "prompt-mean"]
    # reference 0, sigma_i 4 prompts x 2 of 8 completions, draws up to 3 x 2 of 4 x 8
    assert "14 gradient computations" in out and "256 completions in all" in out
    assert "min to go" in out  # the estimate, once a gradient compiled nothing
    dynamo = gv.config_file(spec, "dynamo").allocation
    for m in measured:
        assert m["stage"] == 1 and m["n_avg"] == 8
        n = m["allocations"]
        np.testing.assert_array_equal(n["uniform"], [8, 8, 8, 8])
        for name in ("dynamo", "oracle_sigma"):
            assert n[name].sum() == 32
            assert n[name].min() >= dynamo.g_min and n[name].max() <= dynamo.g_max
        for s in m["stats"].values():
            assert s.gram.shape == (2, 2) and s.variance > 0 and s.ref_dot is None
        assert np.all(m["sigma2"] >= 0) and m["sigma2"].sum() > 0
        assert f"at step 1 of `{workdir}`, {m['task']}" in out
    # The same seeds: the modes see the same rollouts (warm-up history, hence dynamo's n_i) and
    # differ in the loss's gradient only.
    a, b = measured
    np.testing.assert_array_equal(a["warmup_p"], b["warmup_p"])
    np.testing.assert_array_equal(a["allocations"]["dynamo"], b["allocations"]["dynamo"])
    assert not np.allclose(a["sigma2"], b["sigma2"])
    assert "| `prompt-mean` | 1 |" in out and "| n/a | n/a |" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--config", "configs/tiny.py"], "go together"),
        (["--policy", "W"], "go together"),
        (["--config", "nowhere.py", "--policy", "W"], "no such file"),
        (["--loss_agg_mode", "token-mean,prompt-mean"], "a list with --config"),
        (["--loss_agg_mode", "token-sum"], "token-sum"),
        (["--reference", "1"], "--reference 0 or >= 2"),
        (["--warmup", "2"], "at least 2 per round"),
        (["--config.train.packing=False"], "needs --config"),
        (["--config", "configs/tiny.py", "--policy", "W", "--config.train.nope=1"], "train.nope"),
        (["--config", "configs/tiny.py", "--policy", "W", "--config.train.packing=2"], "packing"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        gv.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_real_mode_defaults_to_both_modes_and_tiny_mode_to_the_methods_own():
    args = gv.parse_args(["--config", "configs/tiny.py", "--policy", "W"])
    assert args.loss_agg_mode == ["token-mean", "prompt-mean"]
    assert gv.parse_args([]).loss_agg_mode == [""]


def test_config_overrides_are_set_as_the_fields_types():
    argv = ["--config", "configs/smollm2_arith.py:pool=64", "--policy", "W"]
    argv += ["--config.train.share_prompts=True", "--config.train.packing=false"]
    argv += ["--config.optim.learning_rate=3e-5", "--config.train.steps=3"]
    args = gv.parse_args(argv)
    cfg = gv.config_file(args.config, "dynamo", args.overrides)
    assert cfg.train.share_prompts is True and cfg.train.packing is False
    assert cfg.optim.learning_rate == 3e-5 and cfg.train.steps == 3
    assert cfg.data.max_train_problems == 64 and cfg.allocation.policy == "dynamo"
