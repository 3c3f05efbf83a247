"""Shared building blocks of the config files (not a runnable config itself).

Each section is a ConfigDict whose fields are exactly the fields of that subsystem's dataclass
(`dynamo_jax/config.py` maps them and rejects unknown names). Config files call these builders
and then set what differs; `parse_arg` reads the `file.py:key=value,key=value` argument.
"""

from __future__ import annotations

import dataclasses

import ml_collections as mlc
from ml_collections import config_dict

from dynamo_jax.models.presets import get_preset
from dynamo_jax.sharding.rules import DEFAULT_RULES


def parse_arg(arg: str | None, **defaults: str) -> dict[str, str]:
    """'baseline=grpo,ablation=no_gc' → {'baseline': 'grpo', 'ablation': 'no_gc'} over defaults."""
    out = dict(defaults)
    for part in filter(None, (arg or "").split(",")):
        key, sep, value = part.partition("=")
        if not sep or key not in defaults:
            raise ValueError(
                f"config argument {part!r}: expected key=value with key in {sorted(defaults)}"
            )
        out[key] = value
    return out


def _optional(value, kind):
    """A None default that a `--config.x=...` override can still set (typed placeholder)."""
    return config_dict.placeholder(kind) if value is None else value


def model(preset: str, **overrides) -> mlc.ConfigDict:
    """The model section: every `ModelConfig` field, copied from a named preset (models/presets.py)."""
    fields = dataclasses.asdict(get_preset(preset, **overrides))
    section = mlc.ConfigDict()
    for key, value in fields.items():
        section[key] = _optional(value, bool if key in ("qkv_bias", "qk_norm") else int)
    return section


def init(checkpoint: str = "", tokenizer: str = "") -> mlc.ConfigDict:
    return mlc.ConfigDict(
        dict(
            checkpoint=checkpoint,  # HF directory with the initial weights ("" = random init)
            tokenizer=tokenizer,  # HF tokenizer directory ("" = the data section's own)
        )
    )


def rollout(engine: str, max_new_tokens: int) -> mlc.ConfigDict:
    return mlc.ConfigDict(
        dict(
            engine=engine,  # "jax" (in-process sampler) or "vllm" (sidecar process)
            max_new_tokens=max_new_tokens,  # response length limit
            top_p=1.0,  # nucleus sampling during training (1.0 = off, as in both papers)
            top_k=-1,  # top-k sampling (-1 = off)
            sidecar_python=".venv-vllm/bin/python",  # vllm: interpreter of the vLLM venv
            vllm_dtype="bfloat16",  # vllm: weights/compute dtype
            gpu_memory_utilization=0.4,  # vllm: share of GPU memory for vLLM (colocated)
            vllm_enforce_eager=False,  # vllm: no CUDA graphs (faster start, slower decode)
            vllm_max_num_seqs=256,  # vllm: concurrent sequences
        )
    )


def jax_engine(max_batch: int = 256) -> mlc.ConfigDict:
    return mlc.ConfigDict(
        dict(
            min_batch=8,  # smallest batch bucket of the embedded engine
            max_batch=max_batch,  # most rows one program runs (larger calls are split)
            min_prompt_len=16,  # floor of the prompt-length buckets
            min_new_tokens=16,  # floor of the generation-length buckets
            decode_chunk=32,  # decode steps per program call between host checks
            compact=True,  # gather live rows into a smaller bucket when half have finished
            cache_dtype=_optional(None, str),  # KV-cache dtype (None = model compute dtype)
        )
    )


def allocation(
    policy: str, n_avg: int, g_min: int, g_max: int, decay: float = 1.0
) -> mlc.ConfigDict:
    return mlc.ConfigDict(
        dict(
            policy=policy,  # uniform | dynamo | dynamo_released | e3
            n_avg=n_avg,  # mean rollouts per prompt; the step's budget is prompts_per_step * n_avg
            g_min=g_min,  # fewest rollouts a prompt gets (>= 2 with std-normalised advantages)
            g_max=g_max,  # most rollouts a prompt gets
            min_history=2,  # DynaMO: prompts with fewer past rollouts get n_avg (Appendix D)
            decay=decay,  # multiply old (G_i, k_i) by this before adding a step's counts (1 = paper)
            e3_curriculum_step=2,  # E3: widen [g_min, g_max] by this per epoch
            released_priority_floor=0.01,  # released heuristic: priority floor
            released_mastered_acc=0.85,  # released heuristic: accuracy marking a prompt mastered
            released_explore_rollouts=4,  # released heuristic: rollouts for rarely seen prompts
            released_explore_below=4,  # released heuristic: "rarely seen" = fewer rollouts than this
        )
    )


def temperature(
    mode: str = "fixed",
    initial: float = 1.0,
    vocab_size: int | None = None,
    anneal: bool = False,
    total_steps: int | None = None,
) -> mlc.ConfigDict:
    return mlc.ConfigDict(
        dict(
            mode=mode,  # "fixed" or "e3" (entropy-holding scheduler, E3 Eq. 4)
            initial=initial,  # starting (or fixed) sampling temperature
            init_steps=1,  # H_init = mean entropy of the first this many batches
            vocab_size=_optional(
                vocab_size, int
            ),  # |V| of the policy (e3 only; = model.vocab_size)
            anneal=anneal,  # cosine-anneal the entropy target (E3 Eq. 5)
            anneal_start_frac=0.6,  # annealing starts at this fraction of train.steps (E3 paper)
            eta=0.9,  # final entropy target = eta * H_init
            total_steps=_optional(total_steps, int),  # t_max of Eq. 5 (= train.steps)
            temperature_min=0.1,  # clamp of the scheduled temperature
            temperature_max=2.0,  # clamp of the scheduled temperature
        )
    )


def loss(baseline: str = "dynamo") -> mlc.ConfigDict:
    """The loss section for a Table-1 baseline, with that baseline's published defaults."""
    from dynamo_jax.losses.config import LossConfig

    # Every field of LossConfig, at the baseline's published values; each field's meaning and
    # source is documented beside it in dynamo_jax/losses/config.py.
    fields = dataclasses.asdict(LossConfig.preset(baseline))
    section = mlc.ConfigDict()
    optional = {"dual_clip": float, "max_len_norm": int, "comp_alpha": float, "stab_alpha": float}
    for key, value in fields.items():
        section[key] = _optional(value, optional.get(key, float))
    return section


def mesh(shape=(1, -1, 1)) -> mlc.ConfigDict:
    return mlc.ConfigDict(
        dict(
            shape=tuple(shape),  # (data, fsdp, tensor) sizes; one -1 = the rest of the devices
            rules=DEFAULT_RULES,  # logical axis → mesh axes table (sharding/rules.py)
        )
    )


def optim(learning_rate: float, warmup_steps: int = 0) -> mlc.ConfigDict:
    return mlc.ConfigDict(
        dict(
            learning_rate=learning_rate,  # peak learning rate
            schedule="constant",  # after warm-up: "constant" or "cosine"
            warmup_steps=warmup_steps,  # linear warm-up, in optimizer updates
            weight_decay=0.01,  # AdamW decoupled weight decay
            b1=0.9,  # Adam beta1
            b2=0.999,  # Adam beta2
            eps=1e-8,  # Adam epsilon
            max_grad_norm=1.0,  # global-norm gradient clip (<= 0: off)
        )
    )


def train(steps: int, prompts_per_step: int, mini_batch_size: int, seed: int = 0) -> mlc.ConfigDict:
    return mlc.ConfigDict(
        dict(
            seed=seed,  # every random stream derives from (seed, step)
            steps=steps,  # RL steps (one rollout batch each)
            prompts_per_step=prompts_per_step,  # N prompts per step
            mini_batch_size=mini_batch_size,  # responses per optimizer update (divides the budget)
            micro_batches=1,  # gradient accumulation inside one update
            ppo_epochs=1,  # passes over each batch
            norm_adv_by_std=True,  # GRPO std normalisation (False = Dr.GRPO)
            max_consecutive_nonfinite=3,  # stop after this many skipped NaN/Inf updates in a row
            shuffle_mini_batches=True,  # permute responses before splitting into mini-batches
        )
    )


def checkpoint(every_steps: int, max_to_keep: int = 3) -> mlc.ConfigDict:
    return mlc.ConfigDict(
        dict(
            every_steps=every_steps,  # save every this many steps (and at the end / on Ctrl-C)
            max_to_keep=max_to_keep,  # older checkpoints are deleted
            async_save=False,  # write in the background (waits before the next save)
        )
    )


def evaluation(every_steps: int, n_samples: int, ks=(1,), max_problems: int = 64) -> mlc.ConfigDict:
    return mlc.ConfigDict(
        dict(
            every_steps=every_steps,  # pass@k evaluation every this many steps (0 = never)
            n_samples=n_samples,  # samples per problem (temperature 1.0, top-p 1.0)
            ks=tuple(ks),  # report pass@k for these k
            max_problems=max_problems,  # first this many eval problems (0 = all)
        )
    )


def logging(progress_bar: bool = True) -> mlc.ConfigDict:
    return mlc.ConfigDict(
        dict(
            tensorboard=True,  # TensorBoard events in workdir/tb
            progress_bar=progress_bar,  # tqdm bar with reward, temperature, entropy, tokens/s
            plots_at_end=True,  # PNGs of reward/entropy/temperature/allocation in workdir/plots
        )
    )


def dry_run(num_devices: int = 8, device_memory_gb: float = 80.0) -> mlc.ConfigDict:
    return mlc.ConfigDict(
        dict(
            num_devices=num_devices,  # simulated devices of the planned mesh
            device_memory_gb=device_memory_gb,  # per-device memory the plan must fit
        )
    )


def _data(**fields) -> mlc.ConfigDict:
    section = dict(
        task="synthetic",  # "math" (files below) or "synthetic" (generated arithmetic)
        paths=(),  # training files (verl parquet or JSONL), relative to the repo root
        eval_paths=(),  # evaluation files (same formats)
        format="auto",  # auto | parquet | jsonl (auto: by extension)
        system_prompt="Please reason step by step, and put your final answer within \\boxed{}.",
        max_prompt_tokens=1024,  # longer prompts are truncated on the left or filtered
        overflow="truncate_left",  # truncate_left | filter
        on_bad_row="error",  # error (names file, row, field) | skip (counted and logged)
        id_field="id",  # column holding a stable row id (else a hash of source + prompt)
        seed=0,  # data order seed (the epoch iterator's shuffles)
        synthetic_op="add_mod",  # synthetic task: copy | max | add_mod
        synthetic_modulus=5,  # synthetic task: answers are one digit in [0, modulus)
        synthetic_num_rows=0,  # synthetic task: 0 = every distinct problem once
    )
    section.update(fields)
    return mlc.ConfigDict(section)


def data_synthetic(max_prompt_tokens: int = 16, **fields) -> mlc.ConfigDict:
    return _data(task="synthetic", system_prompt="", max_prompt_tokens=max_prompt_tokens, **fields)


def data_math(paths, eval_paths=(), max_prompt_tokens: int = 1024, **fields) -> mlc.ConfigDict:
    return _data(
        task="math",
        paths=tuple(paths),
        eval_paths=tuple(eval_paths),
        max_prompt_tokens=max_prompt_tokens,
        **fields,
    )


def reward(num_workers: int = 4) -> mlc.ConfigDict:
    return mlc.ConfigDict(
        dict(
            correct_reward=1.0,  # reward of a verified answer
            wrong_reward=0.0,  # reward of a wrong/unparseable/timed-out answer
            no_answer_reward=0.0,  # reward when no final answer could be extracted
            timeout_s=5.0,  # wall-clock limit per completion (math-verify, SIGALRM in a worker)
            kill_grace_s=1.0,  # a worker still busy this long after its deadline is replaced
            max_chars=100_000,  # longer completions are not parsed (reward = wrong_reward)
            max_answer_chars=4096,  # bound on the extracted answer handed to math-verify
            max_nesting=64,  # bound on brace nesting of the extracted answer
            num_workers=num_workers,  # scoring processes
            start_method="forkserver",  # forkserver | spawn (fork is unsafe once JAX is loaded)
            worker_memory_mb=2048,  # address-space cap per worker (0 = none)
        )
    )
