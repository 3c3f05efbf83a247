"""Builders of the papers' GPU runs (not a runnable config: see dynamo_*.py and e3_*.py).

DynaMO (arXiv 2602.19208) on Qwen2.5-Math-1.5B/7B and Qwen3-14B, with every Table 1 baseline and
Table 2 ablation one config argument away; E3 (arXiv 2505.18573) on R1-Distill-Qwen-1.5B/7B.
All of them: the project's verl-parquet math data (data/math: E3's 10,240 training problems,
evaluated on test.jsonl's AIME24, AMC23, MATH500 and OlympiadBench), the vLLM sidecar for
rollouts, FSDP meshes, bf16 compute with fp32 master weights, full remat.

The values are the papers' published run settings (docs/algorithm.md#run-settings): DynaMO's Table 3 and its
authors' `run_qwen2.5-math-7b.sh`; E3's "Training Details" and its authors' `train_*.sh`. Where
this project's conventions differ from verl's the value is converted and says so (mini-batches
count responses here, prompts in verl; warm-up counts optimizer updates here, RL steps in verl).
The one per-model departure, a response cut to fit a shorter context, is stated in the model's
config file. The DynaMO paper's own training set is not part of docs/algorithm.md#run-settings: its runs here use
E3's set (20 steps per pass at 512 prompts, so 2,000 steps are 100 passes).

Throughput settings, as verl's `use_remove_padding` / `use_dynamic_bsz`: sequences are packed
into rows of max_prompt_tokens + max_new_tokens tokens (train.packing, the default) and each
mini-batch is cut into micro-batches by a per-GPU token budget (train.max_tokens_per_micro_batch,
sized with --dry_run, which plans the worst case of one sequence per row). Rollouts: one vLLM
sidecar per `vllm_tensor_parallel` GPUs on every host, colocated with the trainer. Table 3's
memory utilisation 0.8 is verl's time-sharing (it frees vLLM's memory while it trains); JAX
takes its share of each GPU once when it starts, so here the two shares are fixed and sum to at
most 0.95 (rollout.jax_memory_fraction + rollout.gpu_memory_utilization, docs/vllm_sidecar.md):
each model's file states its split, and its dry run plans against JAX's share.
"""

from pathlib import Path

from configs import base
from dynamo_jax.allocation.config import AllocationConfig
from dynamo_jax.losses import BASELINES  # Table 1: one loss preset each

DATA = Path(__file__).resolve().parents[1] / "data" / "math"

# Table 2: which DynaMO components stay on, as (DRA, GC, UMS).
ABLATIONS = {
    "none": (True, True, True),
    "no_dra": (False, True, True),
    "no_gc": (True, False, True),
    "no_ums": (True, True, False),
    "no_modulation": (True, False, False),
}

# ---- DynaMO, paper Table 3 (docs/algorithm.md#run-settings) ----
DYNAMO_STEPS = 2000  # the authors' script: total_training_steps
DYNAMO_PROMPTS = 512  # generation batch (prompts per step)
DYNAMO_N_AVG, DYNAMO_G_MIN, DYNAMO_G_MAX = 16, 8, 24  # rollouts per prompt: mean, range
DYNAMO_MINI_BATCH_PROMPTS = 32  # PPO mini-batch, one pass: 32 × 16 = 512 responses
DYNAMO_LR = 1e-6
# verl steps its learning-rate scheduler once per RL step: 10 warm-up steps (linear from 0, then
# constant) are 10 × 16 optimizer updates here, where warm-up counts updates.
DYNAMO_WARMUP_RL_STEPS = 10
DYNAMO_WEIGHT_DECAY = 0.1  # the script's value (Table 3 also lists 0.01)
DYNAMO_EVAL_EVERY, DYNAMO_EVAL_SAMPLES, DYNAMO_EVAL_KS = 5, 32, (1, 32)  # pass@1, pass@32, T = 1
DYNAMO_SAVE_EVERY = 20
DYNAMO_VLLM_MAX_SEQS = 1024

# ---- E3, paper Section 5 "Training Details" (docs/algorithm.md#run-settings) ----
E3_STEPS = 480  # 3 epochs × 10,240 training problems / 64 per step
E3_PROMPTS, E3_G = 64, 8  # batch 64 prompts × G = 8, one policy update per batch
# The curriculum's limits after two epochs (G = 8 widened by 2 per epoch, both sides).
E3_G_MIN, E3_G_MAX, E3_CURRICULUM_STEP = 4, 12, 2
E3_MAX_PROMPT_TOKENS = 2048  # the authors' scripts, which drop longer prompts
E3_MAX_NEW_TOKENS = 6144
E3_ANNEAL_START_FRAC, E3_ETA = 0.6, 0.9  # annealing from ⌊0.6 t_max⌋ towards 0.9 H_init
E3_EVAL_EVERY, E3_EVAL_SAMPLES, E3_EVAL_KS = 10, 16, (1, 16)  # script test_freq; pass@1, @16
E3_SAVE_EVERY = 80  # script save_freq
# Read from the authors' verl actor, not stated in the paper: dual clip c = 3 (verl's default
# clip_ratio_c, applied by their dp_actor) and weight decay 0.01 (verl's default).
E3_DUAL_CLIP = 3.0
E3_WEIGHT_DECAY = 0.01
A100_GB = 80.0


def _common(
    preset: str,
    hf_dir: str,
    *,
    steps: int,
    prompts: int,
    mini_batch: int,
    micro_tokens: int,
    max_prompt_tokens: int,
    max_new_tokens: int,
    mesh_shape,
    devices: int,
    overflow: str,
    vllm: dict,
):
    config = base.mlc.ConfigDict()
    # bf16 compute, fp32 master weights, full rematerialisation of each layer; blockwise
    # attention (memory linear in length: no [L, L] scores at 8k-10k tokens; docs/scaling.md)
    config.model = base.model(
        preset,
        dtype="bfloat16",
        param_dtype="float32",
        remat_policy="full",
        attention_impl="blockwise",
    )
    config.init = base.init(checkpoint=hf_dir, tokenizer=hf_dir)  # download the HF model here
    config.data = base.data_math(
        paths=(str(DATA / "train.parquet"),),
        eval_paths=(str(DATA / "test.jsonl"),),  # AIME24, AMC23, MATH500, OlympiadBench
        max_prompt_tokens=max_prompt_tokens,
        overflow=overflow,
    )
    config.reward = base.reward(num_workers=16)  # math-verify processes
    # Both papers sample with top-p 1.0 and top-k off.
    # vllm: vllm_tensor_parallel, gpu_memory_utilization, jax_memory_fraction (colocated)
    config.rollout = base.rollout(
        "vllm", max_new_tokens=max_new_tokens, top_p=1.0, top_k=-1, **vllm
    )
    config.jax_engine = base.jax_engine()  # unused with vLLM; kept for --config.rollout.engine=jax
    config.mesh = base.mesh(mesh_shape)
    config.train = base.train(
        steps=steps,
        prompts_per_step=prompts,
        mini_batch_size=mini_batch,
        packing=True,
        max_tokens_per_micro_batch=micro_tokens,  # per GPU: see the model's config file
        ppo_epochs=1,
    )
    config.logging = base.logging()
    # A100 80 GB, of which JAX has its share (the rest is vLLM's)
    jax_gb = round(A100_GB * vllm["jax_memory_fraction"], 1)
    config.dry_run = base.dry_run(num_devices=devices, device_memory_gb=jax_gb)
    return config


def dynamo_config(
    preset: str,
    hf_dir: str,
    arg: str | None,
    *,
    mesh_shape,
    devices: int,
    micro_tokens: int,
    vllm: dict,
    max_prompt_tokens: int = 2048,
    max_new_tokens: int = 8192,
    dynamo_loss: dict | None = None,
):
    """DynaMO (or a Table 1 baseline / Table 2 ablation) on a Qwen model, Table 3's settings.

    `arg`: baseline=<Table 1 name>, ablation=<Table 2 name>, allocation=<policy name> (the
    policy DRA runs; any `AllocationConfig.policy`). Baselines and ablation=no_dra sample a
    uniform 16 per prompt. `dynamo_loss`: the DynaMO loss's per-model hyperparameters;
    `micro_tokens` the per-GPU token budget of a micro-batch; `vllm` the sidecars' settings.
    """
    args = base.parse_arg(arg, baseline="dynamo", ablation="none", allocation="dynamo")
    baseline, ablation, policy = args["baseline"], args["ablation"], args["allocation"]
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation must be one of {tuple(ABLATIONS)}, got {ablation!r}")
    if ablation != "none" and baseline != "dynamo":
        raise ValueError("ablations switch off parts of DynaMO: use them with baseline=dynamo")
    dra, gc, ums = ABLATIONS[ablation]
    dra = dra and baseline == "dynamo"  # every Table 1 baseline samples uniformly
    if not dra and policy != "dynamo":
        raise ValueError(
            f"allocation={policy!r} picks the policy of DynaMO's DRA; baseline={baseline} "
            f"ablation={ablation} samples a uniform {DYNAMO_N_AVG} per prompt"
        )
    config = _common(
        preset,
        hf_dir,
        steps=DYNAMO_STEPS,
        prompts=DYNAMO_PROMPTS,
        mini_batch=DYNAMO_MINI_BATCH_PROMPTS * DYNAMO_N_AVG,  # responses
        micro_tokens=micro_tokens,
        max_prompt_tokens=max_prompt_tokens,
        max_new_tokens=max_new_tokens,
        mesh_shape=mesh_shape,
        devices=devices,
        overflow="truncate_left",  # the script's data.truncation='left'
        vllm=vllm,
    )
    name = f"{preset}_{baseline}" + ("" if ablation == "none" else f"_{ablation}")
    config.name = name + ("" if policy == "dynamo" else f"_{policy}")
    config.rollout.vllm_max_num_seqs = DYNAMO_VLLM_MAX_SEQS
    # Effective clips ε_low 0.2, ε_high 0.28 (the script's 0.2 × the 1.4 its actor applies) and
    # dual clip c = 10 are the dynamo preset's; token-mean; no entropy or KL term (kl="none").
    per_model = (dynamo_loss or {}) if baseline == "dynamo" else {}
    config.loss = base.loss(baseline, **per_model)
    config.loss.enable_gc, config.loss.enable_ums = gc, ums
    config.allocation = base.allocation(
        policy if dra else "uniform", n_avg=DYNAMO_N_AVG, g_min=DYNAMO_G_MIN, g_max=DYNAMO_G_MAX
    )
    try:  # a misspelt policy fails here, naming the argument
        AllocationConfig(**config.allocation.to_dict())
    except ValueError as err:
        raise ValueError(f"config argument allocation={policy!r}: {err}") from err
    config.temperature = base.temperature("fixed", 1.0)
    updates_per_step = DYNAMO_PROMPTS // DYNAMO_MINI_BATCH_PROMPTS  # 16
    config.optim = base.optim(
        learning_rate=DYNAMO_LR,
        schedule="constant",
        warmup_steps=DYNAMO_WARMUP_RL_STEPS * updates_per_step,  # 160 updates = 10 RL steps
        weight_decay=DYNAMO_WEIGHT_DECAY,
        max_grad_norm=1.0,
    )
    config.checkpoint = base.checkpoint(every_steps=DYNAMO_SAVE_EVERY, max_to_keep=3)
    config.eval = base.evaluation(
        every_steps=DYNAMO_EVAL_EVERY,
        n_samples=DYNAMO_EVAL_SAMPLES,
        ks=DYNAMO_EVAL_KS,
        max_problems=0,  # every problem of test.jsonl
    )
    return config


def e3_config(
    preset: str,
    hf_dir: str,
    *,
    learning_rate: float,
    mesh_shape,
    devices: int,
    micro_tokens: int,
    vllm: dict,
):
    """E3: rank allocation with the widening curriculum + entropy-holding temperature, G = 8."""
    steps = E3_STEPS
    config = _common(
        preset,
        hf_dir,
        steps=steps,
        prompts=E3_PROMPTS,
        mini_batch=E3_PROMPTS * E3_G,  # the whole batch: one update per sampling
        micro_tokens=micro_tokens,
        max_prompt_tokens=E3_MAX_PROMPT_TOKENS,
        max_new_tokens=E3_MAX_NEW_TOKENS,
        mesh_shape=mesh_shape,
        devices=devices,
        overflow="filter",  # the scripts' filter_overlong_prompts=True, truncation='error'
        vllm=vllm,
    )
    config.name = f"{preset}_e3"
    # E3 builds on GRPO's clipped surrogate (ε = 0.2 both sides, token-mean).
    config.loss = base.loss("grpo", dual_clip=E3_DUAL_CLIP)
    # G = 8 in the first epoch; the bounds widen by 2 per epoch up to [4, 12].
    config.allocation = base.allocation(
        "e3", n_avg=E3_G, g_min=E3_G_MIN, g_max=E3_G_MAX, e3_curriculum_step=E3_CURRICULUM_STEP
    )
    config.temperature = base.temperature(
        "e3",
        initial=1.0,
        anneal=True,
        anneal_start_frac=E3_ANNEAL_START_FRAC,
        eta=E3_ETA,
    )
    # No warm-up (verl's default ratio 0), constant rate, gradient clip 1.0.
    config.optim = base.optim(
        learning_rate=learning_rate,
        schedule="constant",
        warmup_steps=0,
        weight_decay=E3_WEIGHT_DECAY,
        max_grad_norm=1.0,
    )
    config.checkpoint = base.checkpoint(every_steps=E3_SAVE_EVERY, max_to_keep=3)
    config.eval = base.evaluation(
        every_steps=E3_EVAL_EVERY, n_samples=E3_EVAL_SAMPLES, ks=E3_EVAL_KS, max_problems=0
    )
    return config
