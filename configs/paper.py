"""Builders of the papers' GPU runs (not a runnable config: see dynamo_*.py and e3_*.py).

DynaMO (arXiv 2602.19208) on Qwen2.5-Math-1.5B/7B and Qwen3-14B, with every Table 1 baseline and
Table 2 ablation one config argument away; E3 (arXiv 2505.18573) on R1-Distill-Qwen-1.5B/7B.
All of them: verl-parquet math data from ../shared/data/math, the vLLM sidecar for rollouts,
FSDP meshes, bf16 compute with fp32 master weights, full remat.

Hyperparameters stated in ALGORITHM.md are used as stated: clip ε_low = 0.2 and ε_high = 0.28
(the authors' scripts say 0.2 but their actor multiplies it by 1.4: 0.28 is the effective value),
dual clip c = 10, token-mean aggregation, α = 0.4, γ = 50, τ = 0.9 (7B: α_c = 0.2, α_s = 0.4,
τ = 0.99). Batch shape, response length and learning rate are the usual verl RLVR settings
(128 prompts × 8 rollouts, 256-response mini-batches, lr 1e-6): our choice where ALGORITHM.md is
silent, to be checked against the papers' appendices before claiming a reproduction.
"""

from pathlib import Path

from configs import base
from dynamo_jax.losses import BASELINES  # Table 1: one loss preset each

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "math"

# Table 2: which DynaMO component is switched off.
ABLATIONS = ("none", "no_dra", "no_gc", "no_ums", "no_modulation")


def _common(preset: str, hf_dir: str, *, steps: int, max_new_tokens: int, mesh_shape, devices: int):
    config = base.mlc.ConfigDict()
    # bf16 compute, fp32 master weights, full rematerialisation of each layer
    config.model = base.model(preset, dtype="bfloat16", param_dtype="float32", remat_policy="full")
    config.init = base.init(checkpoint=hf_dir, tokenizer=hf_dir)  # download the HF model here
    config.data = base.data_math(
        paths=(str(DATA / "train.parquet"),),
        eval_paths=(str(DATA / "test.jsonl"),),  # AIME24, AMC23, MATH500, OlympiadBench
        max_prompt_tokens=1024,
    )
    config.reward = base.reward(num_workers=16)  # math-verify processes
    config.rollout = base.rollout("vllm", max_new_tokens=max_new_tokens)
    config.jax_engine = (
        base.jax_engine()
    )  # unused with the vLLM engine; kept for --config.rollout.engine=jax
    config.mesh = base.mesh(mesh_shape)
    config.optim = base.optim(learning_rate=1e-6)
    config.train = base.train(steps=steps, prompts_per_step=128, mini_batch_size=256)
    config.train.micro_batches = 256 // devices  # one row per device per micro-batch
    config.checkpoint = base.checkpoint(every_steps=20, max_to_keep=3)
    config.eval = base.evaluation(every_steps=50, n_samples=32, ks=(1, 8, 32), max_problems=0)
    config.logging = base.logging()
    config.dry_run = base.dry_run(num_devices=devices, device_memory_gb=80.0)
    return config


def dynamo_config(preset: str, hf_dir: str, arg: str | None, *, mesh_shape, devices: int):
    """DynaMO (or a Table 1 baseline / Table 2 ablation) on a Qwen model."""
    args = base.parse_arg(arg, baseline="dynamo", ablation="none")
    baseline, ablation = args["baseline"], args["ablation"]
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation must be one of {ABLATIONS}, got {ablation!r}")
    if ablation != "none" and baseline != "dynamo":
        raise ValueError("ablations switch off parts of DynaMO: use them with baseline=dynamo")
    config = _common(
        preset, hf_dir, steps=500, max_new_tokens=3072, mesh_shape=mesh_shape, devices=devices
    )
    config.name = f"{preset}_{baseline}" + ("" if ablation == "none" else f"_{ablation}")
    config.loss = base.loss(baseline)
    if baseline == "dynamo" and preset == "qwen2.5-math-7b":
        # The authors' 7B script: α_c = 0.2 (μ_max 1.2), α_s = 0.4 (λ_min 0.6), τ = 0.99.
        config.loss.comp_alpha, config.loss.stab_alpha, config.loss.tau = 0.2, 0.4, 0.99
    config.loss.enable_gc = ablation not in ("no_gc", "no_modulation")
    config.loss.enable_ums = ablation not in ("no_ums", "no_modulation")
    # DRA is part of DynaMO only; every baseline samples a uniform n = 8.
    dra = baseline == "dynamo" and ablation != "no_dra"
    config.allocation = base.allocation("dynamo" if dra else "uniform", n_avg=8, g_min=2, g_max=16)
    config.temperature = base.temperature("fixed", 1.0)
    return config


def e3_config(preset: str, hf_dir: str, *, mesh_shape, devices: int):
    """E3: rank allocation with the widening curriculum + entropy-holding temperature, G = 8."""
    steps = 500
    config = _common(
        preset, hf_dir, steps=steps, max_new_tokens=8192, mesh_shape=mesh_shape, devices=devices
    )
    config.name = f"{preset}_e3"
    config.loss = base.loss("grpo")  # E3 builds on GRPO's clipped surrogate
    # G = 8 in the first epoch; the bounds widen by 2 per epoch up to [4, 12] (our limits).
    config.allocation = base.allocation("e3", n_avg=8, g_min=4, g_max=12)
    config.temperature = base.temperature(
        "e3", initial=0.6, vocab_size=config.model.vocab_size, anneal=True, total_steps=steps
    )  # 0.6: DeepSeek-R1's recommended sampling temperature for its distilled models
    config.train.prompts_per_step = 64
    config.train.mini_batch_size = 128
    config.train.micro_batches = 128 // devices  # one row per device per micro-batch
    return config
