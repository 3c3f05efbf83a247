"""The reproduction configs (configs/paper.py and the files built on it) against the papers'
published run settings, docs/algorithm.md#run-settings, written out here independently of configs/paper.py so a
drift in either is caught: DynaMO's Table 3 (+ its authors' run_qwen2.5-math-7b.sh) and E3's
"Training Details" (+ its authors' train_*.sh)."""

import dataclasses
import importlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow.parquet as pq
import pytest

from dynamo_jax.allocation.priorities import e3_bounds
from dynamo_jax.config import from_config_dict
from dynamo_jax.losses import BASELINES
from dynamo_jax.models.presets import get_preset
from dynamo_jax.step.optimizer import make_optimizer

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "math"

# DynaMO configs: (file, preset, devices, max prompt tokens, max response tokens, vLLM tensor
# parallel). Table 3 says prompt ≤ 2,048 and response ≤ 8,192; Qwen2.5-Math's 4,096-token context
# forces 1,024 + 3,072. Table 3's vLLM tensor parallel 2, except for 14B, which gives vLLM less of
# each GPU (its config file says why) and so spreads its weights over 4.
DYNAMO = [
    ("dynamo_qwen25_math_1p5b", "qwen2.5-math-1.5b", 8, 1024, 3072, 2),
    ("dynamo_qwen25_math_7b", "qwen2.5-math-7b", 8, 1024, 3072, 2),
    ("dynamo_qwen3_14b", "qwen3-14b", 16, 2048, 8192, 4),
]
# E3 configs: (file, preset, GPUs as in the paper, learning rate).
E3 = [
    ("e3_r1_distill_1p5b", "r1-distill-qwen-1.5b", 4, 5e-6),
    ("e3_r1_distill_7b", "r1-distill-qwen-7b", 8, 2e-6),
]


def _load(name: str, arg: str | None = None):
    return from_config_dict(importlib.import_module(f"configs.{name}").get_config(arg))


def _learning_rates(run, updates: int) -> np.ndarray:
    """The learning rate of each of the first `updates` updates of the run's optimizer.

    With params held at 0 and a constant gradient of 1, AdamW's bias-corrected moments are
    m̂ = 1 and v̂ = 1 at every update and weight decay adds 0, so update t is −lr_t / (1 + eps);
    the global-norm clip at 1.0 leaves a gradient of norm 1 unchanged.
    """
    opt = make_optimizer(run.optim, run.total_updates)
    params = jnp.zeros(())
    update = jax.jit(lambda state: opt.update(jnp.ones(()), state, params))
    state, out = opt.init(params), []
    for _ in range(updates):
        step, state = update(state)
        out.append(-float(step) * (1.0 + run.optim.eps))
    return np.asarray(out)


def _data_paths_inside_the_project(run):
    for path in (*run.data.paths, *run.data.eval_paths):
        resolved = Path(path).resolve()
        assert resolved.is_relative_to(ROOT / "data"), path
        assert resolved.is_file(), path


def _throughput_settings(run, devices: int):
    """verl's use_remove_padding / use_dynamic_bsz (packed rows of the run's longest sequence,
    micro-batches by a per-GPU token budget of whole rows) and colocated vLLM sidecars whose
    memory share and JAX's sum to at most 0.95; the dry run plans against JAX's share."""
    train, rollout = run.train, run.rollout
    assert (train.packing, train.pack_len, train.micro_batches) == (True, 0, 1)
    budget = train.max_tokens_per_micro_batch
    assert budget >= run.max_seq_len and budget % run.max_seq_len == 0
    assert rollout.sidecar_devices == ()  # colocated on every GPU
    assert rollout.gpu_memory_utilization + rollout.jax_memory_fraction <= 0.95 + 1e-9
    assert run.dry_run.num_devices == devices
    assert run.dry_run.device_memory_gb == pytest.approx(80.0 * rollout.jax_memory_fraction)


@pytest.mark.parametrize("name,preset,devices,max_prompt,max_response,tp", DYNAMO)
def test_dynamo_configs_hold_table_3(name, preset, devices, max_prompt, max_response, tp):
    run = _load(name)
    # The published model in bf16 compute with fp32 master weights, full remat and blockwise
    # attention.
    assert run.model == get_preset(
        preset,
        dtype="bfloat16",
        param_dtype="float32",
        remat_policy="full",
        attention_impl="blockwise",
    )
    # Generation: 512 prompts × 16 rollouts on average, each prompt in [8, 24] (DRA on).
    assert run.train.prompts_per_step == 512
    assert (run.allocation.policy, run.allocation.n_avg) == ("dynamo", 16)
    assert (run.allocation.g_min, run.allocation.g_max) == (8, 24)
    assert run.budget == 8192
    # PPO mini-batch 32 prompts, one pass: 32 × 16 = 512 responses, 8,192 / 512 = 16 updates.
    assert (run.train.mini_batch_size, run.train.ppo_epochs) == (512, 1)
    assert run.updates_per_step == 16
    # Optimizer: lr 1e-6 constant after 10 warm-up RL steps, weight decay 0.1, clip 1.0.
    assert (run.optim.learning_rate, run.optim.schedule) == (1e-6, "constant")
    assert (run.optim.weight_decay, run.optim.max_grad_norm) == (0.1, 1.0)
    assert run.optim.warmup_steps == 10 * 16
    # Loss: ε_low 0.2, effective ε_high 0.28 (0.2 × 1.4), dual clip 10, token-mean, GRPO
    # advantages normalised by std, no KL term, no entropy term (that is the entropy_loss
    # baseline's, not DynaMO's).
    loss = run.loss
    assert (loss.variant, loss.clip_low, loss.clip_high, loss.dual_clip) == (
        "dynamo",
        0.2,
        0.28,
        10.0,
    )
    assert (loss.loss_agg_mode, loss.norm_adv_by_std, loss.kl) == ("token-mean", True, "none")
    # Sampling: temperature 1.0 fixed, top-p 1.0, top-k off, vLLM with 1,024 sequences.
    assert (run.temperature.mode, run.temperature.initial) == ("fixed", 1.0)
    assert (run.rollout.engine, run.rollout.top_p, run.rollout.top_k) == ("vllm", 1.0, -1)
    assert run.rollout.vllm_max_num_seqs == 1024
    # Lengths: left truncation of prompts; the cut fits the model's context.
    assert (run.data.max_prompt_tokens, run.rollout.max_new_tokens) == (max_prompt, max_response)
    assert run.data.overflow == "truncate_left"
    assert run.max_seq_len <= run.model.max_position_embeddings
    if run.model.max_position_embeddings >= 2048 + 8192:
        assert (max_prompt, max_response) == (2048, 8192)
    # Validation every 5 steps, pass@1 and pass@32 (32 samples at T = 1) on every test problem.
    assert (run.eval.every_steps, run.eval.n_samples, run.eval.ks) == (5, 32, (1, 32))
    assert run.eval.max_problems == 0
    # The authors' script: 2,000 steps, a checkpoint every 20.
    assert (run.train.steps, run.checkpoint.every_steps) == (2000, 20)
    _throughput_settings(run, devices)
    assert run.rollout.vllm_tensor_parallel == tp
    _data_paths_inside_the_project(run)


@pytest.mark.parametrize("name", [d[0] for d in DYNAMO])
def test_baselines_and_ablations_share_the_run_settings(name):
    """Only the loss and (for baselines / no_dra) the allocation policy change with the switch."""
    default = _load(name)
    args = [f"baseline={b}" for b in BASELINES if b != "dynamo"]
    args += [f"ablation={a}" for a in ("no_dra", "no_gc", "no_ums", "no_modulation")]
    for arg in args:
        run = _load(name, arg)
        alloc = dataclasses.replace(run.allocation, policy=default.allocation.policy)
        same = dict(name=default.name, loss=default.loss, allocation=alloc)
        assert dataclasses.replace(run, **same) == default, arg
        uniform = arg.startswith("baseline=") or arg == "ablation=no_dra"
        assert run.allocation.policy == ("uniform" if uniform else "dynamo"), arg


def test_warm_up_matches_verl_once_per_rl_step():
    """verl steps its scheduler once per RL step: lr(k) = 1e-6 · min(k / 10, 1) for RL step k.
    With 16 updates per step and a 160-update linear warm-up, the first update of step k gets
    1e-6 · 16k / 160, the same value: step 1 → update 16 → 1e-7, step 5 → update 80 → 5e-7,
    step 10 → update 160 → 1e-6, and 1e-6 from there on."""
    run = _load("dynamo_qwen25_math_7b")
    lrs = _learning_rates(run, 16 * 12 + 1)
    for rl_step in range(13):
        verl = 1e-6 * min(rl_step / 10, 1.0)
        assert lrs[16 * rl_step] == pytest.approx(verl, rel=1e-5, abs=1e-13), rl_step
    assert lrs[160:] == pytest.approx(np.full(lrs.size - 160, 1e-6), rel=1e-5)
    assert np.all(np.diff(lrs[:161]) > 0)  # rising within the warm-up, not stepwise


def test_allocation_switch_picks_any_known_policy():
    default = _load("dynamo_qwen25_math_7b")
    released = _load("dynamo_qwen25_math_7b", "allocation=dynamo_released")
    assert released.allocation.policy == "dynamo_released"
    assert released.name == default.name + "_dynamo_released"
    assert (
        dataclasses.replace(released, name=default.name, allocation=default.allocation) == default
    )
    assert _load("dynamo_qwen3_14b", "allocation=uniform").allocation.policy == "uniform"
    with pytest.raises(ValueError, match=r"allocation='dynamo_typo'.*policy"):
        _load("dynamo_qwen25_math_7b", "allocation=dynamo_typo")
    with pytest.raises(ValueError, match="picks the policy of DynaMO's DRA"):
        _load("dynamo_qwen25_math_7b", "baseline=grpo,allocation=dynamo_released")
    with pytest.raises(ValueError, match="picks the policy of DynaMO's DRA"):
        _load("dynamo_qwen25_math_7b", "ablation=no_dra,allocation=dynamo_released")


def test_the_7b_modulation_is_the_authors_7b_script():
    run = _load("dynamo_qwen25_math_7b")
    assert (*run.loss.settings.alphas(), run.loss.settings.gamma, run.loss.settings.ums_tau) == (
        0.2,
        0.4,
        50.0,
        0.99,
    )
    for name in ("dynamo_qwen25_math_1p5b", "dynamo_qwen3_14b"):
        loss = _load(name).loss
        s = loss.settings
        assert (*s.alphas(), s.gamma, s.ums_tau) == (0.4, 0.4, 50.0, 0.9)
    # Baselines keep their own published presets on the 7B too.
    assert _load("dynamo_qwen25_math_7b", "baseline=grpo").loss.flat()["ums_tau"] == 0.9


@pytest.mark.parametrize("name,preset,devices,lr", E3)
def test_e3_configs_hold_the_papers_training_details(name, preset, devices, lr):
    run = _load(name)
    # 64 prompts × G = 8; one policy update per sampling (update batch 64 × 8).
    assert (run.train.prompts_per_step, run.allocation.n_avg, run.budget) == (64, 8, 512)
    assert (run.train.mini_batch_size, run.train.ppo_epochs, run.updates_per_step) == (512, 1, 1)
    # 3 epochs over the 10,240 training problems: 3 × 10,240 / 64 = 480 steps.
    rows = pq.read_metadata(DATA / "train.parquet").num_rows
    assert rows == 10_240
    assert run.train.steps == 3 * rows // 64 == 480
    # Curriculum: [8, 8] in epoch 1, G_max += 2 and G_min -= 2 per epoch: [6, 10], then [4, 12].
    a = run.allocation
    assert a.policy == "e3"
    bounds = [
        e3_bounds(e, a.n_avg, a.g_min, a.g_max, a.settings.e3_curriculum_step) for e in range(4)
    ]
    assert bounds == [(8, 8), (6, 10), (4, 12), (4, 12)]
    # Temperature: from τ = 1, entropy held; annealing from ⌊0.6 · 480⌋ = 288 with η = 0.9.
    t = run.temperature
    assert (t.mode, t.initial, t.settings.anneal, t.settings.eta) == ("e3", 1.0, True, 0.9)
    assert (t.total_steps, t.settings.anneal_start_step(t.total_steps)) == (480, 288)
    assert t.vocab_size == run.model.vocab_size
    # Responses ≤ 6,144 tokens; prompts ≤ 2,048, longer ones dropped as the scripts do.
    assert (run.rollout.max_new_tokens, run.data.max_prompt_tokens) == (6144, 2048)
    assert run.data.overflow == "filter"
    assert run.max_seq_len <= run.model.max_position_embeddings
    assert (run.rollout.top_p, run.rollout.top_k) == (1.0, -1)
    # lr 5e-6 (1.5B) / 2e-6 (7B), no warm-up; GRPO's clipped surrogate, no KL.
    assert (run.optim.learning_rate, run.optim.warmup_steps, run.optim.schedule) == (
        lr,
        0,
        "constant",
    )
    assert (run.loss.variant, run.loss.clip_low, run.loss.clip_high) == ("grpo", 0.2, 0.2)
    assert run.loss.kl == "none"
    # Not in the paper, read from the authors' verl actor: dual clip c = 3, weight decay 0.01.
    assert (run.loss.dual_clip, run.optim.weight_decay, run.optim.max_grad_norm) == (3.0, 0.01, 1.0)
    # Evaluation: 16 samples per problem at T = 1, pass@1 and pass@16.
    assert (run.eval.n_samples, run.eval.ks, run.eval.max_problems) == (16, (1, 16), 0)
    _throughput_settings(run, devices)
    _data_paths_inside_the_project(run)


def test_math_tiny_reads_the_projects_data():
    run = _load("math_tiny")
    _data_paths_inside_the_project(run)
    assert [Path(p).name for p in run.data.paths] == ["train.parquet"]
